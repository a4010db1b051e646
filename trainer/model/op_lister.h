// What a step's op list is made of (trainer/model/op_list.h): each op a kernel at one shape with
// its count, FLOPs and bytes, and the builder the model's blocks list their ops with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/op_log.h"
#include "parallel/comm.h"
#include "trainer/model/layer_gemm.h"

namespace tr {

// What prices an op: GEMM rates, attention's, memory bandwidth, the links a collective crosses;
// the optimizer's class is the planner's own (its update is not the model's).
enum class OpClass { gemm, attention, memory, loss, optimizer, communication };
// "GEMM", "attention", "memory", "loss", "optimizer", "communication"
const char* op_class_name(OpClass c);

// Where an op runs in the step: a micro-batch's forward (the LM head's whole loss chunk
// included: its backward runs inside the forward), its backward, or the update.
enum class OpPhase { forward, backward, update };

// Where an op belongs: the stage's transformer layers, the LM head with the loss, the input
// embedding, the optimizer.
enum class OpPlace { layers, head, embedding, optimizer };

// A collective the model starts (OpClass::communication): on which of the rank's groups
// ("tp", "cp"), which kind, and whether it runs beside the compute (Lane::beside) or in order.
struct CollectiveSpec {
  std::string group;
  CommOp::Kind kind = CommOp::all_reduce;
  Lane lane = Lane::in_order;
};

// One op of a rank's step: a kernel at one shape, how often it runs and what it costs once.
struct ModelOp {
  std::string name;  // "qkv projection: forward", "attention: backward", "swiglu: backward", ...
  OpKey key;         // the kernel and its shape as Ctx::log records them (kernels/op_log.h)
  OpClass cls = OpClass::gemm;
  OpPhase phase = OpPhase::forward;
  OpPlace place = OpPlace::layers;
  // What it computes in: a GEMM's operands, a pass's elements (bf16 on GPUs, f32 or f64 on the
  // CPU); a precision per GEMM is what FP8 training will set.
  DType precision = DType::bf16;
  double count = 0;  // times per step on this rank
  // Once: FLOPs (GEMMs; attention at its full causal span of key.k keys per query) and bytes
  // read plus written (memory-bound passes; a weight gradient's fp32 accumulation); a
  // collective's bytes those of its buffer as keyed (an exchange's: what it sends).
  double flop = 0, bytes = 0;
  // The weight gradient of a column-parallel layer of the body (QKV, gate and up): with
  // parallel.overlap_tp the TP reduction of the layer's input gradient runs beside it.
  bool column_weight_grad = false;
  CollectiveSpec comm = {};  // a collective's (OpClass::communication)
  // Over the rows a mixture of experts' routing sends this rank (expert parallelism), keyed at
  // their mean (every routed row of a micro-batch): the busiest rank's are more.
  bool routed = false;
};

// Elements an RMSNorm backward moves per element of its input: din's pass reads dout and in and
// writes din (and reads it too when it accumulates into the residual stream's gradient), and
// dweight's column sums read dout and in again (kernels/cuda/rmsnorm.cu).
inline constexpr double kNormBwdElems = 5, kNormBwdAccumulateElems = 6;

// A list under construction: ops added with their counts, identical ones (name and key)
// merged, those run zero times left out.
class OpLister {
 public:
  // Ops computing in `dtype` (its size the bytes per activation element), the layers'
  // projections as `layers` says (FP8: each operand's cast and the FP8 product); with
  // `split_backward` a projection's input and weight gradients run in passes apart, each casting
  // the output gradient.
  explicit OpLister(DType dtype, GemmPrecision layers = {}, bool split_backward = false)
      : dtype_(dtype),
        e_(static_cast<double>(dtype_size(dtype))),
        layers_(layers),
        split_(split_backward) {}

  void add(ModelOp op);
  // A memory-bound pass over rows x width that moves `elems` elements (read plus written).
  void pass(const std::string& name, const char* kernel, OpPhase phase, OpPlace place, double count,
            int64_t rows, int64_t width, double elems, OpClass cls = OpClass::memory);
  // A projection's forward: out [m, n] = in [m, k] . W[n, k]^T.
  void linear_fwd(const std::string& name, OpPhase phase, OpPlace place, double count, int64_t m,
                  int64_t n, int64_t k);
  // Its input gradient [m, k] (`din` times) and weight gradient [n, k] (`dweight` times, summed
  // over the m tokens into the fp32 gradient: 8 bytes a weight read and written besides), and
  // with `bias` the bias's.
  void linear_bwd(const std::string& name, OpPlace place, OpPhase phase, double din, double dweight,
                  int64_t m, int64_t n, int64_t k, bool column_parallel = false, bool bias = false);
  // The experts' projections as grouped GEMMs (kernels/ops.h grouped_linear_fwd/bwd): m routed
  // rows over `groups` weights [n, k] (their rows summing to m), forward; and backward, the input
  // gradient `din` times and the weight gradients `dweight` times (each group's summed into its
  // fp32 gradient).
  void grouped_fwd(const std::string& name, OpPhase phase, double count, int64_t m, int64_t n,
                   int64_t k);
  void grouped_bwd(const std::string& name, double din, double dweight, int64_t m, int64_t n,
                   int64_t k, int64_t groups);
  // Bytes of one activation element.
  double elem_bytes() const { return e_; }
  // Causal attention of m queries over sequences of k keys, width n = heads x head_dim.
  void attention(const std::string& name, const char* kernel, OpPhase phase, double count,
                 int64_t m, int64_t n, int64_t k, bool backward);
  // With FP8 projections: a layer's weight [n, k] cast into both layouts, once a step
  // (trainer/model/layer_gemm.h keeps the codes for every product of the step).
  void weight_cast(const std::string& name, int64_t n, int64_t k);
  // A collective on `group` over a buffer of rows x width elements of `dtype` (keyed as
  // parallel/comm.h collective_key keys it).
  void collective(const std::string& name, OpPhase phase, OpPlace place, double count,
                  const std::string& group, CommOp::Kind kind, Lane lane, int64_t rows,
                  int64_t width, DType dtype);
  std::vector<ModelOp> take() { return std::move(ops_); }
  // The ops added from now on are over the routed rows (ModelOp::routed), or no longer.
  void set_routed(bool routed) { routed_ = routed; }

 private:
  // An FP8 cast of a [rows, cols] tensor into `layouts` code layouts (row-major, transposed).
  void fp8_cast(const std::string& name, OpPhase phase, double count, int64_t rows, int64_t cols,
                int layouts);

  DType dtype_;
  double e_;
  GemmPrecision layers_;
  bool split_;
  bool routed_ = false;
  std::vector<ModelOp> ops_;
};

// How a pass over a layer runs: its forward in the forward (count per step, phase forward) or
// again in the backward for recomputation (phase backward, names marked so).
struct Run {
  double count;
  OpPhase phase;
  std::string suffix;  // "" or " (recomputed)"
};

}  // namespace tr
