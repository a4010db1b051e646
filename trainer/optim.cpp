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

AdamW::AdamW(const OptimConfig& cfg, Qwen2Model& model, Ctx ctx, Comm* dp, bool zero1, Comm* tp,
             Comm* pp)
    : cfg_(cfg),
      model_(model),
      ctx_(ctx),
      dp_(dp),
      zero1_(zero1 && dp != nullptr && dp->size() > 1),
      tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr),
      pp_(pp != nullptr && pp->size() > 1 ? pp : nullptr) {
  const int64_t capacity = model.layout().capacity;
  shard_size_ = model.layout().total;
  if (zero1_) {
    TR_ASSERT(capacity % dp_->size() == 0, "ZeRO-1 needs flat buffers padded to a multiple of dp");
    shard_size_ = capacity / dp_->size();
    shard_begin_ = shard_size_ * dp_->rank();
  }
  TR_ASSERT(!model.masters_sharded() || (zero1_ && model.masters_begin() == shard_begin_ &&
                                         model.masters().numel() == shard_size_),
            "the model's master shard must be this rank's ZeRO-1 shard");
  arena_ =
      std::make_unique<Arena>((zero1_ ? 3 : 2) * arena_bytes(DType::f32, shard_size_), ctx.device);
  m_ = arena_->alloc(DType::f32, {shard_size_});
  v_ = arena_->alloc(DType::f32, {shard_size_});
  if (zero1_) grad_shard_ = arena_->alloc(DType::f32, {shard_size_});
  configure_dp(bucket_elems_, false);
}

size_t AdamW::reduce_staging_bytes(int64_t capacity, int dp, bool zero1, DType reduce_dtype) {
  if (reduce_dtype == DType::f32 || dp <= 1) return 0;
  return arena_bytes(reduce_dtype, capacity) +
         (zero1 ? arena_bytes(reduce_dtype, capacity / dp) : 0);
}

void AdamW::configure_dp(int64_t bucket_elems, bool overlap, DType reduce_dtype) {
  TR_ASSERT(bucket_elems > 0, "bucket size must be positive");
  TR_ASSERT(reduce_dtype == DType::f32 || reduce_dtype == DType::bf16,
            "gradients are reduced in fp32 or bf16");
  const int dp = dp_ != nullptr ? dp_->size() : 1;
  lp_arena_.reset();
  lp_grads_ = lp_shard_ = Tensor();
  if (const size_t bytes = reduce_staging_bytes(model_.layout().capacity, dp, zero1_, reduce_dtype);
      bytes > 0) {
    lp_arena_ = std::make_unique<Arena>(bytes, ctx_.device);
    lp_grads_ = lp_arena_->alloc(reduce_dtype, {model_.layout().capacity});
    if (zero1_) lp_shard_ = lp_arena_->alloc(reduce_dtype, {shard_size_});
  }
  bucket_elems_ = bucket_elems;
  overlap_ = overlap && dp_ != nullptr && dp_->size() > 1;
  const int64_t n = (model_.layout().total + bucket_elems - 1) / bucket_elems;
  bucket_final_.assign(static_cast<size_t>(n), 0);
  bucket_started_.assign(static_cast<size_t>(n), false);
}

void AdamW::grads_final(int64_t begin, int64_t end) {
  if (!overlap_) return;
  for (int64_t b = begin / bucket_elems_; b * bucket_elems_ < end; ++b) {
    const auto [lo, hi] = bucket_range(b);
    bucket_final_[b] += std::min(hi, end) - std::max(lo, begin);
    if (bucket_final_[b] == hi - lo && !bucket_started_[b]) start_bucket(b);
  }
}

std::pair<int64_t, int64_t> AdamW::bucket_range(int64_t b) const {
  const int64_t lo = b * bucket_elems_;
  return {lo, std::min(lo + bucket_elems_, model_.layout().total)};
}

void AdamW::start_bucket(int64_t b) {
  const auto [lo, hi] = bucket_range(b);
  Tensor g = model_.grads();
  bucket_started_[b] = true;
  Tensor shard = grad_shard_;
  if (!lp_grads_.empty()) {  // reduced in bf16: round the bucket, reduce the copy
    cast(ctx_, lp_grads_.slice(lo, hi - lo), g.slice(lo, hi - lo));
    g = lp_grads_;
    shard = lp_shard_;
  }
  if (!zero1_) return dp_->all_reduce_start(g.slice(lo, hi - lo), ReduceOp::sum);
  // ZeRO-1: each piece of the bucket is summed into the rank whose shard holds it.
  for (int64_t r = lo / shard_size_; r * shard_size_ < hi; ++r) {
    const int64_t a = std::max(lo, r * shard_size_), c = std::min(hi, (r + 1) * shard_size_);
    const Tensor out = r == dp_->rank() ? shard.slice(a - shard_begin_, c - a) : Tensor();
    dp_->reduce_start(out, g.slice(a, c - a), static_cast<int>(r), ReduceOp::sum);
  }
}

Tensor AdamW::grad_shard() const {
  return zero1_ ? grad_shard_ : model_.grads();
}

void AdamW::reduce_grads() {
  if (dp_ == nullptr || dp_->size() <= 1) return;
  // Buckets in the same order on every rank: those backward started, in its order, then the
  // rest from the front. Under ZeRO-1 each is reduced piecewise into its shards' owners (the
  // padding tail of the last shard is never written and stays zero).
  early_buckets_ = 0;
  for (size_t b = 0; b < bucket_started_.size(); ++b) {
    if (bucket_started_[b])
      ++early_buckets_;
    else
      start_bucket(static_cast<int64_t>(b));
  }
  dp_->wait_all();
  if (!lp_grads_.empty()) {  // the bf16 sums back into the fp32 buffer the update reads
    if (zero1_)
      cast(ctx_, grad_shard_, lp_shard_);
    else
      cast(ctx_, model_.grads(), lp_grads_.slice(0, model_.layout().total));
  }
  std::fill(bucket_final_.begin(), bucket_final_.end(), 0);
  std::fill(bucket_started_.begin(), bucket_started_.end(), false);
}

void AdamW::accumulate_norm(Tensor acc) const {
  Ctx ctx = ctx_;
  if (!zero1_ && tp_ == nullptr && pp_ == nullptr)
    return accumulate_sum_squares(ctx, acc, grad_shard());
  // Tensor by tensor: replicated tensors count on TP rank 0 only, the tied copy not at all.
  const int64_t end = std::min(shard_begin_ + shard_size_, model_.layout().total);
  Tensor grads = grad_shard();
  for (const ParamInfo& p : model_.layout().tensors) {
    const int64_t lo = std::max(p.offset, shard_begin_), hi = std::min(p.offset + p.numel, end);
    if (lo >= hi || p.tied_copy || (p.split_dim < 0 && tp_ != nullptr && tp_->rank() != 0))
      continue;
    accumulate_sum_squares(ctx, acc, grads.at(zero1_ ? lo - shard_begin_ : lo, {hi - lo}));
  }
}

double AdamW::global_norm(double own_squares) const {
  double sq = own_squares;
  for (Comm* c : {zero1_ ? dp_ : nullptr, tp_, pp_})  // the groups this rank's squares miss
    if (c != nullptr) c->all_reduce(Tensor(&sq, DType::f64, Device::cpu, {1}), ReduceOp::sum);
  return std::sqrt(sq);
}

void AdamW::clip(double norm) {
  if (cfg_.grad_clip > 0 && norm > cfg_.grad_clip)
    scale_(ctx_, grad_shard(), static_cast<float>(cfg_.grad_clip / norm));
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
  return norm;
}

void AdamW::update(double lr, int64_t step) {
  const int64_t end = std::min(shard_begin_ + shard_size_, model_.layout().total);
  // The masters of [lo, hi) are at lo - origin: whole, or this rank's shard of them.
  Tensor params = model_.masters(), grads = grad_shard(), compute = model_.compute_copy();
  const int64_t origin = model_.masters_begin();
  for (const ParamInfo& p : model_.layout().tensors) {
    const int64_t lo = std::max(p.offset, shard_begin_), hi = std::min(p.offset + p.numel, end);
    if (lo >= hi) continue;  // tensor outside this rank's shard
    const AdamWParams a{static_cast<float>(lr),
                        static_cast<float>(cfg_.beta1),
                        static_cast<float>(cfg_.beta2),
                        static_cast<float>(cfg_.eps),
                        p.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f,
                        step};
    const int64_t at = lo - shard_begin_;  // offset within the shard
    adamw_update(ctx_, params.at(lo - origin, {hi - lo}), grads.at(zero1_ ? at : lo, {hi - lo}),
                 m_.at(at, {hi - lo}), v_.at(at, {hi - lo}), a,
                 compute.empty() ? Tensor() : compute.at(lo, {hi - lo}));
  }
  if (!zero1_) return;
  if (model_.masters_sharded()) {
    // Megatron's distributed optimizer: the updated shard's compute copy (written with the
    // update) goes to every rank; the masters stay sharded.
    Tensor all = model_.compute_copy();
    dp_->all_gather(all, all.slice(shard_begin_, shard_size_));
  } else {
    Tensor all = model_.params_padded();
    dp_->all_gather(all, all.slice(shard_begin_, shard_size_));
    model_.refresh_compute_copy();  // the other ranks' shards arrived as masters
  }
}

}  // namespace tr
