// FP8 on the CPU backend, the oracle of the CUDA path: the cast exactly as kernels/fp8.h defines
// it, and the product over the codes' exact values (each product of two FP8 values is exact in
// fp32; the sums round) times the two inverse scales.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/fp8.h"

namespace tr::cpu {
namespace {

Fp8Format format_of(DType dtype) {
  return dtype == DType::f8e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
}

// The elements of a CPU float tensor as fp32.
std::vector<float> as_f32(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::f32) {
    std::copy_n(t.ptr<float>(), out.size(), out.begin());
  } else {
    TR_ASSERT(t.dtype == DType::f64,
              std::string("fp8 on the CPU: f32 or f64, not ") + dtype_name(t.dtype));
    std::transform(t.ptr<double>(), t.ptr<double>() + out.size(), out.begin(),
                   [](double x) { return static_cast<float>(x); });
  }
  return out;
}

// a [M, K] codes as their values (unscaled), in T.
template <class T>
std::vector<T> decoded(const Tensor& a) {
  const Fp8Format f = format_of(a.dtype);
  const auto* codes = static_cast<const uint8_t*>(a.data);
  std::vector<T> out(static_cast<size_t>(a.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(fp8_decode(codes[i], f));
  return out;
}

template <class T>
void linear_fp8_impl(Tensor out, Tensor a, float a_scale_inv, Tensor b, float b_scale_inv,
                     Tensor bias, bool accumulate) {
  const int64_t m = a.dim(0), n = b.dim(0), k = a.dim(1);
  const std::vector<T> av = decoded<T>(a), bv = decoded<T>(b);
  std::vector<T> sum(static_cast<size_t>(m * n));
  gemm(false, true, m, n, k, T(1), av.data(), k, bv.data(), k, T(0), sum.data(), n);
  // The scales as the GPU applies them: one fp32 factor (a's times b's) on the fp32 sums.
  const auto scale = static_cast<T>(a_scale_inv * b_scale_inv);
  T* o = out.ptr<T>();
  const T* bi = bias.empty() ? nullptr : bias.ptr<T>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      T v = sum[static_cast<size_t>(i * n + j)] * scale;
      if (bi != nullptr) v += bi[j];
      o[i * n + j] = accumulate ? o[i * n + j] + v : v;
    }
}

}  // namespace

void fp8_cast(Ctx&, Tensor out, Tensor out_t, Tensor scale_inv, Tensor in) {
  const Fp8Format f = format_of(out.empty() ? out_t.dtype : out.dtype);
  const std::vector<float> x = as_f32(in);
  std::vector<uint8_t> codes(x.size());
  const Fp8Scaling s = fp8_cast_scaled(codes, x, f);
  *scale_inv.ptr<float>() = s.scale_inv;
  if (!out.empty()) std::copy(codes.begin(), codes.end(), static_cast<uint8_t*>(out.data));
  if (out_t.empty()) return;
  const int64_t rows = in.dim(0), cols = in.dim(1);
  auto* t = static_cast<uint8_t*>(out_t.data);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = codes[static_cast<size_t>(r * cols + c)];
}

void linear_fp8(Ctx&, Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv,
                Tensor bias, bool accumulate) {
  dispatch_float(out.dtype, "linear_fp8", [&](auto tag) {
    linear_fp8_impl<decltype(tag)>(out, a, *a_scale_inv.ptr<float>(), b, *b_scale_inv.ptr<float>(),
                                   bias, accumulate);
  });
}

}  // namespace tr::cpu
