// Shared by the CUDA kernels: element types, 16-byte packs, reductions, the workspace carver.
// Internal to kernels/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/ctx.h"
#include "core/tensor.h"
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

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, never more than 8192.
inline int grid_stride_blocks(int64_t n, int threads) {
  return static_cast<int>(std::min<int64_t>(blocks_for(n, threads), 8192));
}

// Deterministic column sums (dweight of RMSNorm, dbias of linear) without atomics, in two
// passes: each of column_chunks(rows) fixed chunks of rows writes its partial sums
// (partial[chunk][col], f32, gridDim.y = chunks), then one ordered sum per column is added
// to the output.
constexpr int kColumnChunks = 128;
inline int column_chunks(int64_t rows) {
  return static_cast<int>(std::min<int64_t>(rows, kColumnChunks));
}
// Pass 1: rows [*begin, *end) of this block's chunk (blockIdx.y of gridDim.y).
__device__ inline void chunk_rows(int64_t rows, int64_t* begin, int64_t* end) {
  const int64_t per = (rows + gridDim.y - 1) / gridDim.y;
  *begin = blockIdx.y * per;
  *end = *begin + per < rows ? *begin + per : rows;
}
// Pass 2: out[j] += sum over chunks of partial[c][j], in chunk order. ACCUMULATES.
template <class G>
__global__ void add_column_partials_kernel(G* out, const float* partial, int chunks, int64_t cols,
                                           bool assign) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= cols) return;
  float acc = 0;
  for (int c = 0; c < chunks; ++c) acc += partial[c * cols + j];
  out[j] = from_f<G>(assign ? acc : to_f(out[j]) + acc);
}
// out += (or, with assign, =) the column sums of the partials.
inline void add_column_partials(const Ctx& ctx, Tensor out, const float* partial, int chunks,
                                const char* op, bool assign) {
  constexpr int kThreads = 256;
  dispatch_float(out.dtype, op, [&](auto tag) {
    using G = decltype(tag);
    add_column_partials_kernel<G>
        <<<blocks_for(out.numel(), kThreads), kThreads, 0, stream_of(ctx)>>>(
            out.ptr<G>(), partial, chunks, out.numel(), assign);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace tr::cuda
