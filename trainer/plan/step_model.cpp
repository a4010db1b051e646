#include "trainer/plan/step_model.h"

#include <algorithm>

#include "trainer/model/model_layout.h"

namespace tr {

double gemm_shape_efficiency(const GpuSpec& gpu, double m, double n, double k) {
  auto fill = [&](double d) { return d / (d + gpu.gemm_fill); };
  const double full = fill(8192) * fill(8192) * fill(8192);
  return std::min(1.0, fill(m) * fill(n) * fill(k) / full);
}

double attention_fraction(const GpuSpec& gpu, int64_t head_dim, bool backward) {
  const double at64 = backward ? gpu.attention_bwd_hd64 : gpu.attention_fwd_hd64;
  const double at128 = backward ? gpu.attention_bwd_hd128 : gpu.attention_fwd_hd128;
  const double x = std::clamp((static_cast<double>(head_dim) - 64.0) / 64.0, 0.0, 1.0);
  return at64 + x * (at128 - at64);
}

const char* attention_anchor(int64_t head_dim) {
  return head_dim <= 64 ? "hd64" : head_dim >= 128 ? "hd128" : nullptr;
}

double attention_length_factor(double keys) {
  constexpr double kTile = 128;
  return keys / (keys + kTile) / (4096.0 / (4096.0 + kTile));
}

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

constexpr double kBf16 = 2.0;  // bytes per activation element

// The ops of a stage, appended one by one with their counts; an op counted zero times is left
// out.
class OpList {
 public:
  explicit OpList(const GpuSpec& gpu)
      : gpu_(gpu),
        gemm_rate_(gpu.gemm_flops),
        peak_(gpu.peak_bf16_flops),
        stream_(gpu.copy_bw * gpu.stream_fraction) {}

  // A projection's forward, input gradient and weight gradient (M x N x K as linear_fwd runs
  // it; the weight gradient accumulates into the fp32 gradient: 8 bytes per weight read and
  // written besides the product). `recomputed` more forwards run in the backward.
  void projection(const std::string& name, OpPlace place, double count, double recomputed,
                  int64_t m, int64_t n, int64_t k, OpPhase backward = OpPhase::backward,
                  bool column_parallel = false) {
    const double flop =
        2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    auto gemm = [&](const std::string& what, OpPhase phase, double times, int64_t a, int64_t b,
                    int64_t c, double bytes, bool column_weight = false) {
      add({.name = name + ": " + what,
           .cls = OpClass::gemm,
           .phase = phase,
           .place = place,
           .count = times,
           .flop = flop,
           .bytes = bytes,
           .seconds = flop / (gemm_rate_ * gemm_shape_efficiency(gpu_, static_cast<double>(a),
                                                                 static_cast<double>(b),
                                                                 static_cast<double>(c))) +
                      bytes / stream_,
           .m = a,
           .n = b,
           .k = c,
           .column_weight_grad = column_weight});
    };
    gemm("forward", OpPhase::forward, count, m, n, k, 0);
    gemm("forward (recomputed)", OpPhase::backward, recomputed, m, n, k, 0);
    gemm("input gradient", backward, count, m, k, n, 0);
    gemm("weight gradient", backward, count, n, k, m, 8.0 * static_cast<double>(n * k),
         column_parallel);
  }
  // Flash attention over `tokens` queries of `seq` keys each on average (causal: a sequence's
  // length, or its documents' span), `width` = heads x head_dim.
  void attention(double count, double recomputed, double tokens, double seq, double width,
                 int64_t head_dim) {
    const double fwd = 2 * tokens * seq * width;
    auto op = [&](const std::string& what, OpPhase phase, double times, double flop,
                  bool backward) {
      add({.name = "attention: " + what,
           .cls = OpClass::attention,
           .phase = phase,
           .place = OpPlace::layers,
           .count = times,
           .flop = flop,
           .seconds = flop / (peak_ * attention_fraction(gpu_, head_dim, backward) *
                              attention_length_factor(seq))});
    };
    op("forward", OpPhase::forward, count, fwd, false);
    op("forward (recomputed)", OpPhase::backward, recomputed, fwd, false);
    op("backward", OpPhase::backward, count, 2 * fwd, true);
  }
  // A pass that moves `bytes` (read plus written) over rows x width elements.
  void pass(const std::string& name, OpClass cls, OpPhase phase, OpPlace place, double count,
            double bytes, int64_t rows, int64_t width) {
    add({.name = name,
         .cls = cls,
         .phase = phase,
         .place = place,
         .count = count,
         .bytes = bytes,
         .seconds = bytes / stream_,
         .m = rows,
         .n = width});
  }
  std::vector<StepOp> take() { return std::move(ops_); }

 private:
  void add(StepOp op) {
    if (op.count > 0) ops_.push_back(std::move(op));
  }
  const GpuSpec& gpu_;
  double gemm_rate_, peak_, stream_;
  std::vector<StepOp> ops_;
};

}  // namespace

std::vector<StepOp> stage_ops(const Config& cfg, const RunLayout& layout, const GpuSpec& gpu,
                              int stage, double params_on_rank, double attention_span) {
  const Topology& topo = layout.topo;
  OpList ops(gpu);
  const double mb = static_cast<double>(layout.micro_batches);
  const int64_t seq = cfg.data.seq_len;
  const int64_t T = cfg.train.micro_batch * seq / topo.cp;  // tokens of a micro-batch here
  // Outside the tensor-parallel regions (norms, residual stream) a rank holds T / tp tokens
  // under sequence parallelism.
  const int64_t Ts = layout.sequence_parallel ? T / topo.tp : T;
  const double passes = static_cast<double>(layout.recompute_passes());
  const ModelDims d = ModelDims::from(cfg, layout.of_rank(topo.rank_at(0, 0, stage)).topo);
  const int64_t H = d.hidden, I = d.inter, A = d.heads * d.head_dim;
  const int64_t R = (d.heads + d.kv_heads) * d.head_dim;  // RoPE's heads
  const double L = static_cast<double>(d.layers);
  const double full = static_cast<double>(std::min(d.recompute_full, d.layers));
  const double each = mb * L, again = mb * full * passes;  // per step: layers, recomputed ones
  const double t = static_cast<double>(T), ts = static_cast<double>(Ts);
  // Per layer and micro-batch: the four projections (gate and up as one), attention, and the
  // memory-bound passes (forward and backward elements read plus written).
  ops.projection("qkv projection", OpPlace::layers, each, again, T, d.qkv_out(), H,
                 OpPhase::backward, /*column_parallel=*/true);
  ops.projection("attention output projection", OpPlace::layers, each, again, T, H, A);
  ops.projection("gate and up projection", OpPlace::layers, each, again, T, 2 * I, H,
                 OpPhase::backward, /*column_parallel=*/true);
  ops.projection("down projection", OpPlace::layers, each, again, T, H, I);
  const double span = attention_span > 0 ? attention_span : static_cast<double>(seq);
  ops.attention(each, again, t, span, static_cast<double>(A), d.head_dim);
  const OpClass mem = OpClass::memory;
  const OpPhase fwd = OpPhase::forward, bwd = OpPhase::backward;
  const OpPlace layers = OpPlace::layers;
  const double h = static_cast<double>(H), r = static_cast<double>(R), i = static_cast<double>(I);
  const double selective = d.recompute_selective ? mb * L * passes : 0;
  ops.pass("rmsnorm: forward", mem, fwd, layers, 2 * each, 2 * h * ts * kBf16, Ts, H);
  ops.pass("rmsnorm: forward (recomputed)", mem, bwd, layers, 2 * (again + selective),
           2 * h * ts * kBf16, Ts, H);
  ops.pass("residual add: forward", mem, fwd, layers, 2 * each, 3 * h * ts * kBf16, Ts, H);
  ops.pass("residual add: forward (recomputed)", mem, bwd, layers, 2 * again, 3 * h * ts * kBf16,
           Ts, H);
  ops.pass("rope: forward", mem, fwd, layers, each, 2 * r * t * kBf16, T, R);
  ops.pass("rope: forward (recomputed)", mem, bwd, layers, again, 2 * r * t * kBf16, T, R);
  ops.pass("swiglu: forward", mem, fwd, layers, each, 3 * i * t * kBf16, T, I);
  ops.pass("swiglu: forward (recomputed)", mem, bwd, layers, again + selective, 3 * i * t * kBf16,
           T, I);
  ops.pass("rmsnorm: backward", mem, bwd, layers, 2 * each, 3 * h * ts * kBf16, Ts, H);
  ops.pass("residual add: backward", mem, bwd, layers, 2 * each, 3 * h * ts * kBf16, Ts, H);
  ops.pass("rope: backward", mem, bwd, layers, each, 2 * r * t * kBf16, T, R);
  ops.pass("swiglu: backward", mem, bwd, layers, each, 5 * i * t * kBf16, T, I);
  if (d.qk_norm) {  // qwen3: q and k split out of the qkv rows, normed per head, joined back
    const double q = static_cast<double>(d.qkv_out());
    ops.pass("qk-norm: forward", mem, fwd, layers, each + again, (4 * q + 2 * r) * t * kBf16, T, R);
    ops.pass("qk-norm: backward", mem, bwd, layers, each, (4 * q + 3 * r) * t * kBf16, T, R);
  }
  if (d.first_stage) {  // the gather of bf16 rows; the scatter-add into fp32 rows
    ops.pass("embedding: forward", mem, fwd, OpPlace::embedding, mb, 2 * h * t * kBf16, T, H);
    ops.pass("embedding: backward", mem, bwd, OpPlace::embedding, mb, h * t * (kBf16 + 8), T, H);
  }
  if (d.last_stage) {
    // The final norm, the LM head's three GEMMs and the cross-entropy's two reads and one write
    // of the bf16 logits, all in the forward (each loss chunk's backward runs right after it).
    const OpPlace head = OpPlace::head;
    ops.pass("final rmsnorm: forward", mem, fwd, head, mb, 2 * h * ts * kBf16, Ts, H);
    ops.pass("final rmsnorm: backward", mem, fwd, head, mb, 3 * h * ts * kBf16, Ts, H);
    ops.projection("LM head", head, mb, 0, T, d.vocab_local, H, OpPhase::forward);
    ops.pass("cross-entropy", OpClass::loss, fwd, head, mb,
             3 * static_cast<double>(d.vocab_local) * t * kBf16, T, d.vocab_local);
  }
  // AdamW over the rank's range (fp32 master, gradient, m, v read; master, m, v and the bf16
  // compute copy written: 30 bytes a parameter) and the norm's read of every gradient here.
  const double shards = layout.zero1 ? topo.dp_cp() : 1;
  const auto updated = static_cast<int64_t>(params_on_rank / shards);
  ops.pass("adamw", OpClass::optimizer, OpPhase::update, OpPlace::optimizer, 1,
           30.0 * static_cast<double>(updated), updated, 1);
  ops.pass("gradient norm", OpClass::optimizer, OpPhase::update, OpPlace::optimizer, 1,
           4.0 * params_on_rank, static_cast<int64_t>(params_on_rank), 1);
  return ops.take();
}

std::vector<StageCompute> stage_compute(const Config& cfg, const RunLayout& layout,
                                        const GpuSpec& gpu,
                                        const std::vector<double>& params_on_rank,
                                        double attention_span) {
  std::vector<StageCompute> out;
  for (int stage = 0; stage < layout.topo.pp; ++stage) {
    StageCompute c;
    c.stage = stage;
    c.layers = ModelDims::from(cfg, layout.of_rank(layout.topo.rank_at(0, 0, stage)).topo).layers;
    for (const StepOp& op : stage_ops(cfg, layout, gpu, stage,
                                      params_on_rank[static_cast<size_t>(stage)], attention_span)) {
      const double s = op.total_s();
      switch (op.cls) {
        case OpClass::gemm:
          c.gemm_s += s;
          c.gemm_flop += op.count * op.flop;
          break;
        case OpClass::attention:
          c.attention_s += s;
          break;
        case OpClass::memory:
          c.memory_s += s;
          c.memory_bytes += op.count * op.bytes;
          break;
        case OpClass::loss:
          c.loss_s += s;
          break;
        case OpClass::optimizer:
          c.optimizer_s += s;
          break;
      }
      double update = 0;  // the optimizer's place: its class's sum already
      (op.place == OpPlace::layers      ? c.layers_s
       : op.place == OpPlace::head      ? c.head_s
       : op.place == OpPlace::embedding ? c.embedding_s
                                        : update) += s;
      if (op.column_weight_grad) c.column_weight_grads.push_back(s);
      if (op.phase == OpPhase::forward) c.forward_s += s;
      if (op.phase == OpPhase::backward) c.backward_s += s;
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace tr
