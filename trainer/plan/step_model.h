// The planner's step model: what one GPU of a pipeline stage spends on a step's computation, op
// by op, from the GPU's measured ceilings (core/hardware.h: the 8192^3 bf16 GEMM rate and the
// device copy bandwidth). The ops, their shapes, FLOPs and bytes are the model's own list
// (trainer/model/op_list.h: what its kernels dispatch, checked by a test); this prices them:
//
// - GEMMs: every projection of a layer and the LM head, forward, input gradient and weight
//   gradient, each at the GEMM ceiling times gemm_shape_efficiency(gpu, M, N, K) (thin and small
//   products run below it), plus the fp32 weight gradient each micro-batch accumulates into.
// - Attention: cuDNN's flash attention, forward and backward at a fraction of the dense peak
//   that rises with head_dim (attention_fraction) and with the keys per query
//   (attention_length_factor).
// - Memory-bound passes and the loss: by the bytes each reads and writes, at the GPU's
//   stream_fraction of the copy bandwidth (16-byte loads, one pass each; the multi-tensor AdamW
//   reached 94% on an H200).
// - The optimizer (the planner's own ops): the multi-tensor AdamW's bytes per parameter of the
//   rank's range and the gradient norm's read, at the same fraction.
//
// Communication and the pipeline bubble are the planner's (plan.cpp); this is the compute they
// are added to. The efficiencies are the GPU's (core/hardware.h), leads until a GPU run
// measures each op class (`bench_ops --calibration`; docs/PERFORMANCE.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/hardware.h"
#include "trainer/config/config.h"
#include "trainer/layout/run_layout.h"
#include "trainer/model/op_list.h"

namespace tr {

// An M x N x K bf16 GEMM's rate on `gpu` relative to 8192^3's (the ceiling preflight measures):
// each dimension d costs d / (d + gpu.gemm_fill) of it (tiles and waves left partly empty),
// normalised so that 8192^3 gives 1.
double gemm_shape_efficiency(const GpuSpec& gpu, double m, double n, double k);

// Flash attention's rate on `gpu` as a fraction of the dense bf16 peak, forward or backward, by
// head_dim, at 4096 keys per query: the GPU's fractions at 64 and 128 (at or below 64, at or
// above 128), linear between.
double attention_fraction(const GpuSpec& gpu, int64_t head_dim, bool backward);
// The anchor whose fractions attention at `head_dim` runs at, as the GPU table's keys name it:
// "hd64" (64 or below), "hd128" (128 or above); nullptr between them (interpolated).
const char* attention_anchor(int64_t head_dim);

// How attention's rate follows the keys per query (a sequence's length, or its documents'
// span): s / (s + 128) against 4096's, as if each query tile paid for one more tile of 128 keys
// (the causal diagonal's half-empty tile, the softmax's epilogue). cuDNN's forward on an H100
// (the FlashAttention-3 paper's benchmark, head_dim 64 and 128) runs at 0.82 of its 4k rate at
// 512 keys, 0.91-0.94 at 1k, 0.97-1.01 at 2k and 0.98-1.01 at 8k and 16k; this gives 0.83,
// 0.92, 0.97, 1.015 and 1.02.
double attention_length_factor(double keys);

// One op of a stage's step as the model lists it (trainer/model/op_list.h) and the planner prices
// it, and the shape a benchmark runs it at (tools/bench_ops).
struct StepOp {
  std::string name;    // "qkv projection: forward", "attention: backward", "swiglu: backward", ...
  std::string kernel;  // the kernels/ops.h entry point that runs it ("linear_bwd.din": its part)
  OpClass cls = OpClass::gemm;
  OpPhase phase = OpPhase::forward;
  OpPlace place = OpPlace::layers;
  double count = 0;            // times per step on one GPU of the stage
  double flop = 0, bytes = 0;  // once: FLOPs computed (GEMMs, attention), bytes moved
  double seconds = 0;          // once, predicted
  // The shape as the op list keys it (kernels/op_log.h): GEMMs the product M x N x K it runs
  // (a weight gradient's K the tokens summed over); attention tokens x width x keys of a
  // sequence; element-wise ops rows x width.
  int64_t m = 0, n = 0, k = 0;
  // The weight gradient of a column-parallel layer of the body (QKV, gate and up): with
  // parallel.overlap_tp the TP reduction of the layer's input gradient runs beside it.
  bool column_weight_grad = false;
  CollectiveSpec comm = {};  // a collective's group, kind and lane (OpClass::communication)
  // Over the rows the routing sends a rank (expert parallelism; ModelOp::routed): priced for the
  // busiest rank, kExpertImbalance times the mean.
  bool routed = false;
  double total_s() const { return count * seconds; }
};

// Under expert parallelism, the busiest rank's routed rows over the mean (every rank's experts
// receive as many on average as it routes): what the step waits for, since every exchange waits
// for its slowest rank. An assumption until measured: the trainer logs moe_imbalance, the busiest
// expert's tokens over the mean, which bounds a rank's (ep ranks average num_experts / ep
// experts' loads).
inline constexpr double kExpertImbalance = 1.2;

// The ops of one GPU of pipeline stage `stage` in a step of `cfg` under `layout` on `gpu`, with
// `params_on_rank` parameters on that GPU (its fp32 gradients); attention over `attention_span`
// keys per query on average (Plan::attention_span; 0: seq_len).
std::vector<StepOp> stage_ops(const Config& cfg, const RunLayout& layout, const GpuSpec& gpu,
                              int stage, double params_on_rank, double attention_span = 0);

// One stage's step compute on one of its GPUs, in seconds per step, by op class: stage_ops
// summed.
struct StageCompute {
  int stage = 0;
  double gemm_s = 0, attention_s = 0, memory_s = 0, loss_s = 0, optimizer_s = 0;
  // The same by where it runs: the stage's transformer layers (GEMMs, attention, their
  // memory-bound passes, recomputation included), the LM head's GEMMs with the loss, the
  // embedding's gather and scatter. The optimizer is apart.
  double layers_s = 0, head_s = 0, embedding_s = 0;
  int64_t layers = 0;
  double gemm_flop = 0, memory_bytes = 0;  // what the GEMMs compute and the passes move
  // The micro-batches' work split into forward (the LM head's whole loss chunk included: its
  // backward runs inside the forward) and backward, for what each can hide.
  double forward_s = 0, backward_s = 0;
  // Of the GEMMs: each column-parallel layer's weight gradients per step (QKV's, gate/up's:
  // StepOp::column_weight_grad), what its input gradient's TP reduction runs beside.
  std::vector<double> column_weight_grads;
  // The collectives the stage's model starts on its TP and CP groups (the op list's
  // communication ops, unpriced: plan.cpp times them on the links the groups span).
  std::vector<StepOp> collectives;
  // The work of the micro-batches (what the pipeline schedule runs and the bubble stretches).
  double pipelined_s() const { return gemm_s + attention_s + memory_s + loss_s; }
  double total_s() const { return pipelined_s() + optimizer_s; }
};

// Each stage's compute for `cfg` under `layout` on `gpu`; `params_on_rank[s]` is the number of
// parameters a GPU of stage s holds (its fp32 gradients), from the planner's memory; attention
// as stage_ops'.
std::vector<StageCompute> stage_compute(const Config& cfg, const RunLayout& layout,
                                        const GpuSpec& gpu,
                                        const std::vector<double>& params_on_rank,
                                        double attention_span = 0);

}  // namespace tr
