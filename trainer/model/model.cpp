#include "trainer/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/switches.h"
#include "kernels/ops.h"
#include "parallel/context_parallel.h"
#include "parallel/tp_region.h"
#include "trainer/model/init.h"
#include "trainer/model/model_acts.h"

namespace tr {

int64_t loss_chunk_of(const ModelDims& dims, const ModelOptions& o) {
  const int64_t tokens = o.batch * (o.seq_len / dims.cp);
  return o.loss_chunk > 0 ? std::max<int64_t>(1, std::min(tokens, o.loss_chunk))
                          : loss_chunk_tokens(tokens, dims.vocab_local, o.dtype);
}

ParamBuffer make_param_buffer(const ModelDims& dims, const ModelOptions& o, Device device) {
  return ParamBuffer(ParamLayout::make(dims, o.flat_multiple), o.dtype, device, o.plan_only);
}

DecoderModel::DecoderModel(const ModelDims& dims, const ModelOptions& o, ParamBuffer& params,
                           Ctx ctx)
    : dims_(dims),
      options_(o),
      seq_len_(o.seq_len / dims.cp),
      ctx_(ctx),
      dtype_(o.dtype),
      sdtype_(stat_dtype(o.dtype)),
      params_(params),
      gemm_(o.gemm),
      attn_(dims, o.dtype, o.batch, o.seq_len, gemm_),
      mlp_(dims, o.dtype, o.batch * (o.seq_len / dims.cp), gemm_),
      moe_(dims, o.dtype, o.batch * (o.seq_len / dims.cp)),
      global_(dims.global_layers()) {
  TR_ASSERT(o.slots >= 1, "at least one activation slot");
  for (int c = 0; c < dims.num_chunks(); ++c)
    for (int64_t j = 0; j < dims.chunks[c].layers; ++j) layer_pos_.push_back(j);
  body_write_.assign(dims.chunks.size(), GradWrite::add);
  weight_write_.assign(dims.chunks.size(), GradWrite::add);
  TR_ASSERT(dims.cp == 1 || o.seq_len % (2 * dims.cp) == 0,
            "context parallelism cuts each sequence into 2 x cp equal chunks");
  TR_ASSERT(params.compute_dtype() == dtype_ && params.device() == ctx.device,
            "the parameter buffer must hold the model's compute dtype on its device");
  TR_ASSERT(ParamLayout::make(dims_, o.flat_multiple).capacity == params.layout().capacity,
            "the parameter buffer's layout is another model's");
  const bool plan_only = o.plan_only;
  if (!plan_only) {
    w_ = views(params.weights_padded());
    g_ = views(params.grads_padded());
    // Each layer's span of the flat gradient buffer (its tensors are contiguous there).
    const Tensor grads = params.grads_padded();
    const auto at = [&](const Tensor& t) {
      return (static_cast<const char*>(t.data) - static_cast<const char*>(grads.data)) /
             static_cast<int64_t>(dtype_size(grads.dtype));
    };
    // The span of some tensors, which must be contiguous ({0, 0} for none).
    const auto span = [&](const std::vector<const Tensor*>& tensors) {
      int64_t lo = params.layout().total, hi = 0, n = 0;
      for (const Tensor* t : tensors) {
        if (t->empty()) continue;
        lo = std::min(lo, at(*t));
        hi = std::max(hi, at(*t) + t->numel());
        n += t->numel();
      }
      TR_ASSERT(hi - lo == n || n == 0, "a layer's gradients are not contiguous in a region");
      return n == 0 ? std::pair<int64_t, int64_t>{0, 0} : std::pair{lo, hi};
    };
    for (const LayerWeights& g : g_.layers) {
      std::vector<const Tensor*> experts;
      for (const Tensor& t : g.moe.gateup) experts.push_back(&t);
      for (const Tensor& t : g.moe.down) experts.push_back(&t);
      layer_ranges_.push_back(
          {span({&g.ln1, &g.attn.qkv_w, &g.attn.qkv_b, &g.attn.q_norm, &g.attn.k_norm, &g.attn.o_w,
                 &g.ln2, &g.mlp.gateup_w, &g.mlp.down_w, &g.moe.router}),
           span(experts)});
    }
  }

  chunk_ = loss_chunk_of(dims, o);
  // Measure the activation buffers, then allocate exactly that once.
  Arena plan = Arena::planner(ctx.device);
  alloc_acts(plan);
  activation_bytes_ = plan.used();
  if (plan_only) return;
  act_arena_ = std::make_unique<Arena>(plan.used(), ctx.device);
  alloc_acts(*act_arena_);
  if (dims_.cp > 1) {
    const std::vector<int64_t> at = cp_positions(options_.seq_len, dims_.cp, dims_.cp_rank);
    std::vector<int32_t> host(at.begin(), at.end());
    copy_tensor(a_->positions, Tensor(host.data(), DType::i32, Device::cpu, {seq_len_}));
  }
  // Attention's plans and workspace now, not in the first step (under context parallelism,
  // those of its blocks: half of this rank's tokens of a sequence).
  if (dims_.layers > 0)
    attention_ =
        attention_prepare(ctx_, static_cast<int>(options_.batch), static_cast<int>(seq_len_),
                          static_cast<int>(dims_.heads), static_cast<int>(dims_.kv_heads),
                          static_cast<int>(dims_.head_dim),
                          dims_.cp > 1 ? static_cast<int>(seq_len_ / 2) : 0, o.documents);
}

void DecoderModel::alloc_acts(Arena& ar) {
  const ModelDims& d = dims_;
  const int64_t T = options_.batch * seq_len_, H = d.hidden;
  const int64_t Tl = d.sequence_parallel ? T / d.tp : T;  // tokens of the residual stream here
  a_ = std::make_unique<Acts>();
  // A slot holds one chunk's layers (any chunk's: slots are the schedule's, parallel/schedule.h),
  // so its layer j has the buffers of a dense MLP when some chunk's layer j is dense, a sparse
  // one's when some chunk's is sparse.
  int64_t positions = 0;
  for (const ModelDims::Chunk& c : d.chunks) positions = std::max(positions, c.layers);
  std::vector<char> dense_at(static_cast<size_t>(positions)), sparse_at(dense_at);
  for (int c = 0; c < d.num_chunks(); ++c)
    for (int64_t j = 0; j < d.chunks[c].layers; ++j)
      (sparse(d.chunk_begin(c) + j) ? sparse_at : dense_at)[static_cast<size_t>(j)] = 1;
  const bool any_dense = std::count(dense_at.begin(), dense_at.end(), 1) > 0,
             any_sparse = std::count(sparse_at.begin(), sparse_at.end(), 1) > 0;
  // A layer's buffers: those selective recomputation drops (the norm outputs and the MLP
  // block's), and those every mode but full recomputation keeps per micro-batch.
  auto recomputed = [&](Acts::Layer& L, bool dense, bool moe) {
    L.ln1 = ar.alloc(dtype_, {T, H});
    L.ln2 = ar.alloc(dtype_, {T, H});
    if (dense) mlp_.alloc_recomputed(ar, L.mlp);
    if (moe) moe_.alloc_recomputed(ar, L.moe);
  };
  auto kept = [&](Acts::Layer& L, bool dense, bool moe) {
    L.rstd1 = ar.alloc(sdtype_, {Tl});
    attn_.alloc_kept(ar, L.attn);
    L.x_mid = ar.alloc(dtype_, {Tl, H});
    L.rstd2 = ar.alloc(sdtype_, {Tl});
    if (dense) mlp_.alloc_kept(ar, L.mlp);
    if (moe) moe_.alloc_kept(ar, L.moe);
  };
  const int64_t full = std::min(d.recompute_full, d.layers);
  if (full > 0 || d.recompute_selective) recomputed(a_->rc, any_dense, any_sparse);
  if (full > 0) kept(a_->rc, any_dense, any_sparse);
  // Its layer j is recomputed in full when it is among the first recompute_full layers of this
  // rank in every chunk that has a layer j.
  auto full_at = [&](int64_t j) {
    for (int c = 0; c < d.num_chunks(); ++c)
      if (j < d.chunks[c].layers && d.chunk_begin(c) + j >= full) return false;
    return true;
  };
  for (int k = 0; k < options_.slots; ++k) {
    Acts::Slot& slot = a_->slots.emplace_back();
    for (int64_t j = 0; j <= positions; ++j) slot.resid.push_back(ar.alloc(dtype_, {Tl, H}));
    for (int64_t j = 0; j < positions; ++j) {
      if (full_at(j)) {  // only resid[j] is kept
        slot.layers.push_back(a_->rc);
        continue;
      }
      Acts::Layer L;
      const bool dense = dense_at[static_cast<size_t>(j)] != 0,
                 moe = sparse_at[static_cast<size_t>(j)] != 0;
      if (d.recompute_selective) {
        L.ln1 = a_->rc.ln1;
        L.ln2 = a_->rc.ln2;
        L.mlp.act = a_->rc.mlp.act;
        MoeMlp::share_recomputed(L.moe, a_->rc.moe);
      } else {
        recomputed(L, dense, moe);
      }
      kept(L, dense, moe);
      slot.layers.push_back(L);
    }
    // A split backward keeps the linears' output gradients from B to W. Two of them go where
    // B leaves activations that W does not read: dqkv over qkv (attention's input, which W's
    // recomputation does not remake unless in full) and the MLP's dgateup over gateup (unless
    // recomputation remakes the SwiGLU output from it).
    if (options_.split_backward)
      for (int64_t j = 0; j < positions; ++j) {
        Acts::Layer& L = slot.layers[j];
        if (dense_at[static_cast<size_t>(j)])
          mlp_.alloc_split(ar, L.mlp, full_at(j) || d.recompute_selective);
        if (sparse_at[static_cast<size_t>(j)])
          moe_.alloc_split(ar, L.moe, full_at(j) || d.recompute_selective);
        attn_.alloc_split(ar, L.attn, full_at(j));
      }
    if (d.last_stage) {
      slot.lnf = ar.alloc(dtype_, {T, H});
      slot.rstdf = ar.alloc(sdtype_, {Tl});
    }
    if (aux_loss()) {
      slot.moe_in = ar.alloc(sdtype_, {2, d.moe.experts});
      slot.moe_out = ar.alloc(sdtype_, {2, d.moe.experts});
      if (d.last_stage) slot.aux_grad = ar.alloc(sdtype_, {d.moe.experts});
    }
  }
  if (any_sparse) moe_.alloc_scratch(ar);
  if (aux_loss()) {
    a_->aux_grad_in = ar.alloc(sdtype_, {d.moe.experts});
    a_->aux_grad_out = ar.alloc(sdtype_, {d.moe.experts});
    a_->aux_value = ar.alloc(sdtype_, {2});
  }
  alloc_scratch(ar);
}

void DecoderModel::alloc_scratch(Arena& ar) {
  const ModelDims& d = dims_;
  const int64_t T = options_.batch * seq_len_, H = d.hidden, C = chunk_;
  const int64_t Tl = d.sequence_parallel ? T / d.tp : T;
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
  attn_.alloc_scratch(ar);
  mlp_.alloc_scratch(ar);
  // FP8 codes of the largest operand of each role: inputs [T, K] and output gradients [T, O]
  // (K, O: hidden, q heads, intermediate; qkv rows, gate and up); and each layer's weights'.
  const int64_t Q = d.qkv_out(), A = d.heads * d.head_dim, I = d.inter;
  gemm_.alloc_scratch(ar, T * std::max({H, A, I}), T * std::max({Q, H, 2 * I}));
  for (size_t l = 0; l < static_cast<size_t>(d.layers); ++l) {
    const LayerWeights* w = w_.layers.empty() ? nullptr : &w_.layers[l];  // none: plan-only
    attn_.alloc_weight_codes(ar, gemm_, w ? &w->attn : nullptr);
    if (!sparse(static_cast<int64_t>(l))) mlp_.alloc_weight_codes(ar, gemm_, w ? &w->mlp : nullptr);
  }
  a_->logits = ar.alloc(dtype_, {C, d.vocab_local});
  a_->row_max = ar.alloc(sdtype_, {C});
  a_->sums = ar.alloc(sdtype_, {C, 2});
  if (d.tp > 1) {
    a_->stats = ar.alloc(sdtype_, {C, 3});
    a_->all_stats = ar.alloc(sdtype_, {d.tp * C * 3});
  }
  a_->losses = ar.alloc(sdtype_, {C});
  if (d.cp > 1) a_->positions = ar.alloc(DType::i32, {seq_len_});
}

void DecoderModel::begin_step_grads() {
  weights_changed();  // the optimizer's last step changed them
  if (take(Switch::grad_zero)) {
    zero_(ctx_, params_.grads());
    head_write_ = GradWrite::add;
    body_write_.assign(dims_.chunks.size(), GradWrite::add);
    weight_write_.assign(dims_.chunks.size(), GradWrite::add);
    return;
  }
  head_write_ = GradWrite::assign;
  body_write_.assign(dims_.chunks.size(), GradWrite::assign);
  weight_write_.assign(dims_.chunks.size(), GradWrite::assign);
  if (dims_.first_stage && !(dims_.tied && dims_.last_stage)) zero_(ctx_, g_.embed);
}

DecoderModel::~DecoderModel() = default;

void DecoderModel::set_cp_comm(Comm* cp) {
  cp_ = cp;
  attn_.set_cp_comm(cp_logged_ ? cp_logged_.get() : cp_);
}

void DecoderModel::set_op_log(OpLog* log) {
  ctx_.log = log;
  tp_logged_ = log != nullptr && tp_ != nullptr ? logged_comm(*tp_, *log) : nullptr;
  cp_logged_ = log != nullptr && cp_ != nullptr ? logged_comm(*cp_, *log) : nullptr;
  ep_logged_ = log != nullptr && ep_ != nullptr ? logged_comm(*ep_, *log) : nullptr;
  attn_.set_cp_comm(cp_logged_ ? cp_logged_.get() : cp_);
  moe_.set_tp_comm(tp_logged_ ? tp_logged_.get() : tp_);
  moe_.set_ep_comm(ep_logged_ ? ep_logged_.get() : ep_);
}

void DecoderModel::set_ep_comm(Comm* ep) {
  ep_ = ep;
  moe_.set_ep_comm(ep_logged_ ? ep_logged_.get() : ep_);
}

void DecoderModel::set_tp_comm(Comm* tp) {
  tp_ = tp;
  moe_.set_tp_comm(tp_logged_ ? tp_logged_.get() : tp_);
}

Weights DecoderModel::views(Tensor flat) const {
  const ModelDims& d = dims_;
  const int64_t H = d.hidden;
  // Fused views (qkv here, the MLP's gate and up) start at their first member and span the
  // adjacent ones.
  auto at = [&](const std::string& name, std::initializer_list<int64_t> shape) {
    return flat.at(layout().find(name).offset, shape);
  };
  Weights w;
  if (d.first_stage) w.embed = at("embed_tokens/weight", {d.vocab_local, H});
  for (int64_t i : d.global_layers()) {
    const std::string p = absl::StrCat("layers/", i, "/");
    LayerWeights L;
    L.ln1 = at(p + "input_layernorm/weight", {H});
    L.attn = attn_.views(at, p);
    L.ln2 = at(p + "post_attention_layernorm/weight", {H});
    if (d.sparse(i))
      L.moe = moe_.views(at, p);
    else
      L.mlp = mlp_.views(at, p);
    w.layers.push_back(L);
  }
  if (d.last_stage) {
    w.norm = at("norm/weight", {H});
    w.lm_head = at(d.tied ? "embed_tokens/weight" : "lm_head/weight", {d.vocab_local, H});
  }
  return w;
}

}  // namespace tr
