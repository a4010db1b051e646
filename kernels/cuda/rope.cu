// Rotary embedding in place (HF rotate_half: element i pairs with i + hd/2).
//
// The step's kernel reads cos and sin of pos * inv_freq[i] (kernels/rope.h: plain RoPE or YaRN),
// times the attention factor, from an fp32 table [seq_len, hd/2] made once per (seq_len, hd,
// rope) in double and rounded (the CPU reference's values), and rotates in fp32 with 16-byte
// loads where the head's halves allow them: no fp64 in the step.
// TR_ROPE_FP64=1 selects the first kernel (angle and rotation in double per pair, one element
// per thread), to bisect a GPU failure until the table kernel has run on one.
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/switches.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tr::cuda {
namespace {

constexpr int kThreads = 256;

// x: [T, n_heads_total, hd]; heads [0, n_rope) of each token turn by +angle (sign 1) or
// -angle (sign -1, the backward). The first kernel: fp64 per pair.
template <class T>
__global__ void rope_kernel_fp64(T* x, int64_t tokens, int n_total, int n_rope, int hd, int seq_len,
                                 const int32_t* positions, int n_positions, const double* inv_freq,
                                 double scale, double sign) {
  const int half = hd / 2;
  const int64_t pairs = tokens * n_rope * half;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < pairs;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int h = static_cast<int>(idx / half % n_rope);
    const int64_t t = idx / (int64_t{half} * n_rope);
    double s, c;
    const int64_t pos = positions ? positions[t % n_positions] : t % seq_len;
    sincos(static_cast<double>(pos) * inv_freq[i], &s, &c);
    s *= sign * scale;
    c *= scale;
    T* head = x + (t * n_total + h) * hd;
    const double a = to_f(head[i]), b = to_f(head[i + half]);
    head[i] = from_f<T>(static_cast<float>(a * c - b * s));
    head[i + half] = from_f<T>(static_cast<float>(b * c + a * s));
  }
}

// table [seq_len, half, 2]: cos and sin of pos * inv_freq[i] times scale, in double, rounded once.
__global__ void rope_table_kernel(float2* table, int seq_len, int half, const double* inv_freq,
                                  double scale) {
  const int64_t n = int64_t{seq_len} * half;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int64_t pos = idx / half;
    double s, c;
    sincos(static_cast<double>(pos) * inv_freq[i], &s, &c);
    table[idx] = make_float2(static_cast<float>(scale * c), static_cast<float>(scale * s));
  }
}

// One thread per N consecutive pairs (i .. i+N-1 with their partners i+half ..): N-element
// loads of each half of the head, the rotation in fp32 from the table.
template <class T, int N>
__global__ void rope_kernel(T* x, const float2* table, int64_t tokens, int n_total, int n_rope,
                            int hd, int seq_len, const int32_t* positions, int n_positions,
                            float sign) {
  const int half = hd / 2, groups = half / N;
  const int64_t work = tokens * n_rope * groups;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < work;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(idx % groups) * N;
    const int h = static_cast<int>(idx / groups % n_rope);
    const int64_t t = idx / (int64_t{groups} * n_rope);
    T* head = x + (t * n_total + h) * hd;
    const int64_t pos = positions ? positions[t % n_positions] : t % seq_len;
    const float2* cs = table + pos * half + i;
    const Pack<T, N> pa = load_pack<T, N>(head + i), pb = load_pack<T, N>(head + i + half);
    Pack<T, N> oa, ob;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float c = cs[k].x, s = sign * cs[k].y;
      const float a = to_f(pa.v[k]), b = to_f(pb.v[k]);
      oa.v[k] = from_f<T>(a * c - b * s);
      ob.v[k] = from_f<T>(b * c + a * s);
    }
    store_pack<T, N>(head + i, oa);
    store_pack<T, N>(head + i + half, ob);
  }
}

// A rope's frequencies on the device and its table for one seq_len, made on first use and kept
// (a few MiB at most).
struct RopeTables {
  Buffer inv_freq;              // double [hd/2]
  std::map<int, Buffer> table;  // by seq_len: float2 [seq_len, hd/2]
};

// Keyed by the frequencies themselves and the scale: whatever rule made them.
using RopeKey = std::pair<std::vector<double>, double>;

std::mutex g_rope_mu;  // guards every RopeTables

// The tables of (hd, r); the caller holds g_rope_mu.
RopeTables& rope_tables_locked(Ctx& ctx, int hd, const Rope& r) {
  static std::map<RopeKey, RopeTables> all;
  RopeKey key{r.inv_freq(hd), r.attention_factor};
  auto it = all.find(key);
  if (it == all.end()) {
    const std::vector<double>& f = key.first;
    RopeTables t;
    t.inv_freq = Buffer(f.size() * sizeof(double), Device::cuda);
    CUDA_CHECK(cudaMemcpyAsync(t.inv_freq.data(), f.data(), f.size() * sizeof(double),
                               cudaMemcpyHostToDevice, stream_of(ctx)));
    CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));  // `f` moves into the map below
    it = all.emplace(std::move(key), std::move(t)).first;
  }
  return it->second;
}

const double* rope_inv_freq(Ctx& ctx, int hd, const Rope& r) {
  std::lock_guard<std::mutex> lock(g_rope_mu);
  return static_cast<const double*>(rope_tables_locked(ctx, hd, r).inv_freq.data());
}

const float2* rope_table(Ctx& ctx, int seq_len, int hd, const Rope& r) {
  std::lock_guard<std::mutex> lock(g_rope_mu);
  RopeTables& t = rope_tables_locked(ctx, hd, r);
  auto it = t.table.find(seq_len);
  if (it == t.table.end()) {
    const int half = hd / 2;
    Buffer b(static_cast<size_t>(seq_len) * half * sizeof(float2), Device::cuda);
    const int64_t n = int64_t{seq_len} * half;
    rope_table_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream_of(ctx)>>>(
        static_cast<float2*>(b.data()), seq_len, half,
        static_cast<const double*>(t.inv_freq.data()), r.attention_factor);
    CUDA_CHECK_LAUNCH();
    it = t.table.emplace(seq_len, std::move(b)).first;
  }
  return static_cast<const float2*>(it->second.data());
}

void rotate(Ctx& ctx, Tensor x, int n_rope_heads, int seq_len, const Rope& r, Tensor positions,
            double sign, const char* op) {
  const int32_t* pos = positions.empty() ? nullptr : positions.ptr<int32_t>();
  const int n_pos = static_cast<int>(positions.empty() ? 0 : positions.numel());
  const int64_t tokens = x.shape[0];
  const int n_total = static_cast<int>(x.shape[1]), hd = static_cast<int>(x.shape[2]);
  const int64_t pairs = tokens * n_rope_heads * (hd / 2);
  if (pairs == 0) return;  // no rotated heads: nothing to launch
  if (take(Switch::rope_fp64)) {
    dispatch_float(x.dtype, op, [&](auto tag) {
      using T = decltype(tag);
      rope_kernel_fp64<T><<<grid_stride_blocks(pairs, kThreads), kThreads, 0, stream_of(ctx)>>>(
          x.ptr<T>(), tokens, n_total, n_rope_heads, hd, seq_len, pos, n_pos,
          rope_inv_freq(ctx, hd, r), r.attention_factor, sign);
    });
    CUDA_CHECK_LAUNCH();
    return;
  }
  const float2* table = rope_table(ctx, seq_len, hd, r);
  dispatch_float(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    constexpr int N = kPack<T>;
    // 16-byte packs when each half of a head is whole packs (hd 64 and 128 are), else one.
    if ((hd / 2) % N == 0 && packable(hd, sizeof(T), {x.data})) {
      const int64_t work = pairs / N;
      rope_kernel<T, N><<<grid_stride_blocks(work, kThreads), kThreads, 0, stream_of(ctx)>>>(
          x.ptr<T>(), table, tokens, n_total, n_rope_heads, hd, seq_len, pos, n_pos,
          static_cast<float>(sign));
    } else {
      rope_kernel<T, 1><<<grid_stride_blocks(pairs, kThreads), kThreads, 0, stream_of(ctx)>>>(
          x.ptr<T>(), table, tokens, n_total, n_rope_heads, hd, seq_len, pos, n_pos,
          static_cast<float>(sign));
    }
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_fwd(Ctx& ctx, Tensor x, int n_rope_heads, int seq_len, const Rope& rope,
              Tensor positions) {
  rotate(ctx, x, n_rope_heads, seq_len, rope, positions, 1.0, "rope_fwd");
}

void rope_bwd(Ctx& ctx, Tensor dx, int n_rope_heads, int seq_len, const Rope& rope,
              Tensor positions) {
  rotate(ctx, dx, n_rope_heads, seq_len, rope, positions, -1.0, "rope_bwd");
}

}  // namespace tr::cuda
