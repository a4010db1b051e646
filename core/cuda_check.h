// The CUDA runtime's member of the check-macro family (core/check.h), for every layer that calls
// the runtime (core's device buffers, parallel/'s NCCL streams, the kernels): prints the failing
// call, the error's name and message, the current device, rank, host and file:line, then ends
// every rank through the one fatal handler. cuDNN's and cuBLAS's are in kernels/cuda/cuda_check.h.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/check.h"

namespace tr::cuda {

inline int current_device() {
  int device = -1;
  cudaGetDevice(&device);
  return device;
}

// "cudaErrorMemoryAllocation: out of memory (device 3)"
inline std::string cuda_error_detail(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e) + " (device " +
         std::to_string(current_device()) + ")";
}

}  // namespace tr::cuda

#define CUDA_CHECK(expr) \
  TR_CHECK_GEN("CUDA", expr, _v == cudaSuccess, ::tr::cuda::cuda_error_detail(_v))
// After a kernel launch: the launch configuration was accepted.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
