// Cross-entropy over one chunk of LM-head logits, in place: the loss per row and, on request,
// the gradient written over the logits (so no fp32 copy of the logits exists). One block per
// row; statistics in f32 whatever the logits' dtype. The vocab-parallel steps (row max, sums,
// loss and gradient) let the caller reduce the statistics over TP ranks between them.
//
// Every thread reads what it needs of a row (the target's logit) before the block's first
// barrier and writes only its own columns after the last, so the in-place gradient never races
// with a read.
//
// The whole-vocabulary loss (tp 1) is fused: one pass keeps each thread's running max and sum
// of exponentials (online softmax) over 16-byte loads, the block combines them, and a second
// pass writes the gradient with 16-byte stores: two reads and one write of the logits instead
// of three reads and one write. The vocab-parallel loss (tp > 1) reads its shard once for the
// same statistics (xent_shard_stats), the caller gathers them over TP (xent_combine), and the
// gradient pass writes 16-byte packs too. TR_XENT_3PASS=1 selects the first kernels (max, sum,
// gradient in three scalar passes) to bisect a GPU failure until the new ones have run on one.
#include <string>
#include <type_traits>

#include "core/switches.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 512;

template <class T>
__device__ float local_max(const T* x, int64_t valid) {
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, to_f(x[j]));
  return block_max(m);
}

template <class T>
__device__ float local_sum_exp(const T* x, int64_t valid, float m) {
  float s = 0;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) s += expf(to_f(x[j]) - m);
  return block_sum(s);
}

// x := grad_scale * (exp(x - lse) - onehot(local_target)) on valid columns, 0 on padding.
template <class T>
__device__ void write_grad(T* x, int64_t cols, int64_t valid, float lse, int64_t local_target,
                           float grad_scale) {
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = j < valid
                        ? grad_scale * (expf(to_f(x[j]) - lse) - (j == local_target ? 1.0f : 0.0f))
                        : 0.0f;
    x[j] = from_f<T>(g);
  }
}

// An ignored target's row (negative: data.eod_mask_loss): a gradient of exactly 0, also where the
// row's logits are not finite (0 times their softmax would not be).
template <class T>
__device__ void zero_row(T* x, int64_t cols) {
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) x[j] = from_f<T>(0.0f);
}

template <class T>
__global__ void cross_entropy_kernel(float* losses, T* logits, const int32_t* targets, int64_t cols,
                                     int64_t valid, float grad_scale, bool grad) {
  T* x = logits + blockIdx.x * cols;
  const int64_t target = targets[blockIdx.x];
  const bool ignored = target < 0;  // ignored (negative): loss 0, gradient 0
  const float xt = ignored ? 0.0f : to_f(x[target]);
  const float m = local_max(x, valid);
  const float lse = m + logf(local_sum_exp(x, valid, m));
  if (threadIdx.x == 0) losses[blockIdx.x] = ignored ? 0.0f : lse - xt;
  if (grad && ignored) zero_row(x, cols);
  if (grad && !ignored) write_grad(x, cols, valid, lse, target, grad_scale);
}

// Online softmax statistics of x[0, valid): this thread's running max m and sum of exp(x - m)
// over its packs (and, past the last whole pack, its single columns), combined over the block:
// {max, sum of exp(x - max)} on every thread.
template <class T, int N>
__device__ float2 row_stats(const T* x, int64_t valid) {
  float m = -INFINITY, s = 0;
  auto add = [&](float v) {
    if (v > m) {
      s *= expf(m - v);  // 0 while m is -inf: s is 0 then
      m = v;
    }
    s += expf(v - m);
  };
  const int64_t packed = valid / N * N;
  for (int64_t j = int64_t{threadIdx.x} * N; j < packed; j += int64_t{blockDim.x} * N) {
    const Pack<T, N> p = load_pack<T, N>(x + j);
#pragma unroll
    for (int k = 0; k < N; ++k) add(to_f(p.v[k]));
  }
  for (int64_t j = packed + threadIdx.x; j < valid; j += blockDim.x) add(to_f(x[j]));
  const float row_m = block_max(m);
  const float row_s = block_sum(m == -INFINITY ? 0.0f : s * expf(m - row_m));
  return make_float2(row_m, row_s);
}

// x := grad_scale * (exp(x - lse) - onehot(target)) on valid columns, 0 on padding, pack by
// pack (a target outside [0, valid) is in another rank's shard).
template <class T, int N>
__device__ void write_grad_packed(T* x, int64_t cols, int64_t valid, float lse, int64_t target,
                                  float grad_scale) {
  const int64_t packed = cols / N * N;
  for (int64_t j = int64_t{threadIdx.x} * N; j < packed; j += int64_t{blockDim.x} * N) {
    const Pack<T, N> p = load_pack<T, N>(x + j);
    Pack<T, N> g;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int64_t c = j + k;
      g.v[k] = from_f<T>(
          c < valid ? grad_scale * (expf(to_f(p.v[k]) - lse) - (c == target ? 1.0f : 0.0f)) : 0.0f);
    }
    store_pack<T, N>(x + j, g);
  }
  for (int64_t j = packed + threadIdx.x; j < cols; j += blockDim.x)
    x[j] = from_f<T>(j < valid ? grad_scale * (expf(to_f(x[j]) - lse) - (j == target ? 1.0f : 0.0f))
                               : 0.0f);
}

// The fused kernel: statistics in one pass, then the gradient written pack by pack.
template <class T, int N>
__global__ void cross_entropy_fused_kernel(float* losses, T* logits, const int32_t* targets,
                                           int64_t cols, int64_t valid, float grad_scale,
                                           bool grad) {
  T* x = logits + blockIdx.x * cols;
  const int64_t target = targets[blockIdx.x];
  const bool ignored = target < 0;  // ignored (negative): loss 0, gradient 0
  const float xt = ignored ? 0.0f : to_f(x[target]);
  const float2 st = row_stats<T, N>(x, valid);
  const float lse = st.x + logf(st.y);
  if (threadIdx.x == 0) losses[blockIdx.x] = ignored ? 0.0f : lse - xt;
  if (grad && ignored) zero_row(x, cols);
  if (grad && !ignored) write_grad_packed<T, N>(x, cols, valid, lse, target, grad_scale);
}

// A vocabulary shard's statistics in one pass: stats[r] = {max, sum of exp(x - max), the
// target's logit or 0}.
template <class T, int N>
__global__ void shard_stats_kernel(float* stats, const T* logits, const int32_t* targets,
                                   int64_t cols, int64_t offset, int64_t valid) {
  const T* x = logits + blockIdx.x * cols;
  const float2 st = row_stats<T, N>(x, valid);
  if (threadIdx.x != 0) return;
  const int64_t local = targets[blockIdx.x] - offset;
  float* out = stats + 3 * blockIdx.x;
  out[0] = st.x;
  out[1] = st.y;
  out[2] = local >= 0 && local < valid ? to_f(x[local]) : 0.0f;
}

// Row r of every rank's statistics combined, ranks in order.
__global__ void combine_kernel(float* row_max, float* sums, const float* all_stats, int ranks,
                               int64_t rows) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r >= rows) return;
  float m = -INFINITY;
  for (int k = 0; k < ranks; ++k) m = fmaxf(m, all_stats[(k * rows + r) * 3]);
  float s = 0, target = 0;
  for (int k = 0; k < ranks; ++k) {
    const float* one = all_stats + (k * rows + r) * 3;
    if (one[1] > 0) s += one[1] * expf(one[0] - m);
    target += one[2];
  }
  row_max[r] = m;
  sums[2 * r] = s;
  sums[2 * r + 1] = target;
}

template <class T>
__global__ void row_max_kernel(float* row_max, const T* logits, int64_t cols, int64_t valid) {
  const float m = local_max(logits + blockIdx.x * cols, valid);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <class T>
__global__ void sums_kernel(float* sums, const T* logits, const int32_t* targets,
                            const float* row_max, int64_t cols, int64_t offset, int64_t valid) {
  const T* x = logits + blockIdx.x * cols;
  const float s = local_sum_exp(x, valid, row_max[blockIdx.x]);
  if (threadIdx.x != 0) return;
  const int64_t local = targets[blockIdx.x] - offset;
  sums[2 * blockIdx.x] = s;
  sums[2 * blockIdx.x + 1] = local >= 0 && local < valid ? to_f(x[local]) : 0.0f;
}

template <class T, int N>
__global__ void loss_grad_kernel(float* losses, T* logits, const int32_t* targets,
                                 const float* row_max, const float* sums, int64_t cols,
                                 int64_t offset, int64_t valid, float grad_scale, bool grad) {
  const int64_t r = blockIdx.x;
  const bool ignored = targets[r] < 0;  // ignored (negative): loss 0, gradient 0
  const float lse = row_max[r] + logf(sums[2 * r]);
  if (threadIdx.x == 0) losses[r] = ignored ? 0.0f : lse - sums[2 * r + 1];
  if (grad && ignored) zero_row(logits + r * cols, cols);
  if (grad && !ignored)
    write_grad_packed<T, N>(logits + r * cols, cols, valid, lse, targets[r] - offset, grad_scale);
}

// Calls f(std::integral_constant<int, N>{}) with N the 16-byte pack of T when every row of
// `logits` starts 16-byte aligned (and `allowed`), else with N = 1 (single elements).
template <class T, class F>
void with_pack(const Tensor& logits, F&& f, bool allowed = true) {
  if (allowed && packable(logits.shape[1], sizeof(T), {logits.data}))
    f(std::integral_constant<int, kPack<T>>{});
  else
    f(std::integral_constant<int, 1>{});
}

}  // namespace

void cross_entropy_fwd_bwd(Ctx& ctx, Tensor losses, Tensor logits, Tensor targets,
                           int64_t vocab_valid, float grad_scale, bool compute_grad) {
  const auto rows = static_cast<unsigned>(logits.shape[0]);
  const int64_t cols = logits.shape[1];
  dispatch_float(logits.dtype, "cross_entropy_fwd_bwd", [&](auto tag) {
    using T = decltype(tag);
    if (take(Switch::xent_3pass)) {
      cross_entropy_kernel<T><<<rows, kThreads, 0, stream_of(ctx)>>>(
          losses.ptr<float>(), logits.ptr<T>(), targets.ptr<int32_t>(), cols, vocab_valid,
          grad_scale, compute_grad);
      return;
    }
    with_pack<T>(logits, [&](auto n) {
      cross_entropy_fused_kernel<T, decltype(n)::value><<<rows, kThreads, 0, stream_of(ctx)>>>(
          losses.ptr<float>(), logits.ptr<T>(), targets.ptr<int32_t>(), cols, vocab_valid,
          grad_scale, compute_grad);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void xent_row_max(Ctx& ctx, Tensor row_max, Tensor logits, int64_t vocab_valid) {
  dispatch_float(logits.dtype, "xent_row_max", [&](auto tag) {
    using T = decltype(tag);
    row_max_kernel<T><<<static_cast<unsigned>(logits.shape[0]), kThreads, 0, stream_of(ctx)>>>(
        row_max.ptr<float>(), logits.ptr<T>(), logits.shape[1], vocab_valid);
  });
  CUDA_CHECK_LAUNCH();
}

void xent_sums(Ctx& ctx, Tensor sums, Tensor logits, Tensor targets, Tensor row_max,
               int64_t vocab_offset, int64_t vocab_valid) {
  dispatch_float(logits.dtype, "xent_sums", [&](auto tag) {
    using T = decltype(tag);
    sums_kernel<T><<<static_cast<unsigned>(logits.shape[0]), kThreads, 0, stream_of(ctx)>>>(
        sums.ptr<float>(), logits.ptr<T>(), targets.ptr<int32_t>(), row_max.ptr<float>(),
        logits.shape[1], vocab_offset, vocab_valid);
  });
  CUDA_CHECK_LAUNCH();
}

void xent_shard_stats(Ctx& ctx, Tensor stats, Tensor logits, Tensor targets, int64_t vocab_offset,
                      int64_t vocab_valid) {
  const auto rows = static_cast<unsigned>(logits.shape[0]);
  const int64_t cols = logits.shape[1];
  dispatch_float(logits.dtype, "xent_shard_stats", [&](auto tag) {
    using T = decltype(tag);
    with_pack<T>(logits, [&](auto n) {
      shard_stats_kernel<T, decltype(n)::value><<<rows, kThreads, 0, stream_of(ctx)>>>(
          stats.ptr<float>(), logits.ptr<T>(), targets.ptr<int32_t>(), cols, vocab_offset,
          vocab_valid);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void xent_combine(Ctx& ctx, Tensor row_max, Tensor sums, Tensor all_stats) {
  TR_ASSERT(row_max.dtype == DType::f32, "xent_combine on CUDA: f32 statistics");
  const int64_t rows = all_stats.shape[1];
  combine_kernel<<<blocks_for(rows, 256), 256, 0, stream_of(ctx)>>>(
      row_max.ptr<float>(), sums.ptr<float>(), all_stats.ptr<float>(),
      static_cast<int>(all_stats.shape[0]), rows);
  CUDA_CHECK_LAUNCH();
}

void xent_loss_grad(Ctx& ctx, Tensor losses, Tensor logits, Tensor targets, Tensor row_max,
                    Tensor sums, int64_t vocab_offset, int64_t vocab_valid, float grad_scale,
                    bool compute_grad) {
  const auto rows = static_cast<unsigned>(logits.shape[0]);
  const int64_t cols = logits.shape[1];
  dispatch_float(logits.dtype, "xent_loss_grad", [&](auto tag) {
    using T = decltype(tag);
    // Scalar stores under TR_XENT_3PASS=1.
    with_pack<T>(
        logits,
        [&](auto n) {
          loss_grad_kernel<T, decltype(n)::value><<<rows, kThreads, 0, stream_of(ctx)>>>(
              losses.ptr<float>(), logits.ptr<T>(), targets.ptr<int32_t>(), row_max.ptr<float>(),
              sums.ptr<float>(), cols, vocab_offset, vocab_valid, grad_scale, compute_grad);
        },
        !take(Switch::xent_3pass));
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace tr::cuda
