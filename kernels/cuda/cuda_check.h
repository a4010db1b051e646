// The CUDA libraries' members of the check-macro family (core/check.h), beside the runtime's
// (core/cuda_check.h): each prints the failing call, the library's error, the current device,
// rank, host and file:line, then ends every rank through the one fatal handler.
#pragma once

#include <cublasLt.h>
#include <cudnn.h>

#include <string>

#include "core/cuda_check.h"

namespace tr::cuda {

inline std::string cublas_error_detail(cublasStatus_t s) {
  return "cublasStatus " + std::to_string(static_cast<int>(s)) + " (device " +
         std::to_string(current_device()) + ")";
}

}  // namespace tr::cuda

#define CUDNN_CHECK(expr)                                           \
  TR_CHECK_GEN("cuDNN", expr, _v == CUDNN_STATUS_SUCCESS,           \
               std::string(cudnnGetErrorString(_v)) + " (device " + \
                   std::to_string(::tr::cuda::current_device()) + ")")
#define CUBLAS_CHECK(expr) \
  TR_CHECK_GEN("cuBLAS", expr, _v == CUBLAS_STATUS_SUCCESS, ::tr::cuda::cublas_error_detail(_v))
