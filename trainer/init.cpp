#include "trainer/init.h"

#include <cmath>
#include <numbers>

#include "core/hash.h"

namespace tr {

double normal_at(uint64_t stream, uint64_t index) {
  const uint64_t a = mix64(stream ^ mix64(2 * index + kGolden64));
  const uint64_t b = mix64(stream ^ mix64(2 * index + 1 + kGolden64));
  // Uniforms in (0, 1]: 53 random bits, never 0 so log() is finite.
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

namespace {
uint64_t hash_name(const std::string& s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

template <class T>
void fill(T* p, int64_t n, InitKind kind, double std, uint64_t stream, int64_t count,
          int64_t first) {
  for (int64_t i = 0; i < n; ++i) {
    double v = 0;
    if (i < count) {
      if (kind == InitKind::ones) v = 1;
      if (kind == InitKind::normal) v = std * normal_at(stream, static_cast<uint64_t>(first + i));
    }
    p[i] = static_cast<T>(v);
  }
}
}  // namespace

void fill_init(Tensor t, InitKind kind, double std, uint64_t seed, const std::string& name,
               int64_t count, int64_t first_index) {
  TR_ASSERT(t.device == Device::cpu, "fill_init runs on host tensors");
  const uint64_t stream = mix64(seed + kGolden64) ^ hash_name(name);
  if (t.dtype == DType::f64)
    fill(t.ptr<double>(), t.numel(), kind, std, stream, count, first_index);
  else
    fill(t.ptr<float>(), t.numel(), kind, std, stream, count, first_index);
}

}  // namespace tr
