// RMSNorm: out = in * rstd * weight, rstd = 1 / sqrt(mean(in^2) + eps), per row of H values.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace tr::cpu {
namespace {

// out [T,H], rstd [T] (saved), in [T,H], weight [H].
template <class T>
void rmsnorm_fwd_impl(Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps) {
  const int64_t n_tok = in.dim(0), hidden = in.dim(1);
  const T* x = in.ptr<T>();
  const T* w = weight.ptr<T>();
  T* o = out.ptr<T>();
  T* r = rstd.ptr<T>();
  for (int64_t t = 0; t < n_tok; ++t) {
    const T* xr = x + t * hidden;
    double ss = 0.0;
    for (int64_t h = 0; h < hidden; ++h) ss += static_cast<double>(xr[h]) * xr[h];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(hidden) + eps);
    r[t] = static_cast<T>(rs);
    T* orow = o + t * hidden;
    for (int64_t h = 0; h < hidden; ++h) orow[h] = static_cast<T>(xr[h] * rs * w[h]);
  }
}

// With g = dout * weight: din = rstd * (g - in * rstd^2 * mean(g * in)) ASSIGNED (or added,
// rounded to T first, as rmsnorm_bwd into a temporary plus add would); dweight += sum over rows
// of dout * in * rstd ACCUMULATES (or is assigned).
template <class T>
void rmsnorm_bwd_impl(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight,
                      Tensor rstd, bool accumulate, bool assign_dweight) {
  const int64_t n_tok = in.dim(0), hidden = in.dim(1);
  const T* x = in.ptr<T>();
  const T* w = weight.ptr<T>();
  const T* go = dout.ptr<T>();
  const T* r = rstd.ptr<T>();
  T* dx = din.ptr<T>();
  std::vector<double> dw(hidden, 0.0);  // [H] accumulated in double, added to dweight once
  for (int64_t t = 0; t < n_tok; ++t) {
    const T* xr = x + t * hidden;
    const T* gr = go + t * hidden;
    const double rs = r[t];
    double dot = 0.0;  // sum_h g_h * x_h
    for (int64_t h = 0; h < hidden; ++h) {
      dot += static_cast<double>(gr[h]) * w[h] * xr[h];
      dw[h] += static_cast<double>(gr[h]) * xr[h] * rs;
    }
    const double c = rs * rs * dot / static_cast<double>(hidden);
    T* dxr = dx + t * hidden;
    for (int64_t h = 0; h < hidden; ++h) {
      const T v = static_cast<T>(rs * (static_cast<double>(gr[h]) * w[h] - xr[h] * c));
      dxr[h] = accumulate ? static_cast<T>(dxr[h] + v) : v;
    }
  }
  T* dwp = dweight.ptr<T>();
  for (int64_t h = 0; h < hidden; ++h)
    dwp[h] =
        assign_dweight ? static_cast<T>(dw[h]) : static_cast<T>(dwp[h] + static_cast<T>(dw[h]));
}

}  // namespace

void rmsnorm_fwd(Ctx&, Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps) {
  dispatch_float(in.dtype, "rmsnorm_fwd",
                 [&](auto tag) { rmsnorm_fwd_impl<decltype(tag)>(out, rstd, in, weight, eps); });
}

void rmsnorm_bwd(Ctx&, Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight,
                 Tensor rstd, bool accumulate_din, bool assign_dweight) {
  dispatch_float(in.dtype, "rmsnorm_bwd", [&](auto tag) {
    rmsnorm_bwd_impl<decltype(tag)>(din, dweight, dout, in, weight, rstd, accumulate_din,
                                    assign_dweight);
  });
}

// The reference of the fused op is the two ops: the same bits.
void add_rmsnorm_fwd(Ctx& ctx, Tensor sum, Tensor out, Tensor rstd, Tensor a, Tensor b,
                     Tensor weight, float eps) {
  cpu::add(ctx, sum, a, b);
  cpu::rmsnorm_fwd(ctx, out, rstd, sum, weight, eps);
}

}  // namespace tr::cpu
