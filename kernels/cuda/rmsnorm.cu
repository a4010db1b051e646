// RMSNorm forward and backward: out = in * rstd * weight, rstd = rsqrt(mean(in^2) + eps),
// statistics in f32. Forward: one block per row, 16-byte packs. Backward: din per row (one
// block each), dweight by common.cuh's deterministic two-pass column sums (partials in the
// workspace).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 256;

// out, in: [rows, H]; weight: [H]; rstd: [rows] f32.
template <class T, int N>
__global__ void rmsnorm_fwd_kernel(T* out, float* rstd, const T* in, const T* weight, int H,
                                   float eps) {
  const T* x = in + blockIdx.x * int64_t{H};
  T* y = out + blockIdx.x * int64_t{H};
  float ss = 0;
  for (int i = threadIdx.x * N; i < H; i += blockDim.x * N) {
    const Pack<T, N> p = load_pack<T, N>(x + i);
#pragma unroll
    for (int k = 0; k < N; ++k) ss += to_f(p.v[k]) * to_f(p.v[k]);
  }
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(H) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int i = threadIdx.x * N; i < H; i += blockDim.x * N) {
    const Pack<T, N> p = load_pack<T, N>(x + i), w = load_pack<T, N>(weight + i);
    Pack<T, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = from_f<T>(to_f(p.v[k]) * r * to_f(w.v[k]));
    store_pack<T, N>(y + i, o);
  }
}

// Fused residual add: sum = a + b (stored in T), then the norm of the stored sum. Each thread
// reads back only the elements it wrote, so no barrier is needed between the two passes.
template <class T, int N>
__global__ void add_rmsnorm_fwd_kernel(T* sum, T* out, float* rstd, const T* a, const T* b,
                                       const T* weight, int H, float eps) {
  const int64_t off = blockIdx.x * int64_t{H};
  float ss = 0;
  for (int i = threadIdx.x * N; i < H; i += blockDim.x * N) {
    const Pack<T, N> pa = load_pack<T, N>(a + off + i), pb = load_pack<T, N>(b + off + i);
    Pack<T, N> ps;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      ps.v[k] = from_f<T>(to_f(pa.v[k]) + to_f(pb.v[k]));
      ss += to_f(ps.v[k]) * to_f(ps.v[k]);
    }
    store_pack<T, N>(sum + off + i, ps);
  }
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(H) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int i = threadIdx.x * N; i < H; i += blockDim.x * N) {
    const Pack<T, N> p = load_pack<T, N>(sum + off + i), w = load_pack<T, N>(weight + i);
    Pack<T, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = from_f<T>(to_f(p.v[k]) * r * to_f(w.v[k]));
    store_pack<T, N>(out + off + i, o);
  }
}

// din = r w g - (r^3 / H) x sum(g w x), per row. ASSIGNS din, or ACCUMULATES with ACC (the
// residual stream's gradient).
template <class T, int N, bool ACC>
__global__ void rmsnorm_bwd_din_kernel(T* din, const T* dout, const T* in, const T* weight,
                                       const float* rstd, int H) {
  const int64_t off = blockIdx.x * int64_t{H};
  const float r = rstd[blockIdx.x];
  float dot = 0;
  for (int i = threadIdx.x * N; i < H; i += blockDim.x * N) {
    const Pack<T, N> g = load_pack<T, N>(dout + off + i), x = load_pack<T, N>(in + off + i),
                     w = load_pack<T, N>(weight + i);
#pragma unroll
    for (int k = 0; k < N; ++k) dot += to_f(g.v[k]) * to_f(w.v[k]) * to_f(x.v[k]);
  }
  const float c = block_sum(dot) * r * r * r / static_cast<float>(H);
  for (int i = threadIdx.x * N; i < H; i += blockDim.x * N) {
    const Pack<T, N> g = load_pack<T, N>(dout + off + i), x = load_pack<T, N>(in + off + i),
                     w = load_pack<T, N>(weight + i);
    Pack<T, N> o;
    if constexpr (ACC) o = load_pack<T, N>(din + off + i);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float v = r * to_f(w.v[k]) * to_f(g.v[k]) - c * to_f(x.v[k]);
      o.v[k] = from_f<T>(ACC ? to_f(o.v[k]) + v : v);
    }
    store_pack<T, N>(din + off + i, o);
  }
}

// Pass 1 of dweight (common.cuh's column sums): the chunk's sum of g[r][j] x[r][j] rstd[r].
template <class T>
__global__ void rmsnorm_dweight_partial(float* partial, const T* dout, const T* in,
                                        const float* rstd, int64_t rows, int H) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= H) return;
  int64_t begin, end;
  chunk_rows(rows, &begin, &end);
  float acc = 0;
  for (int64_t r = begin; r < end; ++r)
    acc += to_f(dout[r * H + j]) * to_f(in[r * H + j]) * rstd[r];
  partial[blockIdx.y * int64_t{H} + j] = acc;
}

}  // namespace

void rmsnorm_fwd(Ctx& ctx, Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps) {
  const int64_t rows = in.shape[0];
  const int H = static_cast<int>(in.shape[1]);
  dispatch_float(in.dtype, "rmsnorm_fwd", [&](auto tag) {
    using T = decltype(tag);
    const dim3 grid(static_cast<unsigned>(rows));
    if (packable(H, sizeof(T), {out.data, in.data, weight.data}))
      rmsnorm_fwd_kernel<T, kPack<T>><<<grid, kThreads, 0, stream_of(ctx)>>>(
          out.ptr<T>(), rstd.ptr<float>(), in.ptr<T>(), weight.ptr<T>(), H, eps);
    else
      rmsnorm_fwd_kernel<T, 1><<<grid, kThreads, 0, stream_of(ctx)>>>(
          out.ptr<T>(), rstd.ptr<float>(), in.ptr<T>(), weight.ptr<T>(), H, eps);
  });
  CUDA_CHECK_LAUNCH();
}

void add_rmsnorm_fwd(Ctx& ctx, Tensor sum, Tensor out, Tensor rstd, Tensor a, Tensor b,
                     Tensor weight, float eps) {
  const int64_t rows = a.shape[0];
  const int H = static_cast<int>(a.shape[1]);
  dispatch_float(a.dtype, "add_rmsnorm_fwd", [&](auto tag) {
    using T = decltype(tag);
    const dim3 grid(static_cast<unsigned>(rows));
    if (packable(H, sizeof(T), {sum.data, out.data, a.data, b.data, weight.data}))
      add_rmsnorm_fwd_kernel<T, kPack<T>>
          <<<grid, kThreads, 0, stream_of(ctx)>>>(sum.ptr<T>(), out.ptr<T>(), rstd.ptr<float>(),
                                                  a.ptr<T>(), b.ptr<T>(), weight.ptr<T>(), H, eps);
    else
      add_rmsnorm_fwd_kernel<T, 1>
          <<<grid, kThreads, 0, stream_of(ctx)>>>(sum.ptr<T>(), out.ptr<T>(), rstd.ptr<float>(),
                                                  a.ptr<T>(), b.ptr<T>(), weight.ptr<T>(), H, eps);
  });
  CUDA_CHECK_LAUNCH();
}

void rmsnorm_bwd(Ctx& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight,
                 Tensor rstd, bool accumulate_din, bool assign_dweight) {
  const int64_t rows = in.shape[0];
  const int H = static_cast<int>(in.shape[1]);
  const int chunks = column_chunks(rows);
  Workspace ws(ctx, "rmsnorm_bwd");
  float* partial = ws.take<float>(int64_t{chunks} * H);
  dispatch_float(in.dtype, "rmsnorm_bwd", [&](auto tag) {
    using T = decltype(tag);
    const dim3 grid(static_cast<unsigned>(rows));
    const bool packs = packable(H, sizeof(T), {din.data, dout.data, in.data, weight.data});
    auto launch = [&](auto kernel) {
      kernel<<<grid, kThreads, 0, stream_of(ctx)>>>(din.ptr<T>(), dout.ptr<T>(), in.ptr<T>(),
                                                    weight.ptr<T>(), rstd.ptr<float>(), H);
    };
    if (packs && accumulate_din)
      launch(rmsnorm_bwd_din_kernel<T, kPack<T>, true>);
    else if (packs)
      launch(rmsnorm_bwd_din_kernel<T, kPack<T>, false>);
    else if (accumulate_din)
      launch(rmsnorm_bwd_din_kernel<T, 1, true>);
    else
      launch(rmsnorm_bwd_din_kernel<T, 1, false>);
    CUDA_CHECK_LAUNCH();
    const dim3 pgrid(blocks_for(H, kThreads), static_cast<unsigned>(chunks));
    rmsnorm_dweight_partial<T><<<pgrid, kThreads, 0, stream_of(ctx)>>>(
        partial, dout.ptr<T>(), in.ptr<T>(), rstd.ptr<float>(), rows, H);
    CUDA_CHECK_LAUNCH();
  });
  add_column_partials(ctx, dweight, partial, chunks, "rmsnorm_bwd", assign_dweight);
}

}  // namespace tr::cuda
