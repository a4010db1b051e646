// The CUDA members of the check-macro family (core/check.h): each prints the failing
// call, the library's error name and message, the current device, rank, host and file:line,
// then ends every rank through the one fatal handler.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "core/check.h"

namespace tr::cuda {

// "cudaErrorMemoryAllocation: out of memory (device 3)"
inline std::string cuda_error_detail(cudaError_t e) {
  int device = -1;
  cudaGetDevice(&device);
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e) + " (device " +
         std::to_string(device) + ")";
}

inline int current_device() {
  int device = -1;
  cudaGetDevice(&device);
  return device;
}

inline std::string cublas_error_detail(cublasStatus_t s) {
  int device = -1;
  cudaGetDevice(&device);
  return "cublasStatus " + std::to_string(static_cast<int>(s)) + " (device " +
         std::to_string(device) + ")";
}

}  // namespace tr::cuda

#define CUDA_CHECK(expr) \
  TR_CHECK_GEN("CUDA", expr, _v == cudaSuccess, ::tr::cuda::cuda_error_detail(_v))
// After a kernel launch: the launch configuration was accepted.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
#define CUDNN_CHECK(expr)                                           \
  TR_CHECK_GEN("cuDNN", expr, _v == CUDNN_STATUS_SUCCESS,           \
               std::string(cudnnGetErrorString(_v)) + " (device " + \
                   std::to_string(::tr::cuda::current_device()) + ")")
#define CUBLAS_CHECK(expr) \
  TR_CHECK_GEN("cuBLAS", expr, _v == CUBLAS_STATUS_SUCCESS, ::tr::cuda::cublas_error_detail(_v))
