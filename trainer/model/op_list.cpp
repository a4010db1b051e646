#include "trainer/model/op_list.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/model/attention_block.h"
#include "trainer/model/mlp_block.h"

namespace tr {

const char* op_class_name(OpClass c) {
  switch (c) {
    case OpClass::gemm:
      return "GEMM";
    case OpClass::attention:
      return "attention";
    case OpClass::memory:
      return "memory";
    case OpClass::loss:
      return "loss";
    case OpClass::optimizer:
      return "optimizer";
  }
  return "?";
}

namespace {

// 2 m n k: a product's multiply-adds.
double flop(int64_t m, int64_t n, int64_t k) {
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

}  // namespace

void OpLister::add(ModelOp op) {
  if (op.count <= 0) return;
  op.precision = dtype_;
  for (ModelOp& o : ops_)
    if (o.name == op.name && o.key == op.key && o.phase == op.phase) {
      o.count += op.count;
      return;
    }
  ops_.push_back(std::move(op));
}

void OpLister::pass(const std::string& name, const char* kernel, OpPhase phase, OpPlace place,
                    double count, int64_t rows, int64_t width, double elems, OpClass cls) {
  add({.name = name,
       .key = {kernel, rows, width},
       .cls = cls,
       .phase = phase,
       .place = place,
       .count = count,
       .bytes = elems * e_});
}

void OpLister::linear_fwd(const std::string& name, OpPhase phase, OpPlace place, double count,
                          int64_t m, int64_t n, int64_t k) {
  add({.name = name,
       .key = {"linear_fwd", m, n, k},
       .phase = phase,
       .place = place,
       .count = count,
       .flop = flop(m, n, k)});
}

void OpLister::linear_bwd(const std::string& name, OpPlace place, OpPhase phase, double din,
                          double dweight, int64_t m, int64_t n, int64_t k, bool column_parallel) {
  add({.name = name + ": input gradient",
       .key = {"linear_bwd.din", m, k, n},
       .phase = phase,
       .place = place,
       .count = din,
       .flop = flop(m, n, k)});
  add({.name = name + ": weight gradient",
       .key = {"linear_bwd.dweight", n, k, m},
       .phase = phase,
       .place = place,
       .count = dweight,
       .flop = flop(m, n, k),
       .bytes = 8.0 * static_cast<double>(n) * static_cast<double>(k),
       .column_weight_grad = column_parallel});
}

void OpLister::attention(const std::string& name, const char* kernel, OpPhase phase, double count,
                         int64_t m, int64_t n, int64_t k, bool backward) {
  add({.name = name,
       .key = {kernel, m, n, k},
       .cls = OpClass::attention,
       .phase = phase,
       .count = count,
       .flop = (backward ? 2.0 : 1.0) * flop(m, n, k)});
}

namespace {

// A micro-batch's shapes on this rank (ModelDims' heads, intermediate size and vocabulary are
// its TP shard).
struct Shape {
  int64_t T;   // tokens of a micro-batch here: batch x seq / cp
  int64_t Ts;  // of them outside the TP regions: T / tp under sequence parallelism
  int64_t H, I;
  double e;  // bytes per activation element
};

constexpr OpPhase kFwd = OpPhase::forward, kBwd = OpPhase::backward;
constexpr OpPlace kLayers = OpPlace::layers;

// The LM head with the cross-entropy, chunk by chunk (each chunk's backward right after it, in
// the forward), over `mb` micro-batches.
void head_ops(OpLister& ops, const ModelDims& d, const Shape& s, int64_t chunk, double mb) {
  const OpPlace head = OpPlace::head;
  const double v = static_cast<double>(d.vocab_local);
  // The whole chunks of a micro-batch, then the rest.
  for (const auto& [n, each] :
       {std::pair{chunk, s.T / chunk}, std::pair{s.T % chunk, int64_t{1}}}) {
    if (n == 0) continue;
    const double times = mb * static_cast<double>(each), rows = static_cast<double>(n);
    // A pass over the chunk's f32 statistics (4 bytes each).
    const auto stats = [&](const char* name, const char* kernel, int64_t width, double values) {
      ops.add({.name = name,
               .key = {kernel, n, width},
               .cls = OpClass::loss,
               .place = head,
               .count = times,
               .bytes = 4 * values});
    };
    ops.linear_fwd("LM head: forward", kFwd, head, times, n, d.vocab_local, s.H);
    if (d.tp == 1) {
      ops.pass("cross-entropy", "cross_entropy_fwd_bwd", kFwd, head, times, n, d.vocab_local,
               3 * v * rows, OpClass::loss);
    } else {  // vocab-parallel: each shard's statistics, combined over TP, then loss and gradient
      ops.pass("cross-entropy: shard statistics", "xent_shard_stats", kFwd, head, times, n,
               d.vocab_local, v * rows, OpClass::loss);
      stats("cross-entropy: combine", "xent_combine", 1, 3.0 * static_cast<double>(d.tp) * rows);
      ops.pass("cross-entropy: loss and gradient", "xent_loss_grad", kFwd, head, times, n,
               d.vocab_local, 2 * v * rows, OpClass::loss);
    }
    stats("loss sum", "accumulate_sum", 1, rows);
    ops.linear_bwd("LM head", head, kFwd, times, times, n, d.vocab_local, s.H);
  }
}

}  // namespace

std::vector<ModelOp> model_ops(const ModelDims& d, const ModelOptions& o, int64_t micro_batches) {
  Shape s{};
  s.T = o.batch * (o.seq_len / d.cp);
  s.Ts = d.sequence_parallel ? s.T / d.tp : s.T;
  s.H = d.hidden;
  s.I = d.inter;
  s.e = static_cast<double>(dtype_size(o.dtype));
  OpLister ops(o.dtype);
  const double mb = static_cast<double>(micro_batches);
  const double passes = o.split_backward ? 2 : 1;  // recomputation runs again for W
  const double kept = o.split_backward ? mb : 0;
  const AttentionBlock attention(d, o.dtype, o.batch, o.seq_len);
  const DenseMlp mlp(d, o.dtype, s.T);
  const double h = static_cast<double>(s.H), ts = static_cast<double>(s.Ts);
  const auto norm = [&](const std::string& name, const char* kernel, OpPhase phase, OpPlace place,
                        double count, double elems) {
    ops.pass(name, kernel, phase, place, count, s.Ts, s.H, elems * h * ts);
  };
  if (d.first_stage) {
    const double t = static_cast<double>(s.T);
    ops.pass("embedding: forward", "embedding_fwd", kFwd, OpPlace::embedding, mb, s.T, s.H,
             2 * h * t);
    // The scatter-add into fp32 rows.
    ops.add({.name = "embedding: backward",
             .key = {"embedding_bwd", s.T, s.H},
             .cls = OpClass::memory,
             .phase = kBwd,
             .place = OpPlace::embedding,
             .count = mb,
             .bytes = h * t * (s.e + 8)});
    // What no backward assigns: the embedding's gradient, zeroed at the step's start (unless
    // the tied LM head on this stage writes it first).
    if (!(d.tied && d.last_stage))
      ops.add({.name = "embedding: gradient zeroed",
               .key = {"zero_", d.vocab_local, s.H},
               .cls = OpClass::memory,
               .phase = kFwd,
               .place = OpPlace::embedding,
               .count = 1,
               .bytes = 4 * static_cast<double>(d.vocab_local) * h});
  }
  int64_t l = 0;  // local layer index
  for (int c = 0; c < d.num_chunks(); ++c) {
    const int64_t n = d.chunks[c].layers;
    const bool head = d.last_stage && c == d.num_chunks() - 1;
    // The residual joins: the chunk's first norm; in each layer the residual add fused with the
    // MLP's norm, and at each layer's end with the next layer's norm; after the chunk's last
    // layer the final norm (fused with its residual add) or the residual add alone.
    if (n > 0) norm("rmsnorm: forward", "rmsnorm_fwd", kFwd, kLayers, mb, 2);
    norm("add + rmsnorm: forward", "add_rmsnorm_fwd", kFwd, kLayers,
         mb * static_cast<double>(std::max<int64_t>(2 * n - 1, 0)), 4);
    if (head && n > 0)
      norm("final rmsnorm: forward", "add_rmsnorm_fwd", kFwd, OpPlace::head, mb, 4);
    else if (head)
      norm("final rmsnorm: forward", "rmsnorm_fwd", kFwd, OpPlace::head, mb, 2);
    else if (n > 0)
      norm("residual add: forward", "add", kFwd, kLayers, mb, 3);
    for (int64_t j = 0; j < n; ++j, ++l) {
      attention.forward_ops(ops, {mb, kFwd, ""});
      mlp.forward_ops(ops, {mb, kFwd, ""});
      const bool full = l < d.recompute_full;
      if (full || d.recompute_selective) {  // the layer's input norm again
        norm("rmsnorm: forward (recomputed)", "rmsnorm_fwd", kBwd, kLayers, mb * passes, 2);
      }
      if (full) {
        const Run again{mb * passes, kBwd, " (recomputed)"};
        attention.forward_ops(ops, again);
        norm("add + rmsnorm: forward (recomputed)", "add_rmsnorm_fwd", kBwd, kLayers, mb * passes,
             4);
        mlp.forward_ops(ops, again, /*down=*/false);
      } else if (d.recompute_selective) {  // the norms' and SwiGLU's outputs
        norm("rmsnorm: forward (recomputed)", "rmsnorm_fwd", kBwd, kLayers, mb * passes, 2);
        ops.pass("swiglu: forward (recomputed)", "swiglu_fwd", kBwd, kLayers, mb * passes, s.T, s.I,
                 3.0 * static_cast<double>(s.I * s.T));
      }
      mlp.backward_ops(ops, mb, mb, kept);
      // Both blocks' input norms, accumulated into the residual stream's gradient.
      norm("rmsnorm: backward", "rmsnorm_bwd", kBwd, kLayers, 2 * mb, kNormBwdAccumulateElems);
      attention.backward_ops(ops, mb, mb, kept);
    }
    if (head) {
      norm("final rmsnorm: backward", "rmsnorm_bwd", kBwd, OpPlace::head, mb, kNormBwdElems);
      head_ops(ops, d, s, loss_chunk_of(d, o), mb);
    }
  }
  return ops.take();
}

std::map<OpKey, int64_t> op_counts(const std::vector<ModelOp>& ops) {
  std::map<OpKey, int64_t> out;
  for (const ModelOp& op : ops) out[op.key] += static_cast<int64_t>(op.count);
  return out;
}

std::string op_count_difference(const std::map<OpKey, int64_t>& logged,
                                const std::map<OpKey, int64_t>& listed) {
  std::map<OpKey, std::pair<int64_t, int64_t>> both;
  for (const auto& [key, n] : logged) both[key].first = n;
  for (const auto& [key, n] : listed) both[key].second = n;
  std::string out;
  for (const auto& [key, n] : both)
    if (n.first != n.second)
      absl::StrAppend(&out, key.str(), ": ran ", n.first, ", listed ", n.second, "\n");
  return out;
}

}  // namespace tr
