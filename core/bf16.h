// bfloat16 on the host: the upper 16 bits of an IEEE float, rounded to nearest even. For tests
// and checkpoints; device code uses cuda_bf16.h.
#pragma once

#include <cstdint>
#include <cstring>

namespace tr {

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
    return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);                   // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The float nearest to f that bf16 represents.
inline float round_to_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

}  // namespace tr
