// Data-parallel gradient reduction over a flat gradient buffer: buckets, their overlap with
// backward, the reduction's type, and ZeRO-1's shard ranges (Megatron's distributed optimizer:
// rank r of dp owns the r-th 1/dp of the flat buffer). The optimizer updates what this hands it:
// the whole reduced buffer, or the rank's reduced shard.
//
// Without ZeRO-1 each bucket is all-reduced in place. With it each bucket is reduced piecewise
// into the ranks whose shards hold it (together a reduce-scatter that can start during
// backward) and the owner's piece lands in shard_grads(). With a bf16 reduction each bucket is
// rounded into a bf16 staging copy, reduced there, and widened back when finish() completes it
// (the accumulation over micro-batches stays fp32 in the caller's buffer).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/core/ctx.h"
#include "kernels/core/tensor.h"
#include "parallel/comm.h"

namespace tr {

class GradReducer {
 public:
  // `total` gradient elements in a flat buffer of `capacity` (a multiple of dp under ZeRO-1;
  // the tail past `total` stays zero). `dp` may be null (one rank).
  GradReducer(Comm* dp, Ctx ctx, int64_t total, int64_t capacity, bool zero1);

  bool zero1() const { return zero1_; }
  // This rank's range of the flat buffer: its ZeRO-1 shard [shard_begin, shard_begin + size),
  // or the whole buffer [0, total) without ZeRO-1.
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_size() const { return shard_size_; }

  // Buckets of `bucket_elems` elements; with `overlap` (and more than one rank) a bucket starts
  // as soon as grads_final() has covered it; reduced in `reduce_dtype` (f32 or bf16).
  void configure(int64_t bucket_elems, bool overlap, DType reduce_dtype = DType::f32);
  bool overlaps() const { return overlap_; }
  // Bytes configure() allocates for a bf16 reduction (0 for fp32): the flat buffer in bf16 and,
  // under ZeRO-1, the shard's reduced bf16 values.
  static size_t staging_bytes(int64_t capacity, int dp, bool zero1, DType reduce_dtype);
  // Bytes of the reduced fp32 gradient shard this allocates under ZeRO-1 (0 otherwise).
  static size_t shard_bytes(int64_t capacity, int dp, bool zero1);

  // The gradients in [begin, end) of `grads` are final for this step: starts the reduction of
  // every bucket they complete. Each range is reported at most once per step.
  void grads_final(Tensor grads, int64_t begin, int64_t end);
  // Starts the buckets backward did not (in bucket order, the same on every rank), waits for
  // all, widens a bf16 reduction back to fp32. Then shard_grads() holds the summed gradients.
  void finish(Tensor grads);
  // The summed gradients of this rank's range after finish(): `grads` itself without ZeRO-1.
  Tensor shard_grads(Tensor grads) const { return zero1_ ? grad_shard_ : grads; }

  // Buckets of the last finish() that had started before it (during backward), and all of them.
  int early_buckets() const { return early_buckets_; }
  int buckets() const { return static_cast<int>(bucket_final_.size()); }

 private:
  std::pair<int64_t, int64_t> bucket_range(int64_t b) const;  // [lo, hi) of the flat buffer
  void start_bucket(Tensor grads, int64_t b);

  Comm* dp_;
  Ctx ctx_;
  int64_t total_, capacity_;
  bool zero1_;
  int64_t shard_begin_ = 0, shard_size_ = 0;
  std::unique_ptr<Arena> arena_;  // the reduced fp32 shard (ZeRO-1)
  Tensor grad_shard_;
  std::unique_ptr<Arena> lp_arena_;  // bf16 reduction: the staging copy and the reduced shard
  Tensor lp_grads_, lp_shard_;
  int64_t bucket_elems_ = int64_t{1} << 25;
  bool overlap_ = false;
  std::vector<int64_t> bucket_final_;  // final elements of each bucket this step
  std::vector<bool> bucket_started_;
  int early_buckets_ = 0;
};

}  // namespace tr
