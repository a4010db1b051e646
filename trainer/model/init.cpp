#include "trainer/model/init.h"

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
  const uint64_t stream = mix64(seed + kGolden64) ^ fnv1a64(name);
  if (t.dtype == DType::f64)
    fill(t.ptr<double>(), t.numel(), kind, std, stream, count, first_index);
  else
    fill(t.ptr<float>(), t.numel(), kind, std, stream, count, first_index);
}

std::vector<float> initial_weights(const ParamLayout& layout, const ModelDims& dims, uint64_t seed,
                                   double std) {
  const double out_std = std / std::sqrt(2.0 * static_cast<double>(dims.total_layers));
  std::vector<float> out(static_cast<size_t>(layout.total));
  for (const ParamInfo& p : layout.tensors) {
    Tensor t(out.data() + p.offset, DType::f32, Device::cpu, {p.numel});
    // RMSNorm weights: the layers' two, QK-norm's, the final one.
    const bool norm = p.name.ends_with("norm/weight");
    const bool bias = p.name.size() >= 4 && p.name.compare(p.name.size() - 4, 4, "bias") == 0;
    const bool out_proj =
        p.name.find("o_proj") != std::string::npos || p.name.find("down_proj") != std::string::npos;
    const InitKind kind = norm ? InitKind::ones : bias ? InitKind::zeros : InitKind::normal;
    const double sd = out_proj ? out_std : std;
    // Row by row, each element keeps the index it has in the whole (vocab-padded) tensor.
    const int64_t rows = p.shape.size() == 2 ? p.shape[0] : 1, cols = p.numel / rows;
    const int64_t global_cols = p.split_dim == 1 ? cols * dims.tp : cols;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t grow = i + (p.split_dim == 0 && p.shape.size() == 2 ? p.split_offset : 0);
      const int64_t first =
          grow * global_cols + (p.split_dim == 1 || p.shape.size() == 1 ? p.split_offset : 0);
      const bool padding_row = p.shape.size() == 2 && p.split_dim == 0 && grow >= p.global_shape[0];
      fill_init(t.at(i * cols, {cols}), kind, sd, seed, p.name, padding_row ? 0 : cols, first);
    }
  }
  return out;
}

}  // namespace tr
