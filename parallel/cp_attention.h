// Context-parallel causal attention on CPU ranks: each rank of the CP group holds its two chunks
// of one sequence (cp_positions) as q [L, nh, hd], k, v [L, nkv, hd], and the group computes
// exactly the whole sequence's attention for each rank's queries. Two ways to meet the other
// ranks' keys and values:
//   all-gather: K and V gathered once (cheap under GQA), then one partial per chunk, merged by
//               log-sum-exp; the backward's dk, dv shares are reduce-scattered to their owners;
//   ring:       K and V passed around the ring cp - 1 times, one partial per step; the backward
//               passes each chunk's dk, dv along with it and back home.
// Both give the whole sequence's attention up to summation order. The reference the GPU path
// is checked against; on a GPU the chunk attention becomes cuDNN's with its statistics.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "parallel/comm.h"
#include "parallel/context_parallel.h"

namespace tr {

// The memory cp_attention_fwd and _bwd work in, for chunks of L tokens with nh query and nkv
// KV heads of hd: carved from the caller's arena (the model's, so that the planner counts it).
struct CpScratch {
  Tensor part, part_lse;  // one key chunk's partial attention: [L, nh, hd], [nh, L]
  // all-gather: every rank's K, V and their dK, dV shares, [cp L, nkv, hd];
  // ring: the chunk in hand, [L, nkv, hd] (and its dK, dV accumulators)
  Tensor k, v, dk, dv;
  Tensor k_next, v_next, dk_next, dv_next;  // ring: the chunk arriving, [L, nkv, hd]
  static CpScratch alloc(Arena& arena, CpExchange how, int cp, int64_t L, int64_t nh, int64_t nkv,
                         int64_t hd, DType dtype);
};

// out [L, nh, hd] and lse [nh, L] ASSIGNED, for a sequence of seq_len tokens split over `cp`.
void cp_attention_fwd(Comm& cp, CpExchange how, const CpScratch& scratch, Tensor out, Tensor lse,
                      Tensor q, Tensor k, Tensor v, int64_t seq_len);
// dq, dk, dv ASSIGNED: this rank's share of the sequence's gradients (its queries', and the sums
// every rank's queries put on its keys and values), from forward's out and lse.
void cp_attention_bwd(Comm& cp, CpExchange how, const CpScratch& scratch, Tensor dq, Tensor dk,
                      Tensor dv, Tensor dout, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                      int64_t seq_len);

}  // namespace tr
