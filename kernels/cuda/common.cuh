// Shared by the CUDA kernels: element types, 16-byte packs, reductions, the workspace carver.
// Internal to kernels/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/core/ctx.h"
#include "kernels/core/tensor.h"
#include "kernels/cuda/cuda_check.h"

namespace tr {
template <>
constexpr DType dtype_of<__nv_bfloat16>() {
  return DType::bf16;
}
}  // namespace tr

namespace tr::cuda {

using bf16 = __nv_bfloat16;

inline cudaStream_t stream_of(const Ctx& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

__device__ __forceinline__ float to_f(float x) {
  return x;
}
__device__ __forceinline__ float to_f(bf16 x) {
  return __bfloat162float(x);
}
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

// N elements of T loaded or stored as one access (16 bytes when N * sizeof(T) == 16).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
template <class T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}
template <class T, int N>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}

// Elements per 16-byte pack.
template <class T>
constexpr int kPack = 16 / sizeof(T);

// True when rows of `cols` elements starting at each pointer allow 16-byte packs.
inline bool packable(int64_t cols, int elem_bytes, std::initializer_list<const void*> ptrs) {
  if (cols % (16 / elem_bytes) != 0) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Calls f(T{}) with T = float or bf16 for the tensor dtype; other dtypes are a program error.
template <class F>
void dispatch_float(DType dt, const char* op, F&& f) {
  if (dt == DType::f32) return f(float{});
  if (dt == DType::bf16) return f(bf16{});
  TR_ASSERT(false,
            std::string(op) + ": the CUDA backend computes in f32 or bf16, not " + dtype_name(dt));
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread, in
// a fixed order (deterministic). Safe to call repeatedly in one kernel.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : T(0);
  if (warp == 0) v = warp_sum(v);
  if (threadIdx.x == 0) partial[0] = v;
  __syncthreads();
  v = partial[0];
  __syncthreads();
  return v;
}

// Maximum over the block, returned to every thread (same constraints as block_sum).
__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : -INFINITY;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x == 0) partial[0] = v;
  __syncthreads();
  v = partial[0];
  __syncthreads();
  return v;
}

// Hands out 256-byte aligned pieces of ctx.workspace; running out is a program error that
// names the op and the bytes it needed.
class Workspace {
 public:
  Workspace(const Ctx& ctx, const char* op)
      : base_(static_cast<char*>(ctx.workspace)), size_(ctx.workspace_bytes), op_(op) {}
  template <class T>
  T* take(int64_t count) {
    const size_t bytes = (static_cast<size_t>(count) * sizeof(T) + 255) / 256 * 256;
    TR_ASSERT(base_ != nullptr && used_ + bytes <= size_,
              std::string(op_) + ": needs " + std::to_string(used_ + bytes) +
                  " bytes of workspace, the context has " + std::to_string(size_));
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += bytes;
    return p;
  }

 private:
  char* base_;
  size_t size_, used_ = 0;
  const char* op_;
};

inline int blocks_for(int64_t n, int threads) {
  return static_cast<int>((n + threads - 1) / threads);
}

}  // namespace tr::cuda
