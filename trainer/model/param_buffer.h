// One rank's parameters as the model computes with them (Megatron's param-and-grad buffer): the
// flat weights the ops read, in the compute dtype, and the flat gradients the backward
// accumulates into (fp32 under bf16 compute), both [capacity] and laid out by ParamLayout, so that
// data-parallel buckets, ZeRO-1's shards and checkpoint I/O each see one contiguous range. The
// fp32 master weights, Adam's moments, the data-parallel reduction and the update are the
// distributed optimizer's (trainer/optim/optim.h); the model reads weight views and writes gradient
// views.
#pragma once

#include <cstdint>
#include <memory>

#include "core/tensor.h"
#include "trainer/model/model_layout.h"

namespace tr {

class ParamBuffer {
 public:
  // `plan_only`: allocate nothing, only measure (the planner sizes a 72B rank on a laptop).
  ParamBuffer(ParamLayout layout, DType compute, Device device, bool plan_only = false);

  // The gradients' (and the masters') dtype for a compute dtype: f32 under bf16, else the same.
  static DType grad_dtype(DType compute) { return compute == DType::bf16 ? DType::f32 : compute; }

  const ParamLayout& layout() const { return layout_; }
  DType compute_dtype() const { return compute_; }
  DType grad_dtype() const { return grad_dtype(compute_); }
  Device device() const { return device_; }

  Tensor weights() const { return weights_.slice(0, layout_.total); }  // [P], compute dtype
  Tensor weights_padded() const { return weights_; }                   // [capacity]: P, padding
  Tensor weight(const ParamInfo& p) const { return weights_.at(p.offset, {p.numel}); }
  Tensor grads() const { return grads_.slice(0, layout_.total); }  // [P]
  Tensor grads_padded() const { return grads_; }                   // [capacity]: P, padding
  Tensor grad(const ParamInfo& p) const { return grads_.at(p.offset, {p.numel}); }

  // Bytes of each, by the arena's own accounting (alignment included).
  size_t weight_bytes() const { return arena_bytes(compute_, layout_.capacity); }
  size_t grad_bytes() const { return arena_bytes(grad_dtype(), layout_.capacity); }

 private:
  ParamLayout layout_;
  DType compute_;
  Device device_;
  std::unique_ptr<Arena> arena_;
  Tensor weights_, grads_;
};

// What a model reports about its flat buffer as it runs, to one subscriber (the distributed
// optimizer: ZeRO-1's weight all-gather and the data-parallel gradient buckets).
class ParamEvents {
 public:
  // The forward is about to read the weights in [begin, end) of the flat buffer.
  virtual void weights_needed(int64_t begin, int64_t end) = 0;
  // The step's last backward has finished the gradients in [begin, end) (each range once).
  virtual void grads_final(int64_t begin, int64_t end) = 0;

 protected:
  ~ParamEvents() = default;
};

}  // namespace tr
