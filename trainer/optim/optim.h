// The optimizer room (it uses the config and model rooms): the distributed optimizer (fp32 masters,
// AdamW, the data-parallel reduction, clipping) over a ParamBuffer, and the learning-rate
// schedules.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/ctx.h"
#include "core/tensor.h"
#include "parallel/comm.h"
#include "parallel/grad_reducer.h"
#include "trainer/config/config.h"
#include "trainer/model/param_buffer.h"

namespace tr {

// Learning rate of optimizer step `step` (1-based) of `total_steps`: linear warm-up from
// lr/warmup to lr over warmup_steps, then cosine | linear | constant | wsd towards min_lr.
double lr_at(const OptimConfig& o, int64_t total_steps, int64_t step);

// The data-parallel gradient reduction's type: parallel.grad_reduce_dtype as a DType.
inline DType grad_reduce_dtype(const ParallelConfig& p) {
  return p.grad_reduce_dtype == "bf16" ? DType::bf16 : DType::f32;
}

// The groups a rank's optimizer works over; null (or of size 1) = none.
struct OptimizerGroups {
  Comm* dp = nullptr;  // data parallel: the gradient reduction, ZeRO-1's shards
  // The replicas of this rank's experts (parallel.ep > 1: Topology::edp; null: dp): the expert
  // region's reduction and shards.
  Comm* experts = nullptr;
  Comm* tp = nullptr;  // tensor parallel: sharded tensors' squares are summed over it
  Comm* pp = nullptr;  // pipeline: each stage's squares are summed over it
  // The first and last pipeline stages when they both hold the tied embedding (pp > 1;
  // RunLayout::tied_embedding_copies): its gradients are summed over it and its weights made
  // bit-identical after each update. Null on every other rank.
  Comm* embed = nullptr;
};

// A rank's weights as the memory breakdown shows them: the masters, and the compute copy beside
// them (0 where the buffer's weights are the masters). `master_bytes`: the optimizer's
// (DistributedOptimizer::master_bytes), 0 without separate masters.
struct WeightMemory {
  size_t masters = 0, compute_copy = 0;
};
inline WeightMemory weight_memory(const ParamBuffer& params, size_t master_bytes) {
  if (master_bytes == 0) return {params.weight_bytes(), 0};
  return {master_bytes, params.weight_bytes()};
}

// Megatron's distributed optimizer over a ParamBuffer: the fp32 master weights (whole, or this
// rank's ZeRO-1 shard), Adam's moments, the data-parallel gradient reduction (a GradReducer per
// region of the flat buffer: buckets, overlap, the reduction's type, ZeRO-1's shards),
// global-norm clipping, the update, which writes the compute weights in the same pass, and
// ZeRO-1's weight all-gather. The dense region reduces over dp, the expert region over the
// experts' replicas (ParamLayout; with expert parallelism fewer ranks than dp).
//
// Without ZeRO-1 every data-parallel rank holds all Adam states and applies the same update to
// the all-reduced gradients. With ZeRO-1 rank r of dp keeps the states (and, with separate
// masters, the fp32 masters) of its shard only (piece r of every bucket of the padded flat
// buffer: parallel/dp_shards.h), updates it from its reduced gradient shard, and the updated
// weights are all-gathered bucket by bucket, overlapping the next forward. The
// gradient norm counts every element exactly once in both modes, and with tensor parallelism
// counts each replicated tensor (the norms) once rather than once per TP rank, the tied
// embedding once although the first and last pipeline stages both hold it, and with expert
// parallelism each expert once (its squares summed over dp, where each replica group of an
// expert holds it once: its ZeRO-1 shards, or without ZeRO-1 the first replica's copy).
class DistributedOptimizer final : public ParamEvents {
 public:
  // Separate masters: fp32 masters beside the buffer's compute weights (always under bf16
  // compute; on f32 ranks when `separate_masters`, to run the GPU's layout on the CPU). Else
  // the buffer's weights are the masters. With zero1 the buffer must be padded to a multiple of
  // DpShards::capacity_multiple(dp) and `shards` be this rank's (trainer/layout/flat_buffers.h
  // dp_shards); without them (no region) each region of the buffer is whole on this rank.
  DistributedOptimizer(const OptimConfig& cfg, ParamBuffer& params, Ctx ctx,
                       const OptimizerGroups& groups = {}, bool zero1 = false,
                       const FlatShards& shards = FlatShards(), bool separate_masters = false);
  // The data-parallel reduction of each region: GradReducer::configure, and what the last
  // step's reduction did.
  void configure_reduction(int64_t bucket_elems, bool overlap, DType reduce_dtype,
                           bool overlap_gather);
  const std::vector<std::unique_ptr<GradReducer>>& reducers() const { return reducers_; }
  // This rank's shard of the flat buffer (every region's).
  const FlatShards& shards() const { return shards_; }
  // Completes every ZeRO-1 weight bucket still gathering.
  void finish_weights();

  // The model's reports (set once: DecoderModel::set_param_events): ZeRO-1's forward completes
  // each bucket of the weight all-gather as it reaches it; the step's last backward starts each
  // data-parallel bucket as it completes (with parallel.overlap_dp).
  void weights_needed(int64_t begin, int64_t end) override;
  void grads_final(int64_t begin, int64_t end) override;

  // Whether a rank computing in `compute` keeps separate fp32 masters (`asked`: also on f32).
  static bool keeps_separate_masters(DType compute, bool asked) {
    return asked || compute != ParamBuffer::grad_dtype(compute);
  }
  // Bytes of fp32 masters a rank keeps beside its compute weights: 0 without separate masters,
  // else those of its ZeRO-1 shard (`shards` split over more than one rank) or of the whole
  // buffer.
  static size_t master_bytes(int64_t capacity, const FlatShards& shards, bool separate_masters);
  size_t master_bytes() const {
    return separate_masters() ? arena_bytes(DType::f32, masters_.numel()) : 0;
  }
  // Bytes of Adam's m and v for the `elems` elements a rank updates (state_elems(): its shard's
  // under ZeRO-1, else the buffer's total), and under ZeRO-1 its reduced gradient shard.
  static size_t state_bytes(int64_t elems, bool zero1) {
    return (zero1 ? 3 : 2) * arena_bytes(DType::f32, elems);
  }

  // The fp32 masters this rank keeps: [capacity], or its ZeRO-1 shard of it (in the shard's
  // order; shards()). The buffer's weights when they are their own masters.
  Tensor masters() const { return masters_; }
  bool masters_sharded() const { return masters_.numel() < params_.layout().capacity; }
  bool separate_masters() const { return masters_.data != params_.weights_padded().data; }
  // View of tensor p in whole masters (not sharded).
  Tensor master(const ParamInfo& p) const;
  // The whole masters on the host (a copy when they live on a device; not sharded).
  std::vector<float> weights_to_host() const;
  // The compute weights from the masters, after the masters (and the moments) were set in place
  // (a local checkpoint's load): cast where they are separate; from ZeRO-1's sharded masters
  // each rank casts its shard and the pieces are all-gathered; then the tied embedding's copies
  // are made equal as after an update. Collective over the dp and embed groups.
  void compute_weights_from_masters();
  // Sets the weights from all of this rank's values on the host ([P] f32: initialisation, a
  // checkpoint or a Hugging Face load): the masters it keeps and the whole compute weights.
  void weights_from_host(const std::vector<float>& host);

  // The end of a step's backward, in four parts so that the training loop reads the squared
  // norm together with the loss, in its one host sync per step:
  // 1. Sums the tied embedding's two copies over the embed group (pp > 1), then the gradients
  //    over dp (GradReducer::finish).
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
  // weights; with the tied embedding on two stages, by making its copies bit-identical.
  void update(double lr, int64_t step);
  // This rank's Adam states: [state_elems()] floats each, in its shard's order
  // (shards(); the whole flat buffer without ZeRO-1). Checkpoints read and write them in place.
  Tensor exp_avg() const { return m_; }
  Tensor exp_avg_sq() const { return v_; }
  int64_t state_elems() const;  // per Adam moment, on this rank

 private:
  // The reduced gradients this rank updates: its ZeRO-1 shard, or the whole flat buffer.
  Tensor grad_shard() const { return zero1_ ? grad_shard_ : params_.grads_padded(); }
  // Region r's part of a [capacity] flat buffer (the weights or the gradients).
  Tensor region(const Tensor& flat, size_t r) const;
  // Calls f(r, begin, end) for each region r that [begin, end) of the flat buffer overlaps,
  // with that part in the region's own indices.
  template <class F>
  void for_regions(int64_t begin, int64_t end, F&& f) const;
  // Rewrites the compute weights from whole masters (after a broadcast changed them): all of
  // them, or only tensor `p`.
  void refresh_compute_weights(const ParamInfo* p = nullptr);
  // The tied embedding's two copies (first and last stage) bit-identical after the update.
  void sync_tied_embedding();
  // Tensor p's elements in this rank's shard (all of it, one run, without ZeRO-1).
  std::vector<ShardRun> own_runs(const ParamInfo& p) const;
  // Whether this rank's share of the norm counts tensor p's gradients, so that every element is
  // counted once over the ranks: a replicated tensor on TP rank 0 only, the tied copy nowhere,
  // and where the squares are summed over dp without ZeRO-1, the first replica's copy only.
  bool counts_in_norm(const ParamInfo& p) const;

  OptimConfig cfg_;
  ParamBuffer& params_;
  Ctx ctx_;
  Comm* dp_;
  Comm* experts_;  // the expert region's replicas (dp without expert parallelism)
  Comm* tp_;       // tensor-parallel group: sharded tensors' squares are summed over it
  Comm* pp_;       // pipeline group: each stage's squares are summed over it
  Comm* embed_;    // the tied embedding's two stages, or null
  bool zero1_;
  // The squares are summed over dp: with ZeRO-1 (each replica counts its shard), or when the
  // experts' replicas are fewer than dp's (each counts on the first replica of its group).
  bool norm_over_dp_;
  FlatShards shards_;
  std::unique_ptr<Arena> arena_;
  Tensor grad_shard_;  // ZeRO-1: the reduced gradients of this rank's shard, every region's
  std::vector<std::unique_ptr<GradReducer>> reducers_;  // one per region of shards_
  Tensor masters_;                                      // see masters()
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
