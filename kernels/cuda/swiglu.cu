// SwiGLU on the packed gate|up output of the gate/up projection: out = silu(gate) * up.
// Each thread handles N consecutive outputs (a 16-byte pack when the row width allows it).
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float g) {
  return 1.0f / (1.0f + __expf(-g));
}

// gateup: [T, 2I] (gate columns [0, I), up columns [I, 2I)); out: [T, I].
// Each thread handles N consecutive columns (one 16-byte pack when I allows it).
template <class T, int N>
__global__ void swiglu_fwd_kernel(T* out, const T* gateup, int64_t tokens, int64_t I) {
  for (int64_t idx = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * N; idx < tokens * I;
       idx += int64_t{gridDim.x} * blockDim.x * N) {
    const int64_t t = idx / I, i = idx % I;
    const Pack<T, N> g = load_pack<T, N>(gateup + t * 2 * I + i),
                     u = load_pack<T, N>(gateup + t * 2 * I + I + i);
    Pack<T, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float gk = to_f(g.v[k]);
      o.v[k] = from_f<T>(gk * sigmoid(gk) * to_f(u.v[k]));
    }
    store_pack<T, N>(out + idx, o);
  }
}

// dgateup: [T, 2I] ASSIGNED: d gate = dout u sig (1 + g (1 - sig)), d up = dout silu(g).
template <class T, int N>
__global__ void swiglu_bwd_kernel(T* dgateup, const T* dout, const T* gateup, int64_t tokens,
                                  int64_t I) {
  for (int64_t idx = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * N; idx < tokens * I;
       idx += int64_t{gridDim.x} * blockDim.x * N) {
    const int64_t t = idx / I, i = idx % I;
    const Pack<T, N> g = load_pack<T, N>(gateup + t * 2 * I + i),
                     u = load_pack<T, N>(gateup + t * 2 * I + I + i),
                     d = load_pack<T, N>(dout + idx);
    Pack<T, N> dg, du;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float gk = to_f(g.v[k]), s = sigmoid(gk), dk = to_f(d.v[k]);
      dg.v[k] = from_f<T>(dk * to_f(u.v[k]) * s * (1.0f + gk * (1.0f - s)));
      du.v[k] = from_f<T>(dk * gk * s);
    }
    store_pack<T, N>(dgateup + t * 2 * I + i, dg);
    store_pack<T, N>(dgateup + t * 2 * I + I + i, du);
  }
}

// Launches kernel<T, N> with 16-byte packs when every row start allows it, else N = 1.
template <class T, class Launch>
void with_packs(int64_t I, std::initializer_list<const void*> ptrs, Launch&& launch) {
  if (packable(I, sizeof(T), ptrs))
    launch(std::integral_constant<int, kPack<T>>{});
  else
    launch(std::integral_constant<int, 1>{});
}

}  // namespace

void swiglu_fwd(Ctx& ctx, Tensor out, Tensor gateup) {
  const int64_t tokens = out.shape[0], I = out.shape[1];
  dispatch_float(out.dtype, "swiglu_fwd", [&](auto tag) {
    using T = decltype(tag);
    with_packs<T>(I, {out.data, gateup.data}, [&](auto n) {
      constexpr int N = decltype(n)::value;
      swiglu_fwd_kernel<T, N>
          <<<grid_stride_blocks(tokens * I / N, kThreads), kThreads, 0, stream_of(ctx)>>>(
              out.ptr<T>(), gateup.ptr<T>(), tokens, I);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void swiglu_bwd(Ctx& ctx, Tensor dgateup, Tensor dout, Tensor gateup) {
  const int64_t tokens = dout.shape[0], I = dout.shape[1];
  dispatch_float(dout.dtype, "swiglu_bwd", [&](auto tag) {
    using T = decltype(tag);
    with_packs<T>(I, {dgateup.data, dout.data, gateup.data}, [&](auto n) {
      constexpr int N = decltype(n)::value;
      swiglu_bwd_kernel<T, N>
          <<<grid_stride_blocks(tokens * I / N, kThreads), kThreads, 0, stream_of(ctx)>>>(
              dgateup.ptr<T>(), dout.ptr<T>(), gateup.ptr<T>(), tokens, I);
    });
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace tr::cuda
