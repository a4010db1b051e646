#include "trainer/model/param_buffer.h"

namespace tr {

ParamBuffer::ParamBuffer(ParamLayout layout, DType compute, Device device, bool plan_only)
    : layout_(std::move(layout)), compute_(compute), device_(device) {
  arena_ = std::make_unique<Arena>(plan_only ? Arena::planner(device)
                                             : Arena(weight_bytes() + grad_bytes(), device));
  weights_ = arena_->alloc(compute_, {layout_.capacity});
  grads_ = arena_->alloc(grad_dtype(), {layout_.capacity});
}

}  // namespace tr
