// Integer and string hashing shared by the counter-based generators (weight init, data shuffle)
// and the names derived from paths.
#pragma once

#include <cstdint>
#include <string_view>

namespace tr {

// The splitmix64 increment (2^64 / golden ratio), to offset counters before mixing.
inline constexpr uint64_t kGolden64 = 0x9e3779b97f4a7c15ULL;

// splitmix64 finaliser (Steele, Lea, Flood 2014 constants): a bijective 64-bit mixer.
constexpr uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a of a string's bytes (names of tensors, of directories).
constexpr uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

}  // namespace tr
