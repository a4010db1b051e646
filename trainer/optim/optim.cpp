#include "trainer/optim/optim.h"

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

DistributedOptimizer::DistributedOptimizer(const OptimConfig& cfg, ParamBuffer& params, Ctx ctx,
                                           const OptimizerGroups& g, bool zero1,
                                           const FlatShards& shards, bool separate_masters)
    : cfg_(cfg),
      params_(params),
      ctx_(ctx),
      dp_(g.dp),
      experts_(g.experts != nullptr ? g.experts : g.dp),
      tp_(g.tp != nullptr && g.tp->size() > 1 ? g.tp : nullptr),
      pp_(g.pp != nullptr && g.pp->size() > 1 ? g.pp : nullptr),
      embed_(g.embed != nullptr && g.embed->size() > 1 ? g.embed : nullptr),
      zero1_(zero1 && shards.sharded()),
      shards_(shards) {
  const ParamLayout& layout = params.layout();
  const bool experts = layout.expert_begin < layout.capacity;
  if (shards_.regions().empty()) {  // each region whole on this rank
    shards_.add(layout.expert_begin, layout.expert_begin + 1, 1, 0);
    const int64_t rest = layout.capacity - layout.expert_begin;
    if (experts) shards_.add(rest, rest + 1, 1, 0);
  }
  TR_ASSERT(shards_.capacity() == layout.capacity &&
                shards_.regions().size() == (experts ? 2u : 1u) &&
                (!experts || shards_.regions()[1].flat == layout.expert_begin),
            "the shards must have the flat buffer's regions");
  norm_over_dp_ = zero1_ || (dp_ != nullptr && experts_->size() < dp_->size());
  const bool separate =
      DistributedOptimizer::keeps_separate_masters(params.compute_dtype(), separate_masters);
  TR_ASSERT(!separate || params.grad_dtype() == DType::f32, "separate masters are fp32");
  const bool sharded = separate && shards_.sharded();
  TR_ASSERT(!sharded || zero1_, "sharded masters are this rank's ZeRO-1 shard of the flat buffer");
  const int64_t n = state_elems();
  arena_ = std::make_unique<Arena>(
      master_bytes(layout.capacity, shards_, separate) + state_bytes(n, zero1_), ctx.device);
  masters_ = separate
                 ? arena_->alloc(DType::f32, {sharded ? shards_.shard_size() : layout.capacity})
                 : params.weights_padded();
  m_ = arena_->alloc(DType::f32, {n});
  v_ = arena_->alloc(DType::f32, {n});
  if (zero1_) grad_shard_ = arena_->alloc(DType::f32, {n});
  // A reducer per region: the dense tensors' over dp, the experts' over their replicas.
  for (size_t r = 0; r < shards_.regions().size(); ++r) {
    const FlatShards::Region& region = shards_.regions()[r];
    const int64_t lo = region.flat, hi = lo + region.shards.capacity();
    int64_t end = lo;  // the end of the region's last tensor
    for (const ParamInfo& p : layout.tensors)
      if (p.offset >= lo && p.offset < hi) end = std::max(end, p.offset + p.numel);
    reducers_.push_back(std::make_unique<GradReducer>(
        r == 0 ? dp_ : experts_, ctx, end - lo, region.shards,
        zero1_ ? grad_shard_.slice(region.shard, region.shards.shard_size()) : Tensor()));
  }
  // Pieces of at most kAdamWPieceElems elements, each inside one tensor (so one decay) and one
  // run of this rank's shard.
  std::vector<int64_t> pieces;
  for (const ParamInfo& p : layout.tensors)
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
  for (const ParamInfo& p : layout.tensors) {
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

bool DistributedOptimizer::counts_in_norm(const ParamInfo& p) const {
  if (p.tied_copy || (p.split_dim < 0 && tp_ != nullptr && tp_->rank() != 0)) return false;
  if (zero1_ || !norm_over_dp_) return true;
  const Comm* replicas = p.expert ? experts_ : dp_;
  return replicas->rank() == 0;
}

std::vector<ShardRun> DistributedOptimizer::own_runs(const ParamInfo& p) const {
  return shards_.runs(p.offset, p.offset + p.numel);
}

int64_t DistributedOptimizer::state_elems() const {
  return zero1_ ? shards_.shard_size() : params_.layout().total;
}

Tensor DistributedOptimizer::region(const Tensor& flat, size_t r) const {
  const FlatShards::Region& g = shards_.regions()[r];
  return flat.slice(g.flat, g.shards.capacity());
}

template <class F>
void DistributedOptimizer::for_regions(int64_t begin, int64_t end, F&& f) const {
  for (size_t r = 0; r < shards_.regions().size(); ++r) {
    const FlatShards::Region& g = shards_.regions()[r];
    const int64_t lo = std::max(begin, g.flat), hi = std::min(end, g.flat + g.shards.capacity());
    if (lo < hi) f(r, lo - g.flat, hi - g.flat);
  }
}

void DistributedOptimizer::weights_needed(int64_t begin, int64_t end) {
  for_regions(begin, end,
              [&](size_t r, int64_t lo, int64_t hi) { reducers_[r]->wait_weights(lo, hi); });
}

void DistributedOptimizer::grads_final(int64_t begin, int64_t end) {
  const Tensor grads = params_.grads_padded();
  for_regions(begin, end, [&](size_t r, int64_t lo, int64_t hi) {
    reducers_[r]->grads_final(region(grads, r), lo, hi);
  });
}

void DistributedOptimizer::configure_reduction(int64_t bucket_elems, bool overlap,
                                               DType reduce_dtype, bool overlap_gather) {
  for (const auto& red : reducers_)
    red->configure(bucket_elems, overlap, reduce_dtype, overlap_gather);
}

void DistributedOptimizer::finish_weights() {
  for (const auto& red : reducers_) red->finish_weights();
}

size_t DistributedOptimizer::master_bytes(int64_t capacity, const FlatShards& shards,
                                          bool separate_masters) {
  if (!separate_masters) return 0;
  return arena_bytes(DType::f32, shards.sharded() ? shards.shard_size() : capacity);
}

Tensor DistributedOptimizer::master(const ParamInfo& p) const {
  TR_ASSERT(!masters_sharded(), "master(): this rank keeps only its ZeRO-1 shard of the masters");
  return masters_.at(p.offset, {p.numel});
}

void DistributedOptimizer::refresh_compute_weights(const ParamInfo* p) {
  if (!separate_masters()) return;
  TR_ASSERT(!masters_sharded(), "refresh_compute_weights needs whole masters");
  if (p == nullptr)
    cast(ctx_, params_.weights_padded(), masters_);
  else
    cast(ctx_, params_.weight(*p), master(*p));
}

void DistributedOptimizer::compute_weights_from_masters() {
  if (!masters_sharded()) {
    refresh_compute_weights();
  } else {
    const Tensor weights = params_.weights_padded();
    for (const ShardRun& r : shards_.runs(0, params_.layout().capacity))
      cast(ctx_, weights.at(r.flat, {r.count}), masters_.at(r.shard, {r.count}));
    for (size_t r = 0; r < reducers_.size(); ++r) reducers_[r]->gather_weights(region(weights, r));
    finish_weights();
  }
  // The tied embedding's two copies as every update leaves them: the first stage's. (The last
  // stage's sharded masters of its copy may differ from the first's in summation order.)
  sync_tied_embedding();
}

std::vector<float> DistributedOptimizer::weights_to_host() const {
  const int64_t total = params_.layout().total;
  TR_ASSERT(!masters_sharded() && masters_.dtype == DType::f32,
            "weights_to_host: whole f32 masters, not " + std::string(dtype_name(masters_.dtype)));
  std::vector<float> host(static_cast<size_t>(total));
  copy_tensor(Tensor(host.data(), DType::f32, Device::cpu, {total}), masters_.slice(0, total));
  return host;
}

void DistributedOptimizer::weights_from_host(const std::vector<float>& host) {
  const int64_t total = params_.layout().total;
  TR_ASSERT(static_cast<int64_t>(host.size()) == total && masters_.dtype == DType::f32,
            "weights_from_host: " + std::to_string(host.size()) + " floats for " +
                std::to_string(total) + " f32 masters");
  float* values = const_cast<float*>(host.data());
  if (!masters_sharded()) {
    copy_tensor(masters_.slice(0, total), Tensor(values, DType::f32, Device::cpu, {total}));
    return refresh_compute_weights();
  }
  // The masters of this rank's shard (its padding tail zero), and the whole compute weights
  // converted on the host (a device has no room for whole fp32 masters beside them).
  std::vector<float> shard(static_cast<size_t>(masters_.numel()), 0.0f);
  for (const ShardRun& r : shards_.runs(0, total))
    std::copy(values + r.flat, values + r.flat + r.count, shard.begin() + r.shard);
  copy_tensor(masters_, Tensor(shard.data(), DType::f32, Device::cpu, {masters_.numel()}));
  const DType compute = params_.compute_dtype();
  std::vector<char> converted(static_cast<size_t>(total) * dtype_size(compute));
  Tensor host_copy(converted.data(), compute, Device::cpu, {total});
  Ctx cpu;
  cast(cpu, host_copy, Tensor(values, DType::f32, Device::cpu, {total}));
  copy_tensor(params_.weights(), host_copy);
}

void DistributedOptimizer::reduce_grads() {
  if (embed_ != nullptr)
    embed_->all_reduce(params_.grad(params_.layout().find("embed_tokens/weight")), ReduceOp::sum);
  for (size_t r = 0; r < reducers_.size(); ++r)
    reducers_[r]->finish(region(params_.grads_padded(), r));
}

void DistributedOptimizer::accumulate_norm(Tensor acc) const {
  Ctx ctx = ctx_;
  // One pass over the pieces table; TR_NORM_PER_TENSOR=1: a reduction per tensor.
  if (!take(Switch::norm_per_tensor))
    return accumulate_sum_squares_pieces(ctx, acc, grad_shard(), norm_pieces_, 0);
  if (!zero1_ && !norm_over_dp_ && tp_ == nullptr && pp_ == nullptr)
    return accumulate_sum_squares(ctx, acc, grad_shard());
  // Tensor by tensor (run by run of the shard) what this rank counts; what it only checks, piece
  // by piece through the table (0, or NaN when not finite).
  Tensor grads = grad_shard();
  for (const ParamInfo& p : params_.layout().tensors) {
    if (!counts_in_norm(p)) continue;
    for (const ShardRun& r : own_runs(p))
      accumulate_sum_squares(ctx, acc, grads.at(r.shard, {r.count}));
  }
  for (int64_t row : checked_rows_)
    accumulate_sum_squares_pieces(ctx, acc, grads, norm_pieces_.slice(row, 1), 0);
}

std::string DistributedOptimizer::first_non_finite() const {
  Ctx ctx = ctx_;
  const Tensor grads = grad_shard();
  for (const ParamInfo& p : params_.layout().tensors)
    for (const ShardRun& r : own_runs(p))
      if (!std::isfinite(sum_squares(ctx, grads.at(r.shard, {r.count})))) return p.name;
  return "";
}

void DistributedOptimizer::poison_first_grad() {
  float nan = std::numeric_limits<float>::quiet_NaN();
  copy_tensor(grad_shard().at(0, {1}), Tensor(&nan, DType::f32, Device::cpu, {1}));
}

double DistributedOptimizer::global_norm(double own_squares) const {
  double sq = own_squares;
  for (Comm* c : {norm_over_dp_ ? dp_ : nullptr, tp_, pp_})  // the groups this rank's squares miss
    if (c != nullptr) c->all_reduce(Tensor(&sq, DType::f64, Device::cpu, {1}), ReduceOp::sum);
  return std::sqrt(sq);
}

void DistributedOptimizer::clip(double norm) {
  clip_scale_ = cfg_.grad_clip > 0 && norm > cfg_.grad_clip
                    ? static_cast<float>(cfg_.grad_clip / norm)
                    : 1.0f;
}

double DistributedOptimizer::reduce_and_clip() {
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

void DistributedOptimizer::update(double lr, int64_t step) {
  const bool zero1 = zero1_;
  // The masters and the reduced gradients: whole (flat indices) or this rank's shard of them.
  Tensor params = masters_, grads = grad_shard(),
         compute = separate_masters() ? params_.weights_padded() : Tensor();
  const AdamWIndex index{masters_sharded(), zero1};
  const float clip_scale = std::exchange(clip_scale_, 1.0f);
  finish_weights();  // the last gather must not land on this update
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
  for (const ParamInfo& p : params_.layout().tensors) {
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
  if (zero1) {
    // The updated pieces of the weights the forward reads (the compute weights, written with
    // the update) go to every rank, bucket by bucket; the next forward waits for each bucket as
    // it reaches it.
    TR_ASSERT(masters_sharded() || !separate_masters(),
              "ZeRO-1 with whole masters beside separate compute weights");
    for (size_t r = 0; r < reducers_.size(); ++r)
      reducers_[r]->gather_weights(region(params_.weights_padded(), r));
  }
  sync_tied_embedding();
}

void DistributedOptimizer::sync_tied_embedding() {
  if (embed_ == nullptr) return;
  // The two copies took the same update up to summation order; make them bit-identical (with
  // sharded masters, the weights the two stages compute with). Its all-gather first (ZeRO-1: on
  // the last stage the tied copy's buckets come last, so the overlap with the next forward is
  // lost there).
  const ParamInfo& embed = params_.layout().find("embed_tokens/weight");
  weights_needed(embed.offset, embed.offset + embed.numel);
  if (masters_sharded()) {
    embed_->broadcast(params_.weight(embed), 0);
  } else {
    embed_->broadcast(master(embed), 0);
    refresh_compute_weights(&embed);
  }
}

}  // namespace tr
