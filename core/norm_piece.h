// A gradient norm piece's contribution, shared by the CPU reference and the CUDA kernel
// (kernels/ops.h accumulate_sum_squares_pieces).
#pragma once

#if defined(__CUDACC__)
#define TR_HOST_DEVICE __host__ __device__
#else
#define TR_HOST_DEVICE
#endif

namespace tr {

// `sum` (a sum of squares, >= 0 or NaN) when the piece is counted; when it is only checked, 0 if
// it is finite and NaN if not (x * 0 is NaN for x = inf or NaN; nothing here is built with
// fast-math, which would fold it to 0).
TR_HOST_DEVICE inline double counted_or_checked(double sum, bool counted) {
  return counted ? sum : sum * 0.0;
}

}  // namespace tr
