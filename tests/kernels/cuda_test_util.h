// What the GPU op tests share (label gpu; tests/kernels/test_cuda_*.cpp): random inputs a dtype
// holds, device tensors poisoned on creation with upload and download through f32 (or as bytes),
// a CUDA context, and the relative-error check ||gpu - cpu|| / ||cpu|| against a bound per dtype
// (1e-5 f32, 1e-2 bf16; the CPU runs in f32 on the same bf16-rounded inputs).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/ops.h"
#include "tests/test_util.h"

namespace tr::cuda_test {

inline constexpr double kTolF32 = 1e-5, kTolBf16 = 1e-2;

inline double tol(DType dt) {
  return dt == DType::bf16 ? kTolBf16 : kTolF32;
}

// The values a tensor of `dt` can hold: bf16 inputs are rounded before both backends see them.
inline std::vector<float> random_values(int64_t n, std::mt19937& rng, DType dt, float lo = -1,
                                        float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dt == DType::bf16 ? round_to_bf16(u(rng)) : u(rng);
  return v;
}

// A host f32 tensor (the CPU reference's operand) over a vector.
inline Tensor host(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), DType::f32, Device::cpu, shape);
}

// A device tensor of `dt` that owns its memory, with upload/download through f32.
struct Dev {
  Buffer buf;
  Tensor t;
  Dev(DType dt, std::initializer_list<int64_t> shape) : t(nullptr, dt, Device::cuda, shape) {
    buf = Buffer(std::max<size_t>(t.nbytes(), 1), Device::cuda);
    t.data = buf.data();
    poison();
  }
  Dev(DType dt, std::initializer_list<int64_t> shape, const std::vector<float>& values)
      : Dev(dt, shape) {
    upload(values);
  }
  void poison() { CUDA_CHECK(cudaMemset(t.data, 0xff, t.nbytes())); }  // NaN in f32 and bf16
  void upload(const std::vector<float>& values) {
    REQUIRE(static_cast<int64_t>(values.size()) == t.numel());
    std::vector<float> copy = values;
    if (t.dtype == DType::i32) {
      std::vector<int32_t> ints(values.begin(), values.end());
      copy_tensor(t, Tensor(ints.data(), DType::i32, Device::cpu, {t.numel()}));
      return;
    }
    Ctx cpu;
    std::vector<uint16_t> half(values.size());
    Tensor src(copy.data(), DType::f32, Device::cpu, {t.numel()});
    if (t.dtype == DType::bf16) {
      cast(cpu, Tensor(half.data(), DType::bf16, Device::cpu, {t.numel()}), src);
      copy_tensor(t, Tensor(half.data(), DType::bf16, Device::cpu, {t.numel()}));
    } else {
      copy_tensor(t, src);
    }
  }
  // The bytes as they are (FP8 codes).
  void upload_bytes(const std::vector<uint8_t>& bytes) {
    REQUIRE(bytes.size() == t.nbytes());
    CUDA_CHECK(cudaMemcpy(t.data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  }
  std::vector<uint8_t> download_bytes() const {
    std::vector<uint8_t> out(t.nbytes());
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(out.data(), t.data, out.size(), cudaMemcpyDeviceToHost));
    return out;
  }
  std::vector<float> download() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> out(static_cast<size_t>(t.numel()));
    Tensor dst(out.data(), DType::f32, Device::cpu, {t.numel()});
    if (t.dtype == DType::bf16) {
      std::vector<uint16_t> half(out.size());
      copy_tensor(Tensor(half.data(), DType::bf16, Device::cpu, {t.numel()}), t);
      Ctx cpu;
      cast(cpu, dst, Tensor(half.data(), DType::bf16, Device::cpu, {t.numel()}));
    } else {
      copy_tensor(dst, t);
    }
    return out;
  }
};

// A CUDA context with a stream and 64 MiB of workspace.
struct GpuCtx {
  Buffer workspace{size_t{64} << 20, Device::cuda};
  cudaStream_t stream = nullptr;
  Ctx ctx;
  GpuCtx() {
    CUDA_CHECK(cudaStreamCreate(&stream));
    ctx.device = Device::cuda;
    ctx.stream = stream;
    ctx.workspace = workspace.data();
    ctx.workspace_bytes = workspace.bytes();
  }
  ~GpuCtx() { cudaStreamDestroy(stream); }
};

inline void check_close(const std::vector<float>& gpu, const std::vector<float>& cpu, DType dt,
                        const std::string& what) {
  const double e = test::rel_err(gpu, cpu);
  INFO(what << ": relative error " << e << " (bound " << tol(dt) << ")");
  CHECK(e <= tol(dt));  // NaN (a poisoned element never written) fails too
}

}  // namespace tr::cuda_test
