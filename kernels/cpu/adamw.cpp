// AdamW with decoupled weight decay, in the order of torch.optim.AdamW (single-tensor path):
//   p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// Since the decay uses the old p, this equals p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p).
// Arithmetic is in double; the results are rounded to the tensors' dtype.
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace tr::cpu {
namespace {

// param, grad, m, v: [n]; param, m and v updated in place.
template <class T>
void adamw_impl(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& hp) {
  const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps;
  const double decay = 1.0 - lr * hp.weight_decay;
  const double step_size = lr / (1.0 - std::pow(b1, static_cast<double>(hp.step)));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(hp.step)));
  T* p = param.ptr<T>();
  const T* g = grad.ptr<T>();
  T* pm = m.ptr<T>();
  T* pv = v.ptr<T>();
  for (int64_t i = 0, n = param.numel(); i < n; ++i) {
    const double gi = g[i];
    const double mi = b1 * pm[i] + (1.0 - b1) * gi;
    const double vi = b2 * pv[i] + (1.0 - b2) * gi * gi;
    pm[i] = static_cast<T>(mi);
    pv[i] = static_cast<T>(vi);
    p[i] = static_cast<T>(p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps));
  }
}

}  // namespace

void adamw_update(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p,
                  Tensor compute_copy) {
  dispatch_float(param.dtype, "adamw_update",
                 [&](auto tag) { adamw_impl<decltype(tag)>(param, grad, m, v, p); });
  if (!compute_copy.empty()) cpu::cast(ctx, compute_copy, param);
}

}  // namespace tr::cpu
