#include "trainer/optim.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/ops.h"

namespace tr {

double lr_at(const OptimConfig& o, int64_t total_steps, int64_t step) {
  if (step <= o.warmup_steps)
    return o.lr * static_cast<double>(step) / static_cast<double>(o.warmup_steps);
  const double decay_steps =
      static_cast<double>(std::max<int64_t>(1, total_steps - o.warmup_steps));
  const double progress =
      std::clamp(static_cast<double>(step - o.warmup_steps) / decay_steps, 0.0, 1.0);
  if (o.schedule == "constant") return o.lr;
  if (o.schedule == "linear") return o.lr - (o.lr - o.min_lr) * progress;
  if (o.schedule == "wsd") {
    // Warm-up, stable at lr, then the last decay_fraction of all steps linearly to min_lr.
    const double decay =
        std::max(1.0, std::ceil(o.decay_fraction * static_cast<double>(total_steps)));
    const double start = static_cast<double>(total_steps) - decay;
    if (static_cast<double>(step) <= start) return o.lr;
    return o.lr - (o.lr - o.min_lr) * std::min(1.0, (static_cast<double>(step) - start) / decay);
  }
  return o.min_lr + (o.lr - o.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

AdamW::AdamW(const OptimConfig& cfg, Qwen2Model& model, Ctx ctx)
    : cfg_(cfg), model_(model), ctx_(ctx) {
  const int64_t n = model.layout().total;
  arena_ = std::make_unique<Arena>(2 * arena_bytes(DType::f32, n), ctx.device);
  m_ = arena_->alloc(DType::f32, {n});
  v_ = arena_->alloc(DType::f32, {n});
}

double AdamW::clip_grad_norm() {
  const double norm = std::sqrt(sum_squares(ctx_, model_.grads()));
  if (cfg_.grad_clip > 0 && norm > cfg_.grad_clip)
    scale_(ctx_, model_.grads(), static_cast<float>(cfg_.grad_clip / norm));
  return norm;
}

void AdamW::update(double lr, int64_t step) {
  for (const ParamInfo& p : model_.layout().tensors) {
    AdamWParams a{static_cast<float>(lr),
                  static_cast<float>(cfg_.beta1),
                  static_cast<float>(cfg_.beta2),
                  static_cast<float>(cfg_.eps),
                  p.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f,
                  step};
    adamw_update(ctx_, model_.param(p), model_.grad(p), m_.at(p.offset, {p.numel}),
                 v_.at(p.offset, {p.numel}), a);
  }
}

}  // namespace tr
