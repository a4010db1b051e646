#include "kernels/fp8.h"

#include <bit>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace tr {

uint8_t fp8_encode(float x, Fp8Format f) {
  const Fp8Info fmt = fp8_info(f);
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7f;               // NaN
  if (abs == 0x7f800000u) return sign | fmt.max_code;      // ±Inf saturates
  const int exponent = static_cast<int>(abs >> 23) - 127;  // of a normal float
  if (abs < 0x00800000u) return sign;  // zero or an fp32 subnormal: far below half of fp8's least
  // |x| = significand * 2^(exponent - 23), significand in [2^23, 2^24). The fp8 result is
  // n * 2^(e - mantissa_bits) with e = max(exponent, 1 - bias) (subnormals share the least
  // exponent); n = significand / 2^shift, rounded to nearest even.
  const uint32_t significand = (abs & 0x007fffffu) | 0x00800000u;
  const int e = exponent > 1 - fmt.bias ? exponent : 1 - fmt.bias;
  const int shift = 23 - fmt.mantissa_bits + (e - exponent);
  if (shift > 24) return sign;  // below half of the least subnormal
  uint32_t n = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (n & 1))) ++n;
  // n holds the implicit bit (2^mantissa_bits for a normal), so it is added to the field below e's:
  // a normal lands in its field, a subnormal in field 0, a rounding carry in the next binade.
  const int code = ((e + fmt.bias - 1) << fmt.mantissa_bits) + static_cast<int>(n);
  return sign | static_cast<uint8_t>(code < fmt.max_code ? code : fmt.max_code);
}

float fp8_decode(uint8_t code, Fp8Format f) {
  const Fp8Info fmt = fp8_info(f);
  const bool negative = code & 0x80;
  const int field = (code & 0x7f) >> fmt.mantissa_bits;
  const int mantissa = code & ((1 << fmt.mantissa_bits) - 1);
  const int top = (1 << fmt.exponent_bits) - 1;
  float v;
  if (f == Fp8Format::e4m3 && (code & 0x7f) == 0x7f) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (f == Fp8Format::e5m2 && field == top) {
    v = mantissa == 0 ? std::numeric_limits<float>::infinity()
                      : std::numeric_limits<float>::quiet_NaN();
  } else if (field == 0) {
    v = std::ldexp(static_cast<float>(mantissa), 1 - fmt.bias - fmt.mantissa_bits);
  } else {
    v = std::ldexp(static_cast<float>(mantissa + (1 << fmt.mantissa_bits)),
                   field - fmt.bias - fmt.mantissa_bits);
  }
  return std::copysign(v, negative ? -1.0f : 1.0f);
}

float fp8_amax(std::span<const float> x) {
  float amax = 0.0f;
  for (float v : x) {
    if (std::isnan(v)) return v;
    amax = std::fabs(v) > amax ? std::fabs(v) : amax;
  }
  return amax;
}

float fp8_scale(float amax, Fp8Format f) {
  if (amax == 0.0f || !std::isfinite(amax)) return 1.0f;
  const float scale = fp8_info(f).max / amax;
  return std::isinf(scale) ? std::numeric_limits<float>::max() : scale;
}

Fp8Scaling fp8_cast_scaled(std::span<uint8_t> out, std::span<const float> in, Fp8Format f) {
  TR_ASSERT(out.size() == in.size(), "fp8_cast_scaled: out and in differ in length");
  Fp8Scaling s;
  s.amax = fp8_amax(in);
  s.scale = fp8_scale(s.amax, f);
  s.scale_inv = 1.0f / s.scale;
  for (size_t i = 0; i < in.size(); ++i) out[i] = fp8_encode(in[i] * s.scale, f);
  return s;
}

void fp8_dequantize(std::span<float> out, std::span<const uint8_t> in, Fp8Format f,
                    float scale_inv) {
  TR_ASSERT(out.size() == in.size(), "fp8_dequantize: out and in differ in length");
  for (size_t i = 0; i < in.size(); ++i) out[i] = fp8_decode(in[i], f) * scale_inv;
}

}  // namespace tr
