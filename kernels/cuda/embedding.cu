// Vocab-parallel embedding. Forward: a row copy per token (zero rows for tokens of other TP
// ranks' vocabulary). Backward, deterministic: the positions are sorted by token id (stable
// radix sort, so equal ids keep their order), then one block per distinct id sums its rows in
// that order and adds the sum to the table's gradient: no atomics, same bits every run.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 256;

// out: [T, H]; table: [Vl, H]; one block per token.
template <class T>
__global__ void embedding_fwd_kernel(T* out, const int32_t* tokens, const T* table, int64_t H,
                                     int64_t vocab_offset, int64_t vocab_local) {
  const int64_t id = tokens[blockIdx.x] - vocab_offset;
  T* row = out + blockIdx.x * H;
  const bool mine = id >= 0 && id < vocab_local;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x)
    row[j] = mine ? table[id * H + j] : from_f<T>(0.0f);
}

__global__ void iota_kernel(int32_t* out, int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] = static_cast<int32_t>(i);
}

// Block b looks at sorted position b; the first position of each run of equal ids sums the run's
// dout rows (positions ascending) and ACCUMULATES them into dtable.
template <class T, class G>
__global__ void embedding_bwd_kernel(G* dtable, const T* dout, const int32_t* sorted_ids,
                                     const int32_t* sorted_pos, int64_t tokens, int64_t H,
                                     int64_t vocab_offset, int64_t vocab_local) {
  const int64_t b = blockIdx.x;
  const int32_t id = sorted_ids[b];
  if (b > 0 && sorted_ids[b - 1] == id) return;
  const int64_t row = id - vocab_offset;
  if (row < 0 || row >= vocab_local) return;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
    float acc = 0;
    for (int64_t k = b; k < tokens && sorted_ids[k] == id; ++k)
      acc += to_f(dout[sorted_pos[k] * H + j]);
    dtable[row * H + j] = from_f<G>(to_f(dtable[row * H + j]) + acc);
  }
}

}  // namespace

void embedding_fwd(Ctx& ctx, Tensor out, Tensor tokens, Tensor table, int64_t vocab_offset) {
  dispatch_float(out.dtype, "embedding_fwd", [&](auto tag) {
    using T = decltype(tag);
    embedding_fwd_kernel<T>
        <<<static_cast<unsigned>(tokens.shape[0]), kThreads, 0, stream_of(ctx)>>>(
            out.ptr<T>(), tokens.ptr<int32_t>(), table.ptr<T>(), table.shape[1], vocab_offset,
            table.shape[0]);
  });
  CUDA_CHECK_LAUNCH();
}

void embedding_bwd(Ctx& ctx, Tensor dtable, Tensor dout, Tensor tokens, int64_t vocab_offset) {
  const int64_t n = tokens.shape[0];
  Workspace ws(ctx, "embedding_bwd");
  int32_t* pos_in = ws.take<int32_t>(n);
  int32_t* ids_out = ws.take<int32_t>(n);
  int32_t* pos_out = ws.take<int32_t>(n);
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, tokens.ptr<int32_t>(), ids_out,
                                             pos_in, pos_out, static_cast<int>(n), 0, 32,
                                             stream_of(ctx)));
  void* temp = ws.take<char>(static_cast<int64_t>(temp_bytes));
  iota_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(pos_in, n);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens.ptr<int32_t>(), ids_out,
                                             pos_in, pos_out, static_cast<int>(n), 0, 32,
                                             stream_of(ctx)));
  dispatch_float(dout.dtype, "embedding_bwd", [&](auto tag) {
    dispatch_float(dtable.dtype, "embedding_bwd", [&](auto gtag) {
      using T = decltype(tag);
      using G = decltype(gtag);
      embedding_bwd_kernel<T, G><<<static_cast<unsigned>(n), kThreads, 0, stream_of(ctx)>>>(
          dtable.ptr<G>(), dout.ptr<T>(), ids_out, pos_out, n, dtable.shape[1], vocab_offset,
          dtable.shape[0]);
    });
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace tr::cuda
