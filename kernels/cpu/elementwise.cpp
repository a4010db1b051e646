// Elementwise helpers over whole tensors (any shape; contiguous).
#include <cstring>

#include "kernels/cpu/cpu_ops.h"

namespace tr::cpu {

void add(Ctx&, Tensor out, Tensor a, Tensor b) {
  dispatch_float(out.dtype, "add", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.ptr<T>();
    const T* pb = b.ptr<T>();
    T* po = out.ptr<T>();  // may alias pa or pb: each element is read before it is written
    for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] = pa[i] + pb[i];
  });
}

void scale_(Ctx&, Tensor x, float s) {
  dispatch_float(x.dtype, "scale_", [&](auto tag) {
    using T = decltype(tag);
    T* p = x.ptr<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) p[i] *= static_cast<T>(s);
  });
}

// All-zero bytes are 0 in every dtype, so this works for i32 and bf16 too.
void zero_(Ctx&, Tensor x) {
  std::memset(x.data, 0, x.nbytes());
}

double sum_squares(Ctx&, Tensor x) {
  double sum = 0.0;
  dispatch_float(x.dtype, "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.ptr<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) sum += static_cast<double>(p[i]) * p[i];
  });
  return sum;
}

}  // namespace tr::cpu
