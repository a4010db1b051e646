// kernels/cuda/gemm.h: the cuBLASLt handle, the plans of each GEMM shape, and the bias added
// apart from the epilogue.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include "core/exit_codes.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"

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
    case DType::f8e4m3:
      return CUDA_R_8F_E4M3;
    case DType::f8e5m2:
      return CUDA_R_8F_E5M2;
    default:
      TR_ASSERT(false, std::string("cuBLASLt GEMM on ") + dtype_name(dt));
  }
}

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

template <class T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

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
  static cublasLtMatmulDesc_t make_desc(const GemmKey& key, const void* bias);
  cublasLtHandle_t handle_ = nullptr;
  std::mutex mu_;
  std::map<GemmKey, GemmPlan> plans_;
};

cublasLtMatmulDesc_t Lt::make_desc(const GemmKey& key, const void* bias) {
  cublasLtMatmulDesc_t desc = nullptr;
  // fp32 accumulation, no TF32 (FP8 requires this compute and scale type too).
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attr(desc, CUBLASLT_MATMUL_DESC_TRANSA, key.ta ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attr(desc, CUBLASLT_MATMUL_DESC_TRANSB, key.tb ? CUBLAS_OP_T : CUBLAS_OP_N);
  if (key.bias) {
    set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set_attr(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cuda_type(key.cd));
    set_attr(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  }
  // FP8: Hopper's tensor cores sum FP8 products in an accumulator narrower than fp32; with fast
  // accumulation off cuBLASLt promotes the partial sums to fp32 at intervals along K (Transformer
  // Engine's "split accumulator", which it and torchao use for the gradient GEMMs). Off for every
  // GEMM here: the sums stay fp32 as the CPU oracle's are, at some cost in speed.
  if (is_fp8(key.a)) set_attr(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0});
  return desc;
}

GemmPlan& Lt::plan(const GemmKey& key, const void* bias) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  GemmPlan p;
  p.desc = make_desc(key, bias);
  // Stored shapes (rows x cols, leading dimension = rows): A is m x k (or k x m when
  // transposed), B is k x n (or n x k), C is m x n.
  const uint64_t a_rows = key.ta ? key.k : key.m, a_cols = key.ta ? key.m : key.k;
  const uint64_t b_rows = key.tb ? key.n : key.k, b_cols = key.tb ? key.k : key.n;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, cuda_type(key.a), a_rows, a_cols, a_rows));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, cuda_type(key.b), b_rows, b_cols, b_rows));
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

// out[t][o] += bias[o].
template <class T>
__global__ void add_bias_rows_kernel(T* out, const T* bias, int64_t rows, int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_f<T>(to_f(out[i]) + to_f(bias[i % cols]));
}

}  // namespace

std::string GemmKey::describe() const {
  const std::string ab =
      a == b ? dtype_name(a) : std::string(dtype_name(a)) + " x " + dtype_name(b);
  return "GEMM m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
         " (" + (ta ? "A^T" : "A") + " x " + (tb ? "B^T" : "B") + ", " + ab + " -> " +
         dtype_name(cd) + (bias ? ", bias" : "") + (accumulate ? ", accumulate" : "") +
         ", alignment " + std::to_string(align_a) + "/" + std::to_string(align_b) + "/" +
         std::to_string(align_c) + (bias ? "/bias " + std::to_string(align_bias) : "") + " bytes)";
}

uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(256, a & (~a + 1)));
}

void gemm(Ctx& ctx, GemmKey key, const void* A, const void* B, void* C, const void* bias,
          float beta, GemmScales scales) {
  key.align_a = alignment(A);
  key.align_b = alignment(B);
  key.align_c = alignment(C);
  if (key.bias) key.align_bias = alignment(bias);
  Lt& lt = Lt::get();
  GemmPlan& p = lt.plan(key, bias);
  if (key.bias) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (is_fp8(key.a)) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(scales.a));
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(scales.b));
  }
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

void add_bias_rows(Ctx& ctx, Tensor out, Tensor bias) {
  const int64_t rows = out.shape[0], cols = out.shape[1];
  dispatch_float(out.dtype, "add_bias_rows", [&](auto tag) {
    using T = decltype(tag);
    add_bias_rows_kernel<T>
        <<<grid_stride_blocks(rows * cols, kThreads), kThreads, 0, stream_of(ctx)>>>(
            out.ptr<T>(), bias.ptr<T>(), rows, cols);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace tr::cuda
