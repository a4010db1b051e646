// Context parallelism's kernels around cuDNN's attention on blocks (attention.cpp): the
// log-sum-exp merge of two partial attentions, and the split of packed qkv rows into q, k and v
// (and the join of their gradients back).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 256;

// One block per (query i, head h) row of out [C, nh, hd] and lse [nh, C] (f32): lse becomes
// log(e^lse + e^lse2), out the two partials weighted by e^(lse_i - lse), in f32, rounded once.
// A partial that saw no key (lse -inf) weighs 0.
template <class T>
__global__ void merge_kernel(T* out, float* lse, const T* out2, const float* lse2, int64_t C,
                             int64_t nh, int64_t hd) {
  const int64_t i = blockIdx.x / nh, h = blockIdx.x % nh;
  const float a = lse[h * C + i], b = lse2[h * C + i];
  if (b == -INFINITY) return;
  const float m = fmaxf(a, b);
  const float l = m + logf(expf(a - m) + expf(b - m));
  const float wa = a == -INFINITY ? 0.0f : expf(a - l), wb = expf(b - l);
  T* o = out + (i * nh + h) * hd;
  const T* o2 = out2 + (i * nh + h) * hd;
  for (int64_t e = threadIdx.x; e < hd; e += blockDim.x)
    o[e] = from_f<T>(wa * to_f(o[e]) + wb * to_f(o2[e]));
  __syncthreads();  // every thread has read lse[h * C + i] (the early return is the block's)
  if (threadIdx.x == 0) lse[h * C + i] = l;
}

// Between packed rows [L, (nh + 2 nkv) hd] and q [L, nh, hd], k, v [L, nkv, hd]: element idx of
// the packed rows goes to (or, with kJoin, comes from) its head's tensor.
template <class T, bool kJoin>
__global__ void split_kernel(T* packed, T* q, T* k, T* v, int64_t L, int64_t nh, int64_t nkv,
                             int64_t hd) {
  const int64_t width = (nh + 2 * nkv) * hd;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < L * width;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = idx / width, c = idx % width, head = c / hd, e = c % hd;
    T* part = head < nh         ? q + (t * nh + head) * hd
              : head < nh + nkv ? k + (t * nkv + head - nh) * hd
                                : v + (t * nkv + head - nh - nkv) * hd;
    if (kJoin)
      packed[idx] = part[e];
    else
      part[e] = packed[idx];
  }
}

template <bool kJoin>
void split_or_join(Ctx& ctx, Tensor packed, Tensor q, Tensor k, Tensor v, const char* op) {
  const int64_t L = q.shape[0], nh = q.shape[1], nkv = k.shape[1], hd = q.shape[2];
  dispatch_float(q.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    split_kernel<T, kJoin>
        <<<grid_stride_blocks(packed.numel(), kThreads), kThreads, 0, stream_of(ctx)>>>(
            packed.ptr<T>(), q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), L, nh, nkv, hd);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_merge(Ctx& ctx, Tensor out, Tensor lse, Tensor out2, Tensor lse2) {
  TR_ASSERT(lse.dtype == DType::f32 && lse2.dtype == DType::f32,
            "attention_merge on CUDA: f32 statistics (bf16 or f32 outputs)");
  const int64_t C = out.shape[0], nh = out.shape[1], hd = out.shape[2];
  if (C * nh == 0) return;
  dispatch_float(out.dtype, "attention_merge", [&](auto tag) {
    using T = decltype(tag);
    merge_kernel<T><<<static_cast<unsigned>(C * nh), 64, 0, stream_of(ctx)>>>(
        out.ptr<T>(), lse.ptr<float>(), out2.ptr<T>(), lse2.ptr<float>(), C, nh, hd);
  });
  CUDA_CHECK_LAUNCH();
}

void qkv_split(Ctx& ctx, Tensor q, Tensor k, Tensor v, Tensor qkv) {
  split_or_join<false>(ctx, qkv, q, k, v, "qkv_split");
}

void qkv_join(Ctx& ctx, Tensor dqkv, Tensor dq, Tensor dk, Tensor dv) {
  split_or_join<true>(ctx, dqkv, dq, dk, dv, "qkv_join");
}

}  // namespace tr::cuda
