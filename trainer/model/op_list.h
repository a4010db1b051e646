// The model's op list: every kernel a rank's model runs in a training step, block by block, with
// the shape it runs at and the FLOPs and bytes that price it. The planner's step model
// (trainer/plan/step_model.h) and tools/bench_ops read this list instead of describing the
// forward and backward again, and a test records what the kernels actually dispatched
// (kernels/op_log.h) over every family, recomputation mode and layout and checks it equals the
// list, so the planner cannot drift from the model.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/op_log.h"
#include "trainer/model/model.h"

namespace tr {

// What prices an op: GEMM rates, attention's, memory bandwidth; the optimizer's class is the
// planner's own (its update is not the model's).
enum class OpClass { gemm, attention, memory, loss, optimizer };
const char* op_class_name(OpClass c);  // "GEMM", "attention", "memory", "loss", "optimizer"

// Where an op runs in the step: a micro-batch's forward (the LM head's whole loss chunk
// included: its backward runs inside the forward), its backward, or the update.
enum class OpPhase { forward, backward, update };

// Where an op belongs: the stage's transformer layers, the LM head with the loss, the input
// embedding, the optimizer.
enum class OpPlace { layers, head, embedding, optimizer };

// One op of a rank's step: a kernel at one shape, how often it runs and what it costs once.
struct ModelOp {
  std::string name;  // "qkv projection: forward", "attention: backward", "swiglu: backward", ...
  OpKey key;         // the kernel and its shape as Ctx::log records them (kernels/op_log.h)
  OpClass cls = OpClass::gemm;
  OpPhase phase = OpPhase::forward;
  OpPlace place = OpPlace::layers;
  double count = 0;  // times per step on this rank
  // Once: FLOPs (GEMMs; attention at its full causal span of key.k keys per query) and bytes
  // read plus written (memory-bound passes; a weight gradient's fp32 accumulation).
  double flop = 0, bytes = 0;
  // The weight gradient of a column-parallel layer of the body (QKV, gate and up): with
  // parallel.overlap_tp the TP reduction of the layer's input gradient runs beside it.
  bool column_weight_grad = false;
};

// The ops a model of `dims` built with `options` runs in a training step of `micro_batches`
// micro-batches (each chunk of its layers forward and backward once per micro-batch), bytes at
// options.dtype's size. Identical ops are merged (their counts added).
std::vector<ModelOp> model_ops(const ModelDims& dims, const ModelOptions& options,
                               int64_t micro_batches);

// Each kernel and shape of `ops` with its count per step: what an OpLog of the step holds.
std::map<OpKey, int64_t> op_counts(const std::vector<ModelOp>& ops);

// "" when `logged` equals `listed`, else each kernel and shape whose counts differ, one per line
// ("linear_fwd 64 x 96 x 32: ran 8, listed 4").
std::string op_count_difference(const std::map<OpKey, int64_t>& logged,
                                const std::map<OpKey, int64_t>& listed);

}  // namespace tr
