// Linear layers through cuBLASLt: out[T,O] = in[T,K] · weight[O,K]^T (+ bias in the epilogue),
// din = dout · weight, dweight += dout^T · in straight into the (f32) gradient buffer (beta 1;
// beta 0 assigns), dbias += column sums of dout (common.cuh's deterministic two-pass column sums).
// bf16 operands accumulate in fp32; f32 operands run in exact fp32 (no TF32), so the f32 path
// matches the CPU to 1e-5.
//
// Row-major X[r,c] is column-major X^T, so each product is set up on the transposes:
//   forward   out^T[O,T] = (W as col-major [K,O])^T · (in as col-major [K,T])
//   din       din^T[K,T] = (W as col-major [K,O]) · (dout as col-major [O,T])
//   dweight   dW^T[K,O] += (in as col-major [K,T]) · (dout as col-major [O,T])^T
// The GEMMs run through gemm.h (the handle, the cached plans and their algorithms).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 256;

// Pass 1 of dbias (common.cuh's column sums): the chunk's sum of dout[t][o].
template <class T>
__global__ void column_sum_partial(float* partial, const T* dout, int64_t rows, int64_t cols) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= cols) return;
  int64_t begin, end;
  chunk_rows(rows, &begin, &end);
  float acc = 0;
  for (int64_t r = begin; r < end; ++r) acc += to_f(dout[r * cols + j]);
  partial[blockIdx.y * cols + j] = acc;
}

// The linear layer's GEMMs; `rows_vary`: T changes from call to call (a grouped linear's
// groups), the token dimension each GEMM plans at its bucket (gemm.h Varying).
void fwd(Ctx& ctx, Tensor out, Tensor in, Tensor weight, Tensor bias, bool rows_vary) {
  const int64_t T = in.shape[0], K = in.shape[1], O = weight.shape[0];
  // The epilogue reads the bias with 16-byte accesses; a bias at an odd offset is added apart.
  const bool epilogue = !bias.empty() && alignment(bias.data) >= 16;
  GemmKey key{O, T, K, true, false, weight.dtype, in.dtype, out.dtype, epilogue, false};
  if (rows_vary) key.varying = Varying::n;
  gemm(ctx, key, weight.data, in.data, out.data, epilogue ? bias.data : nullptr, 0.0f);
  if (!bias.empty() && !epilogue) add_bias_rows(ctx, out, bias);
}

void bwd(Ctx& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight,
         bool assign_dweight, bool rows_vary) {
  const int64_t T = in.shape[0], K = in.shape[1], O = weight.shape[0];
  if (!din.empty()) {
    GemmKey key{K, T, O, false, false, weight.dtype, dout.dtype, din.dtype, false, false};
    if (rows_vary) key.varying = Varying::n;
    gemm(ctx, key, weight.data, dout.data, din.data, nullptr, 0.0f);
  }
  if (dweight.empty()) return;  // the input gradient only (a split backward's B pass)
  GemmKey wkey{K, O, T, false, true, in.dtype, dout.dtype, dweight.dtype, false, !assign_dweight};
  if (rows_vary) wkey.varying = Varying::k;
  gemm(ctx, wkey, in.data, dout.data, dweight.data, nullptr, assign_dweight ? 0.0f : 1.0f);
}

}  // namespace

void linear_fwd(Ctx& ctx, Tensor out, Tensor in, Tensor weight, Tensor bias) {
  fwd(ctx, out, in, weight, bias, /*rows_vary=*/false);
}

void linear_bwd(Ctx& ctx, Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in,
                Tensor weight, bool assign_dweight) {
  bwd(ctx, din, dweight, dout, in, weight, assign_dweight, /*rows_vary=*/false);
  if (!dweight.empty() && !dbias.empty()) bias_grad(ctx, dbias, dout, assign_dweight);
}

void linear_fwd_varying_rows(Ctx& ctx, Tensor out, Tensor in, Tensor weight) {
  fwd(ctx, out, in, weight, Tensor(), /*rows_vary=*/true);
}

void linear_bwd_varying_rows(Ctx& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in,
                             Tensor weight, bool assign_dweight) {
  bwd(ctx, din, dweight, dout, in, weight, assign_dweight, /*rows_vary=*/true);
}

void bias_grad(Ctx& ctx, Tensor dbias, Tensor dout, bool assign_dweight) {
  const int64_t T = dout.shape[0], O = dout.shape[1];
  const int chunks = column_chunks(T);
  Workspace ws(ctx, "bias_grad");
  float* partial = ws.take<float>(int64_t{chunks} * O);
  dispatch_float(dout.dtype, "bias_grad", [&](auto tag) {
    using T_ = decltype(tag);
    const dim3 grid(blocks_for(O, kThreads), static_cast<unsigned>(chunks));
    column_sum_partial<T_><<<grid, kThreads, 0, stream_of(ctx)>>>(partial, dout.ptr<T_>(), T, O);
  });
  CUDA_CHECK_LAUNCH();
  add_column_partials(ctx, dbias, partial, chunks, "bias_grad", assign_dweight);
}

}  // namespace tr::cuda
