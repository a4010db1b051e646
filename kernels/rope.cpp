#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tr {

Rope Rope::yarn_of(double theta, double factor, double original_max_position, double beta_fast,
                   double beta_slow, double attention_factor, bool truncate) {
  Rope r;
  r.theta = theta;
  r.yarn = true;
  r.factor = factor;
  r.original_max_position = original_max_position;
  r.beta_fast = beta_fast;
  r.beta_slow = beta_slow;
  r.truncate = truncate;
  r.attention_factor =
      attention_factor > 0 ? attention_factor : (factor <= 1 ? 1.0 : 0.1 * std::log(factor) + 1);
  return r;
}

Rope Rope::llama3_of(double theta, double factor, double low_freq_factor, double high_freq_factor,
                     double original_max_position) {
  Rope r;
  r.theta = theta;
  r.llama3 = true;
  r.factor = factor;
  r.low_freq_factor = low_freq_factor;
  r.high_freq_factor = high_freq_factor;
  r.original_max_position = original_max_position;
  return r;
}

std::vector<double> Rope::inv_freq(int hd) const {
  const int half = hd / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) f[i] = std::pow(theta, -2.0 * i / hd);
  if (llama3) {
    for (int i = 0; i < half; ++i) {
      // Where the pair's wavelength lies against the trained context: under 1 / high_freq_factor
      // of it the pair keeps its frequency, over 1 / low_freq_factor it turns `factor` times
      // slower, between it blends the two linearly in original / wavelength.
      const double wavelength = 2 * std::numbers::pi / f[i];
      const double cycles = original_max_position / wavelength;
      if (cycles >= high_freq_factor) continue;
      if (cycles <= low_freq_factor) {
        f[i] /= factor;
        continue;
      }
      const double smooth = (cycles - low_freq_factor) / (high_freq_factor - low_freq_factor);
      f[i] = (1 - smooth) * f[i] / factor + smooth * f[i];
    }
    return f;
  }
  if (!yarn) return f;
  // The pair whose wavelength fits `rotations` times into the trained context.
  auto pair_of = [&](double rotations) {
    return hd * std::log(original_max_position / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(theta));
  };
  double low = pair_of(beta_fast), high = pair_of(beta_slow);
  if (truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, hd - 1.0);
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    // 0 below `low` (fast pairs keep their frequency), 1 above `high` (slow ones are divided by
    // factor), linear between.
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    f[i] = f[i] / factor * ramp + f[i] * (1 - ramp);
  }
  return f;
}

}  // namespace tr
