// CUDA backend: the ops of kernels/ops.h on the GPU, f32 and bf16 (activations and weights
// in bf16, parameter gradients and optimizer state in f32). Callers go through the tr:: entry
// points in ops.h, which check preconditions and dispatch here. Each launcher runs on
// ctx.stream, checks the launch and never synchronises the device (sum_squares waits for its
// own stream: its result goes to the host).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ctx.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "kernels/versions.h"

namespace tr::cuda {

// True when a CUDA device can run kernels here (a driver and at least one GPU).
bool device_available();
int device_count();

// One process's GPU: selects device `index`, creates the compute stream (the handles of
// cuBLASLt and cuDNN are made once, on first use) and the ops' workspace. ctx() hands ops all
// three.
class DeviceContext {
 public:
  DeviceContext(int index, size_t workspace_bytes);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;
  Ctx ctx() const;
  int index() const { return index_; }
  size_t workspace_bytes() const { return workspace_.bytes(); }
  // Waits for everything queued on the stream.
  void synchronize() const;

 private:
  int index_;
  void* stream_ = nullptr;  // cudaStream_t
  Buffer workspace_;
};
// Device-side timing of a stream's work without host syncs: marks queued on the stream (CUDA
// events), each with a tag; collect() charges the time between each two consecutive marks that
// have both completed to the earlier mark's tag. Called right after a host sync, it sees
// everything queued before the sync. Marks past `capacity` uncollected ones are dropped (and
// counted), so a caller that never collects costs nothing more.
class EventTimeline {
 public:
  EventTimeline(const Ctx& ctx, int capacity);
  ~EventTimeline();
  EventTimeline(const EventTimeline&) = delete;
  EventTimeline& operator=(const EventTimeline&) = delete;
  void mark(int tag);
  // Adds the seconds of each completed interval to seconds[tag] (tags in [0, n)).
  void collect(double* seconds, int n);
  int64_t dropped() const { return dropped_; }

 private:
  void* stream_;
  std::vector<void*> events_;  // cudaEvent_t, a ring
  std::vector<int> tags_;
  int64_t first_ = 0;  // ring index of the oldest uncollected mark (the next interval's start)
  int64_t count_ = 0;  // uncollected marks from first_
  int64_t dropped_ = 0;
};

// Name of device `index` ("NVIDIA H100 80GB HBM3"), or "" when there is none.
std::string device_name(int index);
// Its PCI bus id ("0000:3B:00.0"): the same physical GPU has the same id in every process,
// whatever CUDA_VISIBLE_DEVICES renumbered.
std::string device_pci_bus_id(int index);
// The current device: name, dense bf16 peak from a table of known GPUs (0 if unknown), memory
// in use.
DeviceInfo device_info();
// The CUDA runtime, driver, cuBLASLt and cuDNN versions loaded (nccl left 0; parallel/ fills it).
LibraryVersions library_versions();
// The versions of the CUDA, cuBLASLt and cuDNN headers this build was compiled with.
LibraryVersions compiled_library_versions();
void synchronize(const Ctx& ctx);

// Every op of kernels/backend_ops.inc, and the CUDA-only ones below.
#define TR_BACKEND_OP(ret, name, params) ret name params;
#include "kernels/backend_ops.inc"
#undef TR_BACKEND_OP

// bf16 only (cuDNN fused attention).
AttentionPlan attention_prepare(Ctx& ctx, int batch, int seq_len, int n_heads, int n_kv_heads,
                                int head_dim, int cp_chunk);
// Whether the backward graph attention_bwd runs for this shape and ctx.deterministic is cuDNN's
// deterministic one (it may have fallen back to the other mode); builds it if needed.
bool attention_bwd_deterministic(Ctx& ctx, int batch, int seq_len, int n_heads, int n_kv_heads,
                                 int head_dim);
void upload_async(Ctx& ctx, Tensor dst, Tensor src);
void read_f64(Ctx& ctx, Tensor src, double* out);

}  // namespace tr::cuda
