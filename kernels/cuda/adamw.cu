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

// Multi-tensor AdamW: block b updates piece b ({first flat index, count, decay, first shard
// index}) of the pieces table; the arithmetic of adamw_kernel, the gradient first scaled in fp32
// as scale_ does.
template <class C>
__global__ void adamw_pieces_kernel(float* p, const float* g, float* m, float* v, C* copy,
                                    const int64_t* pieces, AdamWIndex index, AdamWConsts k,
                                    double decay_on, float grad_scale) {
  const int64_t* piece = pieces + 4 * blockIdx.x;
  const int64_t at = piece[0], n = piece[1], in_shard = piece[3];
  const double decay = piece[2] != 0 ? decay_on : 1.0;
  float* pp = p + (index.param_in_shard ? in_shard : at);
  const float* gp = g + (index.grad_in_shard ? in_shard : at);
  float* mp = m + in_shard;
  float* vp = v + in_shard;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double gi = grad_scale == 1.0f ? gp[i] : gp[i] * grad_scale;
    const double mi = k.b1 * mp[i] + (1.0 - k.b1) * gi;
    const double vi = k.b2 * vp[i] + (1.0 - k.b2) * gi * gi;
    mp[i] = static_cast<float>(mi);
    vp[i] = static_cast<float>(vi);
    const float pi =
        static_cast<float>(pp[i] * decay - k.step_size * mi / (sqrt(vi) / k.bc2_sqrt + k.eps));
    pp[i] = pi;
    if (copy != nullptr) copy[at + i] = from_f<C>(pi);
  }
}

AdamWConsts consts_of(const AdamWParams& hp) {
  const double lr = hp.lr;
  return AdamWConsts{
      hp.beta1,
      hp.beta2,
      hp.eps,
      1.0 - lr * hp.weight_decay,
      lr / (1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step))),
      std::sqrt(1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step)))};
}

}  // namespace

void adamw_update_pieces(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v,
                         Tensor compute_copy, Tensor pieces, AdamWIndex index,
                         const AdamWParams& hp, float grad_scale) {
  TR_ASSERT(param.dtype == DType::f32,
            "adamw_update_pieces on CUDA: master weights and states are f32, got " +
                std::string(dtype_name(param.dtype)));
  const AdamWConsts k = consts_of(hp);
  const auto blocks = static_cast<unsigned>(pieces.dim(0));
  if (blocks == 0) return;
  if (compute_copy.empty()) {
    adamw_pieces_kernel<float><<<blocks, kThreads, 0, stream_of(ctx)>>>(
        param.ptr<float>(), grad.ptr<float>(), m.ptr<float>(), v.ptr<float>(), nullptr,
        pieces.ptr<int64_t>(), index, k, k.decay, grad_scale);
  } else {
    dispatch_float(compute_copy.dtype, "adamw_update_pieces", [&](auto tag) {
      using C = decltype(tag);
      adamw_pieces_kernel<C><<<blocks, kThreads, 0, stream_of(ctx)>>>(
          param.ptr<float>(), grad.ptr<float>(), m.ptr<float>(), v.ptr<float>(),
          compute_copy.ptr<C>(), pieces.ptr<int64_t>(), index, k, k.decay, grad_scale);
    });
  }
  CUDA_CHECK_LAUNCH();
}

void adamw_update(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& hp,
                  Tensor compute_copy) {
  TR_ASSERT(param.dtype == DType::f32,
            "adamw_update on CUDA: master weights and states are f32, got " +
                std::string(dtype_name(param.dtype)));
  const AdamWConsts k = consts_of(hp);
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
