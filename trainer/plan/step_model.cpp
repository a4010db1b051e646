#include "trainer/plan/step_model.h"

#include <algorithm>

#include "trainer/layout/flat_buffers.h"
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

namespace {

// What the ops of `ops` cost once on `gpu`: GEMMs at the GEMM ceiling times their shape's
// efficiency plus their bytes; attention at its fraction of the peak over `span` keys per query
// (the list's FLOPs are at the whole sequence's key.k); the rest by their bytes.
StepOp priced(const ModelOp& op, const GpuSpec& gpu, int64_t head_dim, double span) {
  const double stream = gpu.copy_bw * gpu.stream_fraction;
  StepOp s{.name = op.name,
           .kernel = op.key.kernel,
           .cls = op.cls,
           .phase = op.phase,
           .place = op.place,
           .count = op.count,
           .flop = op.flop,
           .bytes = op.bytes,
           .m = op.key.m,
           .n = op.key.n,
           .k = op.key.k,
           .column_weight_grad = op.column_weight_grad,
           .routed = op.routed};
  switch (op.cls) {
    case OpClass::gemm: {
      // FP8 products (train.precision: fp8) at the FP8 ceiling, the rest at bf16's.
      const double rate = is_fp8(op.precision) ? gpu.gemm_fp8_flops : gpu.gemm_flops;
      s.seconds = op.flop / (rate * gemm_shape_efficiency(gpu, static_cast<double>(op.key.m),
                                                          static_cast<double>(op.key.n),
                                                          static_cast<double>(op.key.k))) +
                  op.bytes / stream;
      break;
    }
    case OpClass::attention: {
      const double keys = span > 0 ? span : static_cast<double>(op.key.k);
      s.flop = op.flop * keys / static_cast<double>(op.key.k);
      s.seconds = s.flop / (gpu.peak_bf16_flops *
                            attention_fraction(gpu, head_dim, op.phase == OpPhase::backward) *
                            attention_length_factor(keys));
      break;
    }
    case OpClass::communication:  // on the links, not the GPU's compute (plan.cpp)
      s.comm = op.comm;
      break;
    default:
      s.seconds = op.bytes / stream;
  }
  if (op.routed)
    s.seconds *= kExpertImbalance;  // the busiest rank's rows (a collective's: plan.cpp)
  return s;
}

}  // namespace

std::vector<StepOp> stage_ops(const Config& cfg, const RunLayout& layout, const GpuSpec& gpu,
                              int stage, double params_on_rank, double attention_span) {
  const Topology& topo = layout.topo;
  const RunLayout mine = layout.of_rank(topo.rank_at(0, 0, stage));
  const ModelDims d = ModelDims::from(cfg, mine.topo);
  // The GPU's model: bf16 compute.
  const ModelOptions o = model_options(cfg, mine, Device::cuda, false, 0, /*plan_only=*/true);
  std::vector<StepOp> ops;
  for (const ModelOp& op : model_ops(d, o, layout.micro_batches))
    ops.push_back(priced(op, gpu, d.head_dim, attention_span));
  // AdamW over the rank's range (fp32 master, gradient, m, v read; master, m, v and the bf16
  // compute copy written: 30 bytes a parameter) and the norm's read of every gradient here.
  const double stream = gpu.copy_bw * gpu.stream_fraction;
  // Under ZeRO-1 its shard of every region (the experts' over their replicas).
  const auto updated =
      layout.zero1 ? dp_shards(cfg, mine.topo).shard_size() : static_cast<int64_t>(params_on_rank);
  const auto update = [&](const char* name, const char* kernel, double bytes, int64_t elems) {
    ops.push_back({.name = name,
                   .kernel = kernel,
                   .cls = OpClass::optimizer,
                   .phase = OpPhase::update,
                   .place = OpPlace::optimizer,
                   .count = 1,
                   .bytes = bytes,
                   .seconds = bytes / stream,
                   .m = elems,
                   .n = 1});
  };
  update("adamw", "adamw_update_pieces", 30.0 * static_cast<double>(updated), updated);
  update("gradient norm", "accumulate_sum_squares_pieces", 4.0 * params_on_rank,
         static_cast<int64_t>(params_on_rank));
  return ops;
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
        case OpClass::communication:  // timed on the links by the planner (plan.cpp)
          c.collectives.push_back(op);
          continue;
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
