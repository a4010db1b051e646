#include "trainer/optim.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

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
      reducer_(dp, ctx, model.layout().total, model.layout().capacity, zero1) {
  TR_ASSERT(!model.masters_sharded() ||
                (reducer_.zero1() && model.masters_begin() == reducer_.shard_begin() &&
                 model.masters().numel() == reducer_.shard_size()),
            "the model's master shard must be this rank's ZeRO-1 shard");
  const int64_t n = reducer_.shard_size();
  arena_ = std::make_unique<Arena>(2 * arena_bytes(DType::f32, n), ctx.device);
  m_ = arena_->alloc(DType::f32, {n});
  v_ = arena_->alloc(DType::f32, {n});
  // Pieces of at most kAdamWPieceElems elements, each inside one tensor (so one decay).
  std::vector<int64_t> pieces;
  const int64_t begin = reducer_.shard_begin(), end = std::min(begin + n, model.layout().total);
  for (const ParamInfo& p : model.layout().tensors) {
    const int64_t lo = std::max(p.offset, begin), hi = std::min(p.offset + p.numel, end);
    for (int64_t at = lo; at < hi; at += kAdamWPieceElems)
      pieces.insert(pieces.end(), {at, std::min(kAdamWPieceElems, hi - at), p.decay ? 1 : 0});
  }
  const auto count = static_cast<int64_t>(pieces.size() / 3);
  pieces_buf_ = Buffer(std::max<size_t>(pieces.size(), 1) * sizeof(int64_t), ctx.device);
  pieces_ = Tensor(pieces_buf_.data(), DType::i64, ctx.device, {count, 3});
  copy_tensor(pieces_, Tensor(pieces.data(), DType::i64, Device::cpu, {count, 3}));
  // The norm's pieces: what this rank counts (replicated tensors on TP rank 0 only, the tied
  // copy nowhere), at most kAdamWPieceElems each.
  std::vector<int64_t> norm;
  for (const ParamInfo& p : model.layout().tensors) {
    if (p.tied_copy || (p.split_dim < 0 && tp_ != nullptr && tp_->rank() != 0)) continue;
    const int64_t lo = std::max(p.offset, begin), hi = std::min(p.offset + p.numel, end);
    for (int64_t at = lo; at < hi; at += kAdamWPieceElems)
      norm.insert(norm.end(), {at, std::min(kAdamWPieceElems, hi - at)});
  }
  const auto norm_count = static_cast<int64_t>(norm.size() / 2);
  norm_pieces_buf_ = Buffer(std::max<size_t>(norm.size(), 1) * sizeof(int64_t), ctx.device);
  norm_pieces_ = Tensor(norm_pieces_buf_.data(), DType::i64, ctx.device, {norm_count, 2});
  copy_tensor(norm_pieces_, Tensor(norm.data(), DType::i64, Device::cpu, {norm_count, 2}));
}

size_t AdamW::state_bytes(int64_t capacity, int64_t total, int dp, bool zero1) {
  return 2 * arena_bytes(DType::f32, zero1 && dp > 1 ? capacity / dp : total);
}

void AdamW::reduce_grads() {
  reducer_.finish(model_.grads());
}

void AdamW::accumulate_norm(Tensor acc) const {
  Ctx ctx = ctx_;
  const bool zero1 = reducer_.zero1();
  const int64_t shard_begin = reducer_.shard_begin(), shard_size = reducer_.shard_size();
  // One pass over the pieces table; TR_NORM_PER_TENSOR=1: a reduction per tensor, the first way.
  static const bool per_tensor = [] {
    const char* env = std::getenv("TR_NORM_PER_TENSOR");
    return env != nullptr && std::string(env) == "1";
  }();
  if (!per_tensor)
    return accumulate_sum_squares_pieces(ctx, acc, grad_shard(), norm_pieces_,
                                         zero1 ? shard_begin : 0);
  if (!zero1 && tp_ == nullptr && pp_ == nullptr)
    return accumulate_sum_squares(ctx, acc, grad_shard());
  // Tensor by tensor: replicated tensors count on TP rank 0 only, the tied copy not at all.
  const int64_t end = std::min(shard_begin + shard_size, model_.layout().total);
  Tensor grads = grad_shard();
  for (const ParamInfo& p : model_.layout().tensors) {
    const int64_t lo = std::max(p.offset, shard_begin), hi = std::min(p.offset + p.numel, end);
    if (lo >= hi || p.tied_copy || (p.split_dim < 0 && tp_ != nullptr && tp_->rank() != 0))
      continue;
    accumulate_sum_squares(ctx, acc, grads.at(zero1 ? lo - shard_begin : lo, {hi - lo}));
  }
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
  const int64_t shard_begin = reducer_.shard_begin(), shard_size = reducer_.shard_size();
  const int64_t end = std::min(shard_begin + shard_size, model_.layout().total);
  // The masters of [lo, hi) are at lo - origin: whole, or this rank's shard of them.
  Tensor params = model_.masters(), grads = grad_shard(), compute = model_.compute_copy();
  const int64_t origin = model_.masters_begin();
  const float clip_scale = std::exchange(clip_scale_, 1.0f);
  static const bool per_tensor = [] {
    const char* env = std::getenv("TR_ADAMW_PER_TENSOR");
    return env != nullptr && std::string(env) == "1";
  }();
  if (!per_tensor) {
    const AdamWParams a{static_cast<float>(lr),
                        static_cast<float>(cfg_.beta1),
                        static_cast<float>(cfg_.beta2),
                        static_cast<float>(cfg_.eps),
                        static_cast<float>(cfg_.weight_decay),
                        step};
    adamw_update_pieces(ctx_, params, grads, m_, v_, compute, pieces_,
                        AdamWBases{origin, zero1 ? shard_begin : 0, shard_begin}, a, clip_scale);
  } else if (clip_scale != 1.0f) {
    scale_(ctx_, grads, clip_scale);
  }
  for (const ParamInfo& p : model_.layout().tensors) {
    if (!per_tensor) break;
    const int64_t lo = std::max(p.offset, shard_begin), hi = std::min(p.offset + p.numel, end);
    if (lo >= hi) continue;  // tensor outside this rank's shard
    const AdamWParams a{static_cast<float>(lr),
                        static_cast<float>(cfg_.beta1),
                        static_cast<float>(cfg_.beta2),
                        static_cast<float>(cfg_.eps),
                        p.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f,
                        step};
    const int64_t at = lo - shard_begin;  // offset within the shard
    adamw_update(ctx_, params.at(lo - origin, {hi - lo}), grads.at(zero1 ? at : lo, {hi - lo}),
                 m_.at(at, {hi - lo}), v_.at(at, {hi - lo}), a,
                 compute.empty() ? Tensor() : compute.at(lo, {hi - lo}));
  }
  if (!zero1) return;
  if (model_.masters_sharded()) {
    // Megatron's distributed optimizer: the updated shard's compute copy (written with the
    // update) goes to every rank; the masters stay sharded.
    Tensor all = model_.compute_copy();
    dp_->all_gather(all, all.slice(shard_begin, shard_size));
  } else {
    Tensor all = model_.params_padded();
    dp_->all_gather(all, all.slice(shard_begin, shard_size));
    model_.refresh_compute_copy();  // the other ranks' shards arrived as masters
  }
}

}  // namespace tr
