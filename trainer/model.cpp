#include "trainer/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/core/switches.h"
#include "kernels/ops.h"
#include "parallel/tp_region.h"
#include "trainer/init.h"

namespace tr {
namespace {
// The vocabulary is padded to a multiple of this times tp (GEMM-friendly shard sizes).
constexpr int64_t kVocabMultiple = 128;
}  // namespace

ModelDims ModelDims::from(const ModelConfig& m, const Topology& topo, bool sequence_parallel,
                          const std::vector<int64_t>& stage_layers) {
  ModelDims d;
  d.hidden = m.hidden_size;
  d.inter = m.intermediate_size / topo.tp;
  d.layers = m.num_layers / topo.pp;
  d.first_layer = d.layers * topo.pp_rank;
  if (!stage_layers.empty()) {
    TR_ASSERT(static_cast<int>(stage_layers.size()) == topo.pp, "one layer count per stage");
    d.layers = stage_layers[topo.pp_rank];
    d.first_layer = 0;
    for (int s = 0; s < topo.pp_rank; ++s) d.first_layer += stage_layers[s];
  }
  d.first_stage = topo.first_stage();
  d.last_stage = topo.last_stage();
  d.heads = m.num_heads / topo.tp;
  d.kv_heads = m.num_kv_heads / topo.tp;
  d.head_dim = m.head_dim;
  d.total_layers = m.num_layers;
  d.vocab = m.vocab_size;
  const int64_t multiple = kVocabMultiple * topo.tp;
  d.vocab_padded = (m.vocab_size + multiple - 1) / multiple * multiple;
  d.vocab_local = d.vocab_padded / topo.tp;
  d.vocab_offset = d.vocab_local * topo.tp_rank;
  d.tp = topo.tp;
  d.tp_rank = topo.tp_rank;
  d.sequence_parallel = sequence_parallel && topo.tp > 1;
  d.eps = static_cast<float>(m.rms_norm_eps);
  d.theta = static_cast<float>(m.rope_theta);
  d.tied = m.tie_embeddings;
  return d;
}

ModelDims ModelDims::from(const Config& c, const Topology& topo) {
  ModelDims d = from(c.model, topo, c.parallel.sequence_parallel, c.parallel.pipeline_layers);
  const TrainConfig& t = c.train;
  d.recompute_selective = t.recompute == "selective";
  if (t.recompute == "full") {
    const std::vector<int64_t>& n = t.recompute_layers;
    d.recompute_full = n.empty() ? d.layers : n[n.size() == 1 ? 0 : topo.pp_rank];
  }
  return d;
}

ParamLayout ParamLayout::make(const ModelDims& d, int64_t multiple) {
  ParamLayout l;
  // split: -1 replicated, 0 rows, 1 columns; the global shape multiplies the split dim by tp.
  auto add = [&](std::string name, std::vector<int64_t> shape, bool decay, int split) {
    ParamInfo p;
    p.name = std::move(name);
    p.shape = shape;
    p.global_shape = shape;
    if (split >= 0) {
      p.global_shape[split] *= d.tp;
      p.split_dim = split;
      p.split_offset = shape[split] * d.tp_rank;
    }
    p.offset = l.total;
    p.numel = 1;
    for (int64_t s : shape) p.numel *= s;
    p.decay = decay;
    l.total += p.numel;
    l.tensors.push_back(std::move(p));
  };
  const int64_t H = d.hidden, hd = d.head_dim;
  auto vocab_table = [&](const std::string& name) {  // vocab-parallel rows; padding not stored
    add(name, {d.vocab_local, H}, true, 0);
    l.tensors.back().global_shape[0] = d.vocab;
  };
  if (d.first_stage) vocab_table("embed_tokens/weight");
  for (int64_t i = d.first_layer; i < d.first_layer + d.layers; ++i) {
    const std::string p = absl::StrCat("layers/", i, "/");
    add(p + "input_layernorm/weight", {H}, false, -1);
    // q, k, v adjacent so that [q; k; v] is one [(nh + 2 nkv) hd, H] matrix; biases likewise.
    // Column-parallel: each TP rank holds whole heads.
    add(p + "self_attn/q_proj/weight", {d.heads * hd, H}, true, 0);
    add(p + "self_attn/k_proj/weight", {d.kv_heads * hd, H}, true, 0);
    add(p + "self_attn/v_proj/weight", {d.kv_heads * hd, H}, true, 0);
    add(p + "self_attn/q_proj/bias", {d.heads * hd}, false, 0);
    add(p + "self_attn/k_proj/bias", {d.kv_heads * hd}, false, 0);
    add(p + "self_attn/v_proj/bias", {d.kv_heads * hd}, false, 0);
    add(p + "self_attn/o_proj/weight", {H, d.heads * hd}, true, 1);  // row-parallel
    add(p + "post_attention_layernorm/weight", {H}, false, -1);
    add(p + "mlp/gate_proj/weight", {d.inter, H}, true, 0);  // gate then up: one [2I, H]
    add(p + "mlp/up_proj/weight", {d.inter, H}, true, 0);
    add(p + "mlp/down_proj/weight", {H, d.inter}, true, 1);  // row-parallel
  }
  if (d.last_stage) {
    add("norm/weight", {H}, false, -1);
    if (!d.tied) {
      vocab_table("lm_head/weight");
    } else if (!d.first_stage) {
      vocab_table("embed_tokens/weight");
      l.tensors.back().tied_copy = true;
    }
  }
  l.capacity = (l.total + multiple - 1) / multiple * multiple;
  return l;
}

const ParamInfo& ParamLayout::find(const std::string& name) const {
  for (const ParamInfo& p : tensors)
    if (p.name == name) return p;
  TR_ASSERT(false, "no parameter named " + name);
}

// Activations kept for backward (one Slot per micro-batch in flight), and scratch shared by
// all micro-batches. T = batch * seq_len.
struct Qwen2Model::Acts {
  struct Layer {
    Tensor ln1;     // [T, H] input_layernorm output (all-gathered)
    Tensor rstd1;   // [Tl]
    Tensor qkv;     // [T, (nh + 2 nkv) hd], rope applied to q and k
    Tensor att;     // [T, nh hd] attention output before o_proj
    Tensor lse;     // [B, nh, S]
    Tensor x_mid;   // [Tl, H] residual after attention
    Tensor ln2;     // [T, H]
    Tensor rstd2;   // [Tl]
    Tensor gateup;  // [T, 2I]
    Tensor act;     // [T, I] silu(gate) * up
  };
  // [T, ...] buffers hold the whole micro-batch; [Tl, ...] ones this rank's tokens (Tl = T, or
  // T / tp with sequence parallelism).
  struct Slot {
    std::vector<Layer> layers;
    std::vector<Tensor> resid;  // L + 1 of [Tl, H]: resid[l] enters layer l
    Tensor lnf, rstdf;          // [T, H], [Tl] (last stage)
  };
  std::vector<Slot> slots;
  // Activation recomputation: the buffers of the layers' recomputed activations, shared by all
  // layers and slots (every buffer for fully recomputed layers; ln1, ln2 and act for selective
  // recomputation). A slot's Layer views them instead of owning them.
  Layer rc;
  Tensor tmp;  // [T, H] projection outputs
  // backward scratch
  Tensor dres;       // [T, H] running gradient of the residual stream; after backward_stage, the
                     // stage input's gradient (sent to the previous stage)
  Tensor grad_in;    // [T, H] the next stage's gradient, received; swapped into dres
  Tensor dln, dlnf;  // [T, H]
  Tensor dqkv;       // [T, (nh + 2 nkv) hd]
  Tensor datt;       // [T, nh hd]
  Tensor dgateup;    // [T, 2I]
  Tensor dact;       // [T, I]
  Tensor logits;     // [C, Vl] one loss chunk; overwritten by its gradient
  Tensor losses;     // [C]
  Tensor row_max, sums;     // [C], [C, 2] vocab-parallel cross-entropy statistics
  Tensor stats, all_stats;  // [C, 3], [tp * C * 3]: this rank's and every TP rank's
  Tensor tokens, targets;   // i32 [T] the micro-batch on the device (unused on the CPU)
  // Sequence parallelism: the residual stream, norms and their gradients hold Tl = T / tp
  // tokens per rank; these are the full-sequence buffers around the TP regions.
  Tensor full;        // [T, H] all-gathered or not yet reduce-scattered
  Tensor ln_local;    // [Tl, H] norm output before its all-gather
  Tensor dlnf_local;  // [Tl, H]
};

int64_t loss_chunk_tokens(int64_t tokens, int64_t vocab_local, DType logits_dtype) {
  const double row =
      static_cast<double>(vocab_local) * static_cast<double>(dtype_size(logits_dtype));
  const auto fit = static_cast<int64_t>(kLossChunkBudgetBytes / row);
  return std::max<int64_t>(1, std::min(tokens, std::max(fit, kMinLossChunkTokens)));
}

namespace {

// Any floating tensor's values as host floats (copied back from a device first).
std::vector<float> to_host_floats(Tensor t) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  Ctx cpu;
  if (t.device == Device::cpu) {
    cast(cpu, Tensor(out.data(), DType::f32, Device::cpu, {n}), t.view({n}));
    return out;
  }
  std::vector<char> raw(t.nbytes());
  Tensor staged(raw.data(), t.dtype, Device::cpu, {n});
  copy_tensor(staged, t.view({n}));
  cast(cpu, Tensor(out.data(), DType::f32, Device::cpu, {n}), staged);
  return out;
}
}  // namespace

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
  step_scalars_ = ar.alloc(DType::f64, {2});
  if (ctx_.device != Device::cpu) {
    a_->tokens = ar.alloc(DType::i32, {T});
    a_->targets = ar.alloc(DType::i32, {T});
  }
}

Tensor Qwen2Model::stage_tokens(const int32_t* host, int64_t n, Tensor device_buf) {
  const int64_t T = batch_ * seq_len_;
  const auto at = reinterpret_cast<uintptr_t>(host);
  for (const auto& [array, offset] : uploaded_) {
    const auto begin = reinterpret_cast<uintptr_t>(array);
    if (at >= begin && at + n * sizeof(int32_t) <= begin + T * sizeof(int32_t))
      return Tensor(static_cast<int32_t*>(staged_dev_.data()) + offset +
                        static_cast<int64_t>((at - begin) / sizeof(int32_t)),
                    DType::i32, ctx_.device, {n});
  }
  // Not uploaded ahead: copied now, which waits for the device (counted on the CPU too).
  Tensor h(const_cast<int32_t*>(host), DType::i32, Device::cpu, {n});
  if (ctx_.device == Device::cpu) {
    count_host_sync();
    return h;
  }
  Tensor d = device_buf.slice(0, n);
  copy_tensor(d, h);
  return d;
}

void Qwen2Model::upload_tokens(const std::vector<const int32_t*>& inputs,
                               const std::vector<const int32_t*>& targets) {
  const int64_t T = batch_ * seq_len_;
  std::vector<const int32_t*> arrays = inputs;
  arrays.insert(arrays.end(), targets.begin(), targets.end());
  const size_t bytes = arrays.size() * static_cast<size_t>(T) * sizeof(int32_t);
  if (staged_dev_.bytes() < bytes) {  // grown at the first step (nothing is in flight then)
    staged_host_ = ctx_.device == Device::cpu ? Buffer(bytes, Device::cpu) : Buffer::pinned(bytes);
    staged_dev_ = Buffer(bytes, ctx_.device);
  }
  // The previous upload from this pinned memory has run: the last step's end read the
  // scalars, which waited for every earlier copy on the stream.
  uploaded_.clear();
  auto* host = static_cast<int32_t*>(staged_host_.data());
  for (size_t i = 0; i < arrays.size(); ++i) {
    std::memcpy(host + i * T, arrays[i], static_cast<size_t>(T) * sizeof(int32_t));
    uploaded_.emplace_back(arrays[i], static_cast<int64_t>(i) * T);
  }
  const auto n = static_cast<int64_t>(arrays.size()) * T;
  upload_async(ctx_, Tensor(staged_dev_.data(), DType::i32, ctx_.device, {n}),
               Tensor(host, DType::i32, Device::cpu, {n}));
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

void Qwen2Model::reset_step_scalars() {
  zero_(ctx_, step_scalars_);
}

std::pair<double, double> Qwen2Model::take_step_scalars() {
  double v[2];
  read_f64(ctx_, step_scalars_, v);
  reset_step_scalars();
  return {v[0], v[1]};
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

Comm* Qwen2Model::tp_group() const {
  TR_ASSERT(dims_.tp == 1 || (tp_ != nullptr && tp_->size() == dims_.tp),
            "tensor parallelism needs set_tp_comm()");
  return tp_;
}

void Qwen2Model::tp_sum(Tensor t) {
  tp::sum(tp_group(), t);
}

// The two ends of a TP region (parallel/tp_region.h). Without sequence parallelism the
// full-sequence buffer is the local one.
Tensor Qwen2Model::full_or(Tensor local) const {
  return dims_.sequence_parallel ? a_->full : local;
}

void Qwen2Model::reduce_to_local(Tensor partial, Tensor local) {
  tp::reduce_out(tp_group(), dims_.sequence_parallel, partial, local);
}

Tensor Qwen2Model::gather_tokens(Tensor local, Tensor full) {
  return tp::gather_in(tp_group(), dims_.sequence_parallel, local, full);
}

void Qwen2Model::sync_replicated_grads() {
  if (!dims_.sequence_parallel) return;
  // The norms saw only this rank's tokens. Those of the layers were summed already when the
  // last backward reported each layer final (one all-reduce per tensor either way, so the sums
  // are the same bits); the final norm's is summed here.
  for (const ParamInfo& p : layout_.tensors)
    if (p.split_dim < 0 && !(layer_norms_summed_ && p.name.starts_with("layers/"))) tp_sum(grad(p));
  layer_norms_summed_ = false;
}

Tensor Qwen2Model::stage_input(int slot) const {
  return a_->slots[slot].resid[0];
}
Tensor Qwen2Model::stage_output(int slot) const {
  return a_->slots[slot].resid[dims_.layers];
}
Tensor Qwen2Model::recv_grad_buffer() const {
  return a_->grad_in;
}
Tensor Qwen2Model::send_grad_buffer() const {
  return a_->dres;
}

void Qwen2Model::forward_stage(int slot, const int32_t* tokens) {
  const ModelDims& d = dims_;
  const int64_t T = batch_ * seq_len_;
  const bool sp = d.sequence_parallel;
  Acts& a = *a_;
  Acts::Slot& S = a.slots[slot];
  if (d.first_stage) {
    Tensor tok = stage_tokens(tokens, T, a.tokens);
    Tensor emb = full_or(S.resid[0]);
    need(w_.embed);
    embedding_fwd(ctx_, emb, tok, w_.embed, d.vocab_offset);
    reduce_to_local(emb, S.resid[0]);  // vocab-parallel: each rank contributed its own rows
  }
  // Each residual add is fused with the RMSNorm after it: the layer's second norm, and the next
  // layer's first norm (or the final norm) at the end of a layer.
  if (d.layers > 0) {
    need(w_.layers[0].ln1);
    rmsnorm_fwd(ctx_, sp ? a.ln_local : S.layers[0].ln1, S.layers[0].rstd1, S.resid[0],
                w_.layers[0].ln1, d.eps);
  } else if (d.last_stage) {
    need(w_.norm);
    rmsnorm_fwd(ctx_, sp ? a.ln_local : S.lnf, S.rstdf, S.resid[0], w_.norm, d.eps);
  }
  for (int64_t l = 0; l < d.layers; ++l) {
    const LayerWeights& w = w_.layers[l];
    Acts::Layer& L = S.layers[l];
    gather_tokens(a.ln_local, L.ln1);  // column-parallel input: the whole sequence
    if (weights_hook_) weights_hook_(layer_ranges_[l].first, layer_ranges_[l].second);
    layer_fwd(slot, l);
    linear_fwd(ctx_, full_or(a.tmp), L.act, w.down_w, Tensor());
    reduce_to_local(full_or(a.tmp), a.tmp);  // row-parallel
    if (l + 1 < d.layers) {
      need(w_.layers[l + 1].ln1);
      add_rmsnorm_fwd(ctx_, S.resid[l + 1], sp ? a.ln_local : S.layers[l + 1].ln1,
                      S.layers[l + 1].rstd1, L.x_mid, a.tmp, w_.layers[l + 1].ln1, d.eps);
    } else if (d.last_stage) {
      need(w_.norm);
      add_rmsnorm_fwd(ctx_, S.resid[l + 1], sp ? a.ln_local : S.lnf, S.rstdf, L.x_mid, a.tmp,
                      w_.norm, d.eps);
    } else {
      add(ctx_, S.resid[l + 1], L.x_mid, a.tmp);
    }
  }
  if (d.last_stage) gather_tokens(a.ln_local, S.lnf);  // the LM head sees the whole sequence
}

void Qwen2Model::need(const Tensor& w) {
  if (!weights_hook_) return;
  const int64_t at = (static_cast<const char*>(w.data) - static_cast<const char*>(compute_.data)) /
                     static_cast<int64_t>(dtype_size(dtype_));
  weights_hook_(at, at + w.numel());
}

void Qwen2Model::layer_fwd(int slot, int64_t l) {
  const ModelDims& d = dims_;
  Acts::Slot& S = a_->slots[slot];
  const int64_t T = batch_ * seq_len_;
  const bool sp = d.sequence_parallel;
  Acts& a = *a_;
  const LayerWeights& w = w_.layers[l];
  Acts::Layer& L = S.layers[l];
  linear_fwd(ctx_, L.qkv, L.ln1, w.qkv_w, w.qkv_b);
  Tensor heads = L.qkv.view({T, d.heads + 2 * d.kv_heads, d.head_dim});
  rope_fwd(ctx_, heads, static_cast<int>(d.heads + d.kv_heads), static_cast<int>(seq_len_),
           d.theta);
  attention_fwd(ctx_, L.att, L.lse, L.qkv, static_cast<int>(batch_), static_cast<int>(seq_len_),
                static_cast<int>(d.heads), static_cast<int>(d.kv_heads),
                static_cast<int>(d.head_dim));
  linear_fwd(ctx_, full_or(a.tmp), L.att, w.o_w, Tensor());
  reduce_to_local(full_or(a.tmp), a.tmp);  // row-parallel: partial sums over the TP ranks' heads
  add_rmsnorm_fwd(ctx_, L.x_mid, sp ? a.ln_local : L.ln2, L.rstd2, S.resid[l], a.tmp, w.ln2, d.eps);
  gather_tokens(a.ln_local, L.ln2);
  linear_fwd(ctx_, L.gateup, L.ln2, w.gateup_w, Tensor());
  swiglu_fwd(ctx_, L.act, L.gateup);
}

void Qwen2Model::recompute_layer(int slot, int64_t l) {
  const ModelDims& d = dims_;
  Acts::Slot& S = a_->slots[slot];
  const bool full = l < d.recompute_full;
  if (!full && !d.recompute_selective) return;
  const bool sp = d.sequence_parallel;
  Acts& a = *a_;
  const LayerWeights& w = w_.layers[l];
  Acts::Layer& L = S.layers[l];
  // The forward fused this norm into the previous layer's residual add, which normalises the
  // stored sum: the same values as normalising the layer's input here.
  rmsnorm_fwd(ctx_, sp ? a.ln_local : L.ln1, L.rstd1, S.resid[l], w.ln1, d.eps);
  gather_tokens(a.ln_local, L.ln1);
  if (full) return layer_fwd(slot, l);
  rmsnorm_fwd(ctx_, sp ? a.ln_local : L.ln2, L.rstd2, L.x_mid, w.ln2, d.eps);
  gather_tokens(a.ln_local, L.ln2);
  swiglu_fwd(ctx_, L.act, L.gateup);
}

// LM head and cross-entropy chunk by chunk; with `grad`, also the head's backward: dlnf is
// assigned, the LM head gradient accumulated.
void Qwen2Model::stage_loss(int slot, const int32_t* targets, float grad_scale, bool grad) {
  TR_ASSERT(dims_.last_stage, "the loss is computed on the last pipeline stage");
  Acts& a = *a_;
  const Tensor lnf = a.slots[slot].lnf;
  const int64_t T = batch_ * seq_len_;
  need(w_.lm_head);
  for (int64_t begin = 0; begin < T; begin += chunk_) {
    const int64_t n = std::min(chunk_, T - begin);
    Tensor logits = a.logits.slice(0, n), losses = a.losses.slice(0, n);
    Tensor x = lnf.slice(begin, n);
    Tensor tgt = stage_tokens(targets + begin, n, a.targets);
    linear_fwd(ctx_, logits, x, w_.lm_head, Tensor());
    chunk_loss(losses, logits, tgt, grad_scale, grad);
    accumulate_sum(ctx_, step_scalars_.slice(0, 1), losses);  // on the device: no host sync
    if (grad) {
      linear_bwd(ctx_, a.dlnf.slice(begin, n), g_.lm_head, Tensor(), logits, x, w_.lm_head,
                 head_write_);
      head_write_ = GradWrite::add;
    }
  }
  // Vocab-parallel LM head: each rank holds its share of d lnf.
  if (grad) reduce_to_local(a.dlnf, dims_.sequence_parallel ? a.dlnf_local : a.dlnf);
}

// One chunk's cross-entropy: in one step on a single rank; with the vocabulary split over TP,
// each rank's statistics of its shard in one pass, all-gathered over TP and combined, then the
// loss and gradient (TR_XENT_3PASS=1: three passes with the row max and the sums all-reduced in
// between).
void Qwen2Model::chunk_loss(Tensor losses, Tensor logits, Tensor targets, float grad_scale,
                            bool grad) {
  const ModelDims& d = dims_;
  if (d.tp == 1) {
    cross_entropy_fwd_bwd(ctx_, losses, logits, targets, d.vocab, grad_scale, grad);
    return;
  }
  const int64_t n = logits.dim(0);
  Tensor row_max = a_->row_max.slice(0, n), sums = a_->sums.slice(0, n);
  if (take(Switch::xent_3pass)) {
    xent_row_max(ctx_, row_max, logits, d.vocab_valid_local());
    tp_group()->all_reduce(row_max, ReduceOp::max);
    xent_sums(ctx_, sums, logits, targets, row_max, d.vocab_offset, d.vocab_valid_local());
    tp_sum(sums);
  } else {
    const Tensor stats = a_->stats.slice(0, n);
    xent_shard_stats(ctx_, stats, logits, targets, d.vocab_offset, d.vocab_valid_local());
    const Tensor all = a_->all_stats.at(0, {d.tp * n * 3});
    tp_group()->all_gather(all, stats.view({n * 3}));
    xent_combine(ctx_, row_max, sums, all.view({d.tp, n, 3}));
  }
  xent_loss_grad(ctx_, losses, logits, targets, row_max, sums, d.vocab_offset,
                 d.vocab_valid_local(), grad_scale, grad);
}

void Qwen2Model::backward_stage(int slot, const int32_t* tokens) {
  const ModelDims& d = dims_;
  const int64_t T = batch_ * seq_len_;
  Acts& a = *a_;
  Acts::Slot& S = a.slots[slot];
  if (d.last_stage)
    rmsnorm_bwd(ctx_, a.dres, g_.norm, d.sequence_parallel ? a.dlnf_local : a.dlnf,
                S.resid[d.layers], w_.norm, S.rstdf, /*accumulate_din=*/false, body_write_);
  else
    std::swap(a.dres, a.grad_in);  // the received gradient becomes the running one
  for (int64_t l = d.layers - 1; l >= 0; --l) {
    const LayerWeights& w = w_.layers[l];
    const LayerWeights& g = g_.layers[l];
    Acts::Layer& L = S.layers[l];
    recompute_layer(slot, l);
    // resid[l + 1] = x_mid + down(swiglu(gateup(ln2(x_mid)))); dres holds d resid[l + 1].
    const GradWrite gw = body_write_;
    linear_bwd(ctx_, a.dact, g.down_w, Tensor(), gather_tokens(a.dres, a.full), L.act, w.down_w,
               gw);
    swiglu_bwd(ctx_, a.dgateup, a.dact, L.gateup);
    linear_bwd(ctx_, full_or(a.dln), g.gateup_w, Tensor(), a.dgateup, L.ln2, w.gateup_w, gw);
    reduce_to_local(full_or(a.dln), a.dln);  // column-parallel input: every rank's share of d ln2
    rmsnorm_bwd(ctx_, a.dres, g.ln2, a.dln, L.x_mid, w.ln2, L.rstd2, /*accumulate_din=*/true, gw);
    // dres now holds d x_mid
    // x_mid = resid[l] + o_proj(attention(rope(qkv(ln1(resid[l])))))
    linear_bwd(ctx_, a.datt, g.o_w, Tensor(), gather_tokens(a.dres, a.full), L.att, w.o_w, gw);
    attention_bwd(ctx_, a.dqkv, a.datt, L.att, L.lse, L.qkv, static_cast<int>(batch_),
                  static_cast<int>(seq_len_), static_cast<int>(d.heads),
                  static_cast<int>(d.kv_heads), static_cast<int>(d.head_dim));
    rope_bwd(ctx_, a.dqkv.view({T, d.heads + 2 * d.kv_heads, d.head_dim}),
             static_cast<int>(d.heads + d.kv_heads), static_cast<int>(seq_len_), d.theta);
    linear_bwd(ctx_, full_or(a.dln), g.qkv_w, g.qkv_b, a.dqkv, L.ln1, w.qkv_w, gw);
    reduce_to_local(full_or(a.dln), a.dln);  // column-parallel input
    rmsnorm_bwd(ctx_, a.dres, g.ln1, a.dln, S.resid[l], w.ln1, L.rstd1, /*accumulate_din=*/true,
                gw);
    // dres now holds d resid[l]
    if (layer_grads_hook_) {
      // The layer's gradients are final; under sequence parallelism its norms' are once summed
      // over TP, here rather than after backward, so that the DP buckets can start now.
      if (d.sequence_parallel) {
        tp_sum(g.ln2);
        tp_sum(g.ln1);
      }
      layer_grads_hook_(layer_ranges_[l].first, layer_ranges_[l].second);
    }
  }
  body_write_ = GradWrite::add;
  if (layer_grads_hook_ && d.sequence_parallel) layer_norms_summed_ = true;
  if (d.first_stage) {
    Tensor tok = stage_tokens(tokens, T, a.tokens);
    embedding_bwd(ctx_, g_.embed, gather_tokens(a.dres, a.full), tok, d.vocab_offset);
  }
}

double Qwen2Model::forward_backward(const int32_t* tokens, const int32_t* targets,
                                    float grad_scale) {
  TR_ASSERT(dims_.first_stage && dims_.last_stage, "forward_backward runs the whole model");
  reset_step_scalars();
  forward_stage(0, tokens);
  stage_loss(0, targets, grad_scale, true);
  backward_stage(0, tokens);
  return take_step_scalars().first;
}

std::vector<float> Qwen2Model::logits(int64_t begin, int64_t n) {
  TR_ASSERT(dims_.tp == 1, "logits() returns the whole vocabulary: tp must be 1");
  TR_ASSERT(n <= chunk_ && begin + n <= batch_ * seq_len_, "logits range too large");
  Tensor logits = a_->logits.slice(0, n);
  linear_fwd(ctx_, logits, a_->slots[0].lnf.slice(begin, n), w_.lm_head, Tensor());
  const std::vector<float> all = to_host_floats(logits);  // [n, vocab_local]
  std::vector<float> out(static_cast<size_t>(n * dims_.vocab));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t v = 0; v < dims_.vocab; ++v)
      out[i * dims_.vocab + v] = all[i * dims_.vocab_local + v];
  return out;
}

}  // namespace tr
