#include "parallel/cp_attention.h"

#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/chunk_attention.h"
#include "parallel/context_parallel.h"

namespace tr {
namespace {

DType stat_dtype(DType d) {
  return d == DType::f64 ? DType::f64 : DType::f32;
}

void fill_neg_inf(Tensor lse) {
  for (int64_t i = 0; i < lse.numel(); ++i) {
    if (lse.dtype == DType::f64)
      lse.ptr<double>()[i] = -std::numeric_limits<double>::infinity();
    else
      lse.ptr<float>()[i] = -std::numeric_limits<float>::infinity();
  }
}

void zero(Tensor t) {
  std::memset(t.data, 0, t.nbytes());
}

// Rank `s`'s block of a gathered [cp * L, ...] tensor.
Tensor block(Tensor all, int s, int64_t rows) {
  return all.slice(s * rows, rows);
}

void check(const Comm& cp, const CpScratch& scratch, const Tensor& q, const Tensor& k,
           int64_t seq_len) {
  TR_ASSERT(q.ndim == 3 && k.ndim == 3 && q.device == Device::cpu &&
                q.shape[0] * cp.size() == seq_len && k.shape[0] == q.shape[0],
            "cp attention: every rank holds seq_len / cp = " +
                std::to_string(seq_len / std::max(cp.size(), 1)) + " tokens of q, k and v");
  TR_ASSERT(scratch.part.numel() == q.numel() && scratch.k.shape[1] == k.shape[1],
            "cp attention: scratch of another shape");
}

}  // namespace

CpScratch CpScratch::alloc(Arena& ar, CpExchange how, int cp, int64_t L, int64_t nh, int64_t nkv,
                           int64_t hd, DType dtype) {
  CpScratch s;
  s.part = ar.alloc(dtype, {L, nh, hd});
  s.part_lse = ar.alloc(stat_dtype(dtype), {nh, L});
  const int64_t rows = how == CpExchange::all_gather ? cp * L : L;
  for (Tensor* t : {&s.k, &s.v, &s.dk, &s.dv}) *t = ar.alloc(dtype, {rows, nkv, hd});
  if (how == CpExchange::ring)
    for (Tensor* t : {&s.k_next, &s.v_next, &s.dk_next, &s.dv_next})
      *t = ar.alloc(dtype, {L, nkv, hd});
  return s;
}

void cp_attention_fwd(Comm& cp, CpExchange how, const CpScratch& sc, Tensor out, Tensor lse,
                      Tensor q, Tensor k, Tensor v, int64_t seq_len) {
  check(cp, sc, q, k, seq_len);
  const int n = cp.size(), r = cp.rank();
  const int64_t L = q.shape[0];
  const std::vector<int64_t> mine = cp_positions(seq_len, n, r);
  zero(out);
  fill_neg_inf(lse);
  auto meet = [&](Tensor ks, Tensor vs, int s) {
    cpu::chunk_attention_fwd(sc.part, sc.part_lse, q, ks, vs, mine, cp_positions(seq_len, n, s));
    cpu::attention_merge(out, lse, sc.part, sc.part_lse);
  };
  if (how == CpExchange::all_gather) {
    cp.all_gather(sc.k, k);
    cp.all_gather(sc.v, v);
    for (int s = 0; s < n; ++s) meet(block(sc.k, s, L), block(sc.v, s, L), s);
    return;
  }
  // Ring: step t holds rank (r - t)'s chunk and passes it on to the next rank while its
  // attention runs (both only read it), receiving the next one.
  Tensor kc = sc.k, vc = sc.v, kn = sc.k_next, vn = sc.v_next;
  std::memcpy(kc.data, k.data, k.nbytes());
  std::memcpy(vc.data, v.data, v.nbytes());
  for (int t = 0; t < n; ++t) {
    if (t == n - 1) {
      meet(kc, vc, (r - t + n) % n);
      break;
    }
    const P2P ops[] = {{P2P::send, kc, (r + 1) % n},
                       {P2P::send, vc, (r + 1) % n},
                       {P2P::recv, kn, (r - 1 + n) % n},
                       {P2P::recv, vn, (r - 1 + n) % n}};
    const Comm::Ticket pass = cp.exchange_start(ops);
    meet(kc, vc, (r - t + n) % n);
    cp.wait(pass);
    std::swap(kc, kn);
    std::swap(vc, vn);
  }
}

void cp_attention_bwd(Comm& cp, CpExchange how, const CpScratch& sc, Tensor dq, Tensor dk,
                      Tensor dv, Tensor dout, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                      int64_t seq_len) {
  check(cp, sc, q, k, seq_len);
  const int n = cp.size(), r = cp.rank();
  const int64_t L = q.shape[0];
  const std::vector<int64_t> mine = cp_positions(seq_len, n, r);
  zero(dq);
  if (how == CpExchange::all_gather) {
    cp.all_gather(sc.k, k);
    cp.all_gather(sc.v, v);
    zero(sc.dk);
    zero(sc.dv);
    for (int s = 0; s < n; ++s)
      cpu::chunk_attention_bwd(dq, block(sc.dk, s, L), block(sc.dv, s, L), dout, out, lse, q,
                               block(sc.k, s, L), block(sc.v, s, L), mine,
                               cp_positions(seq_len, n, s));
    // Each owner's dk, dv: the sum of every rank's share of its chunk.
    cp.reduce_scatter(dk, sc.dk, ReduceOp::sum);
    cp.reduce_scatter(dv, sc.dv, ReduceOp::sum);
    return;
  }
  // Ring: each chunk travels with its dk, dv accumulators; after n steps and one more pass they
  // are back at their owner. K and V pass on while the chunk's backward runs; dK and dV only
  // after it (it writes them).
  Tensor kc = sc.k, vc = sc.v, dkc = sc.dk, dvc = sc.dv;
  Tensor kn = sc.k_next, vn = sc.v_next, dkn = sc.dk_next, dvn = sc.dv_next;
  std::memcpy(kc.data, k.data, k.nbytes());
  std::memcpy(vc.data, v.data, v.nbytes());
  zero(dkc);
  zero(dvc);
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  for (int t = 0; t < n; ++t) {
    Comm::Ticket pass = Comm::kDone;
    const P2P kv[] = {
        {P2P::send, kc, next}, {P2P::send, vc, next}, {P2P::recv, kn, prev}, {P2P::recv, vn, prev}};
    if (n > 1 && t < n - 1) pass = cp.exchange_start(kv);  // the last step's K, V stay
    cpu::chunk_attention_bwd(dq, dkc, dvc, dout, out, lse, q, kc, vc, mine,
                             cp_positions(seq_len, n, (r - t + n) % n));
    if (n == 1) break;
    const P2P grads[] = {{P2P::send, dkc, next},
                         {P2P::send, dvc, next},
                         {P2P::recv, dkn, prev},
                         {P2P::recv, dvn, prev}};
    cp.exchange(grads);
    cp.wait(pass);
    std::swap(kc, kn), std::swap(vc, vn), std::swap(dkc, dkn), std::swap(dvc, dvn);
  }
  // After n steps and n passes each chunk's accumulators are home (with n == 1, never left).
  std::memcpy(dk.data, dkc.data, dk.nbytes());
  std::memcpy(dv.data, dvc.data, dv.nbytes());
}

}  // namespace tr
