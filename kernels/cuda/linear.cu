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
// One handle per process; each GEMM shape's plan (descriptors, layouts and up to 8 of the
// heuristics' algorithms, fastest first) is made once and cached; an algorithm that refuses to
// run (CUBLAS_STATUS_NOT_SUPPORTED) is dropped for the next, a shape none can run ends the job
// with one line, and any other error ends it at once.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/exit_codes.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

constexpr size_t kGemmWorkspace = size_t{32} << 20;  // cuBLASLt's share of ctx.workspace
constexpr int kThreads = 256;

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      TR_ASSERT(false, std::string("cuBLASLt GEMM on ") + dtype_name(dt));
  }
}

// One GEMM D = alpha op(A) op(B) + beta C (C = D), column-major, as cuBLASLt sees it.
struct GemmKey {
  int64_t m, n, k;
  bool ta, tb;
  DType ab, cd;
  bool bias, accumulate;
  // Alignment in bytes (up to 256) of the A, B, C and bias pointers: an algorithm chosen for
  // aligned operands may not run on views at odd offsets of the flat buffers.
  uint32_t align_a = 256, align_b = 256, align_c = 256, align_bias = 256;
  auto tie() const {
    return std::tie(m, n, k, ta, tb, ab, cd, bias, accumulate, align_a, align_b, align_c,
                    align_bias);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
  // "GEMM m=.. n=.. k=.. (A^T x B, bf16 -> f32, bias, accumulate)" for error lines.
  std::string describe() const {
    return "GEMM m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           " (" + (ta ? "A^T" : "A") + " x " + (tb ? "B^T" : "B") + ", " + dtype_name(ab) + " -> " +
           dtype_name(cd) + (bias ? ", bias" : "") + (accumulate ? ", accumulate" : "") +
           ", alignment " + std::to_string(align_a) + "/" + std::to_string(align_b) + "/" +
           std::to_string(align_c) + (bias ? "/bias " + std::to_string(align_bias) : "") +
           " bytes)";
  }
};

// The heuristics' algorithms for one GEMM, fastest first; `chosen` is the first that ran (an
// algorithm that fails is skipped from then on).
constexpr int kGemmAlgos = 8;
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algos[kGemmAlgos] = {};
  int n_algos = 0;
  int chosen = 0;
};

class Lt {
 public:
  static Lt& get() {
    static Lt lt;
    return lt;
  }
  cublasLtHandle_t handle() const { return handle_; }
  // The plan of `key`; `bias` (with key.bias) is a bias pointer of the key's alignment, set
  // while the heuristics choose so that they see the epilogue as it will run.
  GemmPlan& plan(const GemmKey& key, const void* bias);

 private:
  Lt() { CUBLAS_CHECK(cublasLtCreate(&handle_)); }
  cublasLtHandle_t handle_ = nullptr;
  std::mutex mu_;
  std::map<GemmKey, GemmPlan> plans_;
};

GemmPlan& Lt::plan(const GemmKey& key, const void* bias) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  GemmPlan p;
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // fp32 accumulation, no TF32
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  const cublasOperation_t ta = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                          tb = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (key.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    const cudaDataType_t bias_type = cuda_type(key.cd);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                &bias_type, sizeof(bias_type)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
  }
  // Stored shapes (rows x cols, leading dimension = rows): A is m x k (or k x m when
  // transposed), B is k x n (or n x k), C is m x n.
  const uint64_t a_rows = key.ta ? key.k : key.m, a_cols = key.ta ? key.m : key.k;
  const uint64_t b_rows = key.tb ? key.n : key.k, b_cols = key.tb ? key.k : key.n;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, cuda_type(key.ab), a_rows, a_cols, a_rows));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, cuda_type(key.ab), b_rows, b_cols, b_rows));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, cuda_type(key.cd), key.m, key.n, key.m));
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kGemmWorkspace;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
  for (auto [attr, bytes] : aligns)
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof(bytes)));
  cublasLtMatmulHeuristicResult_t results[kGemmAlgos] = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c,
                                                           pref, kGemmAlgos, results, &found);
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  for (int i = 0; i < found && st == CUBLAS_STATUS_SUCCESS; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) p.algos[p.n_algos++] = results[i].algo;
  if (p.n_algos == 0)
    end_job(kExitFailure, "cuBLASLt " + std::to_string(cublasLtGetVersion()) +
                              " has no algorithm for " + key.describe() + " (heuristic status " +
                              std::to_string(static_cast<int>(st)) + ")");
  return plans_.emplace(key, p).first->second;
}

// Largest power of two (up to 256) dividing the address.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(256, a & (~a + 1)));
}

void gemm(Ctx& ctx, GemmKey key, const void* A, const void* B, void* C, const void* bias,
          float beta) {
  key.align_a = alignment(A);
  key.align_b = alignment(B);
  key.align_c = alignment(C);
  if (key.bias) key.align_bias = alignment(bias);
  Lt& lt = Lt::get();
  GemmPlan& p = lt.plan(key, bias);
  if (key.bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
  Workspace ws(ctx, "linear (cuBLASLt)");
  void* scratch = ws.take<char>(static_cast<int64_t>(kGemmWorkspace));
  const float alpha = 1.0f;
  // The chosen algorithm; one that refuses this shape (NOT_SUPPORTED) is dropped for the next,
  // once and for good. Any other error is not the algorithm's: it ends the job now.
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  for (; p.chosen < p.n_algos; ++p.chosen) {
    st = cublasLtMatmul(lt.handle(), p.desc, &alpha, A, p.a, B, p.b, &beta, C, p.c, C, p.c,
                        &p.algos[p.chosen], scratch, kGemmWorkspace, stream_of(ctx));
    if (st == CUBLAS_STATUS_SUCCESS) return;
    if (st != CUBLAS_STATUS_NOT_SUPPORTED)
      end_job(kExitFailure, "cuBLASLt " + std::to_string(cublasLtGetVersion()) + " failed " +
                                key.describe() + ": " + cublas_error_detail(st));
  }
  end_job(kExitFailure, "cuBLASLt " + std::to_string(cublasLtGetVersion()) + ": none of the " +
                            std::to_string(p.n_algos) + " algorithms its heuristics gave ran " +
                            key.describe() + " (last " + cublas_error_detail(st) + ")");
}

// out[t][o] += bias[o]: the bias when its pointer is too unaligned for the GEMM epilogue.
template <class T>
__global__ void add_bias_rows(T* out, const T* bias, int64_t rows, int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_f<T>(to_f(out[i]) + to_f(bias[i % cols]));
}

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

}  // namespace

void linear_fwd(Ctx& ctx, Tensor out, Tensor in, Tensor weight, Tensor bias) {
  const int64_t T = in.shape[0], K = in.shape[1], O = weight.shape[0];
  // The epilogue reads the bias with 16-byte accesses; a bias at an odd offset is added apart.
  const bool epilogue = !bias.empty() && alignment(bias.data) >= 16;
  const GemmKey key{O, T, K, true, false, in.dtype, out.dtype, epilogue, false};
  gemm(ctx, key, weight.data, in.data, out.data, epilogue ? bias.data : nullptr, 0.0f);
  if (bias.empty() || epilogue) return;
  dispatch_float(out.dtype, "linear_fwd", [&](auto tag) {
    using T_ = decltype(tag);
    add_bias_rows<T_><<<grid_stride_blocks(T * O, kThreads), kThreads, 0, stream_of(ctx)>>>(
        out.ptr<T_>(), bias.ptr<T_>(), T, O);
  });
  CUDA_CHECK_LAUNCH();
}

void linear_bwd(Ctx& ctx, Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in,
                Tensor weight, bool assign_dweight) {
  const int64_t T = in.shape[0], K = in.shape[1], O = weight.shape[0];
  if (!din.empty()) {
    const GemmKey key{K, T, O, false, false, dout.dtype, din.dtype, false, false};
    gemm(ctx, key, weight.data, dout.data, din.data, nullptr, 0.0f);
  }
  if (dweight.empty()) return;  // the input gradient only (a split backward's B pass)
  const GemmKey wkey{K, O, T, false, true, in.dtype, dweight.dtype, false, !assign_dweight};
  gemm(ctx, wkey, in.data, dout.data, dweight.data, nullptr, assign_dweight ? 0.0f : 1.0f);
  if (dbias.empty()) return;
  const int chunks = column_chunks(T);
  Workspace ws(ctx, "linear_bwd (dbias)");
  float* partial = ws.take<float>(int64_t{chunks} * O);
  dispatch_float(dout.dtype, "linear_bwd", [&](auto tag) {
    using T_ = decltype(tag);
    const dim3 grid(blocks_for(O, kThreads), static_cast<unsigned>(chunks));
    column_sum_partial<T_><<<grid, kThreads, 0, stream_of(ctx)>>>(partial, dout.ptr<T_>(), T, O);
  });
  CUDA_CHECK_LAUNCH();
  add_column_partials(ctx, dbias, partial, chunks, "linear_bwd", assign_dweight);
}

}  // namespace tr::cuda
