// Device discovery for tests and start-up.
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {

bool device_available() {
  int count = 0;
  // No driver, no device or a broken install all mean "no GPU here"; clear the sticky error.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

std::string device_name(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return prop.name;
}

}  // namespace tr::cuda
