#include "parallel/cp_attention.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/check.h"
#include "kernels/ops.h"

namespace tr {
namespace {

// The index (of the sequence's 2 cp chunks) of CP rank `rank`'s chunk `which`: 0 its early one,
// 1 its late one (parallel/context_parallel.h).
int chunk_index(int cp, int rank, int which) {
  return which == 0 ? rank : 2 * cp - 1 - rank;
}

// One rank's tensors as its two chunks: x [L, ...] -> chunk a's [C, ...] rows; lse [2, nh, C].
struct Chunks {
  int64_t C, nh;
  Tensor of(Tensor x, int a) const { return x.slice(a * C, C); }
  DocStarts of(const DocStarts& d, int a) const { return d.slice(a * C, C); }
  Tensor lse(Tensor l, int a) const { return l.view({2, nh, C}).slice(a, 1).view({nh, C}); }
};

// `x` in the accumulators' dtype: cast into `scratch`, or x itself where scratch is empty (the
// dtypes agree).
Tensor in_acc(Ctx& ctx, Tensor x, Tensor scratch) {
  if (scratch.empty()) return x;
  cast(ctx, scratch, x);
  return scratch;
}
// The accumulator for output `out`: `scratch`, or out itself where scratch is empty.
Tensor acc_for(Tensor out, Tensor scratch) {
  return scratch.empty() ? out : scratch;
}
// out = its accumulator, where that is another tensor.
void finish(Ctx& ctx, Tensor out, Tensor acc) {
  if (acc.data != out.data) cast(ctx, out, acc);
}

void check(const Comm& cp, const CpScratch& scratch, const Tensor& q, const Tensor& k,
           int64_t seq_len) {
  TR_ASSERT(q.ndim == 3 && k.ndim == 3 && q.shape[0] * cp.size() == seq_len &&
                k.shape[0] == q.shape[0] && q.shape[0] % 2 == 0,
            "cp attention: every rank holds seq_len / cp = " +
                std::to_string(seq_len / std::max(cp.size(), 1)) +
                " tokens (two chunks) of q, k and v");
  TR_ASSERT(2 * scratch.part.numel() == q.numel() && scratch.k.shape[1] == k.shape[1] &&
                scratch.part.dtype == q.dtype,
            "cp attention: scratch of another shape or dtype");
}

// Rank `s`'s rows of a gathered [cp L, ...] tensor.
Tensor rows_of(Tensor all, int s, int64_t L) {
  return all.slice(s * L, L);
}

// The forward's blocks, accumulated in out and lse (the accumulators). The rank's own chunks
// first: each query chunk's causal diagonal assigns its out and lse, then the late chunk meets
// the early one; every later block is merged in.
struct Forward {
  Ctx& ctx;
  const CpScratch& sc;
  Chunks ch;
  int n, r;
  Tensor out, lse, q;
  DocStarts doc;  // the queries' document starts (block-causal), or empty

  // The block of query chunk a over keys k, v of chunk index kc, in sc.part and sc.part_lse, then
  // in acc.
  std::pair<Tensor, Tensor> partial(int a, Tensor k, Tensor v, int kc, bool causal) {
    attention_block_fwd(ctx, sc.part, sc.part_lse, ch.of(q, a), k, v, causal, ch.of(doc, a),
                        kc * ch.C);
    return {in_acc(ctx, sc.part, sc.part_acc), in_acc(ctx, sc.part_lse, sc.part_lse_acc)};
  }
  void merge(int a, Tensor k, Tensor v, int kc) {
    auto [o, l] = partial(a, k, v, kc, /*causal=*/false);
    attention_merge(ctx, ch.of(out, a), ch.lse(lse, a), o, l);
  }
  void own(Tensor k, Tensor v) {
    for (int a : {0, 1}) {
      auto [o, l] = partial(a, ch.of(k, a), ch.of(v, a), chunk_index(n, r, a), /*causal=*/true);
      cast(ctx, ch.of(out, a), o);
      cast(ctx, ch.lse(lse, a), l);
    }
    merge(1, ch.of(k, 0), ch.of(v, 0), chunk_index(n, r, 0));
  }
  // Rank s's chunks (s != r), those before each query chunk.
  void other(Tensor k, Tensor v, int s) {
    for (int b : {0, 1})
      for (int a : {0, 1})
        if (chunk_index(n, s, b) < chunk_index(n, r, a))
          merge(a, ch.of(k, b), ch.of(v, b), chunk_index(n, s, b));
  }
};

// The backward's blocks: every visible (query chunk, key chunk) pair's share, added to dq and to
// the key chunk's dk, dv (accumulators).
struct Backward {
  Ctx& ctx;
  const CpScratch& sc;
  Chunks ch;
  int n, r;
  Tensor dq, dout, out, lse, q;
  DocStarts doc;  // the queries' document starts (block-causal), or empty

  // Rank s's chunks k, v [L, nkv, hd], accumulating into dk, dv (the same rows, in acc).
  void source(Tensor k, Tensor v, Tensor dk, Tensor dv, int s) {
    for (int b : {0, 1})
      for (int a : {0, 1}) {
        const int kc = chunk_index(n, s, b), qc = chunk_index(n, r, a);
        if (kc > qc) continue;
        attention_block_bwd(ctx, sc.dq_part, sc.dk_part, sc.dv_part, ch.of(dout, a), ch.of(out, a),
                            ch.lse(lse, a), ch.of(q, a), ch.of(k, b), ch.of(v, b),
                            /*causal=*/kc == qc, ch.of(doc, a), kc * ch.C);
        add(ctx, ch.of(dq, a), ch.of(dq, a), in_acc(ctx, sc.dq_part, sc.dq_part_acc));
        add(ctx, ch.of(dk, b), ch.of(dk, b), in_acc(ctx, sc.dk_part, sc.dk_part_acc));
        add(ctx, ch.of(dv, b), ch.of(dv, b), in_acc(ctx, sc.dv_part, sc.dv_part_acc));
      }
  }
};

}  // namespace

DType cp_accumulator_dtype(DType dtype) {
  return dtype == DType::bf16 ? DType::f32 : dtype;
}

CpScratch CpScratch::alloc(Arena& ar, CpExchange how, int cp, int64_t L, int64_t nh, int64_t nkv,
                           int64_t hd, DType dtype, DType acc) {
  const int64_t C = L / 2;
  const bool separate = acc != dtype;
  // The accumulator tensors, where the accumulators' dtype is not the outputs'.
  auto acc_only = [&](DType t, std::initializer_list<int64_t> shape) {
    return separate ? ar.alloc(t, shape) : Tensor();
  };
  CpScratch s;
  s.acc = acc;
  s.part = ar.alloc(dtype, {C, nh, hd});
  s.part_lse = ar.alloc(stat_dtype(dtype), {nh, C});
  s.dq_part = ar.alloc(dtype, {C, nh, hd});
  s.dk_part = ar.alloc(dtype, {C, nkv, hd});
  s.dv_part = ar.alloc(dtype, {C, nkv, hd});
  s.part_acc = acc_only(acc, {C, nh, hd});
  s.part_lse_acc = acc_only(stat_dtype(acc), {nh, C});
  s.dq_part_acc = acc_only(acc, {C, nh, hd});
  s.dk_part_acc = acc_only(acc, {C, nkv, hd});
  s.dv_part_acc = acc_only(acc, {C, nkv, hd});
  s.out_acc = acc_only(acc, {L, nh, hd});
  s.lse_acc = acc_only(stat_dtype(acc), {2, nh, C});
  s.dq_acc = acc_only(acc, {L, nh, hd});
  const int64_t rows = how == CpExchange::all_gather ? cp * L : L;
  s.k = ar.alloc(dtype, {rows, nkv, hd});
  s.v = ar.alloc(dtype, {rows, nkv, hd});
  s.dk = ar.alloc(acc, {rows, nkv, hd});
  s.dv = ar.alloc(acc, {rows, nkv, hd});
  if (how == CpExchange::all_gather) {
    s.dk_home = acc_only(acc, {L, nkv, hd});
    s.dv_home = acc_only(acc, {L, nkv, hd});
  } else {
    s.k_next = ar.alloc(dtype, {L, nkv, hd});
    s.v_next = ar.alloc(dtype, {L, nkv, hd});
    s.dk_next = ar.alloc(acc, {L, nkv, hd});
    s.dv_next = ar.alloc(acc, {L, nkv, hd});
  }
  return s;
}

void cp_attention_fwd(Ctx& ctx, Comm& cp, CpExchange how, const CpScratch& sc, Tensor out,
                      Tensor lse, Tensor q, Tensor k, Tensor v, int64_t seq_len, DocStarts docs) {
  check(cp, sc, q, k, seq_len);
  const int n = cp.size(), r = cp.rank();
  const int64_t L = q.shape[0];
  Forward f{ctx, sc,  {L / 2, q.shape[1]}, n, r, acc_for(out, sc.out_acc), acc_for(lse, sc.lse_acc),
            q,   docs};
  if (how == CpExchange::all_gather) {
    cp.all_gather(sc.k, k);
    cp.all_gather(sc.v, v);
    f.own(k, v);
    for (int s = 0; s < n; ++s)
      if (s != r) f.other(rows_of(sc.k, s, L), rows_of(sc.v, s, L), s);
  } else {
    // Ring: step t holds rank (r - t)'s chunks and passes them on to the next rank while their
    // attention runs (both only read them), receiving the next ones.
    Tensor kc = sc.k, vc = sc.v, kn = sc.k_next, vn = sc.v_next;
    cast(ctx, kc, k);
    cast(ctx, vc, v);
    for (int t = 0; t < n; ++t) {
      Comm::Ticket pass = Comm::kDone;
      const P2P ops[] = {{P2P::send, kc, (r + 1) % n},
                         {P2P::send, vc, (r + 1) % n},
                         {P2P::recv, kn, (r - 1 + n) % n},
                         {P2P::recv, vn, (r - 1 + n) % n}};
      if (t < n - 1) pass = cp.exchange_start(ops);
      if (t == 0)
        f.own(k, v);
      else
        f.other(kc, vc, (r - t + n) % n);
      if (t == n - 1) break;
      cp.wait(pass);
      std::swap(kc, kn);
      std::swap(vc, vn);
    }
    cp.wait_all();  // every pass is complete: this releases their tickets
  }
  finish(ctx, out, f.out);
  finish(ctx, lse, f.lse);
}

void cp_attention_bwd(Ctx& ctx, Comm& cp, CpExchange how, const CpScratch& sc, Tensor dq, Tensor dk,
                      Tensor dv, Tensor dout, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                      int64_t seq_len, DocStarts docs) {
  check(cp, sc, q, k, seq_len);
  const int n = cp.size(), r = cp.rank();
  const int64_t L = q.shape[0];
  Backward b{ctx, sc, {L / 2, q.shape[1]}, n, r, acc_for(dq, sc.dq_acc), dout, out, lse, q, docs};
  zero_(ctx, b.dq);
  if (how == CpExchange::all_gather) {
    cp.all_gather(sc.k, k);
    cp.all_gather(sc.v, v);
    zero_(ctx, sc.dk);
    zero_(ctx, sc.dv);
    for (int s = 0; s < n; ++s)
      b.source(rows_of(sc.k, s, L), rows_of(sc.v, s, L), rows_of(sc.dk, s, L), rows_of(sc.dv, s, L),
               s);
    // Each owner's dk, dv: the sum of every rank's share of its chunks.
    const Tensor dk_sum = acc_for(dk, sc.dk_home), dv_sum = acc_for(dv, sc.dv_home);
    cp.reduce_scatter(dk_sum, sc.dk, ReduceOp::sum);
    cp.reduce_scatter(dv_sum, sc.dv, ReduceOp::sum);
    finish(ctx, dk, dk_sum);
    finish(ctx, dv, dv_sum);
  } else {
    // Ring: each rank's chunks travel with their dk, dv accumulators and are home after n passes
    // of the accumulators. K and V pass on while the chunks' backward runs; dK and dV only after
    // it (it writes them).
    Tensor kc = sc.k, vc = sc.v, dkc = sc.dk, dvc = sc.dv;
    Tensor kn = sc.k_next, vn = sc.v_next, dkn = sc.dk_next, dvn = sc.dv_next;
    cast(ctx, kc, k);
    cast(ctx, vc, v);
    zero_(ctx, dkc);
    zero_(ctx, dvc);
    const int next = (r + 1) % n, prev = (r - 1 + n) % n;
    for (int t = 0; t < n; ++t) {
      Comm::Ticket pass = Comm::kDone;
      const P2P kv[] = {{P2P::send, kc, next},
                        {P2P::send, vc, next},
                        {P2P::recv, kn, prev},
                        {P2P::recv, vn, prev}};
      if (t < n - 1) pass = cp.exchange_start(kv);  // the last step's K, V go no further
      b.source(kc, vc, dkc, dvc, (r - t + n) % n);
      if (n == 1) break;
      const P2P grads[] = {{P2P::send, dkc, next},
                           {P2P::send, dvc, next},
                           {P2P::recv, dkn, prev},
                           {P2P::recv, dvn, prev}};
      cp.exchange(grads);
      cp.wait(pass);
      std::swap(kc, kn), std::swap(vc, vn), std::swap(dkc, dkn), std::swap(dvc, dvn);
    }
    cp.wait_all();  // every pass is complete: this releases their tickets
    cast(ctx, dk, dkc);
    cast(ctx, dv, dvc);
  }
  finish(ctx, dq, b.dq);
}

}  // namespace tr
