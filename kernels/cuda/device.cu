// kernels/device.h on the CUDA backend, and the device-level ops of cuda_ops.h.
#include <cuda_profiler_api.h>
#include <nvtx3/nvToolsExt.h>  // header-only NVTX 3 of the CUDA toolkit

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr {

bool cuda_built() {
  return true;
}
void profiler_range_push(const char* name) {
  nvtxRangePushA(name);
}
void profiler_range_pop() {
  nvtxRangePop();
}
void profiler_capture(bool on) {
  // Without a profiler attached both are no-ops that return success; a failure costs the
  // capture, not the run.
  if (const cudaError_t e = on ? cudaProfilerStart() : cudaProfilerStop(); e != cudaSuccess) {
    (void)cudaGetLastError();  // not left for the next launch check to find
    std::fprintf(stderr, "warning: %s: %s; the profiler records nothing\n",
                 on ? "cudaProfilerStart" : "cudaProfilerStop", cudaGetErrorString(e));
  }
}

}  // namespace tr

namespace tr::cuda {

int device_count() {
  int count = 0;
  // No driver, no device or a broken install all mean "no GPU here"; clear the sticky error.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

bool device_available() {
  return device_count() > 0;
}

DeviceContext::DeviceContext(int index, size_t workspace_bytes) : index_(index) {
  CUDA_CHECK(cudaSetDevice(index));
  cudaStream_t s = nullptr;
  // A blocking stream: the synchronous copies of copy_tensor (legacy default stream) wait for
  // the kernels queued on it, and it for them, so host reads never see half-written results.
  CUDA_CHECK(cudaStreamCreate(&s));
  stream_ = s;
  workspace_ = Buffer(workspace_bytes, Device::cuda);
}

DeviceContext::~DeviceContext() {
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Ctx DeviceContext::ctx() const {
  Ctx c;
  c.device = Device::cuda;
  c.stream = stream_;
  c.workspace = workspace_.data();
  c.workspace_bytes = workspace_.bytes();
  return c;
}

void DeviceContext::synchronize() const {
  CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
}

EventTimeline::EventTimeline(const Ctx& ctx, int capacity)
    : stream_(ctx.stream), events_(static_cast<size_t>(capacity)), tags_(events_.size()) {
  for (void*& e : events_) {
    cudaEvent_t ev = nullptr;
    CUDA_CHECK(cudaEventCreate(&ev));  // with timing
    e = ev;
  }
}

EventTimeline::~EventTimeline() {
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void EventTimeline::mark(int tag) {
  auto n = static_cast<int64_t>(events_.size());
  if (count_ == n) {
    if (n >= kMaxMarks) {
      ++dropped_;
      return;
    }
    // Doubles the ring, the uncollected marks first and in order (all n of them: it is full).
    std::vector<void*> events;
    std::vector<int> tags;
    events.reserve(static_cast<size_t>(2 * n));
    tags.reserve(static_cast<size_t>(2 * n));
    for (int64_t i = 0; i < n; ++i) {
      events.push_back(events_[static_cast<size_t>((first_ + i) % n)]);
      tags.push_back(tags_[static_cast<size_t>((first_ + i) % n)]);
    }
    for (int64_t i = 0; i < n; ++i) {
      cudaEvent_t ev = nullptr;
      CUDA_CHECK(cudaEventCreate(&ev));
      events.push_back(ev);
      tags.push_back(0);
    }
    events_ = std::move(events);
    tags_ = std::move(tags);
    first_ = 0;
    n *= 2;
  }
  const size_t at = static_cast<size_t>((first_ + count_) % n);
  CUDA_CHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(events_[at]), static_cast<cudaStream_t>(stream_)));
  tags_[at] = tag;
  ++count_;
}

void EventTimeline::collect(double* seconds, int n, int64_t upto) {
  const auto size = static_cast<int64_t>(events_.size());
  // Intervals [k, k + 1) while mark k + 1 has completed; mark k stays as the next start.
  while (count_ >= 2 && first_mark_ + 1 < upto) {
    const auto a = static_cast<size_t>(first_), b = static_cast<size_t>((first_ + 1) % size);
    const cudaError_t done = cudaEventQuery(static_cast<cudaEvent_t>(events_[b]));
    if (done == cudaErrorNotReady) break;
    CUDA_CHECK(done);
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[a]),
                                    static_cast<cudaEvent_t>(events_[b])));
    if (tags_[a] >= 0 && tags_[a] < n) seconds[tags_[a]] += ms * 1e-3;
    first_ = static_cast<int64_t>(b);
    --count_;
    ++first_mark_;
  }
}

DeviceInfo device_info() {
  int index = 0;
  CUDA_CHECK(cudaGetDevice(&index));
  DeviceInfo info{device_name(index), 0.0, 0.0, 0.0};
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  info.memory_used_mib = static_cast<double>(total_bytes - free_bytes) / (1024.0 * 1024.0);
  info.memory_free_mib = static_cast<double>(free_bytes) / (1024.0 * 1024.0);
  return info;
}

void synchronize(const Ctx& ctx) {
  CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
}

// After everything queued on ctx's stream: the copy is queued there and waited for.
void read_f64(Ctx& ctx, Tensor src, double* out) {
  CUDA_CHECK(cudaMemcpyAsync(out, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_of(ctx)));
  CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
}

void upload_async(Ctx& ctx, Tensor dst, Tensor src) {
  CUDA_CHECK(
      cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyHostToDevice, stream_of(ctx)));
}

std::string device_pci_bus_id(int index) {
  char id[32] = {};
  CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof(id), index));
  return id;
}

std::string device_name(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return prop.name;
}

Fp8Support fp8_support(int index) {
  Fp8Support s;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return s;
  }
  s.name = prop.name;
  s.major = prop.major;
  s.minor = prop.minor;
  s.supported = prop.major > 8 || (prop.major == 8 && prop.minor >= 9);
  return s;
}

}  // namespace tr::cuda
