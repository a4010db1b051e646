#include "parallel/grad_reducer.h"

#include <algorithm>
#include <string>

#include "core/check.h"
#include "kernels/ops.h"

namespace tr {

GradReducer::GradReducer(Comm* dp, Ctx ctx, int64_t total, const DpShards& shards, Tensor shard_out)
    : dp_(dp), ctx_(ctx), total_(total), zero1_(!shard_out.empty()) {
  if (zero1_) {
    TR_ASSERT(dp_ != nullptr && shards.dp() == dp_->size() && shards.rank() == dp_->rank() &&
                  shards.capacity() >= total,
              "ZeRO-1's shards must be this rank's of the dp group over the flat buffer");
    TR_ASSERT(shard_out.dtype == DType::f32 && shard_out.numel() == shards.shard_size(),
              "the reduced shard's buffer must be [shard_size] f32");
    shards_ = shards;
    grad_shard_ = shard_out;
  }
  configure(zero1_ ? shards_.bucket_elems() : bucket_elems_, false);
}

size_t GradReducer::staging_bytes(int64_t capacity, int dp, bool zero1, DType reduce_dtype) {
  if (reduce_dtype == DType::f32 || dp <= 1) return 0;
  return arena_bytes(reduce_dtype, capacity) +
         (zero1 ? arena_bytes(reduce_dtype, capacity / dp) : 0);
}

void GradReducer::configure(int64_t bucket_elems, bool overlap, DType reduce_dtype,
                            bool overlap_gather) {
  TR_ASSERT(bucket_elems > 0, "bucket size must be positive");
  TR_ASSERT(reduce_dtype == DType::f32 || reduce_dtype == DType::bf16,
            "gradients are reduced in fp32 or bf16");
  const int dp = dp_ != nullptr ? dp_->size() : 1;
  if (zero1_) {
    TR_ASSERT(DpShards::round_bucket(bucket_elems, dp) == shards_.bucket_elems(),
              "ZeRO-1's buckets are its shards' (" + std::to_string(shards_.bucket_elems()) +
                  " elements), not " + std::to_string(bucket_elems));
    bucket_elems = shards_.bucket_elems();
  }
  bucket_elems_ = bucket_elems;
  overlap_ = overlap && dp > 1;
  overlap_gather_ = overlap_gather;
  lp_arena_.reset();
  lp_grads_ = lp_shard_ = Tensor();
  const int64_t capacity = zero1_ ? shards_.capacity() : total_;
  if (const size_t bytes = staging_bytes(capacity, dp, zero1_, reduce_dtype); bytes > 0) {
    lp_arena_ = std::make_unique<Arena>(bytes, ctx_.device);
    lp_grads_ = lp_arena_->alloc(reduce_dtype, {capacity});
    if (zero1_) lp_shard_ = lp_arena_->alloc(reduce_dtype, {shards_.shard_size()});
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
  TR_ASSERT(!zero1_ || grads.numel() == shards_.capacity(),
            "ZeRO-1 reduces the padded gradient buffer ([capacity])");
  for (int64_t b = begin / bucket_elems_; b * bucket_elems_ < end; ++b) {
    const auto [lo, hi] = bucket_range(b);
    bucket_final_[b] += std::min(hi, end) - std::max(lo, begin);
    if (bucket_final_[b] == hi - lo && !bucket_started_[b]) start_bucket(grads, b);
  }
}

void GradReducer::start_bucket(Tensor grads, int64_t b) {
  // Under ZeRO-1 the whole bucket, with the zero padding past `total` in the last one.
  const auto [lo, hi] = zero1_ ? shards_.bucket(b) : bucket_range(b);
  bucket_started_[b] = true;
  Tensor g = grads, shard = grad_shard_;
  if (!lp_grads_.empty()) {  // reduced in bf16: round the bucket, reduce the copy
    cast(ctx_, lp_grads_.slice(lo, hi - lo), g.slice(lo, hi - lo));
    g = lp_grads_;
    shard = lp_shard_;
  }
  // Completed by finish()'s wait_all. ZeRO-1: the bucket's reduce-scatter, piece r of its sum
  // into rank r's shard.
  if (!zero1_)
    dp_->all_reduce_start(g.slice(lo, hi - lo), ReduceOp::sum);
  else
    dp_->reduce_scatter_start(shard.slice(shards_.shard_offset(b), shards_.piece(b)),
                              g.slice(lo, hi - lo), ReduceOp::sum);
}

void GradReducer::finish(Tensor grads) {
  TR_ASSERT(!zero1_ || grads.numel() == shards_.capacity(),
            "ZeRO-1 reduces the padded gradient buffer ([capacity])");
  if (dp_ == nullptr || dp_->size() <= 1) {
    if (zero1_) cast(ctx_, grad_shard_, grads);  // one rank's shard: a copy of the whole
    return;
  }
  // Buckets in the same order on every rank: those backward started, in its order, then the
  // rest from the front.
  early_buckets_ = 0;
  for (size_t b = 0; b < bucket_started_.size(); ++b) {
    if (bucket_started_[b])
      ++early_buckets_;
    else
      start_bucket(grads, static_cast<int64_t>(b));
  }
  dp_->wait_all();
  // wait_all completed any weight bucket still gathering too.
  std::fill(gather_ticket_.begin(), gather_ticket_.end(), Comm::kDone);
  gathering_ = 0;
  if (!lp_grads_.empty()) {  // the bf16 sums back into fp32
    if (zero1_)
      cast(ctx_, grad_shard_, lp_shard_);
    else
      cast(ctx_, grads.slice(0, total_), lp_grads_.slice(0, total_));
  }
  std::fill(bucket_final_.begin(), bucket_final_.end(), 0);
  std::fill(bucket_started_.begin(), bucket_started_.end(), false);
}

void GradReducer::gather_weights(Tensor weights) {
  if (!zero1_ || dp_->size() == 1) return;  // every rank's weights are whole already
  TR_ASSERT(weights.numel() == shards_.capacity(), "gather_weights: ZeRO-1's [capacity] weights");
  finish_weights();
  const int64_t n = shards_.buckets();
  gather_ticket_.assign(static_cast<size_t>(n), Comm::kDone);
  gathering_ = 0;
  for (int64_t b = 0; b < n; ++b) {
    const auto [lo, hi] = shards_.bucket(b);
    gather_ticket_[b] =
        dp_->all_gather_start(weights.slice(lo, hi - lo),
                              weights.slice(shards_.piece_begin(b, dp_->rank()), shards_.piece(b)));
    // A gather that completed at once (a group of one) has nothing to wait for.
    if (gather_ticket_[b] != Comm::kDone) ++gathering_;
  }
  waited_in_forward_ = 0;
  if (!overlap_gather_) finish_weights();
}

void GradReducer::wait_weights(int64_t begin, int64_t end) {
  if (gathering_ == 0 || begin >= end) return;
  const int64_t last = std::min((end - 1) / bucket_elems_, shards_.buckets() - 1);
  for (int64_t b = begin / bucket_elems_; b <= last; ++b) {
    if (gather_ticket_[b] == Comm::kDone) continue;
    dp_->wait(gather_ticket_[b]);
    gather_ticket_[b] = Comm::kDone;
    --gathering_;
    ++waited_in_forward_;
  }
}

void GradReducer::finish_weights() {
  if (gathering_ == 0) return;
  for (Comm::Ticket& t : gather_ticket_) {
    if (t == Comm::kDone) continue;
    dp_->wait(t);
    t = Comm::kDone;
  }
  gathering_ = 0;
}

}  // namespace tr
