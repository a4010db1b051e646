// AdamW over the model's flat buffers, global-norm clipping and the learning-rate schedules.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/core/ctx.h"
#include "kernels/core/tensor.h"
#include "trainer/config.h"
#include "trainer/model.h"

namespace tr {

// Learning rate of optimizer step `step` (1-based) of `total_steps`: linear warm-up from
// lr/warmup to lr over warmup_steps, then cosine | linear | constant | wsd towards min_lr.
double lr_at(const OptimConfig& o, int64_t total_steps, int64_t step);

class AdamW {
 public:
  AdamW(const OptimConfig& cfg, Qwen2Model& model, Ctx ctx);
  // Global L2 norm of the gradients (before clipping); clips them in place when the norm
  // exceeds grad_clip (> 0).
  double clip_grad_norm();
  // One update with learning rate `lr`; `step` is the 1-based optimizer step (bias correction).
  void update(double lr, int64_t step);
  Tensor exp_avg() const { return m_; }     // [P] Adam first moment
  Tensor exp_avg_sq() const { return v_; }  // [P] Adam second moment

 private:
  OptimConfig cfg_;
  Qwen2Model& model_;
  Ctx ctx_;
  std::unique_ptr<Arena> arena_;
  Tensor m_, v_;
};

}  // namespace tr
