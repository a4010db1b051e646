// SwiGLU: out = silu(gate) * up with silu(g) = g * sigmoid(g); gateup rows are [gate | up].
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace tr::cpu {
namespace {

double sigmoid(double g) {
  return 1.0 / (1.0 + std::exp(-g));
}

// out [T,I], gateup [T,2I].
template <class T>
void swiglu_fwd_impl(Tensor out, Tensor gateup) {
  const int64_t n_tok = out.dim(0), inter = out.dim(1);
  const T* gu = gateup.ptr<T>();
  T* o = out.ptr<T>();
  for (int64_t t = 0; t < n_tok; ++t) {
    const T* gate = gu + t * 2 * inter;
    const T* up = gate + inter;
    for (int64_t i = 0; i < inter; ++i) {
      const double g = gate[i];
      o[t * inter + i] = static_cast<T>(g * sigmoid(g) * up[i]);
    }
  }
}

// dgateup [T,2I] ASSIGNED: dgate = dout * up * silu'(gate), dup = dout * silu(gate), where
// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
template <class T>
void swiglu_bwd_impl(Tensor dgateup, Tensor dout, Tensor gateup) {
  const int64_t n_tok = dout.dim(0), inter = dout.dim(1);
  const T* gu = gateup.ptr<T>();
  const T* go = dout.ptr<T>();
  T* dgu = dgateup.ptr<T>();
  for (int64_t t = 0; t < n_tok; ++t) {
    const T* gate = gu + t * 2 * inter;
    const T* up = gate + inter;
    T* dgate = dgu + t * 2 * inter;
    T* dup = dgate + inter;
    for (int64_t i = 0; i < inter; ++i) {
      const double g = gate[i], s = sigmoid(g), d = go[t * inter + i];
      dgate[i] = static_cast<T>(d * up[i] * s * (1.0 + g * (1.0 - s)));
      dup[i] = static_cast<T>(d * g * s);
    }
  }
}

}  // namespace

void swiglu_fwd(Ctx&, Tensor out, Tensor gateup) {
  dispatch_float(out.dtype, "swiglu_fwd",
                 [&](auto tag) { swiglu_fwd_impl<decltype(tag)>(out, gateup); });
}

void swiglu_bwd(Ctx&, Tensor dgateup, Tensor dout, Tensor gateup) {
  dispatch_float(dout.dtype, "swiglu_bwd",
                 [&](auto tag) { swiglu_bwd_impl<decltype(tag)>(dgateup, dout, gateup); });
}

}  // namespace tr::cpu
