// AdamW with decoupled weight decay, in the order of torch.optim.AdamW (single-tensor path):
//   p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// Since the decay uses the old p, this equals p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p).
// Arithmetic is in double; the results are rounded to the tensors' dtype.
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace tr::cpu {
namespace {

// n elements from p, g, m, v: p, m and v updated in place; each gradient first scaled by
// grad_scale in T (as scale_ does; 1 leaves it as it is).
template <class T>
void adamw_range(T* p, const T* g, T* pm, T* pv, int64_t n, const AdamWParams& hp, bool decays,
                 float grad_scale) {
  const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps;
  const double decay = 1.0 - lr * (decays ? hp.weight_decay : 0.0f);
  const double step_size = lr / (1.0 - std::pow(b1, static_cast<double>(hp.step)));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(hp.step)));
  for (int64_t i = 0; i < n; ++i) {
    const double gi = grad_scale == 1.0f ? g[i] : static_cast<T>(g[i] * grad_scale);
    const double mi = b1 * pm[i] + (1.0 - b1) * gi;
    const double vi = b2 * pv[i] + (1.0 - b2) * gi * gi;
    pm[i] = static_cast<T>(mi);
    pv[i] = static_cast<T>(vi);
    p[i] = static_cast<T>(p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps));
  }
}

// param, grad, m, v: [n]; param, m and v updated in place.
template <class T>
void adamw_impl(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& hp) {
  adamw_range(param.ptr<T>(), grad.ptr<T>(), m.ptr<T>(), v.ptr<T>(), param.numel(), hp,
              /*decays=*/true, 1.0f);
}

}  // namespace

void adamw_update_pieces(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v,
                         Tensor compute_copy, Tensor pieces, AdamWIndex index, const AdamWParams& p,
                         float grad_scale) {
  const int64_t* piece = pieces.ptr<int64_t>();
  dispatch_float(param.dtype, "adamw_update_pieces", [&](auto tag) {
    using T = decltype(tag);
    for (int64_t k = 0; k < pieces.dim(0); ++k) {
      const int64_t at = piece[4 * k], n = piece[4 * k + 1], in_shard = piece[4 * k + 3];
      T* pp = param.ptr<T>() + (index.param_in_shard ? in_shard : at);
      adamw_range(pp, grad.ptr<T>() + (index.grad_in_shard ? in_shard : at), m.ptr<T>() + in_shard,
                  v.ptr<T>() + in_shard, n, p, piece[4 * k + 2] != 0, grad_scale);
      if (!compute_copy.empty())
        cpu::cast(ctx, compute_copy.at(at, {n}), Tensor(pp, param.dtype, Device::cpu, {n}));
    }
  });
}

void adamw_update(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p,
                  Tensor compute_copy) {
  dispatch_float(param.dtype, "adamw_update",
                 [&](auto tag) { adamw_impl<decltype(tag)>(param, grad, m, v, p); });
  if (!compute_copy.empty()) cpu::cast(ctx, compute_copy, param);
}

}  // namespace tr::cpu
