// Between this rank's tensor-parallel shards (the flat buffers) and the global tensors that
// checkpoints hold: gather for saving, scatter for loading. Layout-independent checkpoints are
// what let a run resume under another tp, dp or zero1 setting.
#pragma once

#include <vector>

#include "checkpoint/checkpoint.h"
#include "parallel/comm.h"
#include "trainer/model.h"

namespace tr {

// Storage for every tensor of a layout in its global shape, with checkpoint refs into it.
struct GlobalTensors {
  std::vector<float> data;
  std::vector<ckpt::TensorRef> refs;  // one per ParamInfo, in layout order
  explicit GlobalTensors(const ParamLayout& layout);
};

// Fills `out` from every TP rank's `local` flat buffer (collective over `tp`).
void gather_global(const ParamLayout& layout, Comm& tp, const float* local, GlobalTensors& out);
// Copies this rank's slices of the global tensors into its `local` flat buffer (padding rows of
// the vocabulary become zero).
void scatter_global(const ParamLayout& layout, const GlobalTensors& in, float* local);

}  // namespace tr
