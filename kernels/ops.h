// The op set of the decoder models (Qwen2.5, Llama 3, Qwen3): one typed entry point per op,
// implemented by kernels/cpu (fp32 and fp64 reference) and kernels/cuda. Each call dispatches on
// ctx.device and checks shapes, dtypes and devices before running (and records itself on
// Ctx::log when set: kernels/op_log.h).
//
// Gradient rule: backward of a parameter ACCUMULATES (+=) by default, or ASSIGNS (=) when given
// GradWrite::assign (the first micro-batch of a step, so the buffer need not be zeroed first);
// backward of an activation ASSIGNS (=). Each declaration below says which. Notation: T = tokens in
// a micro-batch (batch * seq_len, batch-major), H = hidden size, I = intermediate size, nh/nkv =
// query/KV heads on this rank, hd = head dim. All floating tensors of one call share one dtype (f32
// or f64 on the CPU, f32 or bf16 on CUDA), except saved statistics and per-row losses (rstd, lse,
// losses): those are f64 when the op's tensors are f64 and f32 otherwise, so fp64 finite-difference
// tests stay clean; and parameter gradients (dweight, dtable), which may be f32 under bf16 compute
// (the fp32 gradient buffers accumulate directly).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/ctx.h"
#include "core/tensor.h"
#include "kernels/rope.h"

namespace tr {

// Bytes of the CUDA ops' workspace (cuBLASLt's 32 MiB plus the reductions' and sorts' scratch):
// what a GPU rank's device context takes, and what the planner counts.
inline constexpr size_t kCudaWorkspaceBytes = size_t{256} << 20;

// The dtype of saved statistics and per-row losses (rstd, lse, losses) for ops computing in
// `dtype`: f64 for f64, else f32.
DType stat_dtype(DType dtype);

// How a backward op writes a parameter gradient: added to what the buffer holds, or assigned.
// Assigning gives the same bits as adding to zeros.
enum class GradWrite : uint8_t { add, assign };

// ---- embedding (vocab-parallel ready) ----
// out[T,H] = table[tok - vocab_offset] for tokens inside [vocab_offset, vocab_offset + Vl),
// zero rows otherwise. tokens: i32 [T]; table: [Vl, H].
void embedding_fwd(Ctx& ctx, Tensor out, Tensor tokens, Tensor table, int64_t vocab_offset);
// dtable[Vl,H] += scatter of dout[T,H] rows (ACCUMULATES).
void embedding_bwd(Ctx& ctx, Tensor dtable, Tensor dout, Tensor tokens, int64_t vocab_offset);

// ---- RMSNorm: out = in * rsqrt(mean(in^2) + eps) * weight ----
// out [T,H], rstd [T] (saved for backward; f32, or f64 for f64 ops), in [T,H], weight [H].
void rmsnorm_fwd(Ctx& ctx, Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps);
// din [T,H] ASSIGNED, or ACCUMULATED with accumulate_din (the residual stream's gradient: the
// fused form of rmsnorm_bwd into a temporary and an add); dweight [H] ACCUMULATES (or is
// assigned with GradWrite::assign).
void rmsnorm_bwd(Ctx& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight,
                 Tensor rstd, bool accumulate_din = false, GradWrite dw = GradWrite::add);
// Residual add fused with the next RMSNorm: sum = a + b (ASSIGNED; may alias a), then
// rmsnorm_fwd(out, rstd, sum, weight, eps) on the sum as stored (rounded to its dtype).
void add_rmsnorm_fwd(Ctx& ctx, Tensor sum, Tensor out, Tensor rstd, Tensor a, Tensor b,
                     Tensor weight, float eps);

// ---- linear: out[T,O] = in[T,K] · weight[O,K]^T + bias[O] (bias may be empty) ----
void linear_fwd(Ctx& ctx, Tensor out, Tensor in, Tensor weight, Tensor bias);
// din [T,K] = dout · weight, ASSIGNED (skipped when din is empty);
// dweight [O,K] += dout^T · in and dbias [O] += column sums of dout, ACCUMULATE (or are
// assigned with GradWrite::assign; dbias may be empty; both skipped when dweight is empty).
void linear_bwd(Ctx& ctx, Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in,
                Tensor weight, GradWrite dw = GradWrite::add);
// dbias [O] += column sums of dout [T, O], ACCUMULATE (or assigned with GradWrite::assign):
// linear_bwd's bias gradient on its own, for a product that runs elsewhere (linear_fp8).
void bias_grad(Ctx& ctx, Tensor dbias, Tensor dout, GradWrite dw = GradWrite::add);

// ---- FP8 GEMMs with per-tensor current scaling (kernels/fp8.h: the formats and the cast) ----
// `in` [R, C] (f32, f64 or bf16, not f64 on CUDA; each element taken as fp32) cast to FP8 at the
// current scale: amax = max |in|, scale = fp8_scale(amax) (the format's max / amax), each code
// fp8_encode(x * scale, saturating), into `out` [R, C] and/or its transpose `out_t` [C, R]
// (either may be empty; FP8 dtypes, the same one when both: the format). scale_inv f32 [1] =
// 1 / scale, ASSIGNED on ctx's device: the scale never visits the host.
void fp8_cast(Ctx& ctx, Tensor out, Tensor out_t, Tensor scale_inv, Tensor in);
// out [M, N] = (a [M, K] · b [N, K]^T) * a_scale_inv * b_scale_inv + bias [N], the products of
// the FP8 codes' values summed in fp32 (f64 for an f64 out), ASSIGNED, or added to out with
// `accumulate`. a and b FP8 (K contiguous in both, as Hopper's FP8 tensor cores read them; not
// both E5M2), scale_invs f32 [1] as fp8_cast writes them, out f32, f64 or bf16, bias out's
// dtype or empty. On CUDA (cuBLASLt) K and N are multiples of kFp8GemmAlign and a, b and out
// start at kFp8GemmAlign-byte aligned addresses; the CPU takes any shape.
inline constexpr int64_t kFp8GemmAlign = 16;
void linear_fp8(Ctx& ctx, Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv,
                Tensor bias, bool accumulate = false);

// ---- rotary embedding (Qwen2 / HF "rotate_half": element i pairs with i + hd/2) ----
// In place on x [T, n_heads_total, hd]: heads [0, n_rope_heads) of token t are rotated by
// angle pos * rope.inv_freq(hd)[i] and scaled by rope.attention_factor; the other heads are left
// untouched. pos = t % seq_len, or with `positions` (i32 [L] on ctx's device, L dividing T: the
// positions of one sequence's tokens this rank holds, as under context parallelism)
// positions[t % L], each in [0, seq_len).
void rope_fwd(Ctx& ctx, Tensor x, int n_rope_heads, int seq_len, const Rope& rope,
              Tensor positions = {});
// In place on dx (same layout): the gradient, the inverse rotation with the same scale.
void rope_bwd(Ctx& ctx, Tensor dx, int n_rope_heads, int seq_len, const Rope& rope,
              Tensor positions = {});

// The documents of `tokens` rows of host starts, `rows` to a sequence (the runs of equal starts
// within each sequence's rows): how many, and the rows of the longest.
struct DocCount {
  int64_t count = 0, longest = 0;
};
DocCount count_documents(const int32_t* start, int64_t tokens, int64_t rows);

// Packed documents for block-causal attention (data.document_mask: block_causal): `start` (i32
// on ctx's device, one per query row) holds for each row the position in its sequence where its
// document begins, the same for every row of a document; `host` holds the same starts on the
// host (on the CPU, start's own data), so that a backend counts each call's documents without
// reading the device. Empty: no documents (causal over the whole sequence).
struct DocStarts {
  Tensor start;
  const int32_t* host = nullptr;
  bool empty() const { return start.empty(); }
  // Rows [first, first + n) of both arrays.
  DocStarts slice(int64_t first, int64_t n) const {
    return empty() ? DocStarts{} : DocStarts{start.slice(first, n), host + first};
  }
  // The documents of its rows, a sequence beginning every `period` rows.
  DocCount documents(int64_t period) const { return count_documents(host, start.numel(), period); }
};
// Host starts as the CPU backend's DocStarts (`start` i32 on the CPU).
inline DocStarts host_doc_starts(Tensor start) {
  return {start, start.ptr<int32_t>()};
}
// Attention backwards that ran cuDNN's fast (non-deterministic) algorithm although
// ctx.deterministic asked for the deterministic one (a graph cuDNN could not build so, or a
// ragged batch whose deterministic workspace was too large), since the process began; the
// backend notes each one.
int64_t attention_fast_fallbacks();
void note_attention_fast_fallback();
// Launches of block-causal attention over ragged batches (cuDNN's, one per part of a call's
// documents) since the process began: the trainer logs each step's as attention_ragged.
int64_t attention_ragged_launches();
void note_attention_ragged_launch();

// ---- causal GQA attention, scale hd^-0.5 ----
// qkv [T, (nh + 2*nkv) * hd]: per token the nh query heads, then nkv key heads, then nkv value
// heads (rope already applied). Query head h reads KV head h / (nh / nkv).
// out [T, nh*hd]; lse [batch, nh, seq_len] log-sum-exp of the scaled scores (for backward;
// f32, or f64 for f64 ops).
// Block-causal (documents packed in a sequence): with `docs` (DocStarts: for each token the
// position in its sequence where its document begins), key j of the same sequence is visible to
// query i when docs.start[i] <= j <= i: each document attends only to itself, as if it were a
// sequence of its own. Empty: every earlier key is visible.
void attention_fwd(Ctx& ctx, Tensor out, Tensor lse, Tensor qkv, int batch, int seq_len,
                   int n_heads, int n_kv_heads, int head_dim, DocStarts docs = {});
// dqkv [T, (nh + 2*nkv) * hd] ASSIGNED, from dout [T, nh*hd] and the forward's out, lse, qkv
// (and the forward's docs).
void attention_bwd(Ctx& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv,
                   int batch, int seq_len, int n_heads, int n_kv_heads, int head_dim,
                   DocStarts docs = {});

// ---- attention in blocks (context parallelism: parallel/cp_attention.h) ----
// One query block of a sequence against one key block: q, out [C, nh, hd]; k, v [Ck, nkv, hd];
// lse [nh, C] (f32, or f64 for f64 ops). Every key is visible (the key block lies before the
// query block), or with `causal` (the same block: C == Ck) key j is visible to query i when
// j <= i. out and lse ASSIGNED: the block's partial attention and the log-sum-exp of its scaled
// scores (a query that sees no key of the block: out 0, lse -inf). Block-causal: with `q_docs`
// (the query rows' DocStarts, each a position in the sequence) key j is visible only when
// k_first + j >= q_docs.start[i], the key block starting at position k_first.
void attention_block_fwd(Ctx& ctx, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                         bool causal, DocStarts q_docs = {}, int64_t k_first = 0);
// This block's share of the gradients, given the query rows' merged out and lse (over all their
// blocks) and dout: dq [C, nh, hd], dk, dv [Ck, nkv, hd] ASSIGNED.
void attention_block_bwd(Ctx& ctx, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out,
                         Tensor lse, Tensor q, Tensor k, Tensor v, bool causal,
                         DocStarts q_docs = {}, int64_t k_first = 0);
// (out, lse) becomes the merge of itself with (out2, lse2), both [C, nh, hd] and [nh, C]:
// lse = log(e^lse + e^lse2), out the two weighted by e^(lse_i - lse). The attention over two
// sets of keys from the attention over each.
void attention_merge(Ctx& ctx, Tensor out, Tensor lse, Tensor out2, Tensor lse2);
// q [L, nh, hd], k, v [L, nkv, hd] ASSIGNED from packed rows qkv [L, (nh + 2 nkv) hd].
void qkv_split(Ctx& ctx, Tensor q, Tensor k, Tensor v, Tensor qkv);
// dqkv [L, (nh + 2 nkv) hd] ASSIGNED from dq, dk, dv (the inverse of qkv_split).
void qkv_join(Ctx& ctx, Tensor dqkv, Tensor dq, Tensor dk, Tensor dv);

// Builds what attention of this shape needs before the first step (cuDNN's graphs and their
// workspace on CUDA) and says what it built: the bytes of workspace it holds for it (0 on the
// CPU), and whether the backward is deterministic (on CUDA ctx.deterministic asks for it; cuDNN
// may only build the other mode, with a warning; the CPU's always is). With cp_chunk > 0
// (context parallelism) it builds the graphs of attention_block_fwd/bwd on blocks of cp_chunk
// tokens, causal and not, instead of the whole sequence's (batch and seq_len unused). With
// `documents` (block-causal attention) its ragged graphs' workspace and tables too, so that no
// step grows them.
struct AttentionPlan {
  size_t workspace_bytes = 0;
  bool deterministic_bwd = true;
};
AttentionPlan attention_prepare(Ctx& ctx, int batch, int seq_len, int n_heads, int n_kv_heads,
                                int head_dim, int cp_chunk = 0, bool documents = false);

// ---- SwiGLU: out[T,I] = silu(gate) * up, gateup [T, 2I] = [gate | up] per row ----
void swiglu_fwd(Ctx& ctx, Tensor out, Tensor gateup);
// dgateup [T,2I] ASSIGNED.
void swiglu_bwd(Ctx& ctx, Tensor dgateup, Tensor dout, Tensor gateup);

// ---- mixture of experts (a token's MLP is the weighted sum of k of E experts') ----
// Notation: E experts, k chosen per token, R = T * k routed rows.
// The router's choice from its logits [T, E]: probs [T, E] = softmax(logits) in the statistics'
// dtype (f32, f64 for f64 logits), ASSIGNED; experts i32 [T, k] the k most probable experts of
// each token, most probable first (equal probabilities: the lower expert first); weights [T, k]
// (logits' dtype) their probabilities, divided by their sum when `normalize`; prob_sums and
// routed (statistics' dtype, [E]) ASSIGNED: each expert's probabilities summed over the tokens,
// and how many tokens chose it (the load-balancing loss's two factors).
void moe_router_fwd(Ctx& ctx, Tensor probs, Tensor experts, Tensor weights, Tensor prob_sums,
                    Tensor routed, Tensor logits, bool normalize);
// dlogits [T, E] ASSIGNED: the softmax's backward of dprobs, where dprobs is the top-k weights'
// gradient dweights [T, k] taken back through the normalisation (when `normalize`) to the chosen
// experts' probabilities, plus aux_scale * aux_counts[e] on every expert e of every token (the
// load-balancing loss's gradient; aux_counts [E] in the statistics' dtype, or empty).
void moe_router_bwd(Ctx& ctx, Tensor dlogits, Tensor dweights, Tensor probs, Tensor experts,
                    bool normalize, Tensor aux_counts, double aux_scale);
// Where each (token, choice) goes in the expert-major order of the routed rows: counts i32 [E]
// ASSIGNED, the rows each expert keeps; rows i32 [T, k] ASSIGNED, each choice's row (expert e's
// rows begin after all of experts 0..e-1's, in token order within it), or -1 when dropped. With
// `capacity` > 0 an expert keeps at most that many of its tokens: those of the highest weight
// (equal weights: the earlier token), as Megatron's "probs" drop policy; 0 keeps all (dropless).
void moe_dispatch(Ctx& ctx, Tensor counts, Tensor rows, Tensor experts, Tensor weights,
                  int64_t capacity);
// xs [R, H]: xs[rows[t, j]] = in[t] for every kept choice (rows >= 0), ASSIGNED; other rows of
// xs untouched.
void moe_permute(Ctx& ctx, Tensor xs, Tensor in, Tensor rows);
// din [T, H] = sum over token t's kept choices j of dxs[rows[t, j]]; ASSIGNED (zero for a token
// with none), or ACCUMULATED with `accumulate`.
void moe_permute_bwd(Ctx& ctx, Tensor din, Tensor dxs, Tensor rows, bool accumulate);
// out [T, H] ASSIGNED = sum over token t's kept choices j of weights[t, j] * ys[rows[t, j]]
// (zero for a token with none).
void moe_unpermute(Ctx& ctx, Tensor out, Tensor ys, Tensor weights, Tensor rows);
// Its backward: dys[rows[t, j]] = weights[t, j] * dout[t] for kept choices (other rows of dys
// untouched) and dweights [T, k] = dout[t] . ys[rows[t, j]] (0 for a dropped one); both
// ASSIGNED. dweights and ys may both be empty: dys alone (moe_row_dots and moe_choice_grads
// give dweights without ys).
void moe_unpermute_bwd(Ctx& ctx, Tensor dys, Tensor dweights, Tensor dout, Tensor ys,
                       Tensor weights, Tensor rows);
// The choices' weight gradients without the experts' outputs, in two halves: when ys[r] =
// act[r] . W^T (a down projection, no bias) and dact [R, I] = dys . W with dys from
// moe_unpermute_bwd, dout[t] . ys[r] = act[r] . dact[r] / weights[t, j]. The dot products run
// where the experts' rows are, the division where the token's weights are: under expert
// parallelism the experts send R scalars back instead of keeping their outputs.
// dots [R] ASSIGNED = a[r] . b[r] for a, b [R, I] of one float dtype; dots in its statistics'
// dtype, summed in f32 at least (f64 on the CPU).
void moe_row_dots(Ctx& ctx, Tensor dots, Tensor a, Tensor b);
// dweights [T, k] ASSIGNED = dots[rows[t, j]] / weights[t, j] (dots [R = T k] in the statistics'
// dtype of weights); 0 for a dropped choice or a zero weight, whose gradient the router's
// softmax multiplies by its zero probability anyway.
void moe_choice_grads(Ctx& ctx, Tensor dweights, Tensor dots, Tensor weights, Tensor rows);
// The load-balancing loss from the router statistics stats [2, E] (each expert's probability
// sums, then its routed tokens; statistics' dtype, as are the outputs): value [2] =
// {value_scale * sum_e stats[0, e] * stats[1, e], the imbalance max_e stats[1, e] / mean_e
// stats[1, e] (0 when no token was routed)} and grad [E] = grad_scale * stats[1, e], both
// ASSIGNED.
void moe_aux_loss_fwd(Ctx& ctx, Tensor value, Tensor grad, Tensor stats, double value_scale,
                      double grad_scale);
// Grouped linear (each expert's projection over its rows): rows [o_g, o_g + group_rows[g]) of
// out [R, N] = the same rows of in [R, K] . weights[g] [N, K]^T, o_g the sum of the groups
// before g (host counts; their sum at most R; rows after it untouched; a group may be empty).
void grouped_linear_fwd(Ctx& ctx, Tensor out, Tensor in, std::span<const Tensor> weights,
                        std::span<const int64_t> group_rows);
// Its backward: din [R, K] rows of each group = dout . weights[g], ASSIGNED (skipped when din is
// empty; rows after the groups' untouched); dweights[g] [N, K] += dout_gᵀ . in_g, ACCUMULATED,
// or ASSIGNED with GradWrite::assign, zeros for an empty group (skipped when dweights is
// empty).
void grouped_linear_bwd(Ctx& ctx, Tensor din, std::span<const Tensor> dweights, Tensor dout,
                        Tensor in, std::span<const Tensor> weights,
                        std::span<const int64_t> group_rows, GradWrite dw = GradWrite::add);

// ---- elementwise ----
// out = a + b (out may alias a or b).
void add(Ctx& ctx, Tensor out, Tensor a, Tensor b);
// x *= s.
void scale_(Ctx& ctx, Tensor x, float s);
// x = 0.
void zero_(Ctx& ctx, Tensor x);
// Sum of squares of x, accumulated in double (for the global gradient norm). Deterministic.
// Reads the value back: a host sync.
double sum_squares(Ctx& ctx, Tensor x);
// acc [1] f64 += sum of x, or of its squares, on the device (no host sync). Deterministic: the
// same partial sums in the same order on every call (the step's loss and gradient norm,
// summed on the device and read once per step).
void accumulate_sum(Ctx& ctx, Tensor acc, Tensor x);
void accumulate_sum_squares(Ctx& ctx, Tensor acc, Tensor x);
// acc [1] f64 += the sum of squares of many ranges of x at once (one pass on CUDA: a partial
// per piece, then the pieces' partials in order): `pieces` i64 [n, 3] on ctx's device, made
// once, each {first index, count, counted} with element i at x[i - base]. A piece with counted 0
// is only checked: it adds 0 when its elements are finite and NaN when one is not (a gradient
// norm counts a replicated tensor once, yet sees a NaN in any rank's copy). Deterministic.
void accumulate_sum_squares_pieces(Ctx& ctx, Tensor acc, Tensor x, Tensor pieces, int64_t base);
// The f64 values of `src` (a few, on ctx's device) on the host: one host sync.
void read_f64(Ctx& ctx, Tensor src, double* out);
// dst (on ctx's device) = src (host memory, pinned on CUDA), queued on ctx's stream: no host
// sync; src must not change until the stream has passed the copy.
void upload_async(Ctx& ctx, Tensor dst, Tensor src);
// out = in converted to out's dtype (f32, f64, bf16; round to nearest even), same numel.
void cast(Ctx& ctx, Tensor out, Tensor in);

// ---- cross-entropy on one chunk of logits ----
// logits [C, Vl]: columns >= vocab_valid are vocabulary padding and never win the softmax.
// targets i32 [C], each in [0, vocab_valid) or negative; losses [C] ASSIGNED (f32, or f64
// for f64 logits): logsumexp(row) - row[target], and 0 for an ignored target (whose gradient row
// is 0 too; data.eod_mask_loss ignores the targets after an end-of-document token).
// When compute_grad, logits are overwritten IN PLACE by grad_scale * (softmax(row) - onehot),
// and by 0 in the padding columns.
void cross_entropy_fwd_bwd(Ctx& ctx, Tensor losses, Tensor logits, Tensor targets,
                           int64_t vocab_valid, float grad_scale, bool compute_grad);

// ---- vocab-parallel cross-entropy: the same loss when the vocabulary is split over TP ranks ----
// This rank holds logits [C, Vl] of vocabulary ids [vocab_offset, vocab_offset + Vl); its
// columns >= vocab_valid are padding. The caller combines the statistics over the TP group
// between the three steps (max all-reduced after step 1, sums after step 2), so no rank ever
// holds full-vocabulary logits. Statistics tensors (row_max, sums, losses) are f32 (f64 for f64
// logits).
// 1. row_max [C] ASSIGNED: max over this shard's valid columns (-inf when it has none).
void xent_row_max(Ctx& ctx, Tensor row_max, Tensor logits, int64_t vocab_valid);
// 2. sums [C, 2] ASSIGNED: {sum of exp(logit - row_max) over valid columns, the target's logit
//    when the target is in this shard else 0}; row_max is the global max.
void xent_sums(Ctx& ctx, Tensor sums, Tensor logits, Tensor targets, Tensor row_max,
               int64_t vocab_offset, int64_t vocab_valid);
// 3. losses [C] ASSIGNED: log(sum) + max - target logit, from the global sums and max. When
//    compute_grad, logits are overwritten IN PLACE by grad_scale * (softmax - onehot) (0 on
//    padding columns). An ignored target (negative) gives loss 0 and a gradient row of 0.
void xent_loss_grad(Ctx& ctx, Tensor losses, Tensor logits, Tensor targets, Tensor row_max,
                    Tensor sums, int64_t vocab_offset, int64_t vocab_valid, float grad_scale,
                    bool compute_grad);

// The same loss in two passes over the logits instead of three (the default; TR_XENT_3PASS=1,
// Switch::xent_3pass, selects the three steps above, and the whole-vocabulary loss's three-pass
// kernel, to bisect a GPU failure): each rank's statistics in one pass, gathered over the TP
// group, combined, then step 3.
// 1. stats [C, 3] ASSIGNED, in one pass (online softmax): {m = max over this shard's valid
//    columns (-inf when it has none), the sum of exp(logit - m) over them (0 when none), the
//    target's logit when the target is in this shard else 0}.
void xent_shard_stats(Ctx& ctx, Tensor stats, Tensor logits, Tensor targets, int64_t vocab_offset,
                      int64_t vocab_valid);
// 2. all_stats [tp, C, 3]: every TP rank's stats (the caller all-gathers them). row_max [C] and
//    sums [C, 2] ASSIGNED as xent_row_max with its max all-reduce and xent_sums with its sum
//    all-reduce give them (up to rounding): M = max of the m, {the sum over ranks of
//    sum * exp(m - M), the sum of the target logits}, over the ranks in order (the same bits on
//    every rank). Then step 3, xent_loss_grad.
void xent_combine(Ctx& ctx, Tensor row_max, Tensor sums, Tensor all_stats);

// ---- AdamW (decoupled weight decay), one contiguous range ----
// param, grad, m, v: [n] f32 (f64 also on the CPU). step >= 1 (bias correction). In the order of
// torch.optim.AdamW: param *= 1 - lr*weight_decay; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
// param -= lr * mhat / (sqrt(vhat) + eps) with mhat = m/(1-b1^step), vhat = v/(1-b2^step); i.e.
// param -= lr * (mhat/(sqrt(vhat)+eps) + weight_decay * param_old). m, v updated in place.
struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;
};
// compute_copy (optional, [n], e.g. bf16): receives the updated param in its dtype, in the same
// pass (the weights the next forward computes with).
void adamw_update(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p,
                  Tensor compute_copy = {});
// The same update over a rank's whole range in one launch (multi-tensor AdamW). `pieces` (i64
// [n, 4] on ctx's device, made once) cut the range into runs {first flat index, count, decay
// 0|1, first shard index} that never cross a change of weight decay: element k of a run is
// element flat + k of the flat buffer and element shard + k of the rank's ZeRO-1 shard (the
// same index without ZeRO-1). m and v are indexed in the shard, compute_copy (optional) in the
// flat buffer, param and grad in one or the other as `index` says. Each gradient is first
// multiplied by grad_scale in its own dtype, as scale_ would (global-norm clipping folded in;
// 1 = none). p.weight_decay applies to the pieces with decay.
struct AdamWIndex {
  bool param_in_shard = false, grad_in_shard = false;
};
void adamw_update_pieces(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v,
                         Tensor compute_copy, Tensor pieces, AdamWIndex index, const AdamWParams& p,
                         float grad_scale);
// Most elements in one piece (a CUDA block's work).
inline constexpr int64_t kAdamWPieceElems = int64_t{1} << 16;

// ---- the device behind a context ----
struct DeviceInfo {
  std::string name;        // "cpu", "NVIDIA H100 80GB HBM3"
  double peak_bf16_flops;  // dense bf16 tensor-core peak; 0 when unknown (the CPU)
  double memory_used_mib;  // device memory in use (total - free), 0 on the CPU
  double memory_free_mib;  // device memory free, 0 on the CPU
};
DeviceInfo device_info(const Ctx& ctx);
// Waits until everything queued on ctx's stream has run (no-op on the CPU): a host sync.
void synchronize(const Ctx& ctx);

}  // namespace tr
