// Integer hashing shared by the counter-based generators (weight init, data shuffle).
#pragma once

#include <cstdint>

namespace tr {

// The splitmix64 increment (2^64 / golden ratio), to offset counters before mixing.
inline constexpr uint64_t kGolden64 = 0x9e3779b97f4a7c15ULL;

// splitmix64 finaliser (Steele, Lea, Flood 2014 constants): a bijective 64-bit mixer.
constexpr uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace tr
