// Rotary embedding as in Hugging Face Qwen2 ("rotate_half"): element i of a head pairs with
// element i + hd/2 and the pair turns by angle pos * inv_freq[i] (kernels/rope.h), computed in
// double, scaled by the attention factor.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace tr::cpu {
namespace {

// In place on x [T, n_heads_total, hd]: heads [0, n_rope_heads) of token t turn by
// sign * angle(its position: t % seq_len, or positions[t % L]); sign = -1 is the inverse rotation,
// which (with the same scale) is also the gradient.
template <class T>
void rope_rotate(Tensor x, int n_rope_heads, int seq_len, const Rope& rope, Tensor positions,
                 double sign) {
  const int64_t n_tok = x.dim(0), n_heads = x.dim(1), hd = x.dim(2), half = hd / 2;
  const std::vector<double> inv_freq = rope.inv_freq(static_cast<int>(hd));  // [hd/2]
  const double scale = rope.attention_factor;
  std::vector<double> cos_t(half), sin_t(half);  // [hd/2] for the current token
  T* data = x.ptr<T>();
  for (int64_t t = 0; t < n_tok; ++t) {
    const double pos = static_cast<double>(
        positions.empty() ? t % seq_len : positions.ptr<int32_t>()[t % positions.numel()]);
    for (int64_t i = 0; i < half; ++i) {
      cos_t[i] = scale * std::cos(pos * inv_freq[i]);
      sin_t[i] = scale * sign * std::sin(pos * inv_freq[i]);
    }
    for (int64_t h = 0; h < n_rope_heads; ++h) {
      T* head = data + (t * n_heads + h) * hd;
      for (int64_t i = 0; i < half; ++i) {
        const double a = head[i], b = head[i + half];
        head[i] = static_cast<T>(a * cos_t[i] - b * sin_t[i]);
        head[i + half] = static_cast<T>(b * cos_t[i] + a * sin_t[i]);
      }
    }
  }
}

}  // namespace

void rope_fwd(Ctx&, Tensor x, int n_rope_heads, int seq_len, const Rope& rope, Tensor positions) {
  dispatch_float(x.dtype, "rope_fwd", [&](auto tag) {
    rope_rotate<decltype(tag)>(x, n_rope_heads, seq_len, rope, positions, 1.0);
  });
}

void rope_bwd(Ctx&, Tensor dx, int n_rope_heads, int seq_len, const Rope& rope, Tensor positions) {
  dispatch_float(dx.dtype, "rope_bwd", [&](auto tag) {
    rope_rotate<decltype(tag)>(dx, n_rope_heads, seq_len, rope, positions, -1.0);
  });
}

}  // namespace tr::cpu
