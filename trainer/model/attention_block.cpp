#include "trainer/model/attention_block.h"

#include "kernels/op_log.h"

namespace tr {

AttentionBlock::AttentionBlock(const ModelDims& dims, DType dtype, int64_t batch, int64_t seq_len,
                               const LayerGemm& gemm)
    : d_(dims),
      dtype_(dtype),
      sdtype_(stat_dtype(dtype)),
      batch_(batch),
      S_(seq_len / dims.cp),
      T_(batch * (seq_len / dims.cp)),
      seq_total_(seq_len),
      gemm_(&gemm) {}

AttentionWeights AttentionBlock::views(
    const std::function<Tensor(const std::string&, std::initializer_list<int64_t>)>& at,
    const std::string& p) const {
  // The fused qkv view starts at q_proj and spans k_proj and v_proj after it (and the biases).
  AttentionWeights w;
  w.qkv_w = at(p + "self_attn/q_proj/weight", {d_.qkv_out(), d_.hidden});
  if (d_.qkv_bias) w.qkv_b = at(p + "self_attn/q_proj/bias", {d_.qkv_out()});
  if (d_.qk_norm) {
    w.q_norm = at(p + "self_attn/q_norm/weight", {d_.head_dim});
    w.k_norm = at(p + "self_attn/k_norm/weight", {d_.head_dim});
  }
  w.o_w = at(p + "self_attn/o_proj/weight", {d_.hidden, d_.heads * d_.head_dim});
  return w;
}

void AttentionBlock::alloc_kept(Arena& ar, AttentionActs& a) const {
  a.qkv = ar.alloc(dtype_, {T_, d_.qkv_out()});
  if (d_.qk_norm) {  // q and k before their norms, and the norms' statistics
    a.q_in = ar.alloc(dtype_, {T_, d_.heads, d_.head_dim});
    a.k_in = ar.alloc(dtype_, {T_, d_.kv_heads, d_.head_dim});
    a.rstd_q = ar.alloc(sdtype_, {T_ * d_.heads});
    a.rstd_k = ar.alloc(sdtype_, {T_ * d_.kv_heads});
  }
  a.att = ar.alloc(dtype_, {T_, d_.heads * d_.head_dim});
  a.lse = ar.alloc(sdtype_, {batch_, d_.heads, S_});
}

void AttentionBlock::alloc_split(Arena& ar, AttentionActs& a, bool fresh_dqkv) const {
  a.dy_o = ar.alloc(dtype_, {T_, d_.hidden});
  a.dqkv = fresh_dqkv ? ar.alloc(dtype_, {T_, d_.qkv_out()}) : a.qkv;
}

void AttentionBlock::alloc_scratch(Arena& ar) {
  const int64_t nh = d_.heads, nkv = d_.kv_heads, hd = d_.head_dim;
  dqkv_ = ar.alloc(dtype_, {T_, d_.qkv_out()});
  if (d_.qk_norm) {
    for (Tensor* t : {&qn_q_, &qn_dq_}) *t = ar.alloc(dtype_, {T_, nh, hd});
    for (Tensor* t : {&qn_k_, &qn_dk_, &qn_v_}) *t = ar.alloc(dtype_, {T_, nkv, hd});
  }
  datt_ = ar.alloc(dtype_, {T_, nh * hd});
  if (d_.cp > 1) {
    for (Tensor* t : {&q_, &dq_}) *t = ar.alloc(dtype_, {S_, nh, hd});
    for (Tensor* t : {&k_, &v_, &dk_, &dv_}) *t = ar.alloc(dtype_, {S_, nkv, hd});
    cp_scratch_ = CpScratch::alloc(ar, d_.cp_exchange, d_.cp, S_, nh, nkv, hd, dtype_,
                                   cp_accumulator_dtype(dtype_));
  }
}

void AttentionBlock::forward(Ctx& ctx, const AttentionActs& a, const AttentionWeights& w, Tensor in,
                             const AttentionInput& input, Tensor out) const {
  gemm_->fwd(ctx, a.qkv, in, w.qkv_w, w.qkv_b);
  if (d_.qk_norm) qk_norm_fwd(ctx, a, w);
  Tensor heads = a.qkv.view({T_, d_.heads + 2 * d_.kv_heads, d_.head_dim});
  rope_fwd(ctx, heads, static_cast<int>(d_.heads + d_.kv_heads), static_cast<int>(seq_total_),
           d_.rope, input.positions);
  attend(ctx, a, input);
  gemm_->fwd(ctx, out, a.att, w.o_w, Tensor());
}

void AttentionBlock::backward(Ctx& ctx, const AttentionActs& a, const AttentionWeights& w,
                              const AttentionWeights& g, Tensor dy, Tensor in,
                              const AttentionInput& input, const BlockBackward& how) const {
  const auto weight_grad = [&](const Tensor& t) { return how.weights ? t : Tensor(); };
  dy = how.keep(dy, a.dy_o);
  gemm_->bwd(ctx, datt_, weight_grad(g.o_w), Tensor(), dy, a.att, w.o_w, how.write);
  attend_bwd(ctx, a, input);
  rope_bwd(ctx, dqkv_.view({T_, d_.heads + 2 * d_.kv_heads, d_.head_dim}),
           static_cast<int>(d_.heads + d_.kv_heads), static_cast<int>(seq_total_), d_.rope,
           input.positions);
  if (d_.qk_norm) qk_norm_bwd(ctx, a, w, g, how.write);
  const Tensor dqkv = how.keep(dqkv_, a.dqkv);  // (qkv is not read after attention's backward)
  how.column(dqkv, in, w.qkv_w, weight_grad(g.qkv_w), weight_grad(g.qkv_b));
}

void AttentionBlock::weight_grads(Ctx& ctx, const AttentionActs& a, const AttentionWeights& w,
                                  const AttentionWeights& g, Tensor in, GradWrite write) const {
  gemm_->bwd(ctx, Tensor(), g.o_w, Tensor(), a.dy_o, a.att, w.o_w, write);
  gemm_->bwd(ctx, Tensor(), g.qkv_w, g.qkv_b, a.dqkv, in, w.qkv_w, write);
}

std::vector<Tensor> AttentionBlock::replicated_over_heads(const AttentionWeights& g) const {
  if (!d_.qk_norm) return {};
  return {g.q_norm, g.k_norm};
}

// QK-norm: each q and k head of the qkv rows normed in place, before RoPE; its backward on dqkv
// (after RoPE's).
void AttentionBlock::qk_norm_fwd(Ctx& ctx, const AttentionActs& a,
                                 const AttentionWeights& w) const {
  const int64_t hd = d_.head_dim, q = T_ * d_.heads, k = T_ * d_.kv_heads;
  qkv_split(ctx, a.q_in, a.k_in, qn_v_, a.qkv);
  rmsnorm_fwd(ctx, qn_q_.view({q, hd}), a.rstd_q, a.q_in.view({q, hd}), w.q_norm, d_.eps);
  rmsnorm_fwd(ctx, qn_k_.view({k, hd}), a.rstd_k, a.k_in.view({k, hd}), w.k_norm, d_.eps);
  qkv_join(ctx, a.qkv, qn_q_, qn_k_, qn_v_);
}

void AttentionBlock::qk_norm_bwd(Ctx& ctx, const AttentionActs& a, const AttentionWeights& w,
                                 const AttentionWeights& g, GradWrite gw) const {
  const int64_t hd = d_.head_dim, q = T_ * d_.heads, k = T_ * d_.kv_heads;
  qkv_split(ctx, qn_q_, qn_k_, qn_v_, dqkv_);  // d(normed q), d(normed k), dv
  rmsnorm_bwd(ctx, qn_dq_.view({q, hd}), g.q_norm, qn_q_.view({q, hd}), a.q_in.view({q, hd}),
              w.q_norm, a.rstd_q, /*accumulate_din=*/false, gw);
  rmsnorm_bwd(ctx, qn_dk_.view({k, hd}), g.k_norm, qn_k_.view({k, hd}), a.k_in.view({k, hd}),
              w.k_norm, a.rstd_k, /*accumulate_din=*/false, gw);
  qkv_join(ctx, dqkv_, qn_dq_, qn_dk_, qn_v_);
}

// Attention over the micro-batch: the whole sequence here, or (cp > 1) each sequence over the CP
// group: one sequence's q, k and v split out of the packed qkv rows and its dq, dk, dv joined
// back into dqkv; out and lse are already one sequence's contiguous block (lse in
// cp_attention's chunk-major order).
void AttentionBlock::attend(Ctx& ctx, const AttentionActs& a, const AttentionInput& in) const {
  const int nh = static_cast<int>(d_.heads), nkv = static_cast<int>(d_.kv_heads),
            hd = static_cast<int>(d_.head_dim);
  if (d_.cp == 1)
    return attention_fwd(ctx, a.att, a.lse, a.qkv, static_cast<int>(batch_), static_cast<int>(S_),
                         nh, nkv, hd, in.docs);
  TR_ASSERT(cp_ != nullptr && cp_->size() == d_.cp, "context parallelism needs set_cp_comm()");
  for (int64_t b = 0; b < batch_; ++b) {
    qkv_split(ctx, q_, k_, v_, a.qkv.slice(b * S_, S_));
    const OpLog::Compound op(ctx, {"cp_attention_fwd", S_, int64_t{nh} * hd, seq_total_});
    cp_attention_fwd(ctx, *cp_, d_.cp_exchange, cp_scratch_,
                     a.att.slice(b * S_, S_).view({S_, nh, hd}), a.lse.slice(b, 1), q_, k_, v_,
                     seq_total_, in.docs.slice(b * S_, S_));
  }
}

void AttentionBlock::attend_bwd(Ctx& ctx, const AttentionActs& a, const AttentionInput& in) const {
  const int nh = static_cast<int>(d_.heads), nkv = static_cast<int>(d_.kv_heads),
            hd = static_cast<int>(d_.head_dim);
  if (d_.cp == 1)
    return attention_bwd(ctx, dqkv_, datt_, a.att, a.lse, a.qkv, static_cast<int>(batch_),
                         static_cast<int>(S_), nh, nkv, hd, in.docs);
  TR_ASSERT(cp_ != nullptr && cp_->size() == d_.cp, "context parallelism needs set_cp_comm()");
  for (int64_t b = 0; b < batch_; ++b) {
    qkv_split(ctx, q_, k_, v_, a.qkv.slice(b * S_, S_));
    {  // one op on the model's list, whatever blocks it runs
      const OpLog::Compound op(ctx, {"cp_attention_bwd", S_, int64_t{nh} * hd, seq_total_});
      cp_attention_bwd(ctx, *cp_, d_.cp_exchange, cp_scratch_, dq_, dk_, dv_,
                       datt_.slice(b * S_, S_).view({S_, nh, hd}),
                       a.att.slice(b * S_, S_).view({S_, nh, hd}), a.lse.slice(b, 1), q_, k_, v_,
                       seq_total_, in.docs.slice(b * S_, S_));
    }
    qkv_join(ctx, dqkv_.slice(b * S_, S_), dq_, dk_, dv_);
  }
}

void AttentionBlock::alloc_weight_codes(Arena& ar, LayerGemm& gemm,
                                        const AttentionWeights* w) const {
  const auto [H, Q, A, R, T, q, nh, nkv] = widths();
  gemm.alloc_weight_codes(ar, w ? w->qkv_w.data : nullptr, Q, H);
  gemm.alloc_weight_codes(ar, w ? w->o_w.data : nullptr, H, A);
}

void AttentionBlock::final_ops(OpLister& ops, DType grad) const {
  const auto [H, Q, A, R, T, q, nh, nkv] = widths();
  ops.weight_cast("qkv projection", Q, H);
  ops.weight_cast("attention output projection", H, A);
  if (d_.tp == 1 || !d_.qk_norm) return;
  for (const char* name : {"qk-norm: q gradient summed", "qk-norm: k gradient summed"})
    ops.collective(name, OpPhase::backward, OpPlace::layers, 1, "tp", CommOp::all_reduce,
                   Lane::in_order, d_.head_dim, 1, grad);
}

AttentionBlock::Widths AttentionBlock::widths() const {
  Widths w;
  w.H = d_.hidden;
  w.Q = d_.qkv_out();
  w.A = d_.heads * d_.head_dim;
  w.R = (d_.heads + d_.kv_heads) * d_.head_dim;
  w.t = static_cast<double>(T_);
  w.q = static_cast<double>(w.Q);
  w.nh = static_cast<double>(w.A);
  w.nkv = static_cast<double>(d_.kv_heads * d_.head_dim);
  return w;
}

void AttentionBlock::forward_ops(OpLister& ops, const Run& r) const {
  const auto [H, Q, A, R, T, q, nh, nkv] = widths();
  const OpPlace layers = OpPlace::layers;
  ops.linear_fwd("qkv projection: forward" + r.suffix, r.phase, layers, r.count, T_, Q, H);
  if (d_.qk_norm) {  // q and k split out of the rows, each head normed, joined back
    ops.pass("qk-norm: split" + r.suffix, "qkv_split", r.phase, layers, r.count, T_, Q, 2 * q * T);
    ops.pass("qk-norm: q forward" + r.suffix, "rmsnorm_fwd", r.phase, layers, r.count,
             T_ * d_.heads, d_.head_dim, 2 * nh * T);
    ops.pass("qk-norm: k forward" + r.suffix, "rmsnorm_fwd", r.phase, layers, r.count,
             T_ * d_.kv_heads, d_.head_dim, 2 * nkv * T);
    ops.pass("qk-norm: join" + r.suffix, "qkv_join", r.phase, layers, r.count, T_, Q, 2 * q * T);
  }
  ops.pass("rope: forward" + r.suffix, "rope_fwd", r.phase, layers, r.count, T_, R,
           2.0 * static_cast<double>(R) * T);
  attention_ops(ops, "attention: forward" + r.suffix, r.phase, r.count, false);
  ops.linear_fwd("attention output projection: forward" + r.suffix, r.phase, layers, r.count, T_, H,
                 A);
}

void AttentionBlock::backward_ops(OpLister& ops, double din, double dweight, double kept) const {
  const auto [H, Q, A, R, T, q, nh, nkv] = widths();
  const OpPhase bwd = OpPhase::backward;
  const OpPlace layers = OpPlace::layers;
  ops.pass("attention output projection: output gradient kept", "cast", bwd, layers, kept, T_, H,
           2.0 * static_cast<double>(H) * T);
  ops.linear_bwd("attention output projection", layers, bwd, din, dweight, T_, H, A);
  attention_ops(ops, "attention: backward", bwd, din, true);
  ops.pass("rope: backward", "rope_bwd", bwd, layers, din, T_, R, 2.0 * static_cast<double>(R) * T);
  if (d_.qk_norm) {
    ops.pass("qk-norm: split gradients", "qkv_split", bwd, layers, din, T_, Q, 2 * q * T);
    ops.pass("qk-norm: q backward", "rmsnorm_bwd", bwd, layers, din, T_ * d_.heads, d_.head_dim,
             kNormBwdElems * nh * T);
    ops.pass("qk-norm: k backward", "rmsnorm_bwd", bwd, layers, din, T_ * d_.kv_heads, d_.head_dim,
             kNormBwdElems * nkv * T);
    ops.pass("qk-norm: join gradients", "qkv_join", bwd, layers, din, T_, Q, 2 * q * T);
  }
  ops.pass("qkv projection: output gradient kept", "cast", bwd, layers, kept, T_, Q, 2 * q * T);
  ops.linear_bwd("qkv projection", layers, bwd, din, dweight, T_, Q, H, /*column_parallel=*/true,
                 /*bias=*/d_.qkv_bias);
}

void AttentionBlock::attention_ops(OpLister& ops, const std::string& name, OpPhase phase,
                                   double count, bool backward) const {
  const char* kernel = backward ? "attention_bwd" : "attention_fwd";
  const int64_t A = d_.heads * d_.head_dim, Q = d_.qkv_out();
  if (d_.cp == 1) return ops.attention(name, kernel, phase, count, T_, A, S_, backward);
  // Each sequence: its q, k and v split out of the rows, the CP group's attention, and in the
  // backward dq, dk and dv joined back.
  const double n = count * static_cast<double>(batch_), q = static_cast<double>(Q),
               rows = static_cast<double>(S_);
  ops.pass("attention: split q, k, v", "qkv_split", phase, OpPlace::layers, n, S_, Q, 2 * q * rows);
  ops.attention(name, backward ? "cp_attention_bwd" : "cp_attention_fwd", phase, n, S_, A,
                seq_total_, backward);
  // What it sends (parallel/cp_attention.h): K and V gathered from every rank, or passed once
  // round the ring beside the blocks' attention; in the backward also dK and dV
  // reduce-scattered home, or passed round the ring after each block.
  const int64_t cp = d_.cp, kv = d_.kv_heads * d_.head_dim;
  const DType acc = cp_accumulator_dtype(dtype_);
  const auto comm = [&](const char* what, double times, CommOp::Kind kind, Lane lane, int64_t rows,
                        int64_t width, DType dtype) {
    ops.collective(name + ": " + what, phase, OpPlace::layers, n * times, "cp", kind, lane, rows,
                   width, dtype);
  };
  if (d_.cp_exchange == CpExchange::all_gather) {
    comm("k, v gathered", 2, CommOp::all_gather, Lane::in_order, cp * S_, kv, dtype_);
    if (backward)
      comm("dk, dv reduce-scattered", 2, CommOp::reduce_scatter, Lane::in_order, cp * S_, kv, acc);
  } else {
    comm("k, v passed on", static_cast<double>(cp - 1), CommOp::exchange, Lane::beside, 2 * S_ * kv,
         1, dtype_);
    if (backward)
      comm("dk, dv passed on", static_cast<double>(cp), CommOp::exchange, Lane::in_order,
           2 * S_ * kv, 1, acc);
  }
  if (backward)
    ops.pass("attention: join dq, dk, dv", "qkv_join", phase, OpPlace::layers, n, S_, Q,
             2 * q * rows);
}

}  // namespace tr
