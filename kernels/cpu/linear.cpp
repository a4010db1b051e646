// Linear layer through cblas GEMMs: out[T,O] = in[T,K] · weight[O,K]^T + bias[O].
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_ops.h"

namespace tr::cpu {
namespace {

// out [T,O] ASSIGNED; bias [O] may be empty.
template <class T>
void linear_fwd_impl(Tensor out, Tensor in, Tensor weight, Tensor bias) {
  const int64_t n_tok = in.dim(0), k = in.dim(1), n_out = weight.dim(0);
  T* o = out.ptr<T>();
  T beta = 0;
  if (!bias.empty()) {  // seed every row with the bias, then accumulate the product onto it
    const T* b = bias.ptr<T>();
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t j = 0; j < n_out; ++j) o[t * n_out + j] = b[j];
    beta = 1;
  }
  gemm(false, true, n_tok, n_out, k, T(1), in.ptr<T>(), k, weight.ptr<T>(), k, beta, o, n_out);
}

// dbias [O] += column sums of dout [T,O] (summed in f64), or assigned.
template <class T>
void bias_grad_impl(Tensor dbias, Tensor dout, bool assign) {
  const int64_t n_tok = dout.dim(0), n_out = dout.dim(1);
  const T* g = dout.ptr<T>();
  std::vector<double> sums(n_out, 0.0);  // [O]
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t j = 0; j < n_out; ++j) sums[j] += g[t * n_out + j];
  T* db = dbias.ptr<T>();
  for (int64_t j = 0; j < n_out; ++j)
    db[j] = assign ? static_cast<T>(sums[j]) : static_cast<T>(db[j] + static_cast<T>(sums[j]));
}

// din [T,K] = dout · weight ASSIGNED (skipped when empty); dweight [O,K] += dout^T · in and
// dbias [O] += column sums of dout ACCUMULATE, or are assigned (dbias may be empty).
template <class T>
void linear_bwd_impl(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in,
                     Tensor weight, bool assign) {
  const int64_t n_tok = in.dim(0), k = in.dim(1), n_out = weight.dim(0);
  const T* g = dout.ptr<T>();
  if (!din.empty())
    gemm(false, false, n_tok, k, n_out, T(1), g, n_out, weight.ptr<T>(), k, T(0), din.ptr<T>(), k);
  if (dweight.empty()) return;  // the input gradient only (a split backward's B pass)
  gemm(true, false, n_out, k, n_tok, T(1), g, n_out, in.ptr<T>(), k, T(assign ? 0 : 1),
       dweight.ptr<T>(), k);
  if (!dbias.empty()) bias_grad_impl<T>(dbias, dout, assign);
}

}  // namespace

void linear_fwd(Ctx&, Tensor out, Tensor in, Tensor weight, Tensor bias) {
  dispatch_float(in.dtype, "linear_fwd",
                 [&](auto tag) { linear_fwd_impl<decltype(tag)>(out, in, weight, bias); });
}

void linear_bwd(Ctx&, Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in,
                Tensor weight, bool assign_dweight) {
  dispatch_float(in.dtype, "linear_bwd", [&](auto tag) {
    linear_bwd_impl<decltype(tag)>(din, dweight, dbias, dout, in, weight, assign_dweight);
  });
}

void bias_grad(Ctx&, Tensor dbias, Tensor dout, bool assign_dweight) {
  dispatch_float(dout.dtype, "bias_grad",
                 [&](auto tag) { bias_grad_impl<decltype(tag)>(dbias, dout, assign_dweight); });
}

}  // namespace tr::cpu
