// A host tensor for the numeric tests: owns its memory, values read and written as double.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"

namespace tr::test {

// Zero-filled host tensor that owns its memory; values read and written as double.
struct HostTensor {
  Buffer buf;
  Tensor t;
  HostTensor(DType dtype, std::initializer_list<int64_t> shape)
      : t(nullptr, dtype, Device::cpu, shape) {
    buf = Buffer(std::max<size_t>(t.nbytes(), 1), Device::cpu);
    std::memset(buf.data(), 0, t.nbytes());
    t.data = buf.data();
  }
  HostTensor(DType dtype, std::initializer_list<int64_t> shape, const std::vector<double>& v)
      : HostTensor(dtype, shape) {
    assign(v);
  }
  int64_t size() const { return t.numel(); }
  double get(int64_t i) const {
    switch (t.dtype) {
      case DType::f32:
        return t.ptr<float>()[i];
      case DType::f64:
        return t.ptr<double>()[i];
      default:
        return t.ptr<int32_t>()[i];
    }
  }
  void set(int64_t i, double v) {
    switch (t.dtype) {
      case DType::f32:
        t.ptr<float>()[i] = static_cast<float>(v);
        break;
      case DType::f64:
        t.ptr<double>()[i] = v;
        break;
      default:
        t.ptr<int32_t>()[i] = static_cast<int32_t>(v);
    }
  }
  std::vector<double> values() const {
    std::vector<double> v(size());
    for (int64_t i = 0; i < size(); ++i) v[i] = get(i);
    return v;
  }
  void assign(const std::vector<double>& v) {
    TR_ASSERT(static_cast<int64_t>(v.size()) == size(), "HostTensor::assign: one value each");
    for (int64_t i = 0; i < size(); ++i) set(i, v[i]);
  }
  void fill(double v) {
    for (int64_t i = 0; i < size(); ++i) set(i, v);
  }
};

}  // namespace tr::test
