// DecoderModel's forward and backward: tensor-parallel regions, the pipeline stage's layers,
// activation recomputation and the chunked loss.
#include "trainer/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/switches.h"
#include "kernels/ops.h"
#include "parallel/tp_region.h"
#include "trainer/model/init.h"
#include "trainer/model/model_acts.h"

namespace tr {
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

Comm* DecoderModel::tp_group() const {
  TR_ASSERT(dims_.tp == 1 || (tp_ != nullptr && tp_->size() == dims_.tp),
            "tensor parallelism needs set_tp_comm()");
  return tp_logged_ ? tp_logged_.get() : tp_;
}

Comm* DecoderModel::cp_group() const {
  TR_ASSERT(dims_.cp == 1 || cp_ != nullptr, "context parallelism needs set_cp_comm()");
  return cp_logged_ ? cp_logged_.get() : cp_;
}

void DecoderModel::tp_sum(Tensor t) {
  tp::sum(tp_group(), t);
}

// The two ends of a TP region (parallel/tp_region.h). Without sequence parallelism the
// full-sequence buffer is the local one.
Tensor DecoderModel::full_or(Tensor local) const {
  return dims_.sequence_parallel ? a_->full : local;
}

void DecoderModel::reduce_to_local(Tensor partial, Tensor local) {
  tp::reduce_out(tp_group(), dims_.sequence_parallel, partial, local);
}

Tensor DecoderModel::gather_tokens(Tensor local, Tensor full) {
  return tp::gather_in(tp_group(), dims_.sequence_parallel, local, full);
}

void DecoderModel::sync_replicated_grads() {
  if (!dims_.sequence_parallel) return;
  // The norms saw only this rank's tokens. Those of the layers were summed already when the
  // last backward reported each layer final (one all-reduce per tensor either way, so the sums
  // are the same bits); the final norm's is summed here.
  for (const ParamInfo& p : layout().tensors)
    if (p.split_dim < 0 && !p.tp_whole_grad &&
        !(layer_norms_summed_ && p.name.starts_with("layers/")))
      tp_sum(params_.grad(p));
  layer_norms_summed_ = false;
}

Tensor DecoderModel::stage_input(int slot, int) const {
  return a_->slots[slot].resid[0];
}
Tensor DecoderModel::stage_output(int slot, int chunk) const {
  return a_->slots[slot].resid[dims_.chunks[chunk].layers];
}
Tensor DecoderModel::recv_grad_buffer() const {
  return a_->grad_in;
}
Tensor DecoderModel::send_grad_buffer() const {
  return a_->dres;
}

Tensor DecoderModel::stage_side_input(int slot, int) const {
  return aux_loss() ? a_->slots[slot].moe_in : Tensor();
}
Tensor DecoderModel::stage_side_output(int slot, int) const {
  return aux_loss() ? a_->slots[slot].moe_out : Tensor();
}
Tensor DecoderModel::recv_side_grad_buffer() const {
  return a_->aux_grad_in;
}
Tensor DecoderModel::send_side_grad_buffer() const {
  return a_->aux_grad_out;
}

Tensor DecoderModel::resid(int slot, int64_t l) const {
  return a_->slots[slot].resid[layer_pos_[l]];
}

bool DecoderModel::holds_head(int chunk) const {
  return dims_.last_stage && chunk == dims_.num_chunks() - 1;
}

void DecoderModel::forward_stage(int slot, Tensor tokens, int chunk, MicroBatchDocs docs) {
  const ModelDims& d = dims_;
  const int64_t T = options_.batch * seq_len_;
  const bool sp = d.sequence_parallel;
  Acts& a = *a_;
  Acts::Slot& S = a.slots[slot];
  const int64_t begin = d.chunk_begin(chunk), end = begin + d.chunks[chunk].layers;
  const bool head = holds_head(chunk);
  const Tensor input = stage_input(slot, chunk);
  TR_ASSERT(docs.doc_start.empty() || docs.doc_start.start.numel() == T,
            "forward_stage: a micro-batch's document starts");
  TR_ASSERT(docs.positions.empty() || docs.positions.numel() == T,
            "forward_stage: a micro-batch's positions");
  S.docs = docs;
  if (aux_loss()) {  // the router statistics entering the chunk, and so far leaving it
    if (d.first_stage && chunk == 0) zero_(ctx_, S.moe_in);
    cast(ctx_, S.moe_out, S.moe_in);  // (a copy in the stream's order)
  }
  if (d.first_stage && chunk == 0) {
    TR_ASSERT(tokens.numel() == T, "forward_stage: a micro-batch's tokens");
    Tensor emb = full_or(input);
    need(w_.embed);
    embedding_fwd(ctx_, emb, tokens, w_.embed, d.vocab_offset);
    reduce_to_local(emb, input);  // vocab-parallel: each rank contributed its own rows
  }
  // Each residual add is fused with the RMSNorm after it: the layer's second norm, and the next
  // layer's first norm (or the final norm) at the end of a layer.
  if (end > begin) {
    need(w_.layers[begin].ln1);
    rmsnorm_fwd(ctx_, sp ? a.ln_local : a_->layer(slot, layer_pos_[begin]).ln1,
                a_->layer(slot, layer_pos_[begin]).rstd1, input, w_.layers[begin].ln1, d.eps);
  } else if (head) {
    need(w_.norm);
    rmsnorm_fwd(ctx_, sp ? a.ln_local : S.lnf, S.rstdf, input, w_.norm, d.eps);
  }
  for (int64_t l = begin; l < end; ++l) {
    const LayerWeights& w = w_.layers[l];
    Acts::Layer& L = a_->layer(slot, layer_pos_[l]);
    gather_tokens(a.ln_local, L.ln1);  // column-parallel input: the whole sequence
    if (events_ != nullptr)
      for (const auto& [begin, end] : {layer_ranges_[l].dense, layer_ranges_[l].experts})
        events_->weights_needed(begin, end);
    layer_fwd(slot, l);
    // The router statistics so far: this layer's added, right away (under full recomputation
    // every layer's activations share one buffer).
    if (aux_loss() && sparse(l)) add(ctx_, S.moe_out, S.moe_out, L.moe.stats);
    if (sparse(l))
      moe_.forward_out(ctx_, L.moe, w.moe, full_or(a.tmp));
    else
      mlp_.forward_out(ctx_, L.mlp, w.mlp, full_or(a.tmp));
    reduce_to_local(full_or(a.tmp), a.tmp);          // row-parallel
    const Tensor next = S.resid[layer_pos_[l] + 1];  // layer l's output
    if (l + 1 < end) {
      need(w_.layers[l + 1].ln1);
      add_rmsnorm_fwd(ctx_, next, sp ? a.ln_local : a_->layer(slot, layer_pos_[l + 1]).ln1,
                      a_->layer(slot, layer_pos_[l + 1]).rstd1, L.x_mid, a.tmp,
                      w_.layers[l + 1].ln1, d.eps);
    } else if (head) {
      need(w_.norm);
      add_rmsnorm_fwd(ctx_, next, sp ? a.ln_local : S.lnf, S.rstdf, L.x_mid, a.tmp, w_.norm, d.eps);
    } else {
      add(ctx_, next, L.x_mid, a.tmp);
    }
  }
  if (head) gather_tokens(a.ln_local, S.lnf);  // the LM head sees the whole sequence
}

void DecoderModel::need(const Tensor& w) {
  if (events_ == nullptr) return;
  const Tensor flat = params_.weights_padded();
  const int64_t at = (static_cast<const char*>(w.data) - static_cast<const char*>(flat.data)) /
                     static_cast<int64_t>(dtype_size(dtype_));
  events_->weights_needed(at, at + w.numel());
}

void DecoderModel::layer_fwd(int slot, int64_t l) {
  const ModelDims& d = dims_;
  const bool sp = d.sequence_parallel;
  Acts& a = *a_;
  const LayerWeights& w = w_.layers[l];
  Acts::Layer& L = a_->layer(slot, layer_pos_[l]);
  attn_.forward(ctx_, L.attn, w.attn, L.ln1, attention_input(slot), full_or(a.tmp));
  reduce_to_local(full_or(a.tmp), a.tmp);  // row-parallel: partial sums over the TP ranks' heads
  add_rmsnorm_fwd(ctx_, L.x_mid, sp ? a.ln_local : L.ln2, L.rstd2, resid(slot, l), a.tmp, w.ln2,
                  d.eps);
  gather_tokens(a.ln_local, L.ln2);
  if (sparse(l))
    moe_.forward_in(ctx_, L.moe, w.moe, L.ln2);
  else
    mlp_.forward_in(ctx_, L.mlp, w.mlp, L.ln2);
}

AttentionInput DecoderModel::attention_input(int slot) const {
  const MicroBatchDocs& docs = a_->slots[slot].docs;
  return {.positions = docs.positions.empty() ? a_->positions : docs.positions,
          .docs = docs.doc_start};
}

void DecoderModel::recompute_layer(int slot, int64_t l) {
  const ModelDims& d = dims_;
  const bool full = l < d.recompute_full;
  if (!full && !d.recompute_selective) return;
  const bool sp = d.sequence_parallel;
  Acts& a = *a_;
  const LayerWeights& w = w_.layers[l];
  Acts::Layer& L = a_->layer(slot, layer_pos_[l]);
  // The forward fused this norm into the previous layer's residual add, which normalises the
  // stored sum: the same values as normalising the layer's input here.
  rmsnorm_fwd(ctx_, sp ? a.ln_local : L.ln1, L.rstd1, resid(slot, l), w.ln1, d.eps);
  gather_tokens(a.ln_local, L.ln1);
  if (full) return layer_fwd(slot, l);
  rmsnorm_fwd(ctx_, sp ? a.ln_local : L.ln2, L.rstd2, L.x_mid, w.ln2, d.eps);
  gather_tokens(a.ln_local, L.ln2);
  if (sparse(l))
    moe_.recompute(ctx_, L.moe);
  else
    mlp_.recompute(ctx_, L.mlp);
}

// LM head and cross-entropy chunk by chunk; with `grad`, also the head's backward: dlnf is
// assigned, the LM head gradient accumulated.
void DecoderModel::stage_loss(int slot, Tensor targets, float grad_scale, bool grad,
                              Tensor loss_sum, Tensor moe_sums) {
  TR_ASSERT(dims_.last_stage, "the loss is computed on the last pipeline stage");
  TR_ASSERT(targets.numel() == options_.batch * seq_len_, "stage_loss: a micro-batch's targets");
  Acts& a = *a_;
  const Tensor lnf = a.slots[slot].lnf;
  const int64_t T = options_.batch * seq_len_;
  need(w_.lm_head);
  for (int64_t begin = 0; begin < T; begin += chunk_) {
    const int64_t n = std::min(chunk_, T - begin);
    Tensor logits = a.logits.slice(0, n), losses = a.losses.slice(0, n);
    Tensor x = lnf.slice(begin, n);
    linear_fwd(ctx_, logits, x, w_.lm_head, Tensor());
    chunk_loss(losses, logits, targets.slice(begin, n), grad_scale, grad);
    accumulate_sum(ctx_, loss_sum, losses);  // on the device: no host sync
    if (grad) {
      linear_bwd(ctx_, a.dlnf.slice(begin, n), g_.lm_head, Tensor(), logits, x, w_.lm_head,
                 head_write_);
      head_write_ = GradWrite::add;
    }
  }
  // Vocab-parallel LM head: each rank holds its share of d lnf.
  if (grad) reduce_to_local(a.dlnf, dims_.sequence_parallel ? a.dlnf_local : a.dlnf);
  if (grad && aux_loss()) moe_aux_loss(slot, grad_scale, loss_sum, moe_sums);
}

// The load-balancing loss of the micro-batch in `slot` (Hugging Face's load_balancing_loss_func,
// over the whole model's sparse layers and the micro-batch's N tokens, all CP ranks'): with
// C_e and P_e each expert's routed tokens and probability sum pooled over them,
// aux = E / (N L)^2 sum_e C_e P_e for L sparse layers, and the loss gains coef x aux per token.
// Each CP rank adds its tokens' share of it to the loss sum; each token's probability of expert
// e gets the gradient grad_scale x coef x E C_e / (N L^2) (C has none), which every backward of
// the micro-batch reads.
void DecoderModel::moe_aux_loss(int slot, float grad_scale, Tensor loss_sum, Tensor moe_sums) {
  const ModelDims& d = dims_;
  Acts::Slot& S = a_->slots[slot];
  if (d.cp > 1) cp_group()->all_reduce(S.moe_out, ReduceOp::sum);
  const double E = static_cast<double>(d.moe.experts), L = static_cast<double>(d.moe.sparse_layers);
  const double N = static_cast<double>(options_.batch * options_.seq_len);
  const double T = static_cast<double>(tokens_per_micro_batch());
  const double coef = d.moe.aux_coef;
  moe_aux_loss_fwd(ctx_, a_->aux_value, S.aux_grad, S.moe_out, coef * E * T / (N * N * L * L),
                   static_cast<double>(grad_scale) * coef * E / (N * L * L));
  const Tensor value = a_->aux_value.slice(0, 1);
  accumulate_sum(ctx_, loss_sum, value);
  if (!moe_sums.empty()) {
    accumulate_sum(ctx_, moe_sums.slice(0, 1), value);
    accumulate_sum(ctx_, moe_sums.slice(1, 1), a_->aux_value.slice(1, 1));
  }
}

// One chunk's cross-entropy: in one step on a single rank; with the vocabulary split over TP,
// each rank's statistics of its shard in one pass, all-gathered over TP and combined, then the
// loss and gradient (TR_XENT_3PASS=1: three passes with the row max and the sums all-reduced in
// between).
void DecoderModel::chunk_loss(Tensor losses, Tensor logits, Tensor targets, float grad_scale,
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

void DecoderModel::backward_stage(int slot, Tensor tokens, bool last_of_step, int chunk) {
  backward_pass(slot, tokens, chunk, /*weights=*/true, last_of_step);
}

void DecoderModel::backward_input(int slot, Tensor tokens, int chunk) {
  TR_ASSERT(options_.split_backward, "backward_input needs ModelOptions::split_backward");
  backward_pass(slot, tokens, chunk, /*weights=*/false, /*last_of_step=*/false);
}

void DecoderModel::backward_pass(int slot, Tensor tokens, int chunk, bool weights,
                                 bool last_of_step) {
  const ModelDims& d = dims_;
  const int64_t T = options_.batch * seq_len_;
  Acts& a = *a_;
  Acts::Slot& S = a.slots[slot];
  const int64_t begin = d.chunk_begin(chunk), end = begin + d.chunks[chunk].layers;
  const GradWrite gw = body_write_[chunk];
  if (holds_head(chunk))
    rmsnorm_bwd(ctx_, a.dres, g_.norm, d.sequence_parallel ? a.dlnf_local : a.dlnf,
                stage_output(slot, chunk), w_.norm, S.rstdf, /*accumulate_din=*/false, gw);
  else
    std::swap(a.dres, a.grad_in);  // the received gradient becomes the running one
  // A B pass leaves out the matrices' weight gradients and keeps, in the slot, each linear's
  // output gradient for its W pass; a whole backward computes them from scratch buffers.
  const auto kept = [&](Tensor dy, Tensor store) {
    if (weights) return dy;
    cast(ctx_, store, dy);
    return store;
  };
  // A column-parallel layer's backward: its input gradient into a.dln, reduced over TP (every
  // rank's share of d ln). With parallel.overlap_tp and the weights' gradients in this pass, the
  // reduction runs on the TP group's side lane beside the weight-gradient GEMM, which reads
  // neither of its buffers.
  const bool overlap = weights && options_.overlap_tp && d.tp > 1;
  const auto column_bwd = [&](Tensor dout, Tensor in, Tensor weight, Tensor dw, Tensor db) {
    if (!overlap) {
      gemm_.bwd(ctx_, full_or(a.dln), dw, db, dout, in, weight, gw);
      reduce_to_local(full_or(a.dln), a.dln);
      return;
    }
    Comm::Ticket t = Comm::kDone;
    gemm_.bwd(ctx_, full_or(a.dln), dw, db, dout, in, weight, gw, [&] {
      t = tp::reduce_out_start(tp_group(), d.sequence_parallel, full_or(a.dln), a.dln);
    });
    // wait_all: this is the TP group's one operation beside, and it releases the ticket (a
    // communicator keeps its started tickets until then).
    tp_group()->wait_all();
    if (t != Comm::kDone) ++tp_overlapped_;  // (staged GPU ranks complete it in start)
  };
  const BlockBackward how{gw, weights, kept, column_bwd};
  // A sparse layer's input gradient: the router's and the experts' into a.dln, reduced over TP.
  const MoeBackward moe_how{[&] { return full_or(a.dln); },
                            [&] { reduce_to_local(full_or(a.dln), a.dln); }};
  // The load-balancing loss's gradient per expert: the micro-batch's own on the chunk holding
  // the loss, else the one received with the gradient.
  const Tensor aux_grad = !aux_loss() ? Tensor() : holds_head(chunk) ? S.aux_grad : a.aux_grad_in;
  for (int64_t l = end - 1; l >= begin; --l) {
    const LayerWeights& w = w_.layers[l];
    const LayerWeights& g = g_.layers[l];
    Acts::Layer& L = a_->layer(slot, layer_pos_[l]);
    recompute_layer(slot, l);
    // resid[l + 1] = x_mid + mlp(ln2(x_mid)); dres holds d resid[l + 1].
    if (sparse(l))
      moe_.backward(ctx_, L.moe, w.moe, g.moe, gather_tokens(a.dres, a.full), L.ln2, aux_grad, how,
                    moe_how);  // d ln2
    else
      mlp_.backward(ctx_, L.mlp, w.mlp, g.mlp, gather_tokens(a.dres, a.full), L.ln2, how);
    rmsnorm_bwd(ctx_, a.dres, g.ln2, a.dln, L.x_mid, w.ln2, L.rstd2, /*accumulate_din=*/true, gw);
    // dres now holds d x_mid
    // x_mid = resid[l] + attention(ln1(resid[l]))
    attn_.backward(ctx_, L.attn, w.attn, g.attn, gather_tokens(a.dres, a.full), L.ln1,
                   attention_input(slot), how);  // d ln1
    rmsnorm_bwd(ctx_, a.dres, g.ln1, a.dln, resid(slot, l), w.ln1, L.rstd1,
                /*accumulate_din=*/true, gw);
    // dres now holds d resid[l]
    if (last_of_step) layer_final(l);
  }
  body_write_[chunk] = GradWrite::add;
  if (last_of_step && d.sequence_parallel) layer_norms_summed_ = true;
  if (aux_loss() && !(d.first_stage && chunk == 0)) cast(ctx_, a.aux_grad_out, aux_grad);
  if (d.first_stage && chunk == 0) {
    TR_ASSERT(tokens.numel() == T, "backward_stage: a micro-batch's tokens");
    embedding_bwd(ctx_, g_.embed, gather_tokens(a.dres, a.full), tokens, d.vocab_offset);
  }
}

void DecoderModel::backward_weight(int slot, bool last_of_step, int chunk) {
  TR_ASSERT(options_.split_backward, "backward_weight needs ModelOptions::split_backward");
  const ModelDims& d = dims_;
  const int64_t begin = d.chunk_begin(chunk), end = begin + d.chunks[chunk].layers;
  const GradWrite gw = weight_write_[chunk];
  for (int64_t l = end - 1; l >= begin; --l) {
    const LayerWeights& w = w_.layers[l];
    const LayerWeights& g = g_.layers[l];
    const Acts::Layer& L = a_->layer(slot, layer_pos_[l]);
    recompute_layer(slot, l);  // the GEMMs' inputs that recomputation dropped, again
    if (sparse(l))
      moe_.weight_grads(ctx_, L.moe, w.moe, g.moe, L.ln2, gw);
    else
      mlp_.weight_grads(ctx_, L.mlp, w.mlp, g.mlp, L.ln2, gw);
    attn_.weight_grads(ctx_, L.attn, w.attn, g.attn, L.ln1, gw);
    if (last_of_step) layer_final(l);
  }
  weight_write_[chunk] = GradWrite::add;
  if (last_of_step && d.sequence_parallel) layer_norms_summed_ = true;
}

// Layer l's gradients are final for the step; under sequence parallelism its norms' are once
// summed over TP, here rather than after backward, so that the DP buckets can start now.
void DecoderModel::layer_final(int64_t l) {
  if (dims_.sequence_parallel) {
    tp_sum(g_.layers[l].ln2);
    tp_sum(g_.layers[l].ln1);
  }
  // Weights that serve every head (QK-norm's), each TP rank holding other heads: their
  // gradients are summed over TP with or without sequence parallelism.
  for (const Tensor& t : attn_.replicated_over_heads(g_.layers[l].attn)) tp_sum(t);
  if (events_ != nullptr)
    for (const auto& [begin, end] : {layer_ranges_[l].dense, layer_ranges_[l].experts})
      if (begin < end) events_->grads_final(begin, end);
}

std::vector<float> DecoderModel::logits(int64_t begin, int64_t n) {
  TR_ASSERT(dims_.tp == 1, "logits() returns the whole vocabulary: tp must be 1");
  TR_ASSERT(n <= chunk_ && begin + n <= options_.batch * seq_len_, "logits range too large");
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
