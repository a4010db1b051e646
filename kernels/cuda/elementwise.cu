// Elementwise ops over flat tensors: add, scale, zero, cast, and the deterministic sum of
// squares behind the global gradient norm.
#include "core/norm_piece.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 256;
// Fixed grid of the sum of squares: the partial sums, and so the result, do not depend on the
// device, and the final pass adds them in one order.
constexpr int kSumBlocks = 512;

template <class T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}

template <class T>
__global__ void scale_kernel(T* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = from_f<T>(to_f(x[i]) * s);
}

template <class To, class From>
__global__ void cast_kernel(To* out, const From* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_f<To>(to_f(in[i]));
}

// Pass 1: block b sums the squares (or the values) of a grid-strided subset into partial[b]
// (double).
template <class T, bool kSquares = true>
__global__ void sum_squares_partial(double* partial, const T* x, int64_t n) {
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double v = to_f(x[i]);
    acc += kSquares ? v * v : v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Pass 2: one block adds the kSumBlocks partials into *out (assigned, or with kAccumulate
// added to it).
template <bool kAccumulate = false>
__global__ void sum_partials(double* out, const double* partial) {
  double acc = 0;
  for (int i = threadIdx.x; i < kSumBlocks; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = kAccumulate ? *out + acc : acc;
}

}  // namespace

void add(Ctx& ctx, Tensor out, Tensor a, Tensor b) {
  dispatch_float(out.dtype, "add", [&](auto tag) {
    using T = decltype(tag);
    add_kernel<T><<<grid_stride_blocks(out.numel(), kThreads), kThreads, 0, stream_of(ctx)>>>(
        out.ptr<T>(), a.ptr<T>(), b.ptr<T>(), out.numel());
  });
  CUDA_CHECK_LAUNCH();
}

void scale_(Ctx& ctx, Tensor x, float s) {
  dispatch_float(x.dtype, "scale_", [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<grid_stride_blocks(x.numel(), kThreads), kThreads, 0, stream_of(ctx)>>>(
        x.ptr<T>(), s, x.numel());
  });
  CUDA_CHECK_LAUNCH();
}

void zero_(Ctx& ctx, Tensor x) {
  CUDA_CHECK(cudaMemsetAsync(x.data, 0, x.nbytes(), stream_of(ctx)));
}

void cast(Ctx& ctx, Tensor out, Tensor in) {
  if (out.dtype == in.dtype) {
    CUDA_CHECK(
        cudaMemcpyAsync(out.data, in.data, in.nbytes(), cudaMemcpyDeviceToDevice, stream_of(ctx)));
    return;
  }
  dispatch_float(out.dtype, "cast", [&](auto to) {
    dispatch_float(in.dtype, "cast", [&](auto from) {
      using To = decltype(to);
      using From = decltype(from);
      cast_kernel<To, From>
          <<<grid_stride_blocks(in.numel(), kThreads), kThreads, 0, stream_of(ctx)>>>(
              out.ptr<To>(), in.ptr<From>(), in.numel());
    });
  });
  CUDA_CHECK_LAUNCH();
}

double sum_squares(Ctx& ctx, Tensor x) {
  Workspace ws(ctx, "sum_squares");
  double* partial = ws.take<double>(kSumBlocks);
  double* total = ws.take<double>(1);
  dispatch_float(x.dtype, "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    sum_squares_partial<T>
        <<<kSumBlocks, kThreads, 0, stream_of(ctx)>>>(partial, x.ptr<T>(), x.numel());
  });
  CUDA_CHECK_LAUNCH();
  sum_partials<false><<<1, kThreads, 0, stream_of(ctx)>>>(total, partial);
  CUDA_CHECK_LAUNCH();
  double host = 0;
  CUDA_CHECK(cudaMemcpyAsync(&host, total, sizeof(double), cudaMemcpyDeviceToHost, stream_of(ctx)));
  CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
  return host;
}

// Block b: the sum of squares of piece b ({first index, count, counted}) into partial[b]; a
// checked-only piece's is 0, or NaN when not finite.
template <class T>
__global__ void piece_squares(double* partial, const T* x, const int64_t* pieces, int64_t base) {
  const T* p = x + (pieces[3 * blockIdx.x] - base);
  const int64_t n = pieces[3 * blockIdx.x + 1];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double v = to_f(p[i]);
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = counted_or_checked(acc, pieces[3 * blockIdx.x + 2]);
}

// One block adds the n partials (thread-strided, then the block's sum: a fixed order) to *out.
__global__ void add_partials(double* out, const double* partial, int64_t n) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out += acc;
}

// The same two passes as sum_squares, the total added to acc on the device: nothing is read back.
// The workspace's partials are reused by the next op on the stream, after these kernels ran.
void accumulate_sum(Ctx& ctx, Tensor acc, Tensor x, bool squares) {
  Workspace ws(ctx, "accumulate_sum");
  double* partial = ws.take<double>(kSumBlocks);
  dispatch_float(x.dtype, "accumulate_sum", [&](auto tag) {
    using T = decltype(tag);
    if (squares)
      sum_squares_partial<T, true>
          <<<kSumBlocks, kThreads, 0, stream_of(ctx)>>>(partial, x.ptr<T>(), x.numel());
    else
      sum_squares_partial<T, false>
          <<<kSumBlocks, kThreads, 0, stream_of(ctx)>>>(partial, x.ptr<T>(), x.numel());
  });
  CUDA_CHECK_LAUNCH();
  sum_partials<true><<<1, kThreads, 0, stream_of(ctx)>>>(acc.ptr<double>(), partial);
  CUDA_CHECK_LAUNCH();
}

void accumulate_sum_squares_pieces(Ctx& ctx, Tensor acc, Tensor x, Tensor pieces, int64_t base) {
  const int64_t n = pieces.dim(0);
  if (n == 0) return;
  Workspace ws(ctx, "accumulate_sum_squares_pieces");
  double* partial = ws.take<double>(n);
  dispatch_float(x.dtype, "accumulate_sum_squares_pieces", [&](auto tag) {
    using T = decltype(tag);
    piece_squares<T><<<static_cast<unsigned>(n), kThreads, 0, stream_of(ctx)>>>(
        partial, x.ptr<T>(), pieces.ptr<int64_t>(), base);
  });
  CUDA_CHECK_LAUNCH();
  add_partials<<<1, kThreads, 0, stream_of(ctx)>>>(acc.ptr<double>(), partial, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tr::cuda
