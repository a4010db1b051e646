#include "core/tensor.h"

#include <atomic>

#ifdef TRAINER_HAVE_CUDA
#include "core/cuda_check.h"
#endif

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

#include "core/check.h"
#include "core/exit_codes.h"

namespace tr {

namespace {
constexpr size_t kAlign = 256;  // enough for AVX-512 and for GPU coalescing
size_t round_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::f8e4m3:
    case DType::f8e5m2:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::f8e4m3:
      return "f8e4m3";
    case DType::f8e5m2:
      return "f8e5m2";
  }
  return "?";
}

const char* device_name(Device device) {
  return device == Device::cpu ? "cpu" : "cuda";
}

Tensor::Tensor(void* data_, DType dtype_, Device device_, std::initializer_list<int64_t> shape_)
    : data(data_), dtype(dtype_), device(device_), ndim(static_cast<int>(shape_.size())) {
  TR_ASSERT(ndim <= kMaxDims, "too many dimensions");
  int i = 0;
  for (int64_t s : shape_) {
    TR_ASSERT(s >= 0, "negative dimension");
    shape[i++] = s;
  }
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += ndim;
  TR_ASSERT(i >= 0 && i < ndim, "dimension index out of range for " + shape_str());
  return shape[i];
}

std::string Tensor::shape_str() const {
  std::ostringstream os;
  os << dtype_name(dtype) << "[";
  for (int i = 0; i < ndim; ++i) os << (i ? "," : "") << shape[i];
  os << "]";
  return os.str();
}

Tensor Tensor::view(std::initializer_list<int64_t> new_shape) const {
  Tensor t(data, dtype, device, new_shape);
  TR_ASSERT(t.numel() == numel(), "view " + t.shape_str() + " of " + shape_str());
  return t;
}

Tensor Tensor::at(int64_t offset, std::initializer_list<int64_t> new_shape) const {
  Tensor t(static_cast<char*>(data) + static_cast<size_t>(offset) * dtype_size(dtype), dtype,
           device, new_shape);
  TR_ASSERT(
      offset >= 0 && offset + t.numel() <= numel(),
      "sub-view " + t.shape_str() + " at " + std::to_string(offset) + " outside " + shape_str());
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t count) const {
  TR_ASSERT(ndim >= 1 && begin >= 0 && count >= 0 && begin + count <= shape[0],
            "slice out of range of " + shape_str());
  Tensor t = *this;
  t.shape[0] = count;
  t.data = static_cast<char*>(data) +
           static_cast<size_t>(begin) * (nbytes() / (shape[0] ? shape[0] : 1));
  return t;
}

bool Tensor::same_shape(const Tensor& other) const {
  if (ndim != other.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (shape[i] != other.shape[i]) return false;
  return true;
}

Buffer::Buffer(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (bytes == 0) return;
  if (device == Device::cuda) {
#ifdef TRAINER_HAVE_CUDA
    if (const cudaError_t e = cudaMalloc(&data_, round_up(bytes)); e != cudaSuccess) {
      (void)cudaGetLastError();
      if (e == cudaErrorMemoryAllocation)
        end_job(kExitFailure, "out of GPU memory: cannot allocate " + std::to_string(bytes >> 20) +
                                  " MiB more; lower train.micro_batch or data.seq_len, or split "
                                  "the model over more GPUs (parallel.tp, parallel.pp, "
                                  "parallel.zero1)");
      CUDA_CHECK(e);
    }
    return;
#else
    TR_ASSERT(false, "a CUDA buffer in a build without the CUDA backend");
#endif
  }
  data_ = std::aligned_alloc(kAlign, round_up(bytes));
  if (data_ == nullptr)
    end_job(kExitFailure, "out of host memory: cannot allocate " + std::to_string(bytes >> 20) +
                              " MiB more; lower train.micro_batch or data.seq_len, or give the "
                              "job more memory (the start-up check counted what it knew)");
}

Buffer::~Buffer() {
  release();
}

Buffer Buffer::pinned(size_t bytes) {
#ifdef TRAINER_HAVE_CUDA
  Buffer b;
  b.bytes_ = bytes;
  if (bytes == 0) return b;
  CUDA_CHECK(cudaHostAlloc(&b.data_, round_up(bytes), cudaHostAllocDefault));
  b.pinned_ = true;
  return b;
#else
  return Buffer(bytes, Device::cpu);
#endif
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_),
      pinned_(std::exchange(other.pinned_, false)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
    pinned_ = std::exchange(other.pinned_, false);
  }
  return *this;
}

void Buffer::release() {
#ifdef TRAINER_HAVE_CUDA
  if (data_ && device_ == Device::cuda) {
    CUDA_CHECK(cudaFree(data_));
    data_ = nullptr;
  }
  if (data_ && pinned_) {
    CUDA_CHECK(cudaFreeHost(data_));
    data_ = nullptr;
  }
#endif
  if (data_) std::free(data_);
  data_ = nullptr;
}

namespace {
std::atomic<int64_t> g_host_syncs{0};
}  // namespace

void count_host_sync() {
  g_host_syncs.fetch_add(1, std::memory_order_relaxed);
}
int64_t host_sync_count() {
  return g_host_syncs.load(std::memory_order_relaxed);
}

void copy_tensor(Tensor dst, Tensor src) {
  TR_ASSERT(dst.dtype == src.dtype && dst.numel() == src.numel(),
            "copy_tensor: " + src.shape_str() + " into " + dst.shape_str());
  if (src.numel() == 0) return;
  if (dst.device == Device::cpu && src.device == Device::cpu) {
    std::memmove(dst.data, src.data, src.nbytes());
    return;
  }
  count_host_sync();
#ifdef TRAINER_HAVE_CUDA
  CUDA_CHECK(cudaMemcpy(dst.data, src.data, src.nbytes(), cudaMemcpyDefault));
#else
  TR_ASSERT(false, "copy_tensor: a CUDA tensor in a build without the CUDA backend");
#endif
}

size_t arena_bytes(DType dtype, int64_t numel) {
  return round_up(static_cast<size_t>(numel) * dtype_size(dtype));
}

Arena::Arena(size_t bytes, Device device) : buffer_(bytes, device), device_(device) {
  if (!buffer_.data()) return;
  if (device == Device::cpu) {
    std::memset(buffer_.data(), 0, buffer_.bytes());
    return;
  }
#ifdef TRAINER_HAVE_CUDA
  CUDA_CHECK(cudaMemset(buffer_.data(), 0, buffer_.bytes()));
  CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

Arena Arena::planner(Device device) {
  Arena a;
  a.planning_ = true;
  a.device_ = device;
  return a;
}

Tensor Arena::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t(nullptr, dtype, device_, shape);
  size_t need = arena_bytes(dtype, t.numel());
  if (planning_) {
    used_ += need;
    return t;
  }
  TR_ASSERT(used_ + need <= buffer_.bytes(), "arena exhausted: need " +
                                                 std::to_string(used_ + need) + " of " +
                                                 std::to_string(buffer_.bytes()) + " bytes");
  t.data = static_cast<char*>(buffer_.data()) + used_;
  used_ += need;
  return t;
}

}  // namespace tr
