// Data-parallel gradient reduction and, under ZeRO-1, the weight all-gather, over the model's
// flat buffers: buckets, their overlap with backward (reductions) and with the next forward
// (all-gathers), the reduction's type, and ZeRO-1's shards (parallel/dp_shards.h: Megatron's
// distributed-optimizer layout, each bucket split over the dp ranks). The optimizer updates what
// this leaves: the whole reduced buffer, or the rank's reduced shard in the optimizer's buffer.
//
// Without ZeRO-1 each bucket is all-reduced in place. With it each bucket is reduce-scattered
// (piece r of its sum to rank r; it can start during backward) into the shard buffer; after the
// update each bucket of the weights is
// all-gathered in place, and with overlap the next forward waits for each bucket only when it
// first reads weights in it. With a bf16 reduction each bucket is rounded into a bf16 staging
// copy, reduced there, and widened back when finish() completes it (the accumulation over
// micro-batches stays fp32 in the caller's buffer).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/ctx.h"
#include "core/tensor.h"
#include "parallel/comm.h"
#include "parallel/dp_shards.h"

namespace tr {

class GradReducer {
 public:
  // `total` gradient elements in a flat buffer of shards.capacity() elements (a multiple of dp
  // under ZeRO-1; the tail past `total` stays zero). `dp` may be null (one rank). With ZeRO-1 (a
  // non-empty `shard_out`: [shards.shard_size()] f32, the caller's) `shards` is this rank's
  // layout and `shard_out` receives its reduced shard, over one rank a copy of the gradients (a
  // region of a flat buffer whose other regions are sharded: trainer/optim/optim.h); without,
  // `shards` is ignored and the gradients are reduced in place.
  GradReducer(Comm* dp, Ctx ctx, int64_t total, const DpShards& shards, Tensor shard_out = {});

  // Buckets of `bucket_elems` elements (under ZeRO-1 the shards' buckets:
  // DpShards::round_bucket(bucket_elems, dp) must be their size); with `overlap` (and more than one
  // rank) a bucket starts as soon as grads_final() has covered it; reduced in `reduce_dtype` (f32
  // or bf16). With `overlap_gather`, gather_weights() leaves each bucket to the next forward.
  void configure(int64_t bucket_elems, bool overlap, DType reduce_dtype = DType::f32,
                 bool overlap_gather = true);
  bool overlaps() const { return overlap_; }
  // Bytes configure() allocates for a bf16 reduction (0 for fp32): the flat buffer in bf16 and,
  // under ZeRO-1, the shard's reduced bf16 values.
  static size_t staging_bytes(int64_t capacity, int dp, bool zero1, DType reduce_dtype);

  // The gradients in [begin, end) of `grads` ([capacity]: the padded buffer, its tail zero) are
  // final for this step: starts the reduction of every bucket they complete. Each range is
  // reported at most once per step.
  void grads_final(Tensor grads, int64_t begin, int64_t end);
  // Starts the buckets backward did not (in bucket order, the same on every rank), waits for
  // all, widens a bf16 reduction back to fp32. Then the shard buffer (ZeRO-1) or `grads`
  // ([capacity]) holds the summed gradients.
  void finish(Tensor grads);

  // ZeRO-1, after the update: each rank's updated pieces of `weights` ([capacity], the weights
  // the forward reads) to every rank, bucket by bucket in place. With overlap_gather the buckets
  // are only started here and complete in wait_weights(); without, all complete here. Nothing
  // to do without ZeRO-1 (or with one rank).
  void gather_weights(Tensor weights);
  // The weights in [begin, end) of the flat buffer are about to be read: completes the
  // gathering buckets that hold them (the forward asks before each layer).
  void wait_weights(int64_t begin, int64_t end);
  // Completes every bucket still gathering (before the weights are read as a whole).
  void finish_weights();
  // Buckets of the last gather_weights() completed by wait_weights(), and all of them.
  int buckets_waited_in_forward() const { return waited_in_forward_; }
  int weight_buckets() const { return static_cast<int>(gather_ticket_.size()); }

  // Buckets of the last finish() that had started before it (during backward), and all of them.
  int early_buckets() const { return early_buckets_; }
  int buckets() const { return static_cast<int>(bucket_final_.size()); }

 private:
  std::pair<int64_t, int64_t> bucket_range(int64_t b) const;  // [lo, hi) of [0, total)
  void start_bucket(Tensor grads, int64_t b);

  Comm* dp_;
  Ctx ctx_;
  int64_t total_;
  bool zero1_;
  DpShards shards_;
  Tensor grad_shard_;                // ZeRO-1: the caller's buffer of this rank's reduced shard
  std::unique_ptr<Arena> lp_arena_;  // bf16 reduction: the staging copy and the reduced shard
  Tensor lp_grads_, lp_shard_;
  int64_t bucket_elems_ = int64_t{1} << 25;
  bool overlap_ = false, overlap_gather_ = true;
  std::vector<int64_t> bucket_final_;  // final elements of each bucket this step
  std::vector<bool> bucket_started_;
  int early_buckets_ = 0;
  std::vector<Comm::Ticket> gather_ticket_;  // per weight bucket: its all-gather's, or kDone
  int64_t gathering_ = 0;                    // weight buckets not yet completed
  int waited_in_forward_ = 0;
};

}  // namespace tr
