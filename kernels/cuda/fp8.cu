// FP8 on the CUDA backend: the per-tensor scaled cast, bit for bit the host's (kernels/fp8.h),
// and the FP8 product through cuBLASLt (gemm.h). The scale never leaves the device: amax is
// reduced into the workspace, and the encoding kernel derives the scale from it and writes
// scale_inv, which the GEMM reads by pointer.
#include <cuda_fp8.h>

#include <cfloat>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/fp8.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;  // the transposing cast's tile: kTile x kTile elements a block

Fp8Format format_of(DType dt) {
  return dt == DType::f8e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
}

// |x| as bits: for non-negative floats their unsigned order is the values' order, and a NaN's
// bits exceed every number's, so their maximum is the host's fp8_amax, a NaN included.
__device__ __forceinline__ uint32_t abs_bits(float x) {
  return __float_as_uint(x) & 0x7fffffffu;
}

// kernels/fp8.h's fp8_scale: max / amax correctly rounded; 1 for an amax of 0, Inf or NaN;
// FLT_MAX where the quotient overflows.
__device__ __forceinline__ float scale_of(uint32_t amax_bits, Fp8Format f) {
  const float amax = __uint_as_float(amax_bits);
  if (amax == 0.0f || !isfinite(amax)) return 1.0f;
  const float s = __fdiv_rn(fp8_info(f).max, amax);
  return isinf(s) ? FLT_MAX : s;
}

// kernels/fp8.h's fp8_encode of x * scale (the product rounded to fp32). CUDA's saturating
// conversion rounds to nearest even, keeps subnormals and saturates Inf to ±max as the host
// does, but gives a NaN its canonical positive code; the host keeps a NaN's sign, so the sign is
// put back here (the product's sign on every code, as on the host).
__device__ __forceinline__ uint8_t encode(float x, float scale, Fp8Format f) {
  const float y = __fmul_rn(x, scale);
  const uint32_t bits = __float_as_uint(y);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return sign | 0x7f;
  const __nv_fp8_interpretation_t kind = f == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2;
  return sign | static_cast<uint8_t>(__nv_cvt_float_to_fp8(fabsf(y), __NV_SATFINITE, kind));
}

// *amax_bits = max over in[n] of abs_bits (it holds 0 before): each warp's maximum, merged by
// atomicMax (the maximum does not depend on the order). 16-byte loads where `in` allows.
template <class T>
__global__ void amax_kernel(uint32_t* amax_bits, const T* in, int64_t n) {
  constexpr int V = kPack<T>;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t head = reinterpret_cast<uintptr_t>(in) % 16 == 0 ? n / V * V : 0;
  uint32_t m = 0;
  for (int64_t p = first; p < head / V; p += stride) {
    const Pack<T, V> v = load_pack<T, V>(in + p * V);
#pragma unroll
    for (int j = 0; j < V; ++j) m = max(m, abs_bits(to_f(v.v[j])));
  }
  for (int64_t i = head + first; i < n; i += stride) m = max(m, abs_bits(to_f(in[i])));
  m = __reduce_max_sync(0xffffffffu, m);
  if (threadIdx.x % 32 == 0 && m != 0) atomicMax(amax_bits, m);
}

// out[i] = the code of in[i] (n elements), a row-major cast: V inputs loaded and V codes stored
// at once where the pointers allow. Block 0 writes scale_inv.
template <class T>
__global__ void encode_kernel(uint8_t* out, float* scale_inv, const T* in, int64_t n,
                              const uint32_t* amax_bits, Fp8Format f) {
  const float s = scale_of(*amax_bits, f);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = __fdiv_rn(1.0f, s);
  constexpr int V = kPack<T>;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const bool packs =
      reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % V == 0;
  const int64_t head = packs ? n / V * V : 0;
  for (int64_t p = first; p < head / V; p += stride) {
    const Pack<T, V> v = load_pack<T, V>(in + p * V);
    Pack<uint8_t, V> c;
#pragma unroll
    for (int j = 0; j < V; ++j) c.v[j] = encode(to_f(v.v[j]), s, f);
    store_pack(out + p * V, c);
  }
  for (int64_t i = head + first; i < n; i += stride) out[i] = encode(to_f(in[i]), s, f);
}

// One kTile x kTile tile of in [rows, cols]: its codes into out_t [cols, rows] through shared
// memory (reads along in's rows, writes along out_t's, 4 codes a store), and into out
// [rows, cols] when given; block (0, 0) writes scale_inv. Grid: (row tiles, column tiles).
template <class T>
__global__ void encode_transposed_kernel(uint8_t* out, uint8_t* out_t, float* scale_inv,
                                         const T* in, int64_t rows, int64_t cols,
                                         const uint32_t* amax_bits, Fp8Format f) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float s = scale_of(*amax_bits, f);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = __fdiv_rn(1.0f, s);
  const int64_t r0 = blockIdx.x * int64_t{kTile}, c0 = blockIdx.y * int64_t{kTile};
  const int tc = threadIdx.x % kTile;
  for (int i = threadIdx.x / kTile; i < kTile; i += kThreads / kTile) {
    const int64_t r = r0 + i, c = c0 + tc;
    if (r >= rows || c >= cols) continue;
    const uint8_t code = encode(to_f(in[r * cols + c]), s, f);
    tile[i][tc] = code;
    if (out != nullptr) out[r * cols + c] = code;
  }
  __syncthreads();
  // 16 threads a row of out_t's tile (64 codes), 4 codes each.
  const int q = threadIdx.x % 16;
  for (int j = threadIdx.x / 16; j < kTile; j += kThreads / 16) {
    const int64_t c = c0 + j, r = r0 + 4 * q;
    if (c >= cols || r >= rows) continue;
    uint8_t* dst = out_t + c * rows + r;
    if (r + 4 <= rows && reinterpret_cast<uintptr_t>(dst) % 4 == 0) {
      const uint32_t word = tile[4 * q][j] | tile[4 * q + 1][j] << 8 | tile[4 * q + 2][j] << 16 |
                            static_cast<uint32_t>(tile[4 * q + 3][j]) << 24;
      *reinterpret_cast<uint32_t*>(dst) = word;
    } else {
      for (int k = 0; k < 4 && r + k < rows; ++k) dst[k] = tile[4 * q + k][j];
    }
  }
}

}  // namespace

void fp8_cast(Ctx& ctx, Tensor out, Tensor out_t, Tensor scale_inv, Tensor in) {
  const Fp8Format f = format_of(out.empty() ? out_t.dtype : out.dtype);
  const int64_t rows = in.shape[0], cols = in.shape[1], n = rows * cols;
  Workspace ws(ctx, "fp8_cast");
  auto* amax_bits = ws.take<uint32_t>(1);
  CUDA_CHECK(cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream_of(ctx)));
  auto* codes = static_cast<uint8_t*>(out.data);
  const int64_t col_tiles = (cols + kTile - 1) / kTile;
  TR_ASSERT(out_t.empty() || col_tiles <= 65535,
            "fp8_cast: " + std::to_string(cols) + " columns: the transposing cast takes at most " +
                std::to_string(65535 * kTile));
  dispatch_float(in.dtype, "fp8_cast", [&](auto tag) {
    using T = decltype(tag);
    const int blocks = grid_stride_blocks(n / kPack<T> + 1, kThreads);
    amax_kernel<T><<<blocks, kThreads, 0, stream_of(ctx)>>>(amax_bits, in.ptr<T>(), n);
    CUDA_CHECK_LAUNCH();
    if (out_t.empty()) {
      encode_kernel<T><<<blocks, kThreads, 0, stream_of(ctx)>>>(codes, scale_inv.ptr<float>(),
                                                                in.ptr<T>(), n, amax_bits, f);
    } else {
      const dim3 grid(static_cast<unsigned>((rows + kTile - 1) / kTile),
                      static_cast<unsigned>(col_tiles));
      encode_transposed_kernel<T><<<grid, kThreads, 0, stream_of(ctx)>>>(
          codes, static_cast<uint8_t*>(out_t.data), scale_inv.ptr<float>(), in.ptr<T>(), rows, cols,
          amax_bits, f);
    }
    CUDA_CHECK_LAUNCH();
  });
}

// out [M, N] = a [M, K] . b [N, K]^T: row-major out is column-major out^T [N, M] = b . a^T, so
// cuBLASLt's A is b (column-major K x N, transposed: op(A) is N x K), its B is a (column-major
// K x M, not transposed), m = N, n = M, k = K: the "TN" form Hopper's FP8 kernels require, both
// operands K-contiguous. A's scale is b's inverse scale, B's a's; compute and scale type fp32,
// fast accumulation off (gemm.h). C = D (out, bf16 or f32): beta 1 accumulates. The bias
// epilogue takes a bf16 bias on a bf16 out; on an f32 out cuBLASLt wants a bf16 bias (our bias is
// out's dtype), and a bias not 16-byte aligned is outside the epilogue too: those are added apart.
void linear_fp8(Ctx& ctx, Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv,
                Tensor bias, bool accumulate) {
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[0];
  const bool epilogue = !bias.empty() && out.dtype == DType::bf16 && alignment(bias.data) >= 16;
  const GemmKey key{N, M, K, true, false, b.dtype, a.dtype, out.dtype, epilogue, accumulate};
  gemm(ctx, key, b.data, a.data, out.data, epilogue ? bias.data : nullptr, accumulate ? 1.0f : 0.0f,
       GemmScales{b_scale_inv.ptr<float>(), a_scale_inv.ptr<float>()});
  if (!bias.empty() && !epilogue) add_bias_rows(ctx, out, bias);
}

}  // namespace tr::cuda
