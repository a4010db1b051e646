// The versions of the GPU libraries this process loaded (kernels/versions.h).
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {

LibraryVersions library_versions() {
  LibraryVersions v;
  v.cuda_toolkit = CUDART_VERSION;
  int runtime = 0, driver = 0;
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  v.cuda_runtime = runtime;
  v.cuda_driver = driver;
  v.cublaslt = static_cast<int64_t>(cublasLtGetVersion());
  v.cublaslt_cudart = static_cast<int64_t>(cublasLtGetCudartVersion());
  v.cudnn = static_cast<int64_t>(cudnnGetVersion());
  v.cudnn_cudart = static_cast<int64_t>(cudnnGetCudartVersion());
  return v;
}

LibraryVersions compiled_library_versions() {
  LibraryVersions v;
  v.cuda_toolkit = CUDART_VERSION;
  v.cublaslt = CUBLAS_VERSION;
  v.cudnn = CUDNN_VERSION;
  return v;
}

}  // namespace tr::cuda
