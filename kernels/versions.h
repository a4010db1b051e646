// The GPU libraries the process loaded, their versions, and the one rule that refuses a mix that
// cannot work: a cuDNN or cuBLASLt built for another CUDA major than the runtime's (as when cuDNN
// comes from a Python wheel made for another CUDA), or a driver older than the runtime's major.
// Filled on GPUs by cuda::library_versions() (kernels/cuda/cuda_ops.h); checked and printed at
// start-up. Encodings are the libraries' own: CUDA 13000 = 13.0; cuDNN, cuBLASLt and NCCL
// major*10000 + minor*100 + patch.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace tr {

struct LibraryVersions {
  int64_t cuda_toolkit = 0;     // CUDART_VERSION the trainer was compiled with
  int64_t cuda_runtime = 0;     // cudaRuntimeGetVersion
  int64_t cuda_driver = 0;      // cudaDriverGetVersion: the newest CUDA the driver supports
  int64_t cublaslt = 0;         // cublasLtGetVersion
  int64_t cublaslt_cudart = 0;  // cublasLtGetCudartVersion: the CUDA it was built for
  int64_t cudnn = 0;            // cudnnGetVersion
  int64_t cudnn_cudart = 0;     // cudnnGetCudartVersion
  int64_t nccl = 0;             // ncclGetVersion (0: not loaded)
};

// "CUDA runtime 13.0 (built with 13.0, driver 13.0), cuBLASLt 13.1.0 (CUDA 13.0), cuDNN 9.14.0
// (CUDA 13.0), NCCL 2.28.3"; libraries not loaded (0) are left out.
std::string describe(const LibraryVersions& v);

// "CUDA 13.0, cuBLASLt 13.1.0, cuDNN 9.14.0, NCCL 2.28.9": the versions of `v` as headers
// give them at build time (cuda_toolkit, cublaslt, cudnn, nccl; 0s left out).
std::string describe_built(const LibraryVersions& v);

// OK, or one line naming the library, both versions and the fix.
absl::Status check_versions(const LibraryVersions& v);

}  // namespace tr
