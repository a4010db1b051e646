// AdamW over the model's flat buffers, global-norm clipping and the learning-rate schedules.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/core/ctx.h"
#include "kernels/core/tensor.h"
#include "parallel/comm.h"
#include "trainer/config.h"
#include "trainer/model.h"

namespace tr {

// Learning rate of optimizer step `step` (1-based) of `total_steps`: linear warm-up from
// lr/warmup to lr over warmup_steps, then cosine | linear | constant | wsd towards min_lr.
double lr_at(const OptimConfig& o, int64_t total_steps, int64_t step);

// Data-parallel gradient reduction, global-norm clipping and AdamW over the model's flat
// buffers (fp32 here: on the CPU the weights are their own fp32 masters).
//
// Without ZeRO-1 every data-parallel rank holds all Adam states: gradients are all-reduced in
// buckets and each rank applies the same update. With ZeRO-1 rank r of dp keeps the states of
// its shard [r*S, (r+1)*S) of the (padded) flat buffer only: each gradient bucket is reduced
// piecewise into the ranks whose shards hold it (together, a reduce-scatter that can start
// during backward), each rank updates its shard, and the updated weights are all-gathered. The
// gradient norm counts every element exactly once in both modes, and with tensor parallelism counts
// each replicated tensor (the norms) once rather than once per TP rank, and the tied embedding once
// although the first and last pipeline stages both hold it.
class AdamW {
 public:
  // `dp` may be null (one rank). With zero1 the model's flat buffers must be padded to a
  // multiple of dp->size() (Qwen2Model's flat_multiple).
  AdamW(const OptimConfig& cfg, Qwen2Model& model, Ctx ctx, Comm* dp = nullptr, bool zero1 = false,
        Comm* tp = nullptr, Comm* pp = nullptr);
  // Data-parallel buckets of `bucket_elems` gradient elements (all-reduced, or under ZeRO-1
  // reduced piecewise into the ranks whose shards hold them); with `overlap` buckets start as
  // soon as grads_final() has covered them. With `reduce_dtype` bf16 each bucket is rounded to
  // bf16 and reduced in bf16 (half the traffic; the accumulation over micro-batches stays fp32
  // in the gradient buffer), then widened back: into a bf16 staging copy of the flat buffer.
  void configure_dp(int64_t bucket_elems, bool overlap, DType reduce_dtype = DType::f32);
  // Bytes of the staging a bf16 reduction needs beside the gradients (0 for fp32): the flat
  // buffer's `capacity` in bf16, and under ZeRO-1 the shard's reduced bf16 values.
  static size_t reduce_staging_bytes(int64_t capacity, int dp, bool zero1, DType reduce_dtype);
  bool overlaps_dp() const { return overlap_; }
  // The gradients in [begin, end) of the flat buffer are final for this step: starts the
  // all-reduce of every bucket they complete. Each range is reported at most once per step.
  void grads_final(int64_t begin, int64_t end);
  // Buckets of the last reduce_and_clip() that had started before it (during backward), and
  // all of them.
  int early_buckets() const { return early_buckets_; }
  int buckets() const { return static_cast<int>(bucket_final_.size()); }
  // The end of a step's backward, in four parts so that the training loop reads the squared
  // norm together with the loss, in its one host sync per step:
  // 1. Sums gradients over dp (starting the buckets not yet started, then waiting for all).
  void reduce_grads();
  // 2. Adds this rank's share of the squared global norm to acc (f64 [1] on ctx's device), on
  //    the device: every element counted once over the ranks (see above).
  void accumulate_norm(Tensor acc) const;
  // 3. The global L2 norm from this rank's share: summed over the groups it misses (host).
  double global_norm(double own_squares) const;
  // 4. Scales the gradients by grad_clip / norm when the norm exceeds grad_clip.
  void clip(double norm);
  // All four, reading the share itself (one host sync); returns the norm before clipping.
  double reduce_and_clip();
  // One update with learning rate `lr`; `step` is the 1-based optimizer step (bias correction).
  // With zero1 it ends by all-gathering the weights.
  void update(double lr, int64_t step);
  // This rank's Adam states: [state_elems()] floats each, covering the flat buffer's range
  // [shard_begin(), shard_begin() + state_elems()) (all of it without ZeRO-1). Checkpoints
  // read and write them in place.
  Tensor exp_avg() const { return m_; }
  Tensor exp_avg_sq() const { return v_; }
  int64_t shard_begin() const { return shard_begin_; }
  int64_t state_elems() const { return shard_size_; }  // per Adam moment, on this rank

 private:
  Tensor grad_shard() const;  // the reduced gradients of this rank's shard
  std::pair<int64_t, int64_t> bucket_range(int64_t b) const;  // [lo, hi) of the flat buffer
  void start_bucket(int64_t b);

  OptimConfig cfg_;
  Qwen2Model& model_;
  Ctx ctx_;
  Comm* dp_;
  bool zero1_;
  Comm* tp_;  // tensor-parallel group: sharded tensors' squares are summed over it
  Comm* pp_;  // pipeline group: each stage's squares are summed over it
  int64_t shard_begin_ = 0, shard_size_ = 0;  // this rank's range of the flat buffer
  std::unique_ptr<Arena> arena_;
  Tensor m_, v_;       // [shard_size] Adam first and second moments
  Tensor grad_shard_;  // [shard_size] this rank's summed gradient shard (zero1 only)
  // bf16 reduction (configure_dp): the buckets rounded to bf16, and the reduced shard (zero1).
  std::unique_ptr<Arena> lp_arena_;
  Tensor lp_grads_, lp_shard_;
  Buffer own_norm_buf_;  // reduce_and_clip's f64 accumulator
  int64_t bucket_elems_ = int64_t{1} << 25;
  bool overlap_ = false;
  std::vector<int64_t> bucket_final_;  // final elements of each bucket this step
  std::vector<bool> bucket_started_;
  int early_buckets_ = 0;
};

}  // namespace tr
