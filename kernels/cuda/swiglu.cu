// SwiGLU on the packed gate|up output of the gate/up projection: out = silu(gate) * up.
// One thread per output element.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float g) {
  return 1.0f / (1.0f + __expf(-g));
}

// gateup: [T, 2I] (gate columns [0, I), up columns [I, 2I)); out: [T, I].
template <class T>
__global__ void swiglu_fwd_kernel(T* out, const T* gateup, int64_t tokens, int64_t I) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < tokens * I;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = idx / I, i = idx % I;
    const float g = to_f(gateup[t * 2 * I + i]), u = to_f(gateup[t * 2 * I + I + i]);
    out[idx] = from_f<T>(g * sigmoid(g) * u);
  }
}

// dgateup: [T, 2I] ASSIGNED: d gate = dout u sig (1 + g (1 - sig)), d up = dout silu(g).
template <class T>
__global__ void swiglu_bwd_kernel(T* dgateup, const T* dout, const T* gateup, int64_t tokens,
                                  int64_t I) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < tokens * I;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = idx / I, i = idx % I;
    const float g = to_f(gateup[t * 2 * I + i]), u = to_f(gateup[t * 2 * I + I + i]);
    const float s = sigmoid(g), d = to_f(dout[idx]);
    dgateup[t * 2 * I + i] = from_f<T>(d * u * s * (1.0f + g * (1.0f - s)));
    dgateup[t * 2 * I + I + i] = from_f<T>(d * g * s);
  }
}

int grid_for(int64_t n) {
  return static_cast<int>(std::min<int64_t>(blocks_for(n, kThreads), 8192));
}

}  // namespace

void swiglu_fwd(Ctx& ctx, Tensor out, Tensor gateup) {
  const int64_t tokens = out.shape[0], I = out.shape[1];
  dispatch_float(out.dtype, "swiglu_fwd", [&](auto tag) {
    using T = decltype(tag);
    swiglu_fwd_kernel<T><<<grid_for(tokens * I), kThreads, 0, stream_of(ctx)>>>(
        out.ptr<T>(), gateup.ptr<T>(), tokens, I);
  });
  CUDA_CHECK_LAUNCH();
}

void swiglu_bwd(Ctx& ctx, Tensor dgateup, Tensor dout, Tensor gateup) {
  const int64_t tokens = dout.shape[0], I = dout.shape[1];
  dispatch_float(dout.dtype, "swiglu_bwd", [&](auto tag) {
    using T = decltype(tag);
    swiglu_bwd_kernel<T><<<grid_for(tokens * I), kThreads, 0, stream_of(ctx)>>>(
        dgateup.ptr<T>(), dout.ptr<T>(), gateup.ptr<T>(), tokens, I);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace tr::cuda
