#include "parallel/cp_attention.h"

#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/chunk_attention.h"
#include "parallel/context_parallel.h"

namespace tr {
namespace {

// A host tensor that owns its memory, zeroed.
struct Owned {
  Buffer buf;
  Tensor t;
  Owned(DType dtype, std::initializer_list<int64_t> shape) : t(nullptr, dtype, Device::cpu, shape) {
    buf = Buffer(std::max<size_t>(t.nbytes(), 1), Device::cpu);
    std::memset(buf.data(), 0, t.nbytes());
    t.data = buf.data();
  }
};

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

// Rank `s`'s block of a gathered [cp * L, ...] tensor.
Tensor block(Tensor all, int s, int64_t rows) {
  return all.slice(s * rows, rows);
}

void check(const Comm& cp, const Tensor& q, const Tensor& k, int64_t seq_len) {
  TR_ASSERT(q.ndim == 3 && k.ndim == 3 && q.device == Device::cpu &&
                q.shape[0] * cp.size() == seq_len && k.shape[0] == q.shape[0],
            "cp attention: every rank holds seq_len / cp = " +
                std::to_string(seq_len / std::max(cp.size(), 1)) + " tokens of q, k and v");
}

}  // namespace

void cp_attention_fwd(Comm& cp, CpExchange how, Tensor out, Tensor lse, Tensor q, Tensor k,
                      Tensor v, int64_t seq_len) {
  check(cp, q, k, seq_len);
  const int n = cp.size(), r = cp.rank();
  const int64_t L = q.shape[0], nkv = k.shape[1], hd = k.shape[2];
  const std::vector<int64_t> mine = cp_positions(seq_len, n, r);
  std::memset(out.data, 0, out.nbytes());
  fill_neg_inf(lse);
  Owned part(q.dtype, {L, q.shape[1], hd}), part_lse(stat_dtype(q.dtype), {q.shape[1], L});
  auto meet = [&](Tensor ks, Tensor vs, int s) {
    cpu::chunk_attention_fwd(part.t, part_lse.t, q, ks, vs, mine, cp_positions(seq_len, n, s));
    cpu::attention_merge(out, lse, part.t, part_lse.t);
  };
  if (how == CpExchange::all_gather) {
    Owned ka(k.dtype, {n * L, nkv, hd}), va(v.dtype, {n * L, nkv, hd});
    cp.all_gather(ka.t, k);
    cp.all_gather(va.t, v);
    for (int s = 0; s < n; ++s) meet(block(ka.t, s, L), block(va.t, s, L), s);
    return;
  }
  // Ring: step t holds rank (r - t)'s chunk, then passes it to the next rank.
  Owned kc(k.dtype, {L, nkv, hd}), vc(v.dtype, {L, nkv, hd}), kn(k.dtype, {L, nkv, hd}),
      vn(v.dtype, {L, nkv, hd});
  std::memcpy(kc.t.data, k.data, k.nbytes());
  std::memcpy(vc.t.data, v.data, v.nbytes());
  for (int t = 0; t < n; ++t) {
    meet(kc.t, vc.t, (r - t + n) % n);
    if (t == n - 1) break;
    const P2P ops[] = {{P2P::send, kc.t, (r + 1) % n},
                       {P2P::send, vc.t, (r + 1) % n},
                       {P2P::recv, kn.t, (r - 1 + n) % n},
                       {P2P::recv, vn.t, (r - 1 + n) % n}};
    cp.exchange(ops);
    std::swap(kc, kn);
    std::swap(vc, vn);
  }
}

void cp_attention_bwd(Comm& cp, CpExchange how, Tensor dq, Tensor dk, Tensor dv, Tensor dout,
                      Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, int64_t seq_len) {
  check(cp, q, k, seq_len);
  const int n = cp.size(), r = cp.rank();
  const int64_t L = q.shape[0], nkv = k.shape[1], hd = k.shape[2];
  const std::vector<int64_t> mine = cp_positions(seq_len, n, r);
  std::memset(dq.data, 0, dq.nbytes());
  if (how == CpExchange::all_gather) {
    Owned ka(k.dtype, {n * L, nkv, hd}), va(v.dtype, {n * L, nkv, hd});
    Owned dka(k.dtype, {n * L, nkv, hd}), dva(v.dtype, {n * L, nkv, hd});
    cp.all_gather(ka.t, k);
    cp.all_gather(va.t, v);
    for (int s = 0; s < n; ++s)
      cpu::chunk_attention_bwd(dq, block(dka.t, s, L), block(dva.t, s, L), dout, out, lse, q,
                               block(ka.t, s, L), block(va.t, s, L), mine,
                               cp_positions(seq_len, n, s));
    // Each owner's dk, dv: the sum of every rank's share of its chunk.
    cp.reduce_scatter(dk, dka.t, ReduceOp::sum);
    cp.reduce_scatter(dv, dva.t, ReduceOp::sum);
    return;
  }
  // Ring: each chunk travels with its dk, dv accumulators; after n steps and one more pass they
  // are back at their owner.
  Owned kc(k.dtype, {L, nkv, hd}), vc(v.dtype, {L, nkv, hd}), dkc(k.dtype, {L, nkv, hd}),
      dvc(v.dtype, {L, nkv, hd});
  Owned kn(k.dtype, {L, nkv, hd}), vn(v.dtype, {L, nkv, hd}), dkn(k.dtype, {L, nkv, hd}),
      dvn(v.dtype, {L, nkv, hd});
  std::memcpy(kc.t.data, k.data, k.nbytes());
  std::memcpy(vc.t.data, v.data, v.nbytes());
  for (int t = 0; t < n; ++t) {
    cpu::chunk_attention_bwd(dq, dkc.t, dvc.t, dout, out, lse, q, kc.t, vc.t, mine,
                             cp_positions(seq_len, n, (r - t + n) % n));
    if (n == 1) break;
    const int next = (r + 1) % n, prev = (r - 1 + n) % n;
    const P2P ops[] = {{P2P::send, kc.t, next},  {P2P::send, vc.t, next}, {P2P::send, dkc.t, next},
                       {P2P::send, dvc.t, next}, {P2P::recv, kn.t, prev}, {P2P::recv, vn.t, prev},
                       {P2P::recv, dkn.t, prev}, {P2P::recv, dvn.t, prev}};
    cp.exchange(ops);
    std::swap(kc, kn), std::swap(vc, vn), std::swap(dkc, dkn), std::swap(dvc, dvn);
  }
  // After n steps and n passes each chunk's accumulators are home (with n == 1, never left).
  std::memcpy(dk.data, dkc.t.data, dk.nbytes());
  std::memcpy(dv.data, dvc.t.data, dv.nbytes());
}

}  // namespace tr
