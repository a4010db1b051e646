// Naive causal GQA attention, one (batch, head) at a time, scale hd^-0.5. The forward saves
// the log-sum-exp of each query's scaled scores; the backward recomputes the probabilities
// from q, k and lse (flash-attention style) and uses dS = P * (dP - rowsum(dO * O)). Query i
// sees keys first(i)..i: 0, or block-causal the start of its document (doc_start).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace tr::cpu {
namespace {

// Addressing of one batch element b inside qkv [T, (nh + 2*nkv) * hd], out [T, nh*hd] and
// lse [batch, nh, seq_len]; token s of the batch element is row b * seq_len + s.
struct AttnDims {
  int64_t batch, seq, nh, nkv, hd;
  const int32_t* doc_start = nullptr;  // [batch * seq], or null: plain causal
  int64_t first(int64_t b, int64_t i) const { return doc_start ? doc_start[b * seq + i] : 0; }
  int64_t qkv_row() const { return (nh + 2 * nkv) * hd; }
  int64_t group() const { return nh / nkv; }  // query heads per KV head
  int64_t q(int64_t b, int64_t h, int64_t s) const { return (b * seq + s) * qkv_row() + h * hd; }
  int64_t k(int64_t b, int64_t g, int64_t s) const { return q(b, nh + g, s); }
  int64_t v(int64_t b, int64_t g, int64_t s) const { return q(b, nh + nkv + g, s); }
  int64_t o(int64_t b, int64_t h, int64_t s) const { return (b * seq + s) * nh * hd + h * hd; }
  int64_t l(int64_t b, int64_t h, int64_t s) const { return (b * nh + h) * seq + s; }
};

template <class T>
double dot(const T* a, const T* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Query head h of batch element b: out rows and lse entries ASSIGNED.
template <class T>
void head_fwd(const AttnDims& d, int64_t b, int64_t h, const T* qkv, T* out, T* lse) {
  const int64_t g = h / d.group();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  std::vector<double> p(d.seq);   // [seq] scores, then unnormalised probabilities
  std::vector<double> acc(d.hd);  // [hd] sum_j p_j v_j
  for (int64_t i = 0; i < d.seq; ++i) {
    const T* qi = qkv + d.q(b, h, i);
    double max = -std::numeric_limits<double>::infinity();
    const int64_t lo = d.first(b, i);
    for (int64_t j = lo; j <= i; ++j) {
      p[j] = scale * dot(qi, qkv + d.k(b, g, j), d.hd);
      max = std::max(max, p[j]);
    }
    double sum = 0.0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = lo; j <= i; ++j) {
      p[j] = std::exp(p[j] - max);
      sum += p[j];
      const T* vj = qkv + d.v(b, g, j);
      for (int64_t e = 0; e < d.hd; ++e) acc[e] += p[j] * vj[e];
    }
    T* oi = out + d.o(b, h, i);
    for (int64_t e = 0; e < d.hd; ++e) oi[e] = static_cast<T>(acc[e] / sum);
    lse[d.l(b, h, i)] = static_cast<T>(max + std::log(sum));
  }
}

// Query head h of batch element b: its dq rows ASSIGNED; dk, dv [seq, hd] (double scratch of
// its KV head) ACCUMULATE, since the query heads of one group share the KV head.
template <class T>
void head_bwd(const AttnDims& d, int64_t b, int64_t h, const T* qkv, const T* out, const T* lse,
              const T* dout, T* dqkv, std::vector<double>& dk, std::vector<double>& dv) {
  const int64_t g = h / d.group();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  std::vector<double> dq(d.hd);  // [hd]
  for (int64_t i = 0; i < d.seq; ++i) {
    const T* qi = qkv + d.q(b, h, i);
    const T* doi = dout + d.o(b, h, i);
    const double li = lse[d.l(b, h, i)];
    const double delta = dot(doi, out + d.o(b, h, i), d.hd);  // rowsum(dO * O)
    std::fill(dq.begin(), dq.end(), 0.0);
    for (int64_t j = d.first(b, i); j <= i; ++j) {
      const T* kj = qkv + d.k(b, g, j);
      const T* vj = qkv + d.v(b, g, j);
      const double pij = std::exp(scale * dot(qi, kj, d.hd) - li);
      const double ds = pij * (dot(doi, vj, d.hd) - delta);
      for (int64_t e = 0; e < d.hd; ++e) {
        dq[e] += scale * ds * kj[e];
        dk[j * d.hd + e] += scale * ds * qi[e];
        dv[j * d.hd + e] += pij * doi[e];
      }
    }
    T* dqi = dqkv + d.q(b, h, i);
    for (int64_t e = 0; e < d.hd; ++e) dqi[e] = static_cast<T>(dq[e]);
  }
}

// (batch, head) pairs are independent: split them over OpenMP threads. Each pair's arithmetic
// is fixed, so results do not depend on the thread count.
template <class T>
void attention_fwd_impl(Tensor out, Tensor lse, Tensor qkv, const AttnDims& d) {
  const T* q = qkv.ptr<T>();
  T* o = out.ptr<T>();
  T* l = lse.ptr<T>();
#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < d.batch * d.nh; ++bh) head_fwd<T>(d, bh / d.nh, bh % d.nh, q, o, l);
}

// dqkv [T, (nh + 2*nkv) * hd] ASSIGNED: every q, k and v column is written once.
// (batch, KV head) pairs are independent (a KV head's query heads run in a fixed order inside
// one pair), so they are split over OpenMP threads without changing any result.
template <class T>
void attention_bwd_impl(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv,
                        const AttnDims& d) {
  T* dst = dqkv.ptr<T>();
#pragma omp parallel for schedule(dynamic)
  for (int64_t bg = 0; bg < d.batch * d.nkv; ++bg) {
    const int64_t b = bg / d.nkv, g = bg % d.nkv;
    std::vector<double> dk(d.seq * d.hd, 0.0), dv(d.seq * d.hd, 0.0);  // [seq, hd] of KV head g
    for (int64_t h = g * d.group(); h < (g + 1) * d.group(); ++h)
      head_bwd<T>(d, b, h, qkv.ptr<T>(), out.ptr<T>(), lse.ptr<T>(), dout.ptr<T>(), dst, dk, dv);
    for (int64_t j = 0; j < d.seq; ++j) {
      for (int64_t e = 0; e < d.hd; ++e) {
        dst[d.k(b, g, j) + e] = static_cast<T>(dk[j * d.hd + e]);
        dst[d.v(b, g, j) + e] = static_cast<T>(dv[j * d.hd + e]);
      }
    }
  }
}

}  // namespace

namespace {
// The dims of one call, with its document starts checked: each within its token's sequence.
AttnDims dims_of(int batch, int seq_len, int n_heads, int n_kv_heads, int head_dim,
                 const DocStarts& docs) {
  AttnDims d{batch, seq_len, n_heads, n_kv_heads, head_dim};
  if (docs.empty()) return d;
  d.doc_start = docs.start.ptr<int32_t>();
  // A document's tokens share their start, and a token whose start differs from its
  // predecessor's begins its document (the documents are runs: the CUDA backend reads them so).
  for (int64_t t = 0; t < d.batch * d.seq; ++t)
    TR_ASSERT(
        d.doc_start[t] >= 0 && d.doc_start[t] <= t % d.seq &&
            (t % d.seq == 0 || d.doc_start[t] == d.doc_start[t - 1] || d.doc_start[t] == t % d.seq),
        "attention: a token's document starts after it, outside its sequence, or inside "
        "another document");
  TR_ASSERT(std::equal(d.doc_start, d.doc_start + d.batch * d.seq, docs.host),
            "attention: docs.host disagrees with docs.start (the CUDA backend counts on the host)");
  return d;
}
}  // namespace

void attention_fwd(Ctx&, Tensor out, Tensor lse, Tensor qkv, int batch, int seq_len, int n_heads,
                   int n_kv_heads, int head_dim, DocStarts docs) {
  const AttnDims d = dims_of(batch, seq_len, n_heads, n_kv_heads, head_dim, docs);
  dispatch_float(qkv.dtype, "attention_fwd",
                 [&](auto tag) { attention_fwd_impl<decltype(tag)>(out, lse, qkv, d); });
}

void attention_bwd(Ctx&, Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, int batch,
                   int seq_len, int n_heads, int n_kv_heads, int head_dim, DocStarts docs) {
  const AttnDims d = dims_of(batch, seq_len, n_heads, n_kv_heads, head_dim, docs);
  dispatch_float(qkv.dtype, "attention_bwd", [&](auto tag) {
    attention_bwd_impl<decltype(tag)>(dqkv, dout, out, lse, qkv, d);
  });
}

}  // namespace tr::cpu
