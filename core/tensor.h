// Tensor: a non-owning, typed, shaped view of memory on one device. Ops take tensors by
// value; ownership lives in Buffer (an RAII allocation) and Arena (views carved out of one).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/check.h"

namespace tr {

// f8e4m3 and f8e5m2: OCP FP8 codes, one byte each (kernels/fp8.h), as FP8 GEMMs read them.
enum class DType : uint8_t { f32, f64, bf16, i32, i64, f8e4m3, f8e5m2 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
inline bool is_fp8(DType dtype) {
  return dtype == DType::f8e4m3 || dtype == DType::f8e5m2;
}
const char* device_name(Device device);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
// bf16 on the host is its bit pattern (core/bf16.h converts); device code uses
// __nv_bfloat16 (kernels/cuda/common.cuh).
template <>
constexpr DType dtype_of<uint16_t>() {
  return DType::bf16;
}

struct Tensor {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};  // row-major, contiguous

  Tensor() = default;
  Tensor(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape);

  bool empty() const { return data == nullptr; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // Size of dimension i; negative i counts from the end.
  int64_t dim(int i) const;
  std::string shape_str() const;  // e.g. "f32[8,64]"

  template <class T>
  T* ptr() const {
    TR_ASSERT(dtype == dtype_of<T>(), std::string("tensor is ") + dtype_name(dtype));
    return static_cast<T*>(data);
  }
  // Same memory, new shape with the same element count.
  Tensor view(std::initializer_list<int64_t> new_shape) const;
  // A contiguous sub-view starting `offset` elements into this tensor's memory.
  Tensor at(int64_t offset, std::initializer_list<int64_t> new_shape) const;
  // Rows [begin, begin + count) of dimension 0.
  Tensor slice(int64_t begin, int64_t count) const;
  bool same_shape(const Tensor& other) const;
};

// Owning allocation of raw bytes on one device (64-byte aligned on the host; cudaMalloc'd,
// 256-byte aligned, on a GPU).
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Device device);
  // Page-locked host memory (cudaHostAlloc), which asynchronous copies to a device need; plain
  // host memory without the CUDA backend. Call only when a GPU is in use.
  static Buffer pinned(size_t bytes);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::cpu;
  bool pinned_ = false;
};

// Bump allocator over one Buffer: everything the step loop touches is carved out at start-up.
// The memory starts zeroed (host or device).
class Arena {
 public:
  Arena(size_t bytes, Device device);
  // An arena that only measures: alloc() returns tensors without memory and counts the bytes a
  // real arena needs for the same sequence of allocations (see used()).
  static Arena planner(Device device);
  Tensor alloc(DType dtype, std::initializer_list<int64_t> shape);
  size_t used() const { return used_; }
  size_t capacity() const { return buffer_.bytes(); }

 private:
  Arena() = default;
  Buffer buffer_;
  size_t used_ = 0;
  bool planning_ = false;
  Device device_ = Device::cpu;
};

// Returns the bytes an Arena needs for these allocations (with alignment padding).
size_t arena_bytes(DType dtype, int64_t numel);

// Copies src into dst (same dtype and element count; any devices). Synchronous: for set-up,
// tests and checkpoints, never the step loop (a copy to or from a device is a host sync).
void copy_tensor(Tensor dst, Tensor src);

// Host synchronisations: each time the host waits for the device (a copy between host and
// device memory, a value read back, synchronize()). The operations that wait on a GPU count on
// the CPU backend too, so that a CPU run shows the GPU step's count (metrics: host_syncs).
void count_host_sync();
int64_t host_sync_count();

}  // namespace tr
