// Elementwise helpers over whole tensors (any shape; contiguous).
#include <cstring>

#include "core/bf16.h"
#include "core/norm_piece.h"
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

namespace {
// Element i of a f32, f64 or bf16 tensor as double, and back (bf16: round to nearest even).
double load_any(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::f32:
      return t.ptr<float>()[i];
    case DType::f64:
      return t.ptr<double>()[i];
    default:
      return bf16_to_f32(t.ptr<uint16_t>()[i]);
  }
}
void store_any(Tensor t, int64_t i, double v) {
  switch (t.dtype) {
    case DType::f32:
      t.ptr<float>()[i] = static_cast<float>(v);
      return;
    case DType::f64:
      t.ptr<double>()[i] = v;
      return;
    default:
      t.ptr<uint16_t>()[i] = f32_to_bf16(static_cast<float>(v));
  }
}
}  // namespace

void cast(Ctx&, Tensor out, Tensor in) {
  for (int64_t i = 0, n = in.numel(); i < n; ++i) store_any(out, i, load_any(in, i));
}

// The sum of x (or of its squares) in double, then added to acc: the same value as
// sum_squares() added on the host.
void accumulate_sum(Ctx& ctx, Tensor acc, Tensor x, bool squares) {
  double sum = 0.0;
  if (squares) {
    sum = cpu::sum_squares(ctx, x);
  } else {
    for (int64_t i = 0, n = x.numel(); i < n; ++i) sum += load_any(x, i);
  }
  acc.ptr<double>()[0] += sum;
}

// Each piece's sum of squares in double (a checked-only piece's: 0, or NaN when not finite),
// then added to acc piece by piece.
void accumulate_sum_squares_pieces(Ctx& ctx, Tensor acc, Tensor x, Tensor pieces, int64_t base) {
  const int64_t* piece = pieces.ptr<int64_t>();
  for (int64_t k = 0; k < pieces.dim(0); ++k) {
    const double s = cpu::sum_squares(ctx, x.at(piece[3 * k] - base, {piece[3 * k + 1]}));
    acc.ptr<double>()[0] += counted_or_checked(s, piece[3 * k + 2] != 0);
  }
}

}  // namespace tr::cpu
