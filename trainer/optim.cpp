#include "trainer/optim.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "core/switches.h"
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

AdamW::AdamW(const OptimConfig& cfg, Qwen2Model& model, Ctx ctx, Comm* dp, bool zero1, Comm* tp,
             Comm* pp)
    : cfg_(cfg),
      model_(model),
      ctx_(ctx),
      dp_(dp),
      tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr),
      pp_(pp != nullptr && pp->size() > 1 ? pp : nullptr),
      reducer_(dp, ctx, model.layout().total, model.shards(), zero1) {
  TR_ASSERT(!model.masters_sharded() ||
                (reducer_.zero1() && model.masters().numel() == reducer_.shard_size()),
            "the model's master shard must be this rank's ZeRO-1 shard");
  const int64_t n = reducer_.shard_size();
  arena_ = std::make_unique<Arena>(2 * arena_bytes(DType::f32, n), ctx.device);
  m_ = arena_->alloc(DType::f32, {n});
  v_ = arena_->alloc(DType::f32, {n});
  // Pieces of at most kAdamWPieceElems elements, each inside one tensor (so one decay) and one
  // run of this rank's shard.
  std::vector<int64_t> pieces;
  for (const ParamInfo& p : model.layout().tensors)
    for (const ShardRun& r : own_runs(p))
      for (int64_t k = 0; k < r.count; k += kAdamWPieceElems)
        pieces.insert(pieces.end(), {r.flat + k, std::min(kAdamWPieceElems, r.count - k),
                                     p.decay ? 1 : 0, r.shard + k});
  const auto count = static_cast<int64_t>(pieces.size() / 4);
  pieces_buf_ = Buffer(std::max<size_t>(pieces.size(), 1) * sizeof(int64_t), ctx.device);
  pieces_ = Tensor(pieces_buf_.data(), DType::i64, ctx.device, {count, 4});
  copy_tensor(pieces_, Tensor(pieces.data(), DType::i64, Device::cpu, {count, 4}));
  // The norm's pieces, in the reduced gradients' index space (the shard under ZeRO-1): every
  // element this rank updates, at most kAdamWPieceElems each. Counted once over the ranks
  // (replicated tensors on TP rank 0, the tied copy nowhere); the others are checked only, so a
  // NaN in any rank's copy of a replicated tensor still makes the norm NaN and skips the step.
  std::vector<int64_t> norm;
  for (const ParamInfo& p : model.layout().tensors) {
    const bool counted = counts_in_norm(p);
    for (const ShardRun& r : own_runs(p))
      for (int64_t k = 0; k < r.count; k += kAdamWPieceElems) {
        if (!counted) checked_rows_.push_back(static_cast<int64_t>(norm.size() / 3));
        norm.insert(norm.end(),
                    {r.shard + k, std::min(kAdamWPieceElems, r.count - k), counted ? 1 : 0});
      }
  }
  const auto norm_count = static_cast<int64_t>(norm.size() / 3);
  norm_pieces_buf_ = Buffer(std::max<size_t>(norm.size(), 1) * sizeof(int64_t), ctx.device);
  norm_pieces_ = Tensor(norm_pieces_buf_.data(), DType::i64, ctx.device, {norm_count, 3});
  copy_tensor(norm_pieces_, Tensor(norm.data(), DType::i64, Device::cpu, {norm_count, 3}));
}

bool AdamW::counts_in_norm(const ParamInfo& p) const {
  return !p.tied_copy && !(p.split_dim < 0 && tp_ != nullptr && tp_->rank() != 0);
}

std::vector<ShardRun> AdamW::own_runs(const ParamInfo& p) const {
  return reducer_.shards().runs(p.offset, p.offset + p.numel);
}

size_t AdamW::state_bytes(int64_t capacity, int64_t total, int dp, bool zero1) {
  return 2 * arena_bytes(DType::f32, zero1 && dp > 1 ? capacity / dp : total);
}

void AdamW::reduce_grads() {
  reducer_.finish(model_.grads_padded());
}

void AdamW::accumulate_norm(Tensor acc) const {
  Ctx ctx = ctx_;
  // One pass over the pieces table; TR_NORM_PER_TENSOR=1: a reduction per tensor.
  if (!take(Switch::norm_per_tensor))
    return accumulate_sum_squares_pieces(ctx, acc, grad_shard(), norm_pieces_, 0);
  if (!reducer_.zero1() && tp_ == nullptr && pp_ == nullptr)
    return accumulate_sum_squares(ctx, acc, grad_shard());
  // Tensor by tensor (run by run of the shard) what this rank counts; what it only checks, piece
  // by piece through the table (0, or NaN when not finite).
  Tensor grads = grad_shard();
  for (const ParamInfo& p : model_.layout().tensors) {
    if (!counts_in_norm(p)) continue;
    for (const ShardRun& r : own_runs(p))
      accumulate_sum_squares(ctx, acc, grads.at(r.shard, {r.count}));
  }
  for (int64_t row : checked_rows_)
    accumulate_sum_squares_pieces(ctx, acc, grads, norm_pieces_.slice(row, 1), 0);
}

std::string AdamW::first_non_finite() const {
  Ctx ctx = ctx_;
  const Tensor grads = grad_shard();
  for (const ParamInfo& p : model_.layout().tensors)
    for (const ShardRun& r : own_runs(p))
      if (!std::isfinite(sum_squares(ctx, grads.at(r.shard, {r.count})))) return p.name;
  return "";
}

void AdamW::poison_first_grad() {
  float nan = std::numeric_limits<float>::quiet_NaN();
  copy_tensor(grad_shard().at(0, {1}), Tensor(&nan, DType::f32, Device::cpu, {1}));
}

double AdamW::global_norm(double own_squares) const {
  double sq = own_squares;
  for (Comm* c :
       {reducer_.zero1() ? dp_ : nullptr, tp_, pp_})  // the groups this rank's squares miss
    if (c != nullptr) c->all_reduce(Tensor(&sq, DType::f64, Device::cpu, {1}), ReduceOp::sum);
  return std::sqrt(sq);
}

void AdamW::clip(double norm) {
  clip_scale_ = cfg_.grad_clip > 0 && norm > cfg_.grad_clip
                    ? static_cast<float>(cfg_.grad_clip / norm)
                    : 1.0f;
}

double AdamW::reduce_and_clip() {
  reduce_grads();
  if (own_norm_buf_.data() == nullptr) own_norm_buf_ = Buffer(sizeof(double), ctx_.device);
  Tensor acc(own_norm_buf_.data(), DType::f64, ctx_.device, {1});
  zero_(ctx_, acc);
  accumulate_norm(acc);
  double sq = 0;
  read_f64(ctx_, acc, &sq);
  const double norm = global_norm(sq);
  clip(norm);
  if (clip_scale_ != 1.0f) scale_(ctx_, grad_shard(), clip_scale_);
  clip_scale_ = 1.0f;
  return norm;
}

void AdamW::update(double lr, int64_t step) {
  const bool zero1 = reducer_.zero1();
  // The masters and the reduced gradients: whole (flat indices) or this rank's shard of them.
  Tensor params = model_.masters(), grads = grad_shard(), compute = model_.compute_copy();
  const AdamWIndex index{model_.masters_sharded(), zero1};
  const float clip_scale = std::exchange(clip_scale_, 1.0f);
  reducer_.finish_weights();  // the last gather must not land on this update
  const bool per_tensor = take(Switch::adamw_per_tensor);
  if (!per_tensor) {
    const AdamWParams a{static_cast<float>(lr),
                        static_cast<float>(cfg_.beta1),
                        static_cast<float>(cfg_.beta2),
                        static_cast<float>(cfg_.eps),
                        static_cast<float>(cfg_.weight_decay),
                        step};
    adamw_update_pieces(ctx_, params, grads, m_, v_, compute, pieces_, index, a, clip_scale);
  } else if (clip_scale != 1.0f) {
    scale_(ctx_, grads, clip_scale);
  }
  for (const ParamInfo& p : model_.layout().tensors) {
    if (!per_tensor) break;
    const AdamWParams a{static_cast<float>(lr),
                        static_cast<float>(cfg_.beta1),
                        static_cast<float>(cfg_.beta2),
                        static_cast<float>(cfg_.eps),
                        p.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f,
                        step};
    for (const ShardRun& r : own_runs(p)) {  // none when the tensor is outside this shard
      const int64_t n = r.count;
      adamw_update(ctx_, params.at(index.param_in_shard ? r.shard : r.flat, {n}),
                   grads.at(index.grad_in_shard ? r.shard : r.flat, {n}), m_.at(r.shard, {n}),
                   v_.at(r.shard, {n}), a, compute.empty() ? Tensor() : compute.at(r.flat, {n}));
    }
  }
  if (!zero1) return;
  // Megatron's distributed optimizer: the updated pieces of the weights the forward reads (the
  // compute copy, written with the update; or the masters where they are the compute copy) go
  // to every rank, bucket by bucket; the next forward waits for each bucket as it reaches it.
  TR_ASSERT(model_.masters_sharded() || model_.compute_is_master(),
            "ZeRO-1 with whole masters beside a separate compute copy");
  reducer_.gather_weights(model_.masters_sharded() ? model_.compute_copy()
                                                   : model_.params_padded());
}

}  // namespace tr
