#include "trainer/model/layer_gemm.h"

namespace tr {

void LayerGemm::alloc_scratch(Arena& ar, int64_t act, int64_t weight, int64_t grad) {
  if (!p_.fp8) return;
  const auto bytes = [&](int64_t n) { return ar.alloc(DType::f8e4m3, {n}); };
  act_ = bytes(act);
  weight_ = bytes(weight);
  grad_ = bytes(grad);
  grad_t_ = bytes(grad);
  scale_inv_ = ar.alloc(DType::f32, {3});
}

Tensor LayerGemm::codes(Tensor buf, DType dtype, int64_t rows, int64_t cols) {
  TR_ASSERT(rows * cols <= buf.numel(), "LayerGemm: an operand beyond its FP8 scratch");
  Tensor t = buf.slice(0, rows * cols).view({rows, cols});
  t.dtype = dtype;
  return t;
}

void LayerGemm::fwd(Ctx& ctx, Tensor out, Tensor in, Tensor w, Tensor b) const {
  if (!p_.fp8) return linear_fwd(ctx, out, in, w, b);
  const DType f = GemmPrecision::kForward;
  const Tensor a8 = codes(act_, f, in.dim(0), in.dim(1)),
               w8 = codes(weight_, f, w.dim(0), w.dim(1));
  const Tensor sa = scale_inv_.slice(0, 1), sw = scale_inv_.slice(1, 1);
  fp8_cast(ctx, a8, Tensor(), sa, in);
  fp8_cast(ctx, w8, Tensor(), sw, w);
  linear_fp8(ctx, out, a8, sa, w8, sw, b);
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
  // (O x T by T); w [O, K] transposed and in [T, K] transposed, each K, T contiguous as the
  // tensor cores read them.
  const DType f = GemmPrecision::kForward;
  const int64_t T = dout.dim(0), O = dout.dim(1), K = in.dim(1);
  const Tensor sa = scale_inv_.slice(0, 1), sw = scale_inv_.slice(1, 1),
               sg = scale_inv_.slice(2, 1);
  const Tensor g8 = din.empty() ? Tensor() : codes(grad_, p_.grad, T, O);
  const Tensor g8t = dw.empty() ? Tensor() : codes(grad_t_, p_.grad, O, T);
  fp8_cast(ctx, g8, g8t, sg, dout);
  if (!din.empty()) {
    const Tensor w8t = codes(weight_, f, K, O);
    fp8_cast(ctx, Tensor(), w8t, sw, w);
    linear_fp8(ctx, din, g8, sg, w8t, sw, Tensor());
  }
  if (between) between();
  if (dw.empty()) return;
  const Tensor a8t = codes(act_, f, K, T);
  fp8_cast(ctx, Tensor(), a8t, sa, in);
  linear_fp8(ctx, dw, g8t, sg, a8t, sa, Tensor(), write == GradWrite::add);
  if (!db.empty()) bias_grad(ctx, db, dout, write);
}

}  // namespace tr
