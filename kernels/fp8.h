// FP8 (OCP E4M3 and E5M2) on the host: the formats, the exact cast both ways, and the pieces of
// per-tensor current scaling. The CPU oracle of the GPU's FP8 GEMM path; tests check it against
// PyTorch's float8 casts bit for bit (tests/tools/test_fp8_torch.py).
//
// Formats by role (Transformer Engine's HYBRID format, torchao's default): weights and
// activations are E4M3 (3 mantissa bits: precision where the forward needs it); output gradients
// are E5M2 (5 exponent bits: their range spans more binades than E4M3's).
#pragma once

#include <cstdint>
#include <span>

namespace tr {

enum class Fp8Format { e4m3, e5m2 };

inline constexpr Fp8Format kFp8Forward = Fp8Format::e4m3;   // weights and activations
inline constexpr Fp8Format kFp8Gradient = Fp8Format::e5m2;  // output gradients

struct Fp8Info {
  const char* name;
  int exponent_bits;
  int mantissa_bits;
  int bias;
  float max;         // the largest finite value: 448 (E4M3), 57344 (E5M2)
  uint8_t max_code;  // its code: 0x7e, 0x7b
};

constexpr Fp8Info fp8_info(Fp8Format f) {
  return f == Fp8Format::e4m3 ? Fp8Info{"e4m3", 4, 3, 7, 448.0f, 0x7e}
                              : Fp8Info{"e5m2", 5, 2, 15, 57344.0f, 0x7b};
}

// x rounded to nearest, ties to even, subnormals included; a magnitude beyond the largest finite
// value, infinities included, saturates to ±max; NaN stays NaN (0x7f, its sign kept). This is
// torch's `x.clamp(-max, max).to(float8)`, torchao's saturated cast, and the __NV_SATFINITE mode
// of CUDA's conversion that Transformer Engine's cast uses. torch 2.15's plain `.to()` agrees for
// E4M3 (no infinity: it saturates too); for E5M2 it gives ±Inf from 61440 (the midpoint above
// the max) on, where a scaled cast must saturate instead.
uint8_t fp8_encode(float x, Fp8Format f);

// The value of a code, exactly: ±0, subnormals, normals; E5M2's ±Inf; a NaN for E4M3's 0x7f and
// 0xff and E5M2's 0x7d-0x7f and 0xfd-0xff (its sign kept, not its payload).
float fp8_decode(uint8_t code, Fp8Format f);

// max |x| over x: 0 when x is empty, NaN when any element is (as torch's x.abs().max()).
float fp8_amax(std::span<const float> x);

// The scale that maps amax to the format's max: max / amax in fp32, or 1 when amax is 0, infinite
// or NaN (nothing to scale), or FLT_MAX when the quotient overflows (a subnormal amax). This is
// Transformer Engine's rule with its default amax epsilon of 0; torchao floors amax at 1e-12
// instead, so the two agree for every amax from 1e-12 up.
float fp8_scale(float amax, Fp8Format f);

// Per-tensor current scaling of `in` into `out` (the same length): amax of `in`, its scale, and
// each element as fp8_encode(x * scale), the product rounded to fp32 first as on the GPU.
// scale_inv = 1 / scale dequantizes: x ≈ fp8_decode(code) * scale_inv.
struct Fp8Scaling {
  float amax, scale, scale_inv;
};
Fp8Scaling fp8_cast_scaled(std::span<uint8_t> out, std::span<const float> in, Fp8Format f);

// out[i] = fp8_decode(in[i]) * scale_inv.
void fp8_dequantize(std::span<float> out, std::span<const uint8_t> in, Fp8Format f,
                    float scale_inv);

}  // namespace tr
