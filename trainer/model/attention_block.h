// A layer's attention block: q, k and v projection (column-parallel, with biases in qwen2), an
// RMSNorm over each q and k head (QK-norm, qwen3), RoPE, causal attention over each sequence
// (block-causal over packed documents; under context parallelism each sequence over the CP group,
// parallel/cp_attention.h), and the output projection (row-parallel). As with the MLP block
// (mlp_block.h), the model hands it its normed input with the whole sequence and reduces its
// output's partial sums over TP; the norm, the residual stream and the TP regions are the
// model's.
#pragma once

#include <functional>
#include <string>

#include "core/ctx.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/cp_attention.h"
#include "trainer/model/layer_gemm.h"
#include "trainer/model/mlp_block.h"
#include "trainer/model/model_layout.h"
#include "trainer/model/op_lister.h"

namespace tr {

// The block's weights (or their gradients) of one layer.
struct AttentionWeights {
  Tensor qkv_w;           // [(nh + 2 nkv) hd, H]: q_proj, k_proj, v_proj rows back to back
  Tensor qkv_b;           // [(nh + 2 nkv) hd]; empty without q, k, v biases (model.family llama)
  Tensor q_norm, k_norm;  // [hd] each (model.family qwen3); else empty
  Tensor o_w;             // [H, nh hd]
};

// The block's activations of one layer and micro-batch (T tokens: the whole sequence here).
struct AttentionActs {
  Tensor qkv;  // [T, (nh + 2 nkv) hd], rope applied to q and k
  // QK-norm: q [T, nh, hd] and k [T, nkv, hd] before their norms, and each head row's rstd
  // [T nh], [T nkv].
  Tensor q_in, k_in, rstd_q, rstd_k;
  Tensor att;  // [T, nh hd] attention output before o_proj
  Tensor lse;  // [B, nh, S] (under context parallelism each sequence's [2, nh, S / 2])
  // Split backward: the projections' output gradients from the B pass to the W pass ([T, H],
  // [T, (nh + 2 nkv) hd]; the latter in qkv's memory where W does not read qkv again).
  Tensor dy_o, dqkv;
};

// What a micro-batch's attention reads besides its activations: RoPE's position of each token
// (i32; empty: its position in the sequence), and under block-causal attention its documents.
struct AttentionInput {
  Tensor positions;
  DocStarts docs;
};

class AttentionBlock {
 public:
  // A micro-batch of `batch` sequences of `seq_len` tokens (seq_len / cp on this rank).
  // Its projections multiply through `gemm` (the model's; it must outlive the block).
  AttentionBlock(const ModelDims& dims, DType dtype, int64_t batch, int64_t seq_len,
                 const LayerGemm& gemm);

  // The context-parallel group (size dims.cp, ordered by cp_rank); needed when cp > 1.
  void set_cp_comm(Comm* cp) { cp_ = cp; }

  AttentionWeights views(const std::function<Tensor(const std::string& name,
                                                    std::initializer_list<int64_t> shape)>& at,
                         const std::string& prefix) const;
  // Its activations every mode but full recomputation keeps per micro-batch, the split
  // backward's (`fresh_dqkv`: dqkv its own buffer, else qkv's memory), and the scratch shared by
  // every layer and micro-batch (and the CP group's exchange buffers).
  void alloc_kept(Arena& arena, AttentionActs& acts) const;
  void alloc_split(Arena& arena, AttentionActs& acts, bool fresh_dqkv) const;
  void alloc_scratch(Arena& arena);

  // Forward from the normed input `in` [T, H] to the output projection's partial sums in `out`
  // [T, H].
  void forward(Ctx& ctx, const AttentionActs& acts, const AttentionWeights& w, Tensor in,
               const AttentionInput& input, Tensor out) const;
  // Backward from the output gradient `dy` [T, H] (the whole sequence) to the input's, through
  // `how.column` (the q, k, v projection's); `g` the gradients the pass writes.
  void backward(Ctx& ctx, const AttentionActs& acts, const AttentionWeights& w,
                const AttentionWeights& g, Tensor dy, Tensor in, const AttentionInput& input,
                const BlockBackward& how) const;
  // The W pass of a split backward: the weight gradients from the kept output gradients.
  void weight_grads(Ctx& ctx, const AttentionActs& acts, const AttentionWeights& w,
                    const AttentionWeights& g, Tensor in, GradWrite write) const;
  // The weights whose gradients every TP rank computes in full from its own heads (QK-norm's,
  // serving every head): the model sums them over TP once a layer's gradients are final.
  std::vector<Tensor> replicated_over_heads(const AttentionWeights& g) const;

  // Its projections' weights' FP8 codes in `gemm` (LayerGemm::alloc_weight_codes; `w` null for
  // a plan-only model).
  void alloc_weight_codes(Arena& arena, LayerGemm& gemm, const AttentionWeights* w) const;

  // The ops of the above as the model's op list has them (trainer/model/op_list.h), as
  // DenseMlp's.
  void forward_ops(OpLister& ops, const Run& r) const;
  void backward_ops(OpLister& ops, double din, double dweight, double kept) const;
  // Once a step: the projections' weights cast to FP8 (with FP8 projections), and
  // replicated_over_heads' gradients summed over TP (gradients in `grad`).
  void final_ops(OpLister& ops, DType grad) const;

 private:
  void qk_norm_fwd(Ctx& ctx, const AttentionActs& acts, const AttentionWeights& w) const;
  void qk_norm_bwd(Ctx& ctx, const AttentionActs& acts, const AttentionWeights& w,
                   const AttentionWeights& g, GradWrite write) const;
  void attend(Ctx& ctx, const AttentionActs& acts, const AttentionInput& input) const;
  void attend_bwd(Ctx& ctx, const AttentionActs& acts, const AttentionInput& input) const;
  // The widths the op list prices: hidden, qkv rows, attention, RoPE's (q and k heads); and as
  // doubles the tokens, the qkv rows, the q heads' and the k heads' widths.
  struct Widths {
    int64_t H, Q, A, R;
    double t, q, nh, nkv;
  };
  Widths widths() const;
  // The attention op's entry in the op list, forward or backward (per sequence under CP).
  void attention_ops(OpLister& ops, const std::string& name, OpPhase phase, double count,
                     bool backward) const;

  ModelDims d_;
  DType dtype_, sdtype_;
  int64_t batch_, S_, T_;  // sequences; tokens of one here (seq_len / cp); of the micro-batch
  int64_t seq_total_;      // tokens of a whole sequence
  const LayerGemm* gemm_;
  Comm* cp_ = nullptr;
  // Scratch: dqkv and datt; QK-norm's q, k and v split out of the rows (normed, or their
  // gradients) and the gradients of q and k before the norms; under CP one sequence's q, k, v
  // ([S, nh, hd], [S, nkv, hd]) and gradients, and the exchange's buffers.
  Tensor dqkv_, datt_;
  Tensor qn_q_, qn_k_, qn_v_, qn_dq_, qn_dk_;
  Tensor q_, k_, v_, dq_, dk_, dv_;
  CpScratch cp_scratch_;
};

}  // namespace tr
