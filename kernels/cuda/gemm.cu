// kernels/cuda/gemm.h: the cuBLASLt handle, the plans of each GEMM shape, and the bias added
// apart from the epilogue.
#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <string>

#include "core/exit_codes.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/gemm_bucket.h"

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

// The heuristics' algorithms for one GEMM, fastest first (none: the heuristics' status says
// why); `chosen` is the first that ran (an algorithm that fails is skipped from then on).
constexpr int kGemmAlgos = 8;
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algos[kGemmAlgos] = {};
  int n_algos = 0;
  int chosen = 0;
  int heuristic_status = 0;
};

template <class T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

// The operands as stored (rows x cols, leading dimension = rows): A is m x k (or k x m when
// transposed), B is k x n (or n x k), C is m x n.
struct Stored {
  cudaDataType_t type;
  uint64_t rows, cols;
};
std::array<Stored, 3> stored(const GemmKey& key) {
  const uint64_t m = key.m, n = key.n, k = key.k;
  const DType a = key.a, b = key.b;
  return {key.ta ? Stored{cuda_type(a), k, m} : Stored{cuda_type(a), m, k},
          key.tb ? Stored{cuda_type(b), n, k} : Stored{cuda_type(b), k, n},
          Stored{cuda_type(key.cd), m, n}};
}

// key's layouts of A, B and C for one call, in place (a plan's own are made once, at its shape).
struct CallLayouts {
  cublasLtMatrixLayoutOpaque_t a, b, c;
  explicit CallLayouts(const GemmKey& key) {
    const std::array<Stored, 3> s = stored(key);
    cublasLtMatrixLayoutOpaque_t* ops[3] = {&a, &b, &c};
    for (int i = 0; i < 3; ++i)
      CUBLAS_CHECK(cublasLtMatrixLayoutInit(ops[i], s[i].type, s[i].rows, s[i].cols, s[i].rows));
  }
  CallLayouts(const CallLayouts&) = delete;
  CallLayouts& operator=(const CallLayouts&) = delete;
};

// key with its varying dimension at its bucket's size: the shape its plan is made for.
GemmKey planned(GemmKey key) {
  if (key.varying == Varying::n) key.n = gemm_bucket(key.n);
  if (key.varying == Varying::k) key.k = gemm_bucket(key.k);
  return key;
}

// Ends the job: "cuBLASLt <version>" then `what`.
[[noreturn]] void gemm_failed(const std::string& what) {
  end_job(kExitFailure, "cuBLASLt " + std::to_string(cublasLtGetVersion()) + what);
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
  bool has_plan(const GemmKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return plans_.count(key) > 0;
  }

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
  const std::array<Stored, 3> s = stored(key);
  cublasLtMatrixLayout_t* layouts[3] = {&p.a, &p.b, &p.c};
  for (int i = 0; i < 3; ++i)
    CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(layouts[i], s[i].type, s[i].rows, s[i].cols, s[i].rows));
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
  p.heuristic_status = static_cast<int>(st);
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
  Workspace ws(ctx, "linear (cuBLASLt)");
  void* scratch = ws.take<char>(static_cast<int64_t>(kGemmWorkspace));
  const float alpha = 1.0f;
  // The plan's descriptor with this call's pointers, run on `algo` over layouts a, b and c.
  auto matmul = [&](GemmPlan& p, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                    cublasLtMatrixLayout_t c, const cublasLtMatmulAlgo_t& algo) {
    if (key.bias) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    if (is_fp8(key.a)) {
      set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(scales.a));
      set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(scales.b));
    }
    return cublasLtMatmul(lt.handle(), p.desc, &alpha, A, a, B, b, &beta, C, c, C, c, &algo,
                          scratch, kGemmWorkspace, stream_of(ctx));
  };
  // A varying size off its bucket's: the bucket's plan at this call's layouts, unless this size
  // has a plan of its own. A refusal (or layouts the algorithm does not match) is this size's
  // alone: the bucket keeps its algorithms, and this size falls to a plan of its own below.
  const GemmKey at = planned(key);
  if ((at.n != key.n || at.k != key.k) && !lt.has_plan(key)) {
    GemmPlan& p = lt.plan(at, bias);
    CallLayouts l(key);
    for (int i = p.chosen; i < p.n_algos; ++i) {
      const cublasStatus_t st = matmul(p, &l.a, &l.b, &l.c, p.algos[i]);
      if (st == CUBLAS_STATUS_SUCCESS) return;
      if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
        gemm_failed(" failed " + key.describe() + " on the plan of " + at.describe() + ": " +
                    cublas_error_detail(st));
    }
  }
  GemmPlan& p = lt.plan(key, bias);
  if (p.n_algos == 0)
    gemm_failed(" has no algorithm for " + key.describe() + " (heuristic status " +
                std::to_string(p.heuristic_status) + ")");
  // The chosen algorithm; one that refuses this shape (NOT_SUPPORTED) is dropped for the next,
  // once and for good. Any other error is not the algorithm's: it ends the job now.
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  for (; p.chosen < p.n_algos; ++p.chosen) {
    st = matmul(p, p.a, p.b, p.c, p.algos[p.chosen]);
    if (st == CUBLAS_STATUS_SUCCESS) return;
    if (st != CUBLAS_STATUS_NOT_SUPPORTED)
      gemm_failed(" failed " + key.describe() + ": " + cublas_error_detail(st));
  }
  gemm_failed(": none of the " + std::to_string(p.n_algos) +
              " algorithms its heuristics gave ran " + key.describe() + " (last " +
              cublas_error_detail(st) + ")");
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
