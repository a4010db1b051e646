// Ctx: where an op runs. CPU ops ignore the stream; CUDA ops launch on it.
#pragma once

#include "kernels/core/tensor.h"

namespace tr {

struct Ctx {
  Device device = Device::cpu;
  void* stream = nullptr;  // cudaStream_t on the CUDA backend
};

}  // namespace tr
