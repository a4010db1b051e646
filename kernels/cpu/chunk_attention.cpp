#include "kernels/cpu/chunk_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace tr::cpu {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct ChunkDims {
  int64_t sq, sk, nh, nkv, hd;
  int64_t group() const { return nh / nkv; }
  int64_t q(int64_t i, int64_t h) const { return (i * nh + h) * hd; }
  int64_t k(int64_t j, int64_t g) const { return (j * nkv + g) * hd; }
  int64_t l(int64_t h, int64_t i) const { return h * sq + i; }
};

ChunkDims dims_of(const Tensor& q, const Tensor& k, const Tensor& v, size_t nq, size_t nk) {
  TR_ASSERT(q.ndim == 3 && k.ndim == 3 && v.same_shape(k) && q.shape[2] == k.shape[2] &&
                k.shape[1] > 0 && q.shape[1] % k.shape[1] == 0,
            "chunk attention: q [Sq, nh, hd] and k, v [Sk, nkv, hd] with nkv dividing nh, got q " +
                q.shape_str() + " k " + k.shape_str() + " v " + v.shape_str());
  TR_ASSERT(static_cast<size_t>(q.shape[0]) == nq && static_cast<size_t>(k.shape[0]) == nk,
            "chunk attention: one position per query and per key");
  return {q.shape[0], k.shape[0], q.shape[1], k.shape[1], q.shape[2]};
}

template <class T>
double dot(const T* a, const T* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Key j is visible to query i: not after it, and (block-causal) not before its document.
struct Visible {
  std::span<const int64_t> q_pos, k_pos, q_first;
  bool operator()(int64_t i, int64_t j) const {
    return k_pos[j] <= q_pos[i] && (q_first.empty() || k_pos[j] >= q_first[i]);
  }
};

template <class T, class L>
void fwd(const ChunkDims& d, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
         const Visible& visible) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  std::vector<double> p(static_cast<size_t>(d.sk)), acc(static_cast<size_t>(d.hd));
  for (int64_t h = 0; h < d.nh; ++h) {
    const int64_t g = h / d.group();
    for (int64_t i = 0; i < d.sq; ++i) {
      const T* qi = q.ptr<T>() + d.q(i, h);
      double max = kNegInf;
      for (int64_t j = 0; j < d.sk; ++j)
        if (visible(i, j)) {
          p[j] = scale * dot(qi, k.ptr<T>() + d.k(j, g), d.hd);
          max = std::max(max, p[j]);
        }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = 0.0;
      for (int64_t j = 0; j < d.sk; ++j) {
        if (!visible(i, j)) continue;
        const double w = std::exp(p[j] - max);
        sum += w;
        const T* vj = v.ptr<T>() + d.k(j, g);
        for (int64_t e = 0; e < d.hd; ++e) acc[e] += w * vj[e];
      }
      T* oi = out.ptr<T>() + d.q(i, h);
      for (int64_t e = 0; e < d.hd; ++e) oi[e] = static_cast<T>(sum > 0 ? acc[e] / sum : 0.0);
      lse.ptr<L>()[d.l(h, i)] = static_cast<L>(sum > 0 ? max + std::log(sum) : kNegInf);
    }
  }
}

template <class T, class L>
void merge(Tensor out, Tensor lse, Tensor out2, Tensor lse2) {
  const int64_t sq = out.shape[0], nh = out.shape[1], hd = out.shape[2];
  for (int64_t h = 0; h < nh; ++h)
    for (int64_t i = 0; i < sq; ++i) {
      L& l = lse.ptr<L>()[h * sq + i];
      const double a = l, b = lse2.ptr<L>()[h * sq + i];
      if (b == kNegInf) continue;  // the second saw no key: nothing to add
      const double m = std::max(a, b);
      const double l_new = m + std::log(std::exp(a - m) + std::exp(b - m));
      const double wa = a == kNegInf ? 0.0 : std::exp(a - l_new), wb = std::exp(b - l_new);
      T* o = out.ptr<T>() + (i * nh + h) * hd;
      const T* o2 = out2.ptr<T>() + (i * nh + h) * hd;
      for (int64_t e = 0; e < hd; ++e) o[e] = static_cast<T>(wa * o[e] + wb * o2[e]);
      l = static_cast<L>(l_new);
    }
}

template <class T, class L>
void bwd(const ChunkDims& d, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse,
         Tensor q, Tensor k, Tensor v, const Visible& visible) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  for (int64_t h = 0; h < d.nh; ++h) {
    const int64_t g = h / d.group();
    for (int64_t i = 0; i < d.sq; ++i) {
      const T* qi = q.ptr<T>() + d.q(i, h);
      const T* doi = dout.ptr<T>() + d.q(i, h);
      const double li = lse.ptr<L>()[d.l(h, i)];
      const double delta = dot(doi, out.ptr<T>() + d.q(i, h), d.hd);  // rowsum(dO * O)
      T* dqi = dq.ptr<T>() + d.q(i, h);
      for (int64_t j = 0; j < d.sk; ++j) {
        if (!visible(i, j)) continue;
        const T* kj = k.ptr<T>() + d.k(j, g);
        const T* vj = v.ptr<T>() + d.k(j, g);
        const double pij = std::exp(scale * dot(qi, kj, d.hd) - li);
        const double ds = pij * (dot(doi, vj, d.hd) - delta);
        T* dkj = dk.ptr<T>() + d.k(j, g);
        T* dvj = dv.ptr<T>() + d.k(j, g);
        for (int64_t e = 0; e < d.hd; ++e) {
          dqi[e] = static_cast<T>(dqi[e] + scale * ds * kj[e]);
          dkj[e] = static_cast<T>(dkj[e] + scale * ds * qi[e]);
          dvj[e] = static_cast<T>(dvj[e] + pij * doi[e]);
        }
      }
    }
  }
}

// T: the tensors' type; the statistics are f64 with f64 tensors, f32 otherwise.
template <class F>
void dispatch(DType dtype, const char* op, F&& f) {
  dispatch_float(dtype, op, [&](auto tag) {
    using T = decltype(tag);
    using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
    f(T{}, L{});
  });
}

}  // namespace

void chunk_attention_fwd(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                         std::span<const int64_t> q_pos, std::span<const int64_t> k_pos,
                         std::span<const int64_t> q_first) {
  const ChunkDims d = dims_of(q, k, v, q_pos.size(), k_pos.size());
  TR_ASSERT(out.same_shape(q) && lse.numel() == d.nh * d.sq,
            "chunk_attention_fwd: out [Sq, nh, "
            "hd] and lse [nh, Sq]");
  dispatch(q.dtype, "chunk_attention_fwd", [&](auto t, auto l) {
    fwd<decltype(t), decltype(l)>(d, out, lse, q, k, v, Visible{q_pos, k_pos, q_first});
  });
}

void attention_merge(Ctx&, Tensor out, Tensor lse, Tensor out2, Tensor lse2) {
  dispatch(out.dtype, "attention_merge",
           [&](auto t, auto l) { merge<decltype(t), decltype(l)>(out, lse, out2, lse2); });
}

void chunk_attention_bwd(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse,
                         Tensor q, Tensor k, Tensor v, std::span<const int64_t> q_pos,
                         std::span<const int64_t> k_pos, std::span<const int64_t> q_first) {
  const ChunkDims d = dims_of(q, k, v, q_pos.size(), k_pos.size());
  TR_ASSERT(dq.same_shape(q) && dout.same_shape(q) && out.same_shape(q) && dk.same_shape(k) &&
                dv.same_shape(v) && lse.numel() == d.nh * d.sq,
            "chunk_attention_bwd: dq, dout, out like q; dk, dv like k; lse [nh, Sq]");
  dispatch(q.dtype, "chunk_attention_bwd", [&](auto t, auto l) {
    bwd<decltype(t), decltype(l)>(d, dq, dk, dv, dout, out, lse, q, k, v,
                                  Visible{q_pos, k_pos, q_first});
  });
}

namespace {

// Positions that make a block of the sequence what attention_block_* says: the keys before
// every query (all visible), or the same positions (the causal diagonal); key positions count
// from the key block's start, and so do the documents' starts (q_doc_start - k_first).
struct BlockPositions {
  std::vector<int64_t> q, k, first;
  BlockPositions(int64_t sq, int64_t sk, bool causal, const DocStarts& q_docs, int64_t k_first)
      : q(sq), k(sk) {
    for (int64_t i = 0; i < sq; ++i) q[i] = causal ? i : sk + i;
    for (int64_t j = 0; j < sk; ++j) k[j] = j;
    if (q_docs.empty()) return;
    const int32_t* start = q_docs.start.ptr<int32_t>();
    TR_ASSERT(std::equal(start, start + sq, q_docs.host),
              "attention block: q_docs.host disagrees with q_docs.start (the CUDA backend counts "
              "on the host)");
    for (int64_t i = 0; i < sq; ++i) first.push_back(start[i] - k_first);
    // The diagonal's rows are the positions k_first + i: a document starts at or before its row,
    // and one that differs from the row before begins there (the CUDA backend reads runs so).
    for (int64_t i = 0; causal && i < sq; ++i)
      TR_ASSERT(first[i] <= i && (i == 0 || first[i] == first[i - 1] || first[i] == i),
                "attention block: a query's document starts after it or inside another");
  }
};

// Heads [first, first + part.shape[1]) of every row of qkv [L, heads * hd] and part [L, n, hd]:
// copied into part, or (`join`) from it.
void copy_heads(Tensor qkv, int64_t first, Tensor part, bool join) {
  const int64_t L = part.shape[0], n = part.shape[1], hd = part.shape[2];
  const int64_t width = qkv.shape[1];
  const size_t es = dtype_size(part.dtype), span = static_cast<size_t>(n * hd) * es;
  for (int64_t t = 0; t < L; ++t) {
    char* row = static_cast<char*>(qkv.data) + static_cast<size_t>(t * width + first * hd) * es;
    char* own = static_cast<char*>(part.data) + static_cast<size_t>(t) * span;
    std::memcpy(join ? row : own, join ? own : row, span);
  }
}

}  // namespace

void attention_block_fwd(Ctx&, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, bool causal,
                         DocStarts q_docs, int64_t k_first) {
  const BlockPositions p(q.shape[0], k.shape[0], causal, q_docs, k_first);
  chunk_attention_fwd(out, lse, q, k, v, p.q, p.k, p.first);
}

void attention_block_bwd(Ctx&, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse,
                         Tensor q, Tensor k, Tensor v, bool causal, DocStarts q_docs,
                         int64_t k_first) {
  for (Tensor* t : {&dq, &dk, &dv}) std::memset(t->data, 0, t->nbytes());
  const BlockPositions p(q.shape[0], k.shape[0], causal, q_docs, k_first);
  chunk_attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, p.q, p.k, p.first);
}

void qkv_split(Ctx&, Tensor q, Tensor k, Tensor v, Tensor qkv) {
  const int64_t nh = q.shape[1], nkv = k.shape[1];
  copy_heads(qkv, 0, q, false);
  copy_heads(qkv, nh, k, false);
  copy_heads(qkv, nh + nkv, v, false);
}

void qkv_join(Ctx&, Tensor dqkv, Tensor dq, Tensor dk, Tensor dv) {
  const int64_t nh = dq.shape[1], nkv = dk.shape[1];
  copy_heads(dqkv, 0, dq, true);
  copy_heads(dqkv, nh, dk, true);
  copy_heads(dqkv, nh + nkv, dv, true);
}

}  // namespace tr::cpu
