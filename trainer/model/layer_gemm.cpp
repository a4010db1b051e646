#include "trainer/model/layer_gemm.h"

namespace tr {

void LayerGemm::alloc_scratch(Arena& ar, int64_t act, int64_t grad) {
  if (!p_.fp8) return;
  const auto bytes = [&](int64_t n) { return ar.alloc(DType::f8e4m3, {n}); };
  act_ = bytes(act);
  grad_ = bytes(grad);
  grad_t_ = bytes(grad);
  scale_inv_ = ar.alloc(DType::f32, {2});
}

void LayerGemm::alloc_weight_codes(Arena& ar, const void* w, int64_t rows, int64_t cols) {
  if (!p_.fp8) return;
  const DType f = GemmPrecision::kForward;
  WeightCodes c{.codes = ar.alloc(f, {rows, cols}),
                .codes_t = ar.alloc(f, {cols, rows}),
                .scale_inv = ar.alloc(DType::f32, {1})};
  if (w != nullptr) weights_[w] = c;
}

const LayerGemm::WeightCodes& LayerGemm::weight_codes(Ctx& ctx, const Tensor& w) const {
  const auto it = weights_.find(w.data);
  TR_ASSERT(it != weights_.end(), "LayerGemm: a weight without FP8 codes (alloc_weight_codes)");
  WeightCodes& c = it->second;
  if (c.generation != generation_) {
    fp8_cast(ctx, c.codes, c.codes_t, c.scale_inv, w);
    c.generation = generation_;
  }
  return c;
}

Tensor LayerGemm::codes(Tensor buf, DType dtype, int64_t rows, int64_t cols) {
  TR_ASSERT(rows * cols <= buf.numel(), "LayerGemm: an operand beyond its FP8 scratch");
  Tensor t = buf.slice(0, rows * cols).view({rows, cols});
  t.dtype = dtype;
  return t;
}

void LayerGemm::fwd(Ctx& ctx, Tensor out, Tensor in, Tensor w, Tensor b) const {
  if (!p_.fp8) return linear_fwd(ctx, out, in, w, b);
  const Tensor a8 = codes(act_, GemmPrecision::kForward, in.dim(0), in.dim(1));
  const Tensor sa = scale_inv_.slice(0, 1);
  fp8_cast(ctx, a8, Tensor(), sa, in);
  const WeightCodes& w8 = weight_codes(ctx, w);
  linear_fp8(ctx, out, a8, sa, w8.codes, w8.scale_inv, b);
}

void LayerGemm::bwd(Ctx& ctx, Tensor din, Tensor dw, Tensor db, Tensor dout, Tensor in, Tensor w,
                    GradWrite write, const std::function<void()>& between) const {
  if (!p_.fp8) {
    if (!between) return linear_bwd(ctx, din, dw, db, dout, in, w, write);
    if (!din.empty()) linear_bwd(ctx, din, Tensor(), Tensor(), dout, in, w, write);
    between();
    if (!dw.empty()) linear_bwd(ctx, Tensor(), dw, db, dout, in, w, write);
    return;
  }
  // dout [T, O] once for both products: row-major for din's (T x O by O), transposed for dw's
  // (O x T by T); w [O, K] and in [T, K] transposed, each O, T contiguous as the tensor cores
  // read them.
  const int64_t T = dout.dim(0), O = dout.dim(1), K = in.dim(1);
  const Tensor sa = scale_inv_.slice(0, 1), sg = scale_inv_.slice(1, 1);
  const Tensor g8 = din.empty() ? Tensor() : codes(grad_, p_.grad, T, O);
  const Tensor g8t = dw.empty() ? Tensor() : codes(grad_t_, p_.grad, O, T);
  fp8_cast(ctx, g8, g8t, sg, dout);
  if (!din.empty()) {
    const WeightCodes& w8 = weight_codes(ctx, w);
    linear_fp8(ctx, din, g8, sg, w8.codes_t, w8.scale_inv, Tensor());
  }
  if (between) between();
  if (dw.empty()) return;
  const Tensor a8t = codes(act_, GemmPrecision::kForward, K, T);
  fp8_cast(ctx, Tensor(), a8t, sa, in);
  linear_fp8(ctx, dw, g8t, sg, a8t, sa, Tensor(), write == GradWrite::add);
  if (!db.empty()) bias_grad(ctx, db, dout, write);
}

}  // namespace tr
