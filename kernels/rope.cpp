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

std::vector<double> Rope::inv_freq(int hd) const {
  const int half = hd / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) f[i] = std::pow(theta, -2.0 * i / hd);
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
