// AdamW over the model's flat buffers, global-norm clipping and the learning-rate schedules.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/ctx.h"
#include "core/tensor.h"
#include "parallel/comm.h"
#include "parallel/grad_reducer.h"
#include "trainer/config.h"
#include "trainer/model.h"

namespace tr {

// Learning rate of optimizer step `step` (1-based) of `total_steps`: linear warm-up from
// lr/warmup to lr over warmup_steps, then cosine | linear | constant | wsd towards min_lr.
double lr_at(const OptimConfig& o, int64_t total_steps, int64_t step);

// The data-parallel gradient reduction's type: parallel.grad_reduce_dtype as a DType.
inline DType grad_reduce_dtype(const ParallelConfig& p) {
  return p.grad_reduce_dtype == "bf16" ? DType::bf16 : DType::f32;
}

// Global-norm clipping and AdamW over the model's flat buffers, on this rank's range of them:
// the data-parallel reduction (buckets, overlap, the reduction's type, ZeRO-1's shards) is the
// GradReducer's (parallel/grad_reducer.h).
//
// Without ZeRO-1 every data-parallel rank holds all Adam states and applies the same update to
// the all-reduced gradients. With ZeRO-1 rank r of dp keeps the states (and, with a separate
// compute copy, the fp32 masters) of its shard only (piece r of every bucket of the padded flat
// buffer: parallel/dp_shards.h), updates it from its reduced gradient shard, and the updated
// weights are all-gathered bucket by bucket, overlapping the next forward. The
// gradient norm counts every element exactly once in both modes, and with tensor parallelism
// counts each replicated tensor (the norms) once rather than once per TP rank, and the tied
// embedding once although the first and last pipeline stages both hold it.
class AdamW final : public ParamEvents {
 public:
  // `dp` may be null (one rank). With zero1 the model's flat buffers must be padded to a
  // multiple of DpShards::capacity_multiple(dp->size()) (Qwen2Model's flat_multiple).
  AdamW(const OptimConfig& cfg, Qwen2Model& model, Ctx ctx, Comm* dp = nullptr, bool zero1 = false,
        Comm* tp = nullptr, Comm* pp = nullptr);
  // The data-parallel reduction: GradReducer::configure, ::grads_final over the model's
  // gradients, and what the last step's reduction did.
  GradReducer& reducer() { return reducer_; }
  const GradReducer& reducer() const { return reducer_; }
  // The model's reports (set once: Qwen2Model::set_param_events): ZeRO-1's forward completes
  // each bucket of the weight all-gather as it reaches it; the step's last backward starts each
  // data-parallel bucket as it completes (with parallel.overlap_dp).
  void weights_needed(int64_t begin, int64_t end) override { reducer_.wait_weights(begin, end); }
  void grads_final(int64_t begin, int64_t end) override {
    reducer_.grads_final(model_.grads_padded(), begin, end);
  }
  // Bytes this allocates for `capacity` parameter elements (Adam m and v of its range).
  static size_t state_bytes(int64_t capacity, int64_t total, int dp, bool zero1);

  // The end of a step's backward, in four parts so that the training loop reads the squared
  // norm together with the loss, in its one host sync per step:
  // 1. Sums gradients over dp (GradReducer::finish).
  void reduce_grads();
  // 2. Adds this rank's share of the squared global norm to acc (f64 [1] on ctx's device), on
  //    the device: every element counted once over the ranks (see above).
  void accumulate_norm(Tensor acc) const;
  // 3. The global L2 norm from this rank's share: summed over the groups it misses (host).
  double global_norm(double own_squares) const;
  // After reduce_grads: the first tensor with a non-finite reduced gradient among the elements
  // this rank updates, "" when all are finite (one reduction per tensor: for a skipped step's
  // report only).
  std::string first_non_finite() const;
  // Test hook (TR_TEST_FAULT=grad_nan): after reduce_grads, NaN into the first reduced gradient
  // element this rank updates; stream-ordered after the reduction, so no collective still
  // reading the buffer can race it.
  void poison_first_grad();
  // 4. The next update() scales the gradients by grad_clip / norm when the norm exceeds
  //    grad_clip (folded into the update: no pass of its own).
  void clip(double norm);
  // All four, reading the share itself (one host sync), and the clipping applied to the
  // gradients in place now (for tests); returns the norm before clipping.
  double reduce_and_clip();
  // One update with learning rate `lr`; `step` is the 1-based optimizer step (bias correction):
  // one multi-tensor launch over this rank's range (TR_ADAMW_PER_TENSOR=1: a double-precision
  // kernel per tensor, with clipping as a pass of its own). With zero1 it ends by all-gathering the
  // weights.
  void update(double lr, int64_t step);
  // This rank's Adam states: [state_elems()] floats each, in its shard's order
  // (reducer().shards(); the whole flat buffer without ZeRO-1). Checkpoints read and write them
  // in place.
  Tensor exp_avg() const { return m_; }
  Tensor exp_avg_sq() const { return v_; }
  int64_t state_elems() const { return reducer_.shard_size(); }  // per Adam moment, on this rank

 private:
  Tensor grad_shard() const { return reducer_.shard_grads(model_.grads_padded()); }
  // Tensor p's elements in this rank's shard (all of it, one run, without ZeRO-1).
  std::vector<ShardRun> own_runs(const ParamInfo& p) const;
  // Whether this rank's share of the norm counts tensor p's gradients, so that every element is
  // counted once over the ranks: a replicated tensor on TP rank 0 only, the tied copy nowhere.
  bool counts_in_norm(const ParamInfo& p) const;

  OptimConfig cfg_;
  Qwen2Model& model_;
  Ctx ctx_;
  Comm* dp_;
  Comm* tp_;  // tensor-parallel group: sharded tensors' squares are summed over it
  Comm* pp_;  // pipeline group: each stage's squares are summed over it
  GradReducer reducer_;
  std::unique_ptr<Arena> arena_;
  Tensor m_, v_;  // [state_elems()] Adam first and second moments
  // The multi-tensor update's pieces of this rank's range (i64 [n, 4] on the device, made once:
  // kernels/ops.h adamw_update_pieces), and the clipping factor the next update applies.
  Buffer pieces_buf_;
  Tensor pieces_;
  // The squared norm's pieces (i64 [n, 3]: every range this rank updates, and whether it counts
  // it or only checks it), made once.
  Buffer norm_pieces_buf_;
  Tensor norm_pieces_;
  std::vector<int64_t> checked_rows_;  // rows of norm_pieces_ that are checked, not counted
  float clip_scale_ = 1.0f;
  Buffer own_norm_buf_;  // reduce_and_clip's f64 accumulator
};

}  // namespace tr
