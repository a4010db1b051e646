#include "parallel/grad_reducer.h"

#include <algorithm>

#include "kernels/core/check.h"
#include "kernels/ops.h"

namespace tr {

GradReducer::GradReducer(Comm* dp, Ctx ctx, int64_t total, int64_t capacity, bool zero1)
    : dp_(dp),
      ctx_(ctx),
      total_(total),
      capacity_(capacity),
      zero1_(zero1 && dp != nullptr && dp->size() > 1) {
  shard_size_ = total;
  if (zero1_) {
    TR_ASSERT(capacity % dp_->size() == 0, "ZeRO-1 needs flat buffers padded to a multiple of dp");
    shard_size_ = capacity / dp_->size();
    shard_begin_ = shard_size_ * dp_->rank();
    arena_ = std::make_unique<Arena>(shard_bytes(capacity, dp_->size(), true), ctx.device);
    grad_shard_ = arena_->alloc(DType::f32, {shard_size_});
  }
  configure(bucket_elems_, false);
}

size_t GradReducer::shard_bytes(int64_t capacity, int dp, bool zero1) {
  return zero1 && dp > 1 ? arena_bytes(DType::f32, capacity / dp) : 0;
}

size_t GradReducer::staging_bytes(int64_t capacity, int dp, bool zero1, DType reduce_dtype) {
  if (reduce_dtype == DType::f32 || dp <= 1) return 0;
  return arena_bytes(reduce_dtype, capacity) +
         (zero1 ? arena_bytes(reduce_dtype, capacity / dp) : 0);
}

void GradReducer::configure(int64_t bucket_elems, bool overlap, DType reduce_dtype) {
  TR_ASSERT(bucket_elems > 0, "bucket size must be positive");
  TR_ASSERT(reduce_dtype == DType::f32 || reduce_dtype == DType::bf16,
            "gradients are reduced in fp32 or bf16");
  const int dp = dp_ != nullptr ? dp_->size() : 1;
  bucket_elems_ = bucket_elems;
  overlap_ = overlap && dp > 1;
  lp_arena_.reset();
  lp_grads_ = lp_shard_ = Tensor();
  if (const size_t bytes = staging_bytes(capacity_, dp, zero1_, reduce_dtype); bytes > 0) {
    lp_arena_ = std::make_unique<Arena>(bytes, ctx_.device);
    lp_grads_ = lp_arena_->alloc(reduce_dtype, {capacity_});
    if (zero1_) lp_shard_ = lp_arena_->alloc(reduce_dtype, {shard_size_});
  }
  const int64_t n = (total_ + bucket_elems - 1) / bucket_elems;
  bucket_final_.assign(static_cast<size_t>(n), 0);
  bucket_started_.assign(static_cast<size_t>(n), false);
}

std::pair<int64_t, int64_t> GradReducer::bucket_range(int64_t b) const {
  const int64_t lo = b * bucket_elems_;
  return {lo, std::min(lo + bucket_elems_, total_)};
}

void GradReducer::grads_final(Tensor grads, int64_t begin, int64_t end) {
  if (!overlap_) return;
  for (int64_t b = begin / bucket_elems_; b * bucket_elems_ < end; ++b) {
    const auto [lo, hi] = bucket_range(b);
    bucket_final_[b] += std::min(hi, end) - std::max(lo, begin);
    if (bucket_final_[b] == hi - lo && !bucket_started_[b]) start_bucket(grads, b);
  }
}

void GradReducer::start_bucket(Tensor grads, int64_t b) {
  const auto [lo, hi] = bucket_range(b);
  bucket_started_[b] = true;
  Tensor g = grads, shard = grad_shard_;
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

void GradReducer::finish(Tensor grads) {
  if (dp_ == nullptr || dp_->size() <= 1) return;
  // Buckets in the same order on every rank: those backward started, in its order, then the
  // rest from the front. Under ZeRO-1 the padding tail of the last shard is never written and
  // stays zero.
  early_buckets_ = 0;
  for (size_t b = 0; b < bucket_started_.size(); ++b) {
    if (bucket_started_[b])
      ++early_buckets_;
    else
      start_bucket(grads, static_cast<int64_t>(b));
  }
  dp_->wait_all();
  if (!lp_grads_.empty()) {  // the bf16 sums back into fp32
    if (zero1_)
      cast(ctx_, grad_shard_, lp_shard_);
    else
      cast(ctx_, grads.slice(0, total_), lp_grads_.slice(0, total_));
  }
  std::fill(bucket_final_.begin(), bucket_final_.end(), 0);
  std::fill(bucket_started_.begin(), bucket_started_.end(), false);
}

}  // namespace tr
