// AdamW over a flat f32 range (master weights, gradients, moments), in the order and double
// arithmetic of the CPU reference (kernels/cpu/adamw.cpp), optionally writing the updated
// weights' bf16 compute copy in the same pass.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 256;

struct AdamWConsts {
  double b1, b2, eps, decay, step_size, bc2_sqrt;
};

template <class C>
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, C* copy, int64_t n,
                             AdamWConsts k) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double gi = g[i];
    const double mi = k.b1 * m[i] + (1.0 - k.b1) * gi;
    const double vi = k.b2 * v[i] + (1.0 - k.b2) * gi * gi;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    const float pi =
        static_cast<float>(p[i] * k.decay - k.step_size * mi / (sqrt(vi) / k.bc2_sqrt + k.eps));
    p[i] = pi;
    if (copy != nullptr) copy[i] = from_f<C>(pi);
  }
}

}  // namespace

void adamw_update(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& hp,
                  Tensor compute_copy) {
  TR_ASSERT(param.dtype == DType::f32,
            "adamw_update on CUDA: master weights and states are f32, got " +
                std::string(dtype_name(param.dtype)));
  const double lr = hp.lr;
  AdamWConsts k{
      hp.beta1,
      hp.beta2,
      hp.eps,
      1.0 - lr * hp.weight_decay,
      lr / (1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step))),
      std::sqrt(1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step)))};
  const int64_t n = param.numel();
  const int grid = grid_stride_blocks(n, kThreads);
  if (compute_copy.empty()) {
    adamw_kernel<float><<<grid, kThreads, 0, stream_of(ctx)>>>(
        param.ptr<float>(), grad.ptr<float>(), m.ptr<float>(), v.ptr<float>(), nullptr, n, k);
  } else {
    dispatch_float(compute_copy.dtype, "adamw_update", [&](auto tag) {
      using C = decltype(tag);
      adamw_kernel<C><<<grid, kThreads, 0, stream_of(ctx)>>>(param.ptr<float>(), grad.ptr<float>(),
                                                             m.ptr<float>(), v.ptr<float>(),
                                                             compute_copy.ptr<C>(), n, k);
    });
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace tr::cuda
