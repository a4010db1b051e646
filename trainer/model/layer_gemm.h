// How the transformer layers' projections multiply (train.precision): in the compute dtype, or
// in FP8 with per-tensor current scaling. Each operand is cast just before its product (its amax
// taken then, kernels/ops.h fp8_cast), activations and weights to E4M3, output gradients to the
// gradient format (E5M2 under the hybrid format, Transformer Engine's and torchao's default:
// gradients span more binades than E4M3's range holds). The products run on the codes
// (linear_fp8) into the compute dtype, a weight gradient into its f32 accumulator, so masters,
// gradients and the optimizer are the same as without FP8. The embedding, the LM head, attention
// and the norms stay in the compute dtype.
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>

#include "core/ctx.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace tr {

struct GemmPrecision {
  bool fp8 = false;
  DType grad = DType::f8e5m2;  // the output gradients' FP8 format (f8e4m3 or f8e5m2)
  static constexpr DType kForward = DType::f8e4m3;  // weights and activations
};

class LayerGemm {
 public:
  explicit LayerGemm(GemmPrecision p = {}) : p_(p) {}
  const GemmPrecision& precision() const { return p_; }

  // FP8's scratch, for products whose inputs hold at most `act` elements and output gradients
  // `grad`: the codes of each operand role and their inverse scales. Nothing without FP8.
  void alloc_scratch(Arena& arena, int64_t act, int64_t grad);
  // FP8: the codes, in both layouts, and the inverse scale of the weight [rows, cols] at `w`
  // (null: only measured, for a plan-only model). A weight is cast at its first product after
  // new_weights() and its codes serve every later product, forward and backward, until the
  // next: once a step (Transformer Engine's FP8 weight cache), not once a micro-batch.
  void alloc_weight_codes(Arena& arena, const void* w, int64_t rows, int64_t cols);
  // The weights changed (an optimizer step, a load): each is cast again at its next product.
  void new_weights() { ++generation_; }

  // out [T, O] = in [T, K] . w [O, K]^T + b [O] (b may be empty): linear_fwd's contract.
  void fwd(Ctx& ctx, Tensor out, Tensor in, Tensor w, Tensor b) const;
  // linear_bwd's contract: din = dout . w (skipped when empty); dw and db from dout and in
  // (skipped when dw is empty), written as `write` says. `between`, when set, runs after the
  // input gradient and before the weight gradient (a TP reduction of din started beside it).
  void bwd(Ctx& ctx, Tensor din, Tensor dw, Tensor db, Tensor dout, Tensor in, Tensor w,
           GradWrite write, const std::function<void()>& between = {}) const;

 private:
  // A [rows, cols] view of scratch `buf` holding codes of `dtype`.
  static Tensor codes(Tensor buf, DType dtype, int64_t rows, int64_t cols);

  struct WeightCodes {
    Tensor codes, codes_t, scale_inv;  // [rows, cols], [cols, rows], f32 [1]
    int64_t generation = -1;           // new_weights() count at its cast
  };
  // Weight w's codes, cast first if they are older than the last new_weights().
  const WeightCodes& weight_codes(Ctx& ctx, const Tensor& w) const;

  GemmPrecision p_;
  Tensor act_, grad_, grad_t_;  // codes, as bytes
  Tensor scale_inv_;            // f32 [2]: the activation's, the gradient's
  mutable std::unordered_map<const void*, WeightCodes> weights_;
  int64_t generation_ = 0;
};

}  // namespace tr
