// The size a cuBLASLt plan is made for when a GEMM dimension changes from call to call (a
// grouped linear's rows per expert): kernels/cuda/gemm.h plans such a GEMM at gemm_bucket(n)
// and runs it at n, so that a run's plans stay few whatever its routing. Here for the CPU tests.
#pragma once

#include <bit>
#include <cstdint>

namespace tr {

// n itself up to 8; above, n rounded up to a multiple of an eighth of its power-of-two ceiling:
// four sizes per octave, each less than 25% above the sizes it serves (at most 4 log2(n) + 8
// sizes up to n). Idempotent and nondecreasing.
constexpr int64_t gemm_bucket(int64_t n) {
  if (n <= 8) return n;
  const int64_t step = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(n))) / 8;
  return (n + step - 1) / step * step;
}

}  // namespace tr
