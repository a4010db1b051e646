#include "trainer/model/step_io.h"

#include <cstring>

#include "kernels/ops.h"

namespace tr {

StepIO::StepIO(Ctx ctx) : ctx_(ctx), scalars_buf_(4 * sizeof(double), ctx.device) {
  scalars_ = Tensor(scalars_buf_.data(), DType::f64, ctx.device, {4});
  reset();
}

size_t StepIO::device_bytes(int64_t micro_batches, int64_t tokens, Device device, int doc_arrays) {
  const size_t scalars = 4 * sizeof(double);
  if (device == Device::cpu) return scalars;  // the ops read the host arrays
  return scalars + static_cast<size_t>((2 + doc_arrays) * micro_batches * tokens) * sizeof(int32_t);
}

void StepIO::stage(const std::vector<const int32_t*>& inputs,
                   const std::vector<const int32_t*>& targets, int64_t tokens,
                   const std::vector<const int32_t*>& doc_starts,
                   const std::vector<const int32_t*>& positions) {
  const std::pair<const std::vector<const int32_t*>*, std::vector<Tensor>*> lists[] = {
      {&inputs, &inputs_},
      {&targets, &targets_},
      {&doc_starts, &doc_starts_},
      {&positions, &positions_}};
  doc_hosts_.clear();
  size_t arrays = 0;
  for (const auto& [from, into] : lists) {
    into->clear();
    arrays += from->size();
  }
  if (ctx_.device == Device::cpu) {
    for (const auto& [from, into] : lists)
      for (const int32_t* p : *from)
        into->push_back(Tensor(const_cast<int32_t*>(p), DType::i32, Device::cpu, {tokens}));
    doc_hosts_ = doc_starts;
    return;
  }
  const size_t bytes = arrays * static_cast<size_t>(tokens) * sizeof(int32_t);
  if (dev_.bytes() < bytes) {  // grown at the first step (nothing is in flight then)
    host_ = Buffer::pinned(bytes);
    dev_ = Buffer(bytes, ctx_.device);
  }
  auto* host = static_cast<int32_t*>(host_.data());
  auto* dev = static_cast<int32_t*>(dev_.data());
  size_t i = 0;
  for (const auto& [from, into] : lists) {
    for (const int32_t* p : *from) {
      std::memcpy(host + i * tokens, p, static_cast<size_t>(tokens) * sizeof(int32_t));
      into->push_back(Tensor(dev + i * tokens, DType::i32, ctx_.device, {tokens}));
      if (into == &doc_starts_) doc_hosts_.push_back(host + i * tokens);
      ++i;
    }
  }
  const auto n = static_cast<int64_t>(arrays) * tokens;
  upload_async(ctx_, Tensor(dev, DType::i32, ctx_.device, {n}),
               Tensor(host, DType::i32, Device::cpu, {n}));
}

void StepIO::reset() {
  zero_(ctx_, scalars_);
}

StepIO::Scalars StepIO::take() {
  double v[4];
  read_f64(ctx_, scalars_, v);
  reset();
  return {v[0], v[1], v[2], v[3]};
}

double forward_backward(DecoderModel& model, const int32_t* tokens, const int32_t* targets,
                        float grad_scale, const int32_t* doc_start, const int32_t* positions) {
  TR_ASSERT(model.dims().first_stage && model.dims().last_stage,
            "forward_backward runs the whole model");
  // Each call is the last of its step (its layers' norms are summed over TP when it ends), so
  // under sequence parallelism a second call would sum them again.
  TR_ASSERT(!model.dims().sequence_parallel, "forward_backward: not under sequence parallelism");
  StepIO io(model.ctx());
  std::vector<const int32_t*> starts, at;
  if (doc_start != nullptr) starts.push_back(doc_start);
  if (positions != nullptr) at.push_back(positions);
  io.stage({tokens}, {targets}, model.tokens_per_micro_batch(), starts, at);
  model.forward_stage(0, io.inputs(0), 0, io.docs(0));
  model.stage_loss(0, io.targets(0), grad_scale, true, io.loss_sum(), io.moe_sums());
  model.backward_stage(0, io.inputs(0), /*last_of_step=*/true);
  return io.take().loss_sum;
}

}  // namespace tr
