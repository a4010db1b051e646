// AdamW over f32 master weights, gradients and moments, optionally writing the updated weights'
// bf16 compute copy in the same pass. The multi-tensor kernel (one launch over a rank's pieces)
// computes in fp32 as torch's fused AdamW does, with 16-byte loads and stores where a piece's
// arrays allow them; the per-tensor kernel (TR_ADAMW_PER_TENSOR=1, the first one, kept to
// bisect) in the double arithmetic of the CPU reference (kernels/cpu/adamw.cpp).
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

// The multi-tensor kernel's constants, in fp32.
struct AdamWConstsF {
  float b1, b2, eps, decay, step_size, inv_bc2_sqrt;
};

// One element in fp32: m and v updated, the new weight returned.
__device__ __forceinline__ float adamw_f32(float p, float g, float& m, float& v,
                                           const AdamWConstsF& k, float decay) {
  m = k.b1 * m + (1.0f - k.b1) * g;
  v = k.b2 * v + (1.0f - k.b2) * g * g;
  return p * decay - k.step_size * (m / (sqrtf(v) * k.inv_bc2_sqrt + k.eps));
}

// Multi-tensor AdamW: block b updates piece b ({first flat index, count, decay, first shard
// index}) of the pieces table, each gradient first scaled in fp32 as scale_ does. Four elements
// at a time (16-byte loads and stores) when the piece's weights, gradients and moments start
// 16-byte aligned and its compute copy 4-element aligned; the rest one at a time.
template <class C>
__global__ void adamw_pieces_kernel(float* __restrict__ p, const float* __restrict__ g,
                                    float* __restrict__ m, float* __restrict__ v,
                                    C* __restrict__ copy, const int64_t* __restrict__ pieces,
                                    AdamWIndex index, AdamWConstsF k, float decay_on,
                                    float grad_scale) {
  const int64_t* piece = pieces + 4 * blockIdx.x;
  const int64_t at = piece[0], n = piece[1], in_shard = piece[3];
  const float decay = piece[2] != 0 ? decay_on : 1.0f;
  float* pp = p + (index.param_in_shard ? in_shard : at);
  const float* gp = g + (index.grad_in_shard ? in_shard : at);
  float* mp = m + in_shard;
  float* vp = v + in_shard;
  C* cp = copy != nullptr ? copy + at : nullptr;
  const auto addr = [](const void* q) { return reinterpret_cast<uintptr_t>(q); };
  const bool packed =
      (addr(pp) | addr(gp) | addr(mp) | addr(vp)) % 16 == 0 && addr(cp) % (4 * sizeof(C)) == 0;
  int64_t done = 0;
  if (packed) {
    const int64_t quads = n / 4;
    for (int64_t i = threadIdx.x; i < quads; i += blockDim.x) {
      Pack<float, 4> P = load_pack<float, 4>(pp + 4 * i), M = load_pack<float, 4>(mp + 4 * i),
                     V = load_pack<float, 4>(vp + 4 * i);
      const Pack<float, 4> G = load_pack<float, 4>(gp + 4 * i);
      Pack<C, 4> out;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float gj = grad_scale == 1.0f ? G.v[j] : G.v[j] * grad_scale;
        P.v[j] = adamw_f32(P.v[j], gj, M.v[j], V.v[j], k, decay);
        out.v[j] = from_f<C>(P.v[j]);
      }
      store_pack<float, 4>(pp + 4 * i, P);
      store_pack<float, 4>(mp + 4 * i, M);
      store_pack<float, 4>(vp + 4 * i, V);
      if (cp != nullptr) store_pack<C, 4>(cp + 4 * i, out);
    }
    done = quads * 4;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    const float gi = grad_scale == 1.0f ? gp[i] : gp[i] * grad_scale;
    const float pi = adamw_f32(pp[i], gi, mp[i], vp[i], k, decay);
    pp[i] = pi;
    if (cp != nullptr) cp[i] = from_f<C>(pi);
  }
}

AdamWConstsF consts_f32(const AdamWParams& hp) {
  const double lr = hp.lr, t = static_cast<double>(hp.step);
  return AdamWConstsF{
      hp.beta1,
      hp.beta2,
      hp.eps,
      static_cast<float>(1.0 - lr * hp.weight_decay),
      static_cast<float>(lr / (1.0 - std::pow(static_cast<double>(hp.beta1), t))),
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(hp.beta2), t)))};
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
  const AdamWConstsF k = consts_f32(hp);
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
