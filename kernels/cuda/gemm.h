// cuBLASLt GEMMs as the linear layers (linear.cu) and the FP8 product (fp8.cu) run them: one
// handle per process, each GEMM shape's plan (descriptors, layouts and up to 8 of the
// heuristics' algorithms, fastest first) made once and cached; an algorithm that refuses to run
// (CUBLAS_STATUS_NOT_SUPPORTED) is dropped for the next, a shape none can run ends the job with
// one line, and any other error ends it at once. A GEMM whose n or k changes from call to call
// (GemmKey::varying) runs on the plan of its size's bucket (kernels/gemm_bucket.h), with its
// exact layouts; a size none of the bucket's algorithms takes gets a plan of its own. Internal
// to kernels/cuda.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include "core/ctx.h"
#include "core/tensor.h"

namespace tr::cuda {

// A GEMM dimension that changes from call to call: a grouped linear's rows per group.
enum class Varying : uint8_t { none, n, k };

// One GEMM D = alpha op(A) op(B) + beta C (C = D), column-major, as cuBLASLt sees it: A and B of
// dtypes a and b (f32 and bf16 both the same; FP8 per operand), C and D of cd.
struct GemmKey {
  int64_t m, n, k;
  bool ta, tb;
  DType a, b, cd;
  bool bias, accumulate;
  // Alignment in bytes (up to 256) of the A, B, C and bias pointers: an algorithm chosen for
  // aligned operands may not run on views at odd offsets of the flat buffers.
  uint32_t align_a = 256, align_b = 256, align_c = 256, align_bias = 256;
  // Not part of the key (a plan of one exact shape serves either way): which dimension, if any,
  // gemm() plans at its bucket.
  Varying varying = Varying::none;
  auto tie() const {
    return std::tie(m, n, k, ta, tb, a, b, cd, bias, accumulate, align_a, align_b, align_c,
                    align_bias);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
  // "GEMM m=.. n=.. k=.. (A^T x B, bf16 -> f32, bias, accumulate, ...)" for error lines.
  std::string describe() const;
};

// FP8 operands' inverse scales (f32 [1] on the device), applied by cuBLASLt to op(A) op(B).
struct GemmScales {
  const float* a = nullptr;
  const float* b = nullptr;
};

// Runs `key` on ctx's stream (key's alignments are taken from the pointers); bias only with
// key.bias (the epilogue adds it, key.cd's dtype, by rows of D); beta 0 assigns, 1 accumulates.
void gemm(Ctx& ctx, GemmKey key, const void* A, const void* B, void* C, const void* bias,
          float beta, GemmScales scales = {});

// Largest power of two (up to 256) dividing the address.
uint32_t alignment(const void* p);

// out [rows, cols] += bias [cols] (f32 or bf16): a bias the GEMM epilogue cannot take.
void add_bias_rows(Ctx& ctx, Tensor out, Tensor bias);

}  // namespace tr::cuda
