// The GPU as the layers above the kernels see it: whether this build has the CUDA backend,
// which devices there are, the GPU libraries loaded, one process's device context and the
// device-side timing of its stream, and profiler ranges. Compiled in every build: without the
// CUDA backend there is no device (device_count() is 0), the versions are zero, the profiler
// ranges do nothing, and a DeviceContext or EventTimeline cannot be made (callers ask
// cuda_built() or device_available() first). The ops themselves are kernels/ops.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/ctx.h"
#include "core/tensor.h"
#include "kernels/versions.h"

namespace tr {

// This build has the CUDA backend (-DTRAINER_CUDA=ON with nvcc found).
bool cuda_built();

// A named range on the profiler's timeline (NVTX: Nsight Systems shows it); ranges nest.
void profiler_range_push(const char* name);
void profiler_range_pop();
// cudaProfilerStart (on) or cudaProfilerStop (off): what a profiler started with capture off
// records lies between them. Nothing on the CPU backend.
void profiler_capture(bool on);

namespace cuda {

// True when a CUDA device can run kernels here (a driver and at least one GPU).
bool device_available();
int device_count();
// Name of device `index` ("NVIDIA H100 80GB HBM3"), or "" when there is none.
std::string device_name(int index);
// Whether device `index` has FP8 tensor cores: compute capability 8.9 or newer (Ada, Hopper,
// Blackwell). Its name and capability come with it for the line that refuses FP8 on an older GPU;
// no such device (or no CUDA backend) is unsupported with an empty name.
struct Fp8Support {
  bool supported = false;
  std::string name;
  int major = 0, minor = 0;  // compute capability
};
Fp8Support fp8_support(int index);
// Its PCI bus id ("0000:3B:00.0"): the same physical GPU has the same id in every process,
// whatever CUDA_VISIBLE_DEVICES renumbered.
std::string device_pci_bus_id(int index);
// The CUDA runtime, driver, cuBLASLt and cuDNN versions loaded (nccl left 0; parallel/ fills it).
LibraryVersions library_versions();
// The versions of the CUDA, cuBLASLt and cuDNN headers this build was compiled with.
LibraryVersions compiled_library_versions();

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
// everything queued before the sync. The ring starts at `capacity` marks and doubles when a mark
// finds it full of uncollected ones (a 72B stage's step makes about 10^5), up to kMaxMarks;
// marks past that are dropped (and counted), so a caller that never collects stops growing.
class EventTimeline {
 public:
  static constexpr int64_t kMaxMarks = int64_t{1} << 20;
  EventTimeline(const Ctx& ctx, int capacity);
  ~EventTimeline();
  EventTimeline(const EventTimeline&) = delete;
  EventTimeline& operator=(const EventTimeline&) = delete;
  void mark(int tag);
  // The marks made so far (a running count, dropped ones not counted).
  int64_t marked() const { return first_mark_ + count_; }
  // Adds the seconds of each completed interval that ends at one of the first `upto` marks to
  // seconds[tag] (tags in [0, n)); later intervals wait for a later collect.
  void collect(double* seconds, int n, int64_t upto);
  int64_t dropped() const { return dropped_; }

 private:
  void* stream_;
  std::vector<void*> events_;  // cudaEvent_t, a ring
  std::vector<int> tags_;
  int64_t first_ = 0;       // ring index of the oldest uncollected mark (the next interval's start)
  int64_t count_ = 0;       // uncollected marks from first_
  int64_t first_mark_ = 0;  // the running number of the mark at first_
  int64_t dropped_ = 0;
};

}  // namespace cuda
}  // namespace tr
