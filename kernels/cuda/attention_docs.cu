// The ragged batch of block-causal attention (attention_docs.h).
#include <cmath>

#include "kernels/cuda/attention_docs.h"
#include "kernels/cuda/common.cuh"

namespace tr::cuda {
namespace {

constexpr int kScanThreads = 1024;

// One block: each thread counts the runs beginning in its slice of the rows, a block-wide scan
// numbers them and each thread writes its runs' first rows to `first`; then every document's
// entry at its part's slot.
__global__ void documents_kernel(RaggedTable t, RaggedParts parts, int64_t* first,
                                 const int32_t* start, int64_t rows, int64_t period, RaggedRows w) {
  __shared__ int64_t scan[kScanThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t per = (rows + kScanThreads - 1) / kScanThreads;
  const int64_t lo = min(rows, tid * per), hi = min(rows, lo + per);
  auto begins = [&](int64_t r) { return r % period == 0 || start[r] != start[r - 1]; };
  int64_t own = 0;
  for (int64_t r = lo; r < hi; ++r) own += begins(r);
  scan[tid] = own;
  __syncthreads();
  for (int d = 1; d < kScanThreads; d <<= 1) {  // inclusive scan (Hillis-Steele)
    const int64_t add = tid >= d ? scan[tid - d] : 0;
    __syncthreads();
    scan[tid] += add;
    __syncthreads();
  }
  if (scan[kScanThreads - 1] != parts.documents) __trap();  // the host counted other documents
  int64_t e = scan[tid] - own;
  for (int64_t r = lo; r < hi; ++r)
    if (begins(r)) first[e++] = r;
  if (tid == 0) first[parts.documents] = rows;
  __syncthreads();  // the block's global writes are visible to the whole block after this
  for (int64_t d = tid; d < parts.documents; d += kScanThreads) {
    int p = 0;
    while (d >= parts.part[p].first + parts.part[p].count) ++p;
    const RaggedPart& part = parts.part[p];
    const int64_t slot = part.slot + d - part.first, row = first[d], end = first[d + 1];
    if (end - row > part.longest) __trap();  // the host found its part's documents shorter
    t.len_q[slot] = t.len_kv[slot] = static_cast<int32_t>(end - row);
    t.off_q[slot] = row * w.q;
    t.off_kv[slot] = row * w.kv;
    t.off_o[slot] = row * w.o;
    t.off_stats[slot] = row * w.stats;
    if (d + 1 < part.first + part.count) continue;
    t.off_q[slot + 1] = end * w.q;  // the part's end
    t.off_kv[slot + 1] = end * w.kv;
    t.off_o[slot + 1] = end * w.o;
    t.off_stats[slot + 1] = end * w.stats;
  }
}

// One block: the first row whose document differs from row 0's, then entry 0 and its end.
__global__ void prefix_kernel(RaggedTable t, const int32_t* start, int64_t rows, int64_t kv_rows,
                              int64_t k_first, RaggedRows w) {
  __shared__ unsigned long long other;  // the first row of another document, or rows
  if (threadIdx.x == 0) other = static_cast<unsigned long long>(rows);
  __syncthreads();
  const int32_t first_doc = start[0];
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    if (start[r] != first_doc) atomicMin(&other, static_cast<unsigned long long>(r));
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int64_t from = min(max(int64_t{first_doc} - k_first, int64_t{0}), kv_rows);
  const int64_t len_kv = kv_rows - from;
  if (len_kv == 0) __trap();  // the host saw keys for the first document: the starts differ
  const auto len_q = static_cast<int64_t>(other);
  t.len_q[0] = static_cast<int32_t>(len_q);
  t.len_kv[0] = static_cast<int32_t>(len_kv);
  t.off_q[0] = t.off_o[0] = t.off_stats[0] = 0;
  t.off_kv[0] = from * w.kv;
  t.off_q[1] = len_q * w.q;
  t.off_o[1] = len_q * w.o;
  t.off_stats[1] = len_q * w.stats;
  t.off_kv[1] = kv_rows * w.kv;
}

__global__ void stats_kernel(float* lse, float* rows, int64_t batch, int64_t seq, int64_t nh,
                             bool to_lse) {
  const int64_t n = batch * seq * nh;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = i / (nh * seq), h = i / seq % nh, s = i % seq;  // i indexes lse
    float& row = rows[(b * seq + s) * nh + h];
    if (to_lse)
      lse[i] = row;
    else
      row = lse[i];
  }
}

// One block per query row of the block.
__global__ void hidden_fwd_kernel(bf16* out, float* lse, const int32_t* start, int64_t rows,
                                  int64_t nh, int64_t hd, int64_t k_first, int64_t kv_rows) {
  const int64_t r = blockIdx.x;
  if (start[r] - k_first < kv_rows) return;  // it sees keys from its document's start on
  for (int64_t e = threadIdx.x; e < nh * hd; e += blockDim.x)
    out[r * nh * hd + e] = __float2bfloat16_rn(0.0f);
  for (int64_t h = threadIdx.x; h < nh; h += blockDim.x) lse[h * rows + r] = -INFINITY;
}

// One block per query row, then one per key row.
__global__ void hidden_bwd_kernel(bf16* dq, bf16* dk, bf16* dv, const int32_t* start, int64_t rows,
                                  int64_t nh, int64_t nkv, int64_t hd, int64_t k_first,
                                  int64_t kv_rows) {
  const bf16 zero = __float2bfloat16_rn(0.0f);
  if (blockIdx.x < rows) {
    const int64_t r = blockIdx.x;
    if (start[r] - k_first < kv_rows) return;
    for (int64_t e = threadIdx.x; e < nh * hd; e += blockDim.x) dq[r * nh * hd + e] = zero;
    return;
  }
  const int64_t j = blockIdx.x - rows;
  if (j >= int64_t{start[0]} - k_first) return;  // at or after the first query's document start
  for (int64_t e = threadIdx.x; e < nkv * hd; e += blockDim.x) {
    dk[j * nkv * hd + e] = zero;
    dv[j * nkv * hd + e] = zero;
  }
}

}  // namespace

void ragged_documents(Ctx& ctx, const RaggedTable& table, const RaggedParts& parts,
                      int64_t* scratch, const int32_t* start, int64_t rows, int64_t period,
                      RaggedRows w) {
  if (parts.documents == 0) return;
  documents_kernel<<<1, kScanThreads, 0, stream_of(ctx)>>>(table, parts, scratch, start, rows,
                                                           period, w);
  CUDA_CHECK_LAUNCH();
}

void ragged_prefix(Ctx& ctx, const RaggedTable& table, const int32_t* start, int64_t rows,
                   int64_t kv_rows, int64_t k_first, RaggedRows w) {
  prefix_kernel<<<1, kScanThreads, 0, stream_of(ctx)>>>(table, start, rows, kv_rows, k_first, w);
  CUDA_CHECK_LAUNCH();
}

void stats_layout(Ctx& ctx, float* lse, float* rows, int64_t batch, int64_t seq, int64_t nh,
                  bool to_lse) {
  const int64_t n = batch * seq * nh;
  if (n == 0) return;
  stats_kernel<<<grid_stride_blocks(n, 256), 256, 0, stream_of(ctx)>>>(lse, rows, batch, seq, nh,
                                                                       to_lse);
  CUDA_CHECK_LAUNCH();
}

void hidden_rows_fwd(Ctx& ctx, Tensor out, Tensor lse, const int32_t* start, int64_t k_first,
                     int64_t kv_rows) {
  const int64_t rows = out.shape[0], nh = out.shape[1], hd = out.shape[2];
  if (rows == 0) return;
  hidden_fwd_kernel<<<static_cast<unsigned>(rows), 128, 0, stream_of(ctx)>>>(
      out.ptr<bf16>(), lse.ptr<float>(), start, rows, nh, hd, k_first, kv_rows);
  CUDA_CHECK_LAUNCH();
}

void hidden_rows_bwd(Ctx& ctx, Tensor dq, Tensor dk, Tensor dv, const int32_t* start,
                     int64_t k_first) {
  const int64_t rows = dq.shape[0], nh = dq.shape[1], hd = dq.shape[2];
  const int64_t kv_rows = dk.shape[0], nkv = dk.shape[1];
  if (rows + kv_rows == 0) return;
  hidden_bwd_kernel<<<static_cast<unsigned>(rows + kv_rows), 128, 0, stream_of(ctx)>>>(
      dq.ptr<bf16>(), dk.ptr<bf16>(), dv.ptr<bf16>(), start, rows, nh, nkv, hd, k_first, kv_rows);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tr::cuda
