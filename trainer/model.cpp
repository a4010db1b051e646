#include "trainer/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/switches.h"
#include "kernels/ops.h"
#include "parallel/tp_region.h"
#include "trainer/init.h"
#include "trainer/model_acts.h"

namespace tr {

Qwen2Model::Qwen2Model(const ModelDims& dims, const ModelOptions& o, Ctx ctx)
    : dims_(dims),
      batch_(o.batch),
      seq_len_(o.seq_len),
      slots_(o.slots),
      ctx_(ctx),
      dtype_(o.dtype),
      mdtype_(o.dtype == DType::bf16 ? DType::f32 : o.dtype),
      sdtype_(o.dtype == DType::f64 ? DType::f64 : DType::f32) {
  TR_ASSERT(o.slots >= 1, "at least one activation slot");
  const bool plan_only = o.plan_only;
  const int64_t loss_chunk = o.loss_chunk;
  layout_ = ParamLayout::make(dims_, o.flat_multiple);
  const bool separate = o.separate_compute_copy || dtype_ != mdtype_;
  shards_ = o.shards.dp() > 1 ? o.shards : DpShards(layout_.capacity, layout_.capacity + 1, 1, 0);
  TR_ASSERT(shards_.capacity() == layout_.capacity,
            "ZeRO-1's shards must cover the flat buffer (" + std::to_string(layout_.capacity) +
                " elements), not " + std::to_string(shards_.capacity()));
  const int64_t masters = separate ? shards_.shard_size() : layout_.capacity;
  memory_.weights = arena_bytes(mdtype_, masters);
  memory_.grads = arena_bytes(mdtype_, layout_.capacity);
  memory_.compute_copy = separate ? arena_bytes(dtype_, layout_.capacity) : 0;
  param_arena_ = std::make_unique<Arena>(
      plan_only ? Arena::planner(ctx.device)
                : Arena(memory_.weights + memory_.grads + memory_.compute_copy, ctx.device));
  params_ = param_arena_->alloc(mdtype_, {masters});
  grads_ = param_arena_->alloc(mdtype_, {layout_.capacity});
  compute_ = separate ? param_arena_->alloc(dtype_, {layout_.capacity}) : params_;
  if (!plan_only) {
    w_ = views(compute_);
    g_ = views(grads_);
    // Each layer's span of the flat gradient buffer (its tensors are contiguous there).
    const auto at = [&](const Tensor& t) {
      return (static_cast<const char*>(t.data) - static_cast<const char*>(grads_.data)) /
             static_cast<int64_t>(dtype_size(mdtype_));
    };
    for (const LayerWeights& g : g_.layers) {
      int64_t lo = layout_.total, hi = 0, n = 0;
      for (const Tensor* t : {&g.ln1, &g.qkv_w, &g.qkv_b, &g.o_w, &g.ln2, &g.gateup_w, &g.down_w}) {
        lo = std::min(lo, at(*t));
        hi = std::max(hi, at(*t) + t->numel());
        n += t->numel();
      }
      TR_ASSERT(hi - lo == n, "a layer's gradients are not contiguous in the flat buffer");
      layer_ranges_.emplace_back(lo, hi);
    }
  }

  const int64_t T = batch_ * seq_len_;
  chunk_ = loss_chunk > 0 ? std::max<int64_t>(1, std::min<int64_t>(T, loss_chunk))
                          : loss_chunk_tokens(T, dims.vocab_local, dtype_);
  // Measure the activation buffers, then allocate exactly that once.
  Arena plan = Arena::planner(ctx.device);
  alloc_acts(plan);
  memory_.activations = plan.used();
  if (plan_only) return;
  act_arena_ = std::make_unique<Arena>(plan.used(), ctx.device);
  alloc_acts(*act_arena_);
  // Attention's plans and workspace now, not in the first step.
  if (dims_.layers > 0)
    attention_ = attention_prepare(ctx_, static_cast<int>(batch_), static_cast<int>(seq_len_),
                                   static_cast<int>(dims_.heads), static_cast<int>(dims_.kv_heads),
                                   static_cast<int>(dims_.head_dim));
}

void Qwen2Model::alloc_acts(Arena& ar) {
  const ModelDims& d = dims_;
  const int64_t T = batch_ * seq_len_, H = d.hidden, Q = d.qkv_out(), A = d.heads * d.head_dim,
                I = d.inter, C = chunk_;
  const int64_t Tl = d.sequence_parallel ? T / d.tp : T;  // tokens of the residual stream here
  a_ = std::make_unique<Acts>();
  // A layer's buffers: those selective recomputation drops (the norm outputs and the SwiGLU
  // output), and those every mode but full recomputation keeps per micro-batch.
  auto recomputed = [&](Acts::Layer& L) {
    L.ln1 = ar.alloc(dtype_, {T, H});
    L.ln2 = ar.alloc(dtype_, {T, H});
    L.act = ar.alloc(dtype_, {T, I});
  };
  auto kept = [&](Acts::Layer& L) {
    L.rstd1 = ar.alloc(sdtype_, {Tl});
    L.qkv = ar.alloc(dtype_, {T, Q});
    L.att = ar.alloc(dtype_, {T, A});
    L.lse = ar.alloc(sdtype_, {batch_, d.heads, seq_len_});
    L.x_mid = ar.alloc(dtype_, {Tl, H});
    L.rstd2 = ar.alloc(sdtype_, {Tl});
    L.gateup = ar.alloc(dtype_, {T, 2 * I});
  };
  const int64_t full = std::min(d.recompute_full, d.layers);
  if (full > 0 || d.recompute_selective) recomputed(a_->rc);
  if (full > 0) kept(a_->rc);
  for (int k = 0; k < slots_; ++k) {
    Acts::Slot& slot = a_->slots.emplace_back();
    for (int64_t l = 0; l <= d.layers; ++l) slot.resid.push_back(ar.alloc(dtype_, {Tl, H}));
    for (int64_t l = 0; l < d.layers; ++l) {
      if (l < full) {  // only resid[l] is kept
        slot.layers.push_back(a_->rc);
        continue;
      }
      Acts::Layer L;
      if (d.recompute_selective) {
        L.ln1 = a_->rc.ln1;
        L.ln2 = a_->rc.ln2;
        L.act = a_->rc.act;
      } else {
        recomputed(L);
      }
      kept(L);
      slot.layers.push_back(L);
    }
    if (d.last_stage) {
      slot.lnf = ar.alloc(dtype_, {T, H});
      slot.rstdf = ar.alloc(sdtype_, {Tl});
    }
  }
  a_->tmp = ar.alloc(dtype_, {Tl, H});
  a_->dres = ar.alloc(dtype_, {Tl, H});
  a_->grad_in = ar.alloc(dtype_, {Tl, H});
  a_->dln = ar.alloc(dtype_, {Tl, H});
  a_->dlnf = ar.alloc(dtype_, {T, H});
  if (d.sequence_parallel) {  // full-sequence twins of the sharded buffers
    a_->full = ar.alloc(dtype_, {T, H});
    a_->ln_local = ar.alloc(dtype_, {Tl, H});
    a_->dlnf_local = ar.alloc(dtype_, {Tl, H});
  }
  a_->dqkv = ar.alloc(dtype_, {T, Q});
  a_->datt = ar.alloc(dtype_, {T, A});
  a_->dgateup = ar.alloc(dtype_, {T, 2 * I});
  a_->dact = ar.alloc(dtype_, {T, I});
  a_->logits = ar.alloc(dtype_, {C, d.vocab_local});
  a_->row_max = ar.alloc(sdtype_, {C});
  a_->sums = ar.alloc(sdtype_, {C, 2});
  if (d.tp > 1) {
    a_->stats = ar.alloc(sdtype_, {C, 3});
    a_->all_stats = ar.alloc(sdtype_, {d.tp * C * 3});
  }
  a_->losses = ar.alloc(sdtype_, {C});
}

void Qwen2Model::begin_step_grads() {
  if (take(Switch::grad_zero)) {
    zero_(ctx_, grads());
    head_write_ = body_write_ = GradWrite::add;
    return;
  }
  head_write_ = body_write_ = GradWrite::assign;
  if (dims_.first_stage && !(dims_.tied && dims_.last_stage)) zero_(ctx_, g_.embed);
}

Tensor Qwen2Model::params() const {
  TR_ASSERT(!masters_sharded(), "params(): this rank keeps only its ZeRO-1 shard of the masters");
  return params_.slice(0, layout_.total);
}

Tensor Qwen2Model::params_padded() const {
  TR_ASSERT(!masters_sharded(),
            "params_padded(): this rank keeps only its ZeRO-1 shard of the masters");
  return params_;
}

void Qwen2Model::refresh_compute_copy(const ParamInfo* p) {
  if (compute_is_master()) return;
  TR_ASSERT(!masters_sharded(), "refresh_compute_copy needs whole masters");
  if (p == nullptr)
    cast(ctx_, compute_, params_);
  else
    cast(ctx_, compute_.at(p->offset, {p->numel}), param(*p));
}

std::vector<float> Qwen2Model::params_to_host() const {
  std::vector<float> host(static_cast<size_t>(layout_.total));
  TR_ASSERT(mdtype_ == DType::f32,
            "params_to_host: the masters are " + std::string(dtype_name(mdtype_)) + ", not f32");
  copy_tensor(Tensor(host.data(), DType::f32, Device::cpu, {layout_.total}), params());
  return host;
}

void Qwen2Model::params_from_host(const std::vector<float>& host) {
  TR_ASSERT(static_cast<int64_t>(host.size()) == layout_.total && mdtype_ == DType::f32,
            "params_from_host: " + std::to_string(host.size()) + " floats for " +
                std::to_string(layout_.total) + " f32 masters");
  float* values = const_cast<float*>(host.data());
  if (!masters_sharded()) {
    copy_tensor(params(), Tensor(values, DType::f32, Device::cpu, {layout_.total}));
    return refresh_compute_copy();
  }
  // The masters of this rank's shard (the padding tail stays zero), and the whole compute copy
  // converted on the host (a device has no room for whole fp32 masters beside it).
  std::vector<float> shard(static_cast<size_t>(params_.numel()), 0.0f);
  for (const ShardRun& r : shards_.runs(0, layout_.total))
    std::copy(values + r.flat, values + r.flat + r.count, shard.begin() + r.shard);
  copy_tensor(params_, Tensor(shard.data(), DType::f32, Device::cpu, {params_.numel()}));
  std::vector<char> converted(static_cast<size_t>(layout_.total) * dtype_size(dtype_));
  Tensor host_copy(converted.data(), dtype_, Device::cpu, {layout_.total});
  Ctx cpu;
  cast(cpu, host_copy, Tensor(values, DType::f32, Device::cpu, {layout_.total}));
  copy_tensor(compute_.slice(0, layout_.total), host_copy);
}

Qwen2Model::~Qwen2Model() = default;

size_t Qwen2Model::activation_bytes() const {
  return act_arena_->capacity();
}

Tensor Qwen2Model::param(const ParamInfo& p) const {
  TR_ASSERT(!masters_sharded(), "param(): this rank keeps only its ZeRO-1 shard of the masters");
  return params_.at(p.offset, {p.numel});
}
Tensor Qwen2Model::compute_param(const ParamInfo& p) const {
  return compute_.at(p.offset, {p.numel});
}
Tensor Qwen2Model::grad(const ParamInfo& p) const {
  return grads_.at(p.offset, {p.numel});
}

Weights Qwen2Model::views(Tensor flat) const {
  const ModelDims& d = dims_;
  const int64_t H = d.hidden, Q = d.qkv_out();
  // Fused views (qkv, gateup) start at their first member and span the adjacent ones.
  auto at = [&](const std::string& name, std::initializer_list<int64_t> shape) {
    return flat.at(layout_.find(name).offset, shape);
  };
  Weights w;
  if (d.first_stage) w.embed = at("embed_tokens/weight", {d.vocab_local, H});
  for (int64_t i = d.first_layer; i < d.first_layer + d.layers; ++i) {
    const std::string p = absl::StrCat("layers/", i, "/");
    LayerWeights L;
    L.ln1 = at(p + "input_layernorm/weight", {H});
    L.qkv_w = at(p + "self_attn/q_proj/weight", {Q, H});
    L.qkv_b = at(p + "self_attn/q_proj/bias", {Q});
    L.o_w = at(p + "self_attn/o_proj/weight", {H, d.heads * d.head_dim});
    L.ln2 = at(p + "post_attention_layernorm/weight", {H});
    L.gateup_w = at(p + "mlp/gate_proj/weight", {2 * d.inter, H});
    L.down_w = at(p + "mlp/down_proj/weight", {H, d.inter});
    w.layers.push_back(L);
  }
  if (d.last_stage) {
    w.norm = at("norm/weight", {H});
    w.lm_head = at(d.tied ? "embed_tokens/weight" : "lm_head/weight", {d.vocab_local, H});
  }
  return w;
}

void Qwen2Model::init_weights(uint64_t seed, double std) {
  const double out_std = std / std::sqrt(2.0 * static_cast<double>(dims_.total_layers));
  // On a device (or into sharded masters) the values are made on the host and copied over once.
  const bool on_host = ctx_.device == Device::cpu && !masters_sharded();
  std::vector<float> staging(on_host ? 0 : static_cast<size_t>(layout_.total));
  for (const ParamInfo& p : layout_.tensors) {
    Tensor t =
        on_host ? param(p) : Tensor(staging.data() + p.offset, DType::f32, Device::cpu, {p.numel});
    const bool norm = p.name.find("layernorm") != std::string::npos || p.name == "norm/weight";
    const bool bias = p.name.size() >= 4 && p.name.compare(p.name.size() - 4, 4, "bias") == 0;
    const bool out_proj =
        p.name.find("o_proj") != std::string::npos || p.name.find("down_proj") != std::string::npos;
    const InitKind kind = norm ? InitKind::ones : bias ? InitKind::zeros : InitKind::normal;
    const double sd = out_proj ? out_std : std;
    // Row by row, each element keeps the index it has in the whole (vocab-padded) tensor, so
    // every tensor-parallel layout initialises the same global weights.
    const int64_t rows = p.shape.size() == 2 ? p.shape[0] : 1, cols = p.numel / rows;
    const int64_t global_cols = p.split_dim == 1 ? cols * dims_.tp : cols;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t grow = i + (p.split_dim == 0 && p.shape.size() == 2 ? p.split_offset : 0);
      const int64_t first =
          grow * global_cols + (p.split_dim == 1 || p.shape.size() == 1 ? p.split_offset : 0);
      const bool padding_row = p.shape.size() == 2 && p.split_dim == 0 && grow >= p.global_shape[0];
      fill_init(t.at(i * cols, {cols}), kind, sd, seed, p.name, padding_row ? 0 : cols, first);
    }
  }
  if (on_host)
    refresh_compute_copy();
  else
    params_from_host(staging);
}

}  // namespace tr
