// Context-parallel causal attention: each rank of the CP group holds its two chunks of one
// sequence (cp_positions: chunks r and 2 cp - 1 - r) as q [L, nh, hd], k, v [L, nkv, hd], and the
// group computes exactly the whole sequence's attention for each rank's queries, one block (a
// query chunk against a key chunk) at a time with the ops of kernels/ops.h (attention_block_*,
// attention_merge: the CPU reference, cuDNN on GPUs). Two ways to meet the other ranks' keys and
// values:
//   all-gather: K and V gathered once (cheap under GQA), then one partial per visible block,
//               merged by log-sum-exp; the backward's dk, dv shares are reduce-scattered to
//               their owners;
//   ring:       K and V passed around the ring cp - 1 times, each pass beside the attention of
//               the chunk in hand; the backward passes each chunk's dk, dv along with it and home.
// Both give the whole sequence's attention up to summation order.
#pragma once

#include <cstdint>

#include "core/ctx.h"
#include "core/tensor.h"
#include "parallel/comm.h"
#include "parallel/context_parallel.h"

namespace tr {

// The memory cp_attention_fwd and _bwd work in, for a rank's L = 2 C tokens with nh query and nkv
// KV heads of hd: carved from the caller's arena (the model's, so that the planner counts it).
struct CpScratch {
  Tensor part, part_lse;             // one block's partial attention: [C, nh, hd], [nh, C]
  Tensor dq_part, dk_part, dv_part;  // one block's gradients: [C, nh, hd], [C, nkv, hd] x 2
  // all-gather: every rank's K, V and their dK, dV shares, [cp L, nkv, hd];
  // ring: the chunks in hand, [L, nkv, hd] (and their dK, dV accumulators)
  Tensor k, v, dk, dv;
  Tensor k_next, v_next, dk_next, dv_next;  // ring: the chunks arriving, [L, nkv, hd]
  static CpScratch alloc(Arena& arena, CpExchange how, int cp, int64_t L, int64_t nh, int64_t nkv,
                         int64_t hd, DType dtype);
};

// out [L, nh, hd] and lse (f32, f64 for f64 tensors; [2, nh, C]: each chunk's statistics in
// turn) ASSIGNED, for a sequence of seq_len tokens split over `cp`. On ctx's device; `cp` moves
// tensors there (NCCL, or MPI for host tensors).
void cp_attention_fwd(Ctx& ctx, Comm& cp, CpExchange how, const CpScratch& scratch, Tensor out,
                      Tensor lse, Tensor q, Tensor k, Tensor v, int64_t seq_len);
// dq, dk, dv ASSIGNED: this rank's share of the sequence's gradients (its queries', and the sums
// every rank's queries put on its keys and values), from forward's out and lse.
void cp_attention_bwd(Ctx& ctx, Comm& cp, CpExchange how, const CpScratch& scratch, Tensor dq,
                      Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse, Tensor q, Tensor k,
                      Tensor v, int64_t seq_len);

}  // namespace tr
