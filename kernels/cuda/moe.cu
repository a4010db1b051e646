// Mixture of experts on the GPU: the router (one warp per token), the permutation to the
// expert-major rows and back (one block per token, choices summed in order j, fp32), the
// choices' weight gradients (a warp per row's dot product) and the experts' grouped projections
// (a cuBLASLt linear per group). The dispatch is moe_dispatch.cu.
// Deterministic throughout: no floating-point atomics.
#include <cmath>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

// The router: kRouterWarps tokens per block, each warp's row of E experts in shared memory.
constexpr int kRouterWarps = 4;
constexpr int kMaxExperts = 1024;
constexpr int kThreads = 256;
constexpr int kDotWarps = 8;  // moe_row_dots: rows per block

__device__ __forceinline__ double warp_max(double v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The softmax runs in f64 (as the CPU reference does) so that the f32 probabilities, and with
// them the top-k choice, come out as the CPU's: f32 rounding would flip near-equal experts.
// probs [T, E] f32; experts, weights [T, k]; shared: E floats and E flags per warp.
template <class T>
__global__ void router_fwd_kernel(float* probs, int32_t* experts, T* weights, const T* logits,
                                  int64_t tokens, int E, int k, bool normalize) {
  extern __shared__ float router_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x * int64_t{kRouterWarps} + warp;
  if (t >= tokens) return;  // the whole warp: no block barrier follows
  float* p = router_smem + warp * E;
  bool* taken = reinterpret_cast<bool*>(router_smem + kRouterWarps * E) + warp * E;
  const T* z = logits + t * E;
  double zmax = -INFINITY, total = 0;
  for (int e = lane; e < E; e += 32) zmax = fmax(zmax, static_cast<double>(to_f(z[e])));
  zmax = warp_max(zmax);
  for (int e = lane; e < E; e += 32) total += exp(static_cast<double>(to_f(z[e])) - zmax);
  total = warp_sum(total);
  for (int e = lane; e < E; e += 32) {
    p[e] = static_cast<float>(exp(static_cast<double>(to_f(z[e])) - zmax) / total);
    probs[t * E + e] = p[e];
    taken[e] = false;
  }
  __syncwarp();
  // k rounds of a warp argmax over the experts not taken: highest probability, lower expert on
  // ties. Lane 0's choice is the warp's (the same on every lane unless a NaN breaks the order).
  double chosen = 0;
  for (int j = 0; j < k; ++j) {
    float best = 0;
    int best_e = -1;
    for (int e = lane; e < E; e += 32)
      if (!taken[e] && (best_e < 0 || p[e] > best)) {
        best = p[e];
        best_e = e;
      }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (oe >= 0 && (best_e < 0 || ov > best || (ov == best && oe < best_e))) {
        best = ov;
        best_e = oe;
      }
    }
    if (lane == 0) {
      taken[best_e] = true;
      experts[t * k + j] = best_e;
      chosen += best;
    }
    __syncwarp();
  }
  if (lane != 0) return;
  for (int j = 0; j < k; ++j) {
    const float pe = p[experts[t * k + j]];
    weights[t * k + j] = from_f<T>(static_cast<float>(normalize ? pe / chosen : pe));
  }
}

// Pass 1 of prob_sums and routed (common.cuh's column chunks): the chunk's sum of probs[t][e]
// (f64) and count of its tokens that chose e.
__global__ void router_sums_partial(double* psum, int32_t* pcount, const float* probs,
                                    const int32_t* experts, int64_t tokens, int E, int k) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  int64_t begin, end;
  chunk_rows(tokens, &begin, &end);
  double s = 0;
  int32_t n = 0;
  for (int64_t t = begin; t < end; ++t) {
    s += probs[t * E + e];
    for (int j = 0; j < k; ++j) n += experts[t * k + j] == e;
  }
  psum[blockIdx.y * int64_t{E} + e] = s;
  pcount[blockIdx.y * int64_t{E} + e] = n;
}

// Pass 2: the chunks' partials in chunk order. ASSIGNS prob_sums and routed.
__global__ void router_sums_finish(float* prob_sums, float* routed, const double* psum,
                                   const int32_t* pcount, int chunks, int E) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  double s = 0;
  int64_t n = 0;
  for (int c = 0; c < chunks; ++c) {
    s += psum[c * int64_t{E} + e];
    n += pcount[c * int64_t{E} + e];
  }
  prob_sums[e] = static_cast<float>(s);
  routed[e] = static_cast<float>(n);
}

// dlogits [T, E] ASSIGNED = p (dp - p . dp), dp = aux_scale aux[e] plus, on the chosen experts,
// dweights through the normalisation; shared: E floats (dp) per warp.
template <class T>
__global__ void router_bwd_kernel(T* dlogits, const T* dweights, const float* probs,
                                  const int32_t* experts, const float* aux, float aux_scale,
                                  int64_t tokens, int E, int k, bool normalize) {
  extern __shared__ float router_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x * int64_t{kRouterWarps} + warp;
  if (t >= tokens) return;
  float* dp = router_smem + warp * E;
  const float* p = probs + t * E;
  const int32_t* ex = experts + t * k;
  const T* dw = dweights + t * k;
  for (int e = lane; e < E; e += 32) dp[e] = aux ? aux_scale * aux[e] : 0.0f;
  // w_j = p_j / s, s the chosen probabilities' sum: dp_j = (dw_j - sum_i dw_i w_i) / s.
  float s = 1, dot = 0;
  if (normalize) {
    s = 0;
    for (int j = lane; j < k; j += 32) s += p[ex[j]];
    s = warp_sum(s);
    for (int j = lane; j < k; j += 32) dot += to_f(dw[j]) * (p[ex[j]] / s);
    dot = warp_sum(dot);
  }
  __syncwarp();
  if (lane == 0)
    for (int j = 0; j < k; ++j) dp[ex[j]] += (to_f(dw[j]) - dot) / s;
  __syncwarp();
  float pdp = 0;
  for (int e = lane; e < E; e += 32) pdp += p[e] * dp[e];
  pdp = warp_sum(pdp);
  for (int e = lane; e < E; e += 32) dlogits[t * E + e] = from_f<T>(p[e] * (dp[e] - pdp));
}

// Threads for a block per row of H elements in packs of N: a multiple of 32, at most 256.
int row_threads(int64_t H, int N) {
  const int64_t packs = (H + N - 1) / N;
  return static_cast<int>(
      std::min<int64_t>(kThreads, std::max<int64_t>(32, (packs + 31) / 32 * 32)));
}

// xs[rows[t, j]] = in[t] for the kept choices; one block per token.
template <class T, int N>
__global__ void permute_kernel(T* xs, const T* in, const int32_t* rows, int H, int k) {
  const int64_t t = blockIdx.x;
  for (int j = 0; j < k; ++j) {
    const int64_t row = rows[t * k + j];
    if (row < 0) continue;
    for (int i = threadIdx.x * N; i < H; i += blockDim.x * N)
      store_pack<T, N>(xs + row * H + i, load_pack<T, N>(in + t * H + i));
  }
}

// din[t] (= or +=) sum over kept j ascending of dxs[rows[t, j]], in fp32.
template <class T, int N>
__global__ void permute_bwd_kernel(T* din, const T* dxs, const int32_t* rows, int H, int k,
                                   bool accumulate) {
  const int64_t t = blockIdx.x;
  for (int i = threadIdx.x * N; i < H; i += blockDim.x * N) {
    float acc[N] = {};
    if (accumulate) {
      const Pack<T, N> d = load_pack<T, N>(din + t * H + i);
#pragma unroll
      for (int n = 0; n < N; ++n) acc[n] = to_f(d.v[n]);
    }
    for (int j = 0; j < k; ++j) {
      const int64_t row = rows[t * k + j];
      if (row < 0) continue;
      const Pack<T, N> g = load_pack<T, N>(dxs + row * H + i);
#pragma unroll
      for (int n = 0; n < N; ++n) acc[n] += to_f(g.v[n]);
    }
    Pack<T, N> o;
#pragma unroll
    for (int n = 0; n < N; ++n) o.v[n] = from_f<T>(acc[n]);
    store_pack<T, N>(din + t * H + i, o);
  }
}

// out[t] = sum over kept j ascending of weights[t, j] ys[rows[t, j]], in fp32.
template <class T, int N>
__global__ void unpermute_kernel(T* out, const T* ys, const T* weights, const int32_t* rows, int H,
                                 int k) {
  const int64_t t = blockIdx.x;
  for (int i = threadIdx.x * N; i < H; i += blockDim.x * N) {
    float acc[N] = {};
    for (int j = 0; j < k; ++j) {
      const int64_t row = rows[t * k + j];
      if (row < 0) continue;
      const float w = to_f(weights[t * k + j]);
      const Pack<T, N> y = load_pack<T, N>(ys + row * H + i);
#pragma unroll
      for (int n = 0; n < N; ++n) acc[n] += w * to_f(y.v[n]);
    }
    Pack<T, N> o;
#pragma unroll
    for (int n = 0; n < N; ++n) o.v[n] = from_f<T>(acc[n]);
    store_pack<T, N>(out + t * H + i, o);
  }
}

// dys[rows[t, j]] = weights[t, j] dout[t]; dweights[t, j] = dout[t] . ys[rows[t, j]] (fp32 block
// sum; 0 for a dropped choice), unless dweights and ys are null. Both ASSIGNED; one block per
// token.
template <class T, int N>
__global__ void unpermute_bwd_kernel(T* dys, T* dweights, const T* dout, const T* ys,
                                     const T* weights, const int32_t* rows, int H, int k) {
  const int64_t t = blockIdx.x;
  for (int j = 0; j < k; ++j) {
    const int64_t row = rows[t * k + j];  // the same on every thread: the barriers below agree
    float dot = 0;
    if (row >= 0) {
      const float w = to_f(weights[t * k + j]);
      for (int i = threadIdx.x * N; i < H; i += blockDim.x * N) {
        const Pack<T, N> d = load_pack<T, N>(dout + t * H + i);
        Pack<T, N> o;
#pragma unroll
        for (int n = 0; n < N; ++n) o.v[n] = from_f<T>(w * to_f(d.v[n]));
        store_pack<T, N>(dys + row * H + i, o);
        if (ys != nullptr) {
          const Pack<T, N> y = load_pack<T, N>(ys + row * H + i);
#pragma unroll
          for (int n = 0; n < N; ++n) dot += to_f(d.v[n]) * to_f(y.v[n]);
        }
      }
      if (ys != nullptr) dot = block_sum(dot);
    }
    if (threadIdx.x == 0 && dweights != nullptr) dweights[t * k + j] = from_f<T>(dot);
  }
}

// dots[r] = a[r] . b[r] (fp32, each lane's strided share then the warp's tree: deterministic),
// ASSIGNED; kDotWarps rows per block, a warp each.
template <class T, int N>
__global__ void row_dots_kernel(float* dots, const T* a, const T* b, int64_t rows, int I) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t{kDotWarps} + warp;
  if (r >= rows) return;  // the whole warp
  float dot = 0;
  for (int i = lane * N; i < I; i += 32 * N) {
    const Pack<T, N> x = load_pack<T, N>(a + r * I + i), y = load_pack<T, N>(b + r * I + i);
#pragma unroll
    for (int n = 0; n < N; ++n) dot += to_f(x.v[n]) * to_f(y.v[n]);
  }
  dot = warp_sum(dot);
  if (lane == 0) dots[r] = dot;
}

// dweights[c] = dots[rows[c]] / weights[c] in fp32 (0 for a dropped choice or a zero weight),
// ASSIGNED; a thread per choice.
template <class T>
__global__ void choice_grads_kernel(T* dweights, const float* dots, const T* weights,
                                    const int32_t* rows, int64_t choices) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= choices) return;
  const int32_t row = rows[c];
  const float w = to_f(weights[c]);
  dweights[c] = from_f<T>(row >= 0 && w != 0.0f ? dots[row] / w : 0.0f);
}

// The load-balancing loss: one block; each thread's strided share of sum_e P_e C_e in f64, then
// a tree in shared memory (a fixed order: deterministic).
__global__ void aux_loss_kernel(float* value, float* grad, const float* stats, int E,
                                double value_scale, double grad_scale) {
  __shared__ double part[3][kThreads];  // the product's, the routed tokens' sums, their max
  double dot = 0, routed = 0, most = 0;
  for (int e = threadIdx.x; e < E; e += kThreads) {
    dot += static_cast<double>(stats[e]) * stats[E + e];
    routed += stats[E + e];
    most = fmax(most, static_cast<double>(stats[E + e]));
    grad[e] = static_cast<float>(grad_scale * stats[E + e]);
  }
  part[0][threadIdx.x] = dot;
  part[1][threadIdx.x] = routed;
  part[2][threadIdx.x] = most;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      part[0][threadIdx.x] += part[0][threadIdx.x + s];
      part[1][threadIdx.x] += part[1][threadIdx.x + s];
      part[2][threadIdx.x] = fmax(part[2][threadIdx.x], part[2][threadIdx.x + s]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    value[0] = static_cast<float>(value_scale * part[0][0]);
    value[1] = static_cast<float>(part[1][0] > 0 ? part[2][0] * E / part[1][0] : 0.0);
  }
}

// Launches kernel<T, N>(grid = one block per token) with 16-byte packs when the rows allow it.
template <class T, class Launch>
void per_token(int64_t H, std::initializer_list<const void*> ptrs, Launch&& launch) {
  if (packable(H, sizeof(T), ptrs))
    launch(std::integral_constant<int, kPack<T>>{}, row_threads(H, kPack<T>));
  else
    launch(std::integral_constant<int, 1>{}, row_threads(H, 1));
}

void check_router_size(int64_t E, const char* op) {
  TR_ASSERT(E <= kMaxExperts, std::string(op) + ": the CUDA router takes at most " +
                                  std::to_string(kMaxExperts) + " experts, not " +
                                  std::to_string(E));
}

}  // namespace

void moe_router_fwd(Ctx& ctx, Tensor probs, Tensor experts, Tensor weights, Tensor prob_sums,
                    Tensor routed, Tensor logits, bool normalize) {
  const int64_t tokens = logits.shape[0];
  const int E = static_cast<int>(logits.shape[1]), k = static_cast<int>(experts.shape[1]);
  check_router_size(E, "moe_router_fwd");
  const int chunks = column_chunks(tokens);
  Workspace ws(ctx, "moe_router_fwd");
  double* psum = ws.take<double>(int64_t{chunks} * E);
  int32_t* pcount = ws.take<int32_t>(int64_t{chunks} * E);
  if (tokens > 0) {
    const size_t smem = size_t{kRouterWarps} * E * (sizeof(float) + sizeof(bool));
    dispatch_float(logits.dtype, "moe_router_fwd", [&](auto tag) {
      using T = decltype(tag);
      router_fwd_kernel<T>
          <<<blocks_for(tokens, kRouterWarps), kRouterWarps * 32, smem, stream_of(ctx)>>>(
              probs.ptr<float>(), experts.ptr<int32_t>(), weights.ptr<T>(), logits.ptr<T>(), tokens,
              E, k, normalize);
    });
    CUDA_CHECK_LAUNCH();
    const dim3 grid(blocks_for(E, kThreads), static_cast<unsigned>(chunks));
    router_sums_partial<<<grid, kThreads, 0, stream_of(ctx)>>>(
        psum, pcount, probs.ptr<float>(), experts.ptr<int32_t>(), tokens, E, k);
    CUDA_CHECK_LAUNCH();
  }
  router_sums_finish<<<blocks_for(E, kThreads), kThreads, 0, stream_of(ctx)>>>(
      prob_sums.ptr<float>(), routed.ptr<float>(), psum, pcount, chunks, E);
  CUDA_CHECK_LAUNCH();
}

void moe_router_bwd(Ctx& ctx, Tensor dlogits, Tensor dweights, Tensor probs, Tensor experts,
                    bool normalize, Tensor aux_counts, double aux_scale) {
  const int64_t tokens = probs.shape[0];
  const int E = static_cast<int>(probs.shape[1]), k = static_cast<int>(experts.shape[1]);
  check_router_size(E, "moe_router_bwd");
  if (tokens == 0) return;
  const size_t smem = size_t{kRouterWarps} * E * sizeof(float);
  dispatch_float(dlogits.dtype, "moe_router_bwd", [&](auto tag) {
    using T = decltype(tag);
    router_bwd_kernel<T>
        <<<blocks_for(tokens, kRouterWarps), kRouterWarps * 32, smem, stream_of(ctx)>>>(
            dlogits.ptr<T>(), dweights.ptr<T>(), probs.ptr<float>(), experts.ptr<int32_t>(),
            aux_counts.empty() ? nullptr : aux_counts.ptr<float>(), static_cast<float>(aux_scale),
            tokens, E, k, normalize);
  });
  CUDA_CHECK_LAUNCH();
}

void moe_permute(Ctx& ctx, Tensor xs, Tensor in, Tensor rows) {
  const int64_t tokens = in.shape[0];
  const int H = static_cast<int>(in.shape[1]), k = static_cast<int>(rows.shape[1]);
  if (tokens == 0) return;
  dispatch_float(in.dtype, "moe_permute", [&](auto tag) {
    using T = decltype(tag);
    per_token<T>(H, {xs.data, in.data}, [&](auto n, int threads) {
      permute_kernel<T, decltype(n)::value>
          <<<static_cast<unsigned>(tokens), threads, 0, stream_of(ctx)>>>(
              xs.ptr<T>(), in.ptr<T>(), rows.ptr<int32_t>(), H, k);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void moe_permute_bwd(Ctx& ctx, Tensor din, Tensor dxs, Tensor rows, bool accumulate) {
  const int64_t tokens = din.shape[0];
  const int H = static_cast<int>(din.shape[1]), k = static_cast<int>(rows.shape[1]);
  if (tokens == 0) return;
  dispatch_float(din.dtype, "moe_permute_bwd", [&](auto tag) {
    using T = decltype(tag);
    per_token<T>(H, {din.data, dxs.data}, [&](auto n, int threads) {
      permute_bwd_kernel<T, decltype(n)::value>
          <<<static_cast<unsigned>(tokens), threads, 0, stream_of(ctx)>>>(
              din.ptr<T>(), dxs.ptr<T>(), rows.ptr<int32_t>(), H, k, accumulate);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void moe_unpermute(Ctx& ctx, Tensor out, Tensor ys, Tensor weights, Tensor rows) {
  const int64_t tokens = out.shape[0];
  const int H = static_cast<int>(out.shape[1]), k = static_cast<int>(rows.shape[1]);
  if (tokens == 0) return;
  dispatch_float(out.dtype, "moe_unpermute", [&](auto tag) {
    using T = decltype(tag);
    per_token<T>(H, {out.data, ys.data}, [&](auto n, int threads) {
      unpermute_kernel<T, decltype(n)::value>
          <<<static_cast<unsigned>(tokens), threads, 0, stream_of(ctx)>>>(
              out.ptr<T>(), ys.ptr<T>(), weights.ptr<T>(), rows.ptr<int32_t>(), H, k);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void moe_unpermute_bwd(Ctx& ctx, Tensor dys, Tensor dweights, Tensor dout, Tensor ys,
                       Tensor weights, Tensor rows) {
  const int64_t tokens = dout.shape[0];
  const int H = static_cast<int>(dout.shape[1]), k = static_cast<int>(rows.shape[1]);
  if (tokens == 0) return;
  dispatch_float(dout.dtype, "moe_unpermute_bwd", [&](auto tag) {
    using T = decltype(tag);
    per_token<T>(H, {dys.data, dout.data, ys.data}, [&](auto n, int threads) {
      unpermute_bwd_kernel<T, decltype(n)::value>
          <<<static_cast<unsigned>(tokens), threads, 0, stream_of(ctx)>>>(
              dys.ptr<T>(), dweights.empty() ? nullptr : dweights.ptr<T>(), dout.ptr<T>(),
              ys.empty() ? nullptr : ys.ptr<T>(), weights.ptr<T>(), rows.ptr<int32_t>(), H, k);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void moe_row_dots(Ctx& ctx, Tensor dots, Tensor a, Tensor b) {
  const int64_t rows = a.shape[0];
  const int I = static_cast<int>(a.shape[1]);
  if (rows == 0) return;
  dispatch_float(a.dtype, "moe_row_dots", [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto n) {
      row_dots_kernel<T, decltype(n)::value>
          <<<blocks_for(rows, kDotWarps), kDotWarps * 32, 0, stream_of(ctx)>>>(
              dots.ptr<float>(), a.ptr<T>(), b.ptr<T>(), rows, I);
    };
    if (packable(I, sizeof(T), {a.data, b.data}))
      launch(std::integral_constant<int, kPack<T>>{});
    else
      launch(std::integral_constant<int, 1>{});
  });
  CUDA_CHECK_LAUNCH();
}

void moe_choice_grads(Ctx& ctx, Tensor dweights, Tensor dots, Tensor weights, Tensor rows) {
  const int64_t choices = rows.numel();
  if (choices == 0) return;
  dispatch_float(weights.dtype, "moe_choice_grads", [&](auto tag) {
    using T = decltype(tag);
    choice_grads_kernel<T><<<blocks_for(choices, kThreads), kThreads, 0, stream_of(ctx)>>>(
        dweights.ptr<T>(), dots.ptr<float>(), weights.ptr<T>(), rows.ptr<int32_t>(), choices);
  });
  CUDA_CHECK_LAUNCH();
}

void moe_aux_loss_fwd(Ctx& ctx, Tensor value, Tensor grad, Tensor stats, double value_scale,
                      double grad_scale) {
  TR_ASSERT(stats.dtype == DType::f32, "moe_aux_loss_fwd: CUDA statistics are f32");
  aux_loss_kernel<<<1, kThreads, 0, stream_of(ctx)>>>(
      value.ptr<float>(), grad.ptr<float>(), stats.ptr<float>(), static_cast<int>(stats.shape[1]),
      value_scale, grad_scale);
  CUDA_CHECK_LAUNCH();
}

// Each group a linear layer on its rows, its GEMMs planned for the rows' bucket (linear.cu).
void grouped_linear_fwd(Ctx& ctx, Tensor out, Tensor in, std::span<const Tensor> weights,
                        std::span<const int64_t> group_rows) {
  int64_t at = 0;
  for (size_t g = 0; g < weights.size(); ++g) {
    const int64_t n = group_rows[g];
    if (n > 0) linear_fwd_varying_rows(ctx, out.slice(at, n), in.slice(at, n), weights[g]);
    at += n;
  }
}

void grouped_linear_bwd(Ctx& ctx, Tensor din, std::span<const Tensor> dweights, Tensor dout,
                        Tensor in, std::span<const Tensor> weights,
                        std::span<const int64_t> group_rows, bool assign_dweight) {
  int64_t at = 0;
  for (size_t g = 0; g < weights.size(); ++g) {
    const int64_t n = group_rows[g];
    const Tensor dw = dweights.empty() ? Tensor() : dweights[g];
    if (n > 0) {
      linear_bwd_varying_rows(ctx, din.empty() ? Tensor() : din.slice(at, n), dw, dout.slice(at, n),
                              in.slice(at, n), weights[g], assign_dweight);
    } else if (!dw.empty() && assign_dweight) {
      cuda::zero_(ctx, dw);  // an expert without tokens: its gradient is zero, not last step's
    }
    at += n;
  }
}

}  // namespace tr::cuda
