// Mixture of experts: the router's softmax and top-k, the expert-major dispatch of the routed
// rows, the permutation there and back, and the experts' grouped projections.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace tr::cpu {
namespace {

// The CPU computes in f32 or f64, its statistics (probs, prob_sums, routed, aux_counts) in the
// same type.
template <class T>
void router_fwd_impl(Tensor probs, Tensor experts, Tensor weights, Tensor prob_sums, Tensor routed,
                     Tensor logits, bool normalize) {
  const int64_t n_tok = logits.dim(0), E = logits.dim(1), k = experts.dim(1);
  const T* z = logits.ptr<T>();
  T* p = probs.ptr<T>();
  int32_t* ex = experts.ptr<int32_t>();
  T* w = weights.ptr<T>();
  std::vector<double> sums(static_cast<size_t>(E), 0.0), count(static_cast<size_t>(E), 0.0);
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < n_tok; ++t) {
    const T* zt = z + t * E;
    T* pt = p + t * E;
    double max = zt[0];
    for (int64_t e = 1; e < E; ++e) max = std::max<double>(max, zt[e]);
    double total = 0;
    for (int64_t e = 0; e < E; ++e) total += std::exp(static_cast<double>(zt[e]) - max);
    for (int64_t e = 0; e < E; ++e) {
      pt[e] = static_cast<T>(std::exp(static_cast<double>(zt[e]) - max) / total);
      sums[e] += pt[e];
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return pt[a] > pt[b] || (pt[a] == pt[b] && a < b);
    });
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += pt[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[j];
      ex[t * k + j] = e;
      w[t * k + j] = static_cast<T>(normalize ? pt[e] / chosen : pt[e]);
      count[e] += 1;
    }
  }
  for (int64_t e = 0; e < E; ++e) {
    prob_sums.ptr<T>()[e] = static_cast<T>(sums[e]);
    routed.ptr<T>()[e] = static_cast<T>(count[e]);
  }
}

template <class T>
void router_bwd_impl(Tensor dlogits, Tensor dweights, Tensor probs, Tensor experts, bool normalize,
                     Tensor aux_counts, double aux_scale) {
  const int64_t n_tok = probs.dim(0), E = probs.dim(1), k = experts.dim(1);
  const T* p = probs.ptr<T>();
  const int32_t* ex = experts.ptr<int32_t>();
  const T* dw = dweights.ptr<T>();
  T* dz = dlogits.ptr<T>();
  std::vector<double> dp(static_cast<size_t>(E));
  for (int64_t t = 0; t < n_tok; ++t) {
    const T* pt = p + t * E;
    for (int64_t e = 0; e < E; ++e)
      dp[e] = aux_counts.empty() ? 0.0 : aux_scale * aux_counts.ptr<T>()[e];
    // w_j = p_j / s with s the chosen probabilities' sum: dp_j = (dw_j - sum_i dw_i w_i) / s.
    double s = 1, dot = 0;
    if (normalize) {
      s = 0;
      for (int64_t j = 0; j < k; ++j) s += pt[ex[t * k + j]];
      for (int64_t j = 0; j < k; ++j) dot += dw[t * k + j] * (pt[ex[t * k + j]] / s);
    }
    for (int64_t j = 0; j < k; ++j) dp[ex[t * k + j]] += (dw[t * k + j] - dot) / s;
    double pdp = 0;
    for (int64_t e = 0; e < E; ++e) pdp += pt[e] * dp[e];
    for (int64_t e = 0; e < E; ++e) dz[t * E + e] = static_cast<T>(pt[e] * (dp[e] - pdp));
  }
}

template <class T>
void dispatch_impl(Tensor counts, Tensor rows, Tensor experts, Tensor weights, int64_t capacity) {
  const int64_t n_tok = experts.dim(0), k = experts.dim(1), E = counts.dim(0);
  const int32_t* ex = experts.ptr<int32_t>();
  const T* w = weights.ptr<T>();
  int32_t* r = rows.ptr<int32_t>();
  // Each expert's choices in token order.
  std::vector<std::vector<int64_t>> of(static_cast<size_t>(E));
  for (int64_t i = 0; i < n_tok * k; ++i) {
    TR_ASSERT(ex[i] >= 0 && ex[i] < E, "moe_dispatch: an expert index outside [0, E)");
    of[ex[i]].push_back(i);
  }
  int64_t offset = 0;
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t>& c = of[e];
    if (capacity > 0 && static_cast<int64_t>(c.size()) > capacity) {
      std::vector<int64_t> dropped = c;  // the highest weights stay, earlier tokens on ties
      std::stable_sort(dropped.begin(), dropped.end(),
                       [&](int64_t a, int64_t b) { return w[a] > w[b]; });
      for (size_t i = static_cast<size_t>(capacity); i < dropped.size(); ++i) r[dropped[i]] = -1;
      dropped.resize(static_cast<size_t>(capacity));
      std::sort(dropped.begin(), dropped.end());
      c = dropped;
    }
    for (size_t i = 0; i < c.size(); ++i) r[c[i]] = static_cast<int32_t>(offset + i);
    counts.ptr<int32_t>()[e] = static_cast<int32_t>(c.size());
    offset += static_cast<int64_t>(c.size());
  }
}

template <class T>
void permute_impl(Tensor xs, Tensor in, Tensor rows) {
  const int64_t n_tok = in.dim(0), H = in.dim(1), k = rows.dim(1);
  const int32_t* r = rows.ptr<int32_t>();
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t j = 0; j < k; ++j)
      if (const int32_t row = r[t * k + j]; row >= 0)
        std::copy_n(in.ptr<T>() + t * H, H, xs.ptr<T>() + row * H);
}

template <class T>
void permute_bwd_impl(Tensor din, Tensor dxs, Tensor rows, bool accumulate) {
  const int64_t n_tok = din.dim(0), H = din.dim(1), k = rows.dim(1);
  const int32_t* r = rows.ptr<int32_t>();
  std::vector<double> acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < n_tok; ++t) {
    T* d = din.ptr<T>() + t * H;
    for (int64_t h = 0; h < H; ++h) acc[h] = accumulate ? static_cast<double>(d[h]) : 0.0;
    for (int64_t j = 0; j < k; ++j)
      if (const int32_t row = r[t * k + j]; row >= 0)
        for (int64_t h = 0; h < H; ++h) acc[h] += dxs.ptr<T>()[row * H + h];
    for (int64_t h = 0; h < H; ++h) d[h] = static_cast<T>(acc[h]);
  }
}

template <class T>
void unpermute_impl(Tensor out, Tensor ys, Tensor weights, Tensor rows) {
  const int64_t n_tok = out.dim(0), H = out.dim(1), k = rows.dim(1);
  const int32_t* r = rows.ptr<int32_t>();
  const T* w = weights.ptr<T>();
  std::vector<double> acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < n_tok; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < k; ++j)
      if (const int32_t row = r[t * k + j]; row >= 0)
        for (int64_t h = 0; h < H; ++h)
          acc[h] += static_cast<double>(w[t * k + j]) * ys.ptr<T>()[row * H + h];
    for (int64_t h = 0; h < H; ++h) out.ptr<T>()[t * H + h] = static_cast<T>(acc[h]);
  }
}

template <class T>
void unpermute_bwd_impl(Tensor dys, Tensor dweights, Tensor dout, Tensor ys, Tensor weights,
                        Tensor rows) {
  const int64_t n_tok = dout.dim(0), H = dout.dim(1), k = rows.dim(1);
  const int32_t* r = rows.ptr<int32_t>();
  const T* w = weights.ptr<T>();
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t row = r[t * k + j];
      double dot = 0;
      if (row >= 0) {
        const T* d = dout.ptr<T>() + t * H;
        T* dy = dys.ptr<T>() + row * H;
        for (int64_t h = 0; h < H; ++h) {
          if (!ys.empty()) dot += static_cast<double>(d[h]) * ys.ptr<T>()[row * H + h];
          dy[h] = static_cast<T>(static_cast<double>(w[t * k + j]) * d[h]);
        }
      }
      if (!dweights.empty()) dweights.ptr<T>()[t * k + j] = static_cast<T>(dot);
    }
}

// dots[r] = a[r] . b[r], summed in f64 and rounded once to T (the statistics' dtype here).
template <class T>
void row_dots_impl(Tensor dots, Tensor a, Tensor b) {
  const int64_t R = a.dim(0), I = a.dim(1);
  for (int64_t r = 0; r < R; ++r) {
    double dot = 0;
    for (int64_t i = 0; i < I; ++i)
      dot += static_cast<double>(a.ptr<T>()[r * I + i]) * b.ptr<T>()[r * I + i];
    dots.ptr<T>()[r] = static_cast<T>(dot);
  }
}

template <class T>
void choice_grads_impl(Tensor dweights, Tensor dots, Tensor weights, Tensor rows) {
  const int32_t* r = rows.ptr<int32_t>();
  for (int64_t c = 0; c < rows.numel(); ++c) {
    const double w = weights.ptr<T>()[c];
    const double g = r[c] >= 0 && w != 0 ? static_cast<double>(dots.ptr<T>()[r[c]]) / w : 0.0;
    dweights.ptr<T>()[c] = static_cast<T>(g);
  }
}

}  // namespace

void moe_router_fwd(Ctx&, Tensor probs, Tensor experts, Tensor weights, Tensor prob_sums,
                    Tensor routed, Tensor logits, bool normalize) {
  dispatch_float(logits.dtype, "moe_router_fwd", [&](auto tag) {
    router_fwd_impl<decltype(tag)>(probs, experts, weights, prob_sums, routed, logits, normalize);
  });
}

void moe_router_bwd(Ctx&, Tensor dlogits, Tensor dweights, Tensor probs, Tensor experts,
                    bool normalize, Tensor aux_counts, double aux_scale) {
  dispatch_float(dlogits.dtype, "moe_router_bwd", [&](auto tag) {
    router_bwd_impl<decltype(tag)>(dlogits, dweights, probs, experts, normalize, aux_counts,
                                   aux_scale);
  });
}

void moe_dispatch(Ctx&, Tensor counts, Tensor rows, Tensor experts, Tensor weights,
                  int64_t capacity) {
  dispatch_float(weights.dtype, "moe_dispatch", [&](auto tag) {
    dispatch_impl<decltype(tag)>(counts, rows, experts, weights, capacity);
  });
}

void moe_permute(Ctx&, Tensor xs, Tensor in, Tensor rows) {
  dispatch_float(in.dtype, "moe_permute",
                 [&](auto tag) { permute_impl<decltype(tag)>(xs, in, rows); });
}

void moe_permute_bwd(Ctx&, Tensor din, Tensor dxs, Tensor rows, bool accumulate) {
  dispatch_float(din.dtype, "moe_permute_bwd",
                 [&](auto tag) { permute_bwd_impl<decltype(tag)>(din, dxs, rows, accumulate); });
}

void moe_unpermute(Ctx&, Tensor out, Tensor ys, Tensor weights, Tensor rows) {
  dispatch_float(out.dtype, "moe_unpermute",
                 [&](auto tag) { unpermute_impl<decltype(tag)>(out, ys, weights, rows); });
}

void moe_unpermute_bwd(Ctx&, Tensor dys, Tensor dweights, Tensor dout, Tensor ys, Tensor weights,
                       Tensor rows) {
  dispatch_float(dout.dtype, "moe_unpermute_bwd", [&](auto tag) {
    unpermute_bwd_impl<decltype(tag)>(dys, dweights, dout, ys, weights, rows);
  });
}

void moe_row_dots(Ctx&, Tensor dots, Tensor a, Tensor b) {
  dispatch_float(a.dtype, "moe_row_dots",
                 [&](auto tag) { row_dots_impl<decltype(tag)>(dots, a, b); });
}

void moe_choice_grads(Ctx&, Tensor dweights, Tensor dots, Tensor weights, Tensor rows) {
  dispatch_float(weights.dtype, "moe_choice_grads", [&](auto tag) {
    choice_grads_impl<decltype(tag)>(dweights, dots, weights, rows);
  });
}

void moe_aux_loss_fwd(Ctx&, Tensor value, Tensor grad, Tensor stats, double value_scale,
                      double grad_scale) {
  dispatch_float(stats.dtype, "moe_aux_loss_fwd", [&](auto tag) {
    using T = decltype(tag);
    const int64_t E = stats.dim(1);
    const T* p = stats.ptr<T>();
    double dot = 0, routed = 0, most = 0;
    for (int64_t e = 0; e < E; ++e) {
      dot += static_cast<double>(p[e]) * p[E + e];
      routed += p[E + e];
      most = std::max<double>(most, p[E + e]);
      grad.ptr<T>()[e] = static_cast<T>(grad_scale * p[E + e]);
    }
    value.ptr<T>()[0] = static_cast<T>(value_scale * dot);
    value.ptr<T>()[1] = static_cast<T>(routed > 0 ? most * static_cast<double>(E) / routed : 0.0);
  });
}

// Each group through the linear layer's own reference on its rows.
void grouped_linear_fwd(Ctx& ctx, Tensor out, Tensor in, std::span<const Tensor> weights,
                        std::span<const int64_t> group_rows) {
  int64_t at = 0;
  for (size_t g = 0; g < weights.size(); ++g) {
    const int64_t n = group_rows[g];
    if (n > 0) cpu::linear_fwd(ctx, out.slice(at, n), in.slice(at, n), weights[g], Tensor());
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
      cpu::linear_bwd(ctx, din.empty() ? Tensor() : din.slice(at, n), dw, Tensor(),
                      dout.slice(at, n), in.slice(at, n), weights[g], assign_dweight);
    } else if (!dw.empty() && assign_dweight) {
      cpu::zero_(ctx, dw);  // an expert without tokens: its gradient is zero, not last step's
    }
    at += n;
  }
}

}  // namespace tr::cpu
