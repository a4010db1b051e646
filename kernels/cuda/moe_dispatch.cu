// moe_dispatch: each (token, choice)'s row in the expert-major order, deterministic. A stable
// radix sort of the choices by expert (CUB) lists each expert's choices in token order, so a
// choice's sorted position is its row (dropless). With a capacity, a second stable sort by
// (expert, weight descending) ranks each expert's choices, the earlier token first on equal
// weights; those ranked past the capacity are dropped, and an exclusive scan of the kept flags
// in expert-major order numbers the kept rows.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <climits>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void iota_kernel(int32_t* out, int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] = static_cast<int32_t>(i);
}

// begin, end [E] (zeroed before): expert e's run [begin[e], end[e]) of the sorted experts.
__global__ void expert_runs_kernel(int32_t* begin, int32_t* end, const uint32_t* sorted, int64_t n,
                                   uint32_t E) {
  const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (p >= n) return;
  const uint32_t e = sorted[p];
  if (e >= E) return;  // outside [0, E): a caller's error, never written out of bounds
  if (p == 0 || sorted[p - 1] != e) begin[e] = static_cast<int32_t>(p);
  if (p == n - 1 || sorted[p + 1] != e) end[e] = static_cast<int32_t>(p + 1);
}

// Dropless: rows[idx[p]] = p, idx the choices in expert-major order.
__global__ void place_rows_kernel(int32_t* rows, const int32_t* idx, int64_t n) {
  const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (p < n) rows[idx[p]] = static_cast<int32_t>(p);
}

// counts [E] ASSIGNED: each expert's run, at most `capacity` when it is > 0.
__global__ void counts_kernel(int32_t* counts, const int32_t* begin, const int32_t* end, int E,
                              int64_t capacity) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  const int64_t n = end[e] - begin[e];
  counts[e] = static_cast<int32_t>(capacity > 0 && n > capacity ? capacity : n);
}

// An unsigned key in the float's order (-0 taken as +0, so that equal weights tie).
__device__ __forceinline__ uint32_t ordered_bits(float f) {
  const uint32_t b = __float_as_uint(f + 0.0f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// keys[i] = expert << 32 | ~ordered(weight): ascending is expert-major, the heaviest first.
template <class T>
__global__ void capacity_keys_kernel(uint64_t* keys, const int32_t* experts, const T* weights,
                                     int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const uint32_t e = static_cast<uint32_t>(experts[i]);
  keys[i] = (uint64_t{e} << 32) | ~ordered_bits(to_f(weights[i]));
}

// keep[idx[p]] = 1 when position p ranks within its expert's capacity, idx the choices sorted
// by (expert, weight descending).
__global__ void keep_kernel(int32_t* keep, const uint64_t* sorted, const int32_t* idx,
                            const int32_t* begin, int64_t n, uint32_t E, int64_t capacity) {
  const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (p >= n) return;
  const uint32_t e = static_cast<uint32_t>(sorted[p] >> 32);
  keep[idx[p]] = e < E && p - begin[e] < capacity;
}

// kept[p] = keep[idx[p]], idx the choices in expert-major order (the scan's input).
__global__ void gather_keep_kernel(int32_t* kept, const int32_t* keep, const int32_t* idx,
                                   int64_t n) {
  const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (p < n) kept[p] = keep[idx[p]];
}

// rows[idx[p]] = the kept choices before p (its row), or -1 for a dropped one.
__global__ void place_kept_kernel(int32_t* rows, const int32_t* idx, const int32_t* kept,
                                  const int32_t* before, int64_t n) {
  const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (p < n) rows[idx[p]] = kept[p] ? before[p] : -1;
}

// Bits that hold the experts 0..E-1 (at least 1).
int expert_bits(int64_t E) {
  int b = 1;
  while ((int64_t{1} << b) < E) ++b;
  return b;
}

// CUB's stable radix sort of (key, value) pairs on the key's bits [0, end_bit); its temporary
// storage from ws.
template <class K>
void sort_pairs(Ctx& ctx, Workspace& ws, const K* keys_in, K* keys_out, const int32_t* vals_in,
                int32_t* vals_out, int n, int end_bit) {
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys_in, keys_out, vals_in, vals_out,
                                             n, 0, end_bit, stream_of(ctx)));
  void* temp = ws.take<char>(static_cast<int64_t>(bytes));
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, keys_in, keys_out, vals_in, vals_out, n,
                                             0, end_bit, stream_of(ctx)));
}

// The capacity rule: rows of the dropped choices -1, the kept ones numbered in expert-major,
// then token, order. sorted_idx: the choices sorted by expert; iota: 0..n-1.
void place_with_capacity(Ctx& ctx, Workspace& ws, Tensor rows, Tensor experts, Tensor weights,
                         const int32_t* iota, const int32_t* sorted_idx, const int32_t* begin,
                         int n, int E, int64_t capacity) {
  const cudaStream_t s = stream_of(ctx);
  const int blocks = blocks_for(n, kThreads);
  uint64_t* keys = ws.take<uint64_t>(n);
  uint64_t* keys_sorted = ws.take<uint64_t>(n);
  int32_t* by_weight = ws.take<int32_t>(n);
  int32_t* keep = ws.take<int32_t>(n);
  int32_t* kept = ws.take<int32_t>(n);
  int32_t* before = ws.take<int32_t>(n);
  dispatch_float(weights.dtype, "moe_dispatch", [&](auto tag) {
    using T = decltype(tag);
    capacity_keys_kernel<T>
        <<<blocks, kThreads, 0, s>>>(keys, experts.ptr<int32_t>(), weights.ptr<T>(), n);
  });
  CUDA_CHECK_LAUNCH();
  sort_pairs<uint64_t>(ctx, ws, keys, keys_sorted, iota, by_weight, n, 32 + expert_bits(E));
  keep_kernel<<<blocks, kThreads, 0, s>>>(keep, keys_sorted, by_weight, begin, n,
                                          static_cast<uint32_t>(E), capacity);
  CUDA_CHECK_LAUNCH();
  gather_keep_kernel<<<blocks, kThreads, 0, s>>>(kept, keep, sorted_idx, n);
  CUDA_CHECK_LAUNCH();
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, kept, before, n, s));
  void* temp = ws.take<char>(static_cast<int64_t>(bytes));
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, kept, before, n, s));
  place_kept_kernel<<<blocks, kThreads, 0, s>>>(rows.ptr<int32_t>(), sorted_idx, kept, before, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

// Experts must lie in [0, E), as the router's do; the GPU does not check (the CPU asserts): one
// outside is counted nowhere and leaves the rows undefined.
void moe_dispatch(Ctx& ctx, Tensor counts, Tensor rows, Tensor experts, Tensor weights,
                  int64_t capacity) {
  const int64_t choices = experts.numel(), E = counts.shape[0];
  TR_ASSERT(choices < INT_MAX && E < INT_MAX, "moe_dispatch: " + std::to_string(choices) +
                                                  " choices of " + std::to_string(E) +
                                                  " experts, more than the i32 rows hold");
  const int n = static_cast<int>(choices);
  const cudaStream_t s = stream_of(ctx);
  Workspace ws(ctx, "moe_dispatch");
  int32_t* begin = ws.take<int32_t>(E);
  int32_t* end = ws.take<int32_t>(E);
  CUDA_CHECK(cudaMemsetAsync(begin, 0, E * sizeof(int32_t), s));
  CUDA_CHECK(cudaMemsetAsync(end, 0, E * sizeof(int32_t), s));
  if (n > 0) {
    int32_t* iota = ws.take<int32_t>(n);
    uint32_t* sorted = ws.take<uint32_t>(n);
    int32_t* sorted_idx = ws.take<int32_t>(n);
    const int blocks = blocks_for(n, kThreads);
    iota_kernel<<<blocks, kThreads, 0, s>>>(iota, n);
    CUDA_CHECK_LAUNCH();
    // As unsigned keys: the sort looks at the bits that hold 0..E-1 only.
    sort_pairs<uint32_t>(ctx, ws, reinterpret_cast<const uint32_t*>(experts.ptr<int32_t>()), sorted,
                         iota, sorted_idx, n, expert_bits(E));
    expert_runs_kernel<<<blocks, kThreads, 0, s>>>(begin, end, sorted, n, static_cast<uint32_t>(E));
    CUDA_CHECK_LAUNCH();
    if (capacity == 0) {
      place_rows_kernel<<<blocks, kThreads, 0, s>>>(rows.ptr<int32_t>(), sorted_idx, n);
      CUDA_CHECK_LAUNCH();
    } else {
      place_with_capacity(ctx, ws, rows, experts, weights, iota, sorted_idx, begin, n,
                          static_cast<int>(E), capacity);
    }
  }
  counts_kernel<<<blocks_for(E, kThreads), kThreads, 0, s>>>(counts.ptr<int32_t>(), begin, end,
                                                             static_cast<int>(E), capacity);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tr::cuda
