// Ctx: where an op runs. CPU ops ignore the stream; CUDA ops launch on it.
#pragma once

#include "core/tensor.h"

namespace tr {

class OpLog;  // kernels/op_log.h

struct Ctx {
  Device device = Device::cpu;
  void* stream = nullptr;  // cudaStream_t on the CUDA backend
  // Scratch memory on `device` for ops that need it (deterministic two-pass reductions,
  // sorting, GEMM workspace); reused by every op on the stream, so nothing in it outlives a
  // call. Ops that need more than workspace_bytes stop with a message naming the size.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Ops with a faster non-deterministic algorithm (cuDNN's attention backward) use it when
  // false; true gives the same bits run after run. CPU ops are always deterministic.
  bool deterministic = true;
  // Where the ops on this context are recorded (kernels/op_log.h: tests comparing what ran with
  // the model's op list); null = nowhere.
  OpLog* log = nullptr;
};

}  // namespace tr
