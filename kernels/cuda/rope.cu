// Rotary embedding in place (HF rotate_half: element i pairs with i + hd/2). One thread per
// rotated pair; the angle pos * theta^(-2i/hd) in double, as the CPU reference computes it
// (in float it would be off by ~1e-4 rad at position 4096).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 256;

// x: [T, n_heads_total, hd]; heads [0, n_rope) of each token turn by +angle (sign 1) or
// -angle (sign -1, the backward).
template <class T>
__global__ void rope_kernel(T* x, int64_t tokens, int n_total, int n_rope, int hd, int seq_len,
                            double log_theta, double sign) {
  const int half = hd / 2;
  const int64_t pairs = tokens * n_rope * half;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < pairs;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int h = static_cast<int>(idx / half % n_rope);
    const int64_t t = idx / (int64_t{half} * n_rope);
    const double inv_freq = exp(-2.0 * i / hd * log_theta);
    double s, c;
    sincos(static_cast<double>(t % seq_len) * inv_freq, &s, &c);
    s *= sign;
    T* head = x + (t * n_total + h) * hd;
    const double a = to_f(head[i]), b = to_f(head[i + half]);
    head[i] = from_f<T>(static_cast<float>(a * c - b * s));
    head[i + half] = from_f<T>(static_cast<float>(b * c + a * s));
  }
}

void rope(Ctx& ctx, Tensor x, int n_rope_heads, int seq_len, float theta, double sign,
          const char* op) {
  const int64_t tokens = x.shape[0];
  const int n_total = static_cast<int>(x.shape[1]), hd = static_cast<int>(x.shape[2]);
  const int64_t pairs = tokens * n_rope_heads * (hd / 2);
  if (pairs == 0) return;  // no rotated heads: nothing to launch
  const int grid = grid_stride_blocks(pairs, kThreads);
  dispatch_float(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<grid, kThreads, 0, stream_of(ctx)>>>(
        x.ptr<T>(), tokens, n_total, n_rope_heads, hd, seq_len,
        std::log(static_cast<double>(theta)), sign);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_fwd(Ctx& ctx, Tensor x, int n_rope_heads, int seq_len, float theta) {
  rope(ctx, x, n_rope_heads, seq_len, theta, 1.0, "rope_fwd");
}

void rope_bwd(Ctx& ctx, Tensor dx, int n_rope_heads, int seq_len, float theta) {
  rope(ctx, dx, n_rope_heads, seq_len, theta, -1.0, "rope_bwd");
}

}  // namespace tr::cuda
