#include "trainer/model/op_list.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/ops.h"
#include "trainer/model/attention_block.h"
#include "trainer/model/mlp_block.h"
#include "trainer/model/moe_block.h"
#include "trainer/model/param_buffer.h"

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
    case OpClass::communication:
      return "communication";
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
  // The lister's dtype, but for what states its own: a collective, an FP8 product.
  if (op.cls != OpClass::communication && !is_fp8(op.precision)) op.precision = dtype_;
  op.routed = op.routed || routed_;
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

void OpLister::fp8_cast(const std::string& name, OpPhase phase, double count, int64_t rows,
                        int64_t cols, int layouts) {
  add({.name = name,
       .key = {"fp8_cast", rows, cols},
       .cls = OpClass::memory,
       .phase = phase,
       .place = OpPlace::layers,
       .count = count,
       .bytes = (e_ + layouts) * static_cast<double>(rows) * static_cast<double>(cols)});
}

void OpLister::weight_cast(const std::string& name, int64_t n, int64_t k) {
  if (layers_.fp8) fp8_cast(name + ": weight cast", OpPhase::forward, 1, n, k, 2);
}

void OpLister::linear_fwd(const std::string& name, OpPhase phase, OpPlace place, double count,
                          int64_t m, int64_t n, int64_t k) {
  const bool fp8 = layers_.fp8 && place == OpPlace::layers;
  if (fp8) fp8_cast(name + ": input cast", phase, count, m, k, 1);
  ModelOp op{.name = name,
             .key = {fp8 ? "linear_fp8" : "linear_fwd", m, n, k},
             .phase = phase,
             .place = place,
             .count = count,
             .flop = flop(m, n, k)};
  if (fp8) op.precision = GemmPrecision::kForward;
  add(std::move(op));
}

void OpLister::linear_bwd(const std::string& name, OpPlace place, OpPhase phase, double din,
                          double dweight, int64_t m, int64_t n, int64_t k, bool column_parallel,
                          bool bias) {
  const bool fp8 = layers_.fp8 && place == OpPlace::layers;
  if (fp8) {
    // The output gradient [m, n] once per pass: both layouts in a whole backward, one in each
    // of a split backward's passes; the input [m, k] transposed for the weight gradient.
    if (split_) {
      fp8_cast(name + ": output gradient cast (input pass)", phase, din, m, n, 1);
      fp8_cast(name + ": output gradient cast (weight pass)", phase, dweight, m, n, 1);
    } else {
      fp8_cast(name + ": output gradient cast", phase, std::max(din, dweight), m, n,
               din > 0 && dweight > 0 ? 2 : 1);
    }
    fp8_cast(name + ": input cast (transposed)", phase, dweight, m, k, 1);
  }
  ModelOp in{.name = name + ": input gradient",
             .key = {fp8 ? "linear_fp8" : "linear_bwd.din", m, k, n},
             .phase = phase,
             .place = place,
             .count = din,
             .flop = flop(m, n, k)};
  ModelOp w{.name = name + ": weight gradient",
            .key = {fp8 ? "linear_fp8" : "linear_bwd.dweight", n, k, m},
            .phase = phase,
            .place = place,
            .count = dweight,
            .flop = flop(m, n, k),
            .bytes = 8.0 * static_cast<double>(n) * static_cast<double>(k),
            .column_weight_grad = column_parallel};
  if (fp8) in.precision = w.precision = layers_.grad;
  add(std::move(in));
  add(std::move(w));
  // linear_bwd sums the bias gradient inside; beside linear_fp8 it is its own pass.
  if (fp8 && bias)
    pass(name + ": bias gradient", "bias_grad", phase, place, dweight, m, n,
         static_cast<double>(m) * static_cast<double>(n));
}

void OpLister::grouped_fwd(const std::string& name, OpPhase phase, double count, int64_t m,
                           int64_t n, int64_t k) {
  add({.name = name,
       .key = {"grouped_linear_fwd", m, n, k},
       .phase = phase,
       .count = count,
       .flop = flop(m, n, k)});
}

void OpLister::grouped_bwd(const std::string& name, double din, double dweight, int64_t m,
                           int64_t n, int64_t k, int64_t groups) {
  const OpPhase bwd = OpPhase::backward;
  add({.name = name + ": input gradient",
       .key = {"grouped_linear_bwd.din", m, k, n},
       .phase = bwd,
       .count = din,
       .flop = flop(m, n, k)});
  add({.name = name + ": weight gradient",
       .key = {"grouped_linear_bwd.dweight", n, k, m},
       .phase = bwd,
       .count = dweight,
       .flop = flop(m, n, k),
       .bytes =
           8.0 * static_cast<double>(groups) * static_cast<double>(n) * static_cast<double>(k)});
}

void OpLister::collective(const std::string& name, OpPhase phase, OpPlace place, double count,
                          const std::string& group, CommOp::Kind kind, Lane lane, int64_t rows,
                          int64_t width, DType dtype) {
  ModelOp op;
  op.name = name;
  op.key = {collective_kernel(group, kind, lane), rows, width};
  op.cls = OpClass::communication;
  op.phase = phase;
  op.place = place;
  op.precision = dtype;
  op.count = count;
  op.bytes = static_cast<double>(rows * width) * static_cast<double>(dtype_size(dtype));
  op.comm = {group, kind, lane};
  add(std::move(op));
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
  double e;    // bytes per activation element
  DType stat;  // the loss's statistics (kernels/ops.h stat_dtype)
  DType grad;  // the gradients (ParamBuffer::grad_dtype)
};

constexpr OpPhase kFwd = OpPhase::forward, kBwd = OpPhase::backward;
constexpr OpPlace kLayers = OpPlace::layers;

// The two ends of a TP region over a micro-batch's [T, H] activations (parallel/tp_region.h):
// leaving all-reduces the partial sums (reduce-scatters them under sequence parallelism);
// entering all-gathers the tokens under sequence parallelism and is nothing without it.
struct TpRegion {
  OpLister& ops;
  const ModelDims& d;
  const Shape& s;
  DType dtype;
  void leave(const std::string& name, OpPhase phase, OpPlace place, double count,
             Lane lane = Lane::in_order) const {
    if (d.tp == 1) return;
    ops.collective(name, phase, place, count, "tp",
                   d.sequence_parallel ? CommOp::reduce_scatter : CommOp::all_reduce, lane, s.T,
                   s.H, dtype);
  }
  void enter(const std::string& name, OpPhase phase, OpPlace place, double count) const {
    if (d.tp == 1 || !d.sequence_parallel) return;
    ops.collective(name, phase, place, count, "tp", CommOp::all_gather, Lane::in_order, s.T, s.H,
                   dtype);
  }
};

// The LM head with the cross-entropy, chunk by chunk (each chunk's backward right after it, in
// the forward), over `mb` micro-batches.
void head_ops(OpLister& ops, const ModelDims& d, const Shape& s, int64_t chunk, double mb,
              const TpRegion& region) {
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
      ops.collective("cross-entropy: statistics gathered", kFwd, head, times, "tp",
                     CommOp::all_gather, Lane::in_order, d.tp * n * 3, 1, s.stat);
      stats("cross-entropy: combine", "xent_combine", 1, 3.0 * static_cast<double>(d.tp) * rows);
      ops.pass("cross-entropy: loss and gradient", "xent_loss_grad", kFwd, head, times, n,
               d.vocab_local, 2 * v * rows, OpClass::loss);
    }
    stats("loss sum", "accumulate_sum", 1, rows);
    ops.linear_bwd("LM head", head, kFwd, times, times, n, d.vocab_local, s.H);
  }
  region.leave("LM head: input gradient reduced", kFwd, head, mb);  // vocab-parallel
}

}  // namespace

std::vector<ModelOp> model_ops(const ModelDims& d, const ModelOptions& o, int64_t micro_batches) {
  Shape s{};
  s.T = o.batch * (o.seq_len / d.cp);
  s.Ts = d.sequence_parallel ? s.T / d.tp : s.T;
  s.H = d.hidden;
  s.I = d.inter;
  s.e = static_cast<double>(dtype_size(o.dtype));
  s.stat = stat_dtype(o.dtype);
  s.grad = ParamBuffer::grad_dtype(o.dtype);
  OpLister ops(o.dtype, o.gemm, o.split_backward);
  const TpRegion region{ops, d, s, o.dtype};
  // A whole backward (not a split one's B pass) reduces a column-parallel layer's input
  // gradient beside its weight gradient with parallel.overlap_tp.
  const Lane column_lane = o.overlap_tp && !o.split_backward ? Lane::beside : Lane::in_order;
  const double mb = static_cast<double>(micro_batches);
  const double passes = o.split_backward ? 2 : 1;  // recomputation runs again for W
  const double kept = o.split_backward ? mb : 0;
  const LayerGemm gemm(o.gemm);
  const AttentionBlock attention(d, o.dtype, o.batch, o.seq_len, gemm);
  const DenseMlp mlp(d, o.dtype, s.T, gemm);
  const MoeMlp moe(d, o.dtype, s.T);
  const std::vector<int64_t> global = d.global_layers();
  // The load-balancing loss: the router statistics gathered along the stages (DecoderModel::
  // stage_side_input), the loss and its gradient on the last.
  const bool aux = d.moe.aux_loss();
  const double h = static_cast<double>(s.H), ts = static_cast<double>(s.Ts);
  const auto norm = [&](const std::string& name, const char* kernel, OpPhase phase, OpPlace place,
                        double count, double elems) {
    ops.pass(name, kernel, phase, place, count, s.Ts, s.H, elems * h * ts);
  };
  if (d.first_stage) {
    const double t = static_cast<double>(s.T);
    ops.pass("embedding: forward", "embedding_fwd", kFwd, OpPlace::embedding, mb, s.T, s.H,
             2 * h * t);
    region.leave("embedding: reduced", kFwd, OpPlace::embedding, mb);  // vocab-parallel rows
    region.enter("embedding: output gradient gathered", kBwd, OpPlace::embedding, mb);
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
    if (aux) {  // the chunk's router statistics: from zero or the previous stage's, and its
                // load-balancing gradient passed upstream
      const double e = static_cast<double>(d.moe.experts);
      if (d.first_stage && c == 0)
        ops.pass("router statistics: zeroed", "zero_", kFwd, kLayers, mb, 2, d.moe.experts, 2 * e);
      ops.pass("router statistics: carried", "cast", kFwd, kLayers, mb, 2, d.moe.experts, 4 * e);
      if (!(d.first_stage && c == 0))
        ops.pass("load-balancing gradient: passed on", "cast", kBwd, kLayers, mb, d.moe.experts, 1,
                 2 * e);
    }
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
      const bool sparse = d.sparse(global[static_cast<size_t>(l)]);
      const auto mlp_forward = [&](const Run& r, bool down) {
        if (sparse)
          moe.forward_ops(ops, r, down);
        else
          mlp.forward_ops(ops, r, down);
      };
      if (sparse && aux)
        ops.pass("router statistics: added", "add", kFwd, kLayers, mb, 2, d.moe.experts,
                 6.0 * static_cast<double>(d.moe.experts));
      // Each block a TP region: its input gathered, its output's partial sums reduced.
      const auto blocks_forward = [&](const Run& r, bool mlp_out) {
        region.enter("attention: input gathered" + r.suffix, r.phase, kLayers, r.count);
        region.leave("attention: output reduced" + r.suffix, r.phase, kLayers, r.count);
        region.enter("mlp: input gathered" + r.suffix, r.phase, kLayers, r.count);
        if (mlp_out) region.leave("mlp: output reduced", r.phase, kLayers, r.count);
      };
      attention.forward_ops(ops, {mb, kFwd, ""});
      mlp_forward({mb, kFwd, ""}, true);
      blocks_forward({mb, kFwd, ""}, true);
      const bool full = l < d.recompute_full;
      if (full || d.recompute_selective) {  // the layer's input norm again
        norm("rmsnorm: forward (recomputed)", "rmsnorm_fwd", kBwd, kLayers, mb * passes, 2);
      }
      if (full) {
        const Run again{mb * passes, kBwd, " (recomputed)"};
        attention.forward_ops(ops, again);
        norm("add + rmsnorm: forward (recomputed)", "add_rmsnorm_fwd", kBwd, kLayers, mb * passes,
             4);
        mlp_forward(again, /*down=*/false);
        blocks_forward(again, false);
      } else if (d.recompute_selective) {  // the norms' and SwiGLU's outputs
        norm("rmsnorm: forward (recomputed)", "rmsnorm_fwd", kBwd, kLayers, mb * passes, 2);
        const int64_t rows = sparse ? moe.routed_rows() : s.T, width = sparse ? d.moe.inter : s.I;
        ops.pass("swiglu: forward (recomputed)", "swiglu_fwd", kBwd, kLayers, mb * passes, rows,
                 width, 3.0 * static_cast<double>(rows * width));
        region.enter("attention: input gathered (recomputed)", kBwd, kLayers, mb * passes);
        region.enter("mlp: input gathered (recomputed)", kBwd, kLayers, mb * passes);
      }
      if (sparse)
        moe.backward_ops(ops, mb, o.split_backward);
      else
        mlp.backward_ops(ops, mb, mb, kept);
      // Both blocks' input norms, accumulated into the residual stream's gradient.
      norm("rmsnorm: backward", "rmsnorm_bwd", kBwd, kLayers, 2 * mb, kNormBwdAccumulateElems);
      attention.backward_ops(ops, mb, mb, kept);
      // Backward through each block's TP region: its output gradient gathered, its input
      // gradient's partial sums reduced.
      region.enter("mlp: output gradient gathered", kBwd, kLayers, mb);
      region.leave("mlp: input gradient reduced", kBwd, kLayers, mb,
                   sparse ? Lane::in_order : column_lane);
      region.enter("attention: output gradient gathered", kBwd, kLayers, mb);
      region.leave("attention: input gradient reduced", kBwd, kLayers, mb, column_lane);
      // Once a step: gradients of weights each TP rank applied to other tokens (the norms',
      // under sequence parallelism) or other heads (attention's), summed over TP.
      if (d.tp > 1 && d.sequence_parallel)
        ops.collective("rmsnorm: gradients summed", kBwd, kLayers, 2, "tp", CommOp::all_reduce,
                       Lane::in_order, s.H, 1, s.grad);
      attention.final_ops(ops, s.grad);
      if (!sparse) mlp.final_ops(ops);
    }
    if (head) {
      norm("final rmsnorm: backward", "rmsnorm_bwd", kBwd, OpPlace::head, mb, kNormBwdElems);
      region.enter("final rmsnorm: output gathered", kFwd, OpPlace::head, mb);
      head_ops(ops, d, s, loss_chunk_of(d, o), mb, region);
      if (aux) {  // the micro-batch's load-balancing loss (DecoderModel::moe_aux_loss)
        const int64_t E = d.moe.experts;
        if (d.cp > 1)
          ops.collective("router statistics: summed over CP", kFwd, OpPlace::head, mb, "cp",
                         CommOp::all_reduce, Lane::in_order, 2, E, s.stat);
        const auto loss_op = [&](const char* name, OpKey key, double count, double bytes) {
          ModelOp op;
          op.name = name;
          op.key = std::move(key);
          op.cls = OpClass::loss;
          op.place = OpPlace::head;
          op.count = count;
          op.bytes = bytes;
          ops.add(std::move(op));
        };
        loss_op("load-balancing loss", {"moe_aux_loss_fwd", 2, E}, mb,
                4.0 * static_cast<double>(dtype_size(s.stat)) * static_cast<double>(E));
        // Into the loss sum, and into the step's router sums (the loss's share, the imbalance).
        loss_op("load-balancing loss: summed", {"accumulate_sum", 1, 1}, 3 * mb, 16);
      }
      if (d.tp > 1 && d.sequence_parallel)
        ops.collective("final rmsnorm: gradient summed", kBwd, OpPlace::head, 1, "tp",
                       CommOp::all_reduce, Lane::in_order, s.H, 1, s.grad);
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
