// Typed row-major GEMM over OpenBLAS cblas for the CPU backend:
// C[M,N] = alpha * op(A) · op(B) + beta * C, op(X) = X or X^T; lda/ldb/ldc are row strides.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <limits>
#include <string>

#include "core/check.h"

namespace tr::cpu {

inline blasint blas_int(int64_t n) {
  TR_ASSERT(n >= 0 && n <= std::numeric_limits<blasint>::max(),
            "GEMM dimension " + std::to_string(n) + " does not fit the BLAS integer");
  return static_cast<blasint>(n);
}

inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, blas_int(m), blas_int(n), blas_int(k), alpha, a,
              blas_int(lda), b, blas_int(ldb), beta, c, blas_int(ldc));
}

inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                 int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, blas_int(m), blas_int(n), blas_int(k), alpha, a,
              blas_int(lda), b, blas_int(ldb), beta, c, blas_int(ldc));
}

}  // namespace tr::cpu
