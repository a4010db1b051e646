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
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/context_parallel.h"

namespace tr {

// What context parallelism accumulates in for compute dtype `dtype`: f32 under bf16 (so that up
// to 2 cp partial outputs, and dq, dk, dv over every block and ring pass, are summed in fp32 and
// rounded once, as the model's gradients are), else the compute dtype itself.
DType cp_accumulator_dtype(DType dtype);

// The memory cp_attention_fwd and _bwd work in, for a rank's L = 2 C tokens with nh query and nkv
// KV heads of hd: carved from the caller's arena (the model's, so that the planner counts it).
// `acc` is the accumulators' dtype (cp_accumulator_dtype; tests may pick another); where it is
// the compute dtype the *_acc tensors are empty and the outputs accumulate in place.
struct CpScratch {
  DType acc = DType::f32;
  Tensor part, part_lse;             // one block's partial attention: [C, nh, hd], [nh, C]
  Tensor dq_part, dk_part, dv_part;  // one block's gradients: [C, nh, hd], [C, nkv, hd] x 2
  // The same in acc, and the accumulators: out [L, nh, hd], lse [2, nh, C], dq [L, nh, hd].
  Tensor part_acc, part_lse_acc, dq_part_acc, dk_part_acc, dv_part_acc;
  Tensor out_acc, lse_acc, dq_acc;
  // all-gather: every rank's K and V [cp L, nkv, hd], their dK, dV shares in acc, and this rank's
  // reduce-scattered sums [L, nkv, hd] in acc; ring: the chunks in hand [L, nkv, hd] and their
  // dK, dV accumulators in acc, and the ones arriving.
  Tensor k, v, dk, dv, dk_home, dv_home;
  Tensor k_next, v_next, dk_next, dv_next;
  static CpScratch alloc(Arena& arena, CpExchange how, int cp, int64_t L, int64_t nh, int64_t nkv,
                         int64_t hd, DType dtype, DType acc);
};

// out [L, nh, hd] and lse (f32, f64 for f64 tensors; [2, nh, C]: each chunk's statistics in
// turn) ASSIGNED, for a sequence of seq_len tokens split over `cp`. On ctx's device; `cp` moves
// tensors there (NCCL, or MPI for host tensors). Block-causal with `docs` (DocStarts of this
// rank's L queries, each a position in the sequence, with bounds that hold for each of its two
// chunks: the blocks take chunks): keys before a query's document start are hidden.
void cp_attention_fwd(Ctx& ctx, Comm& cp, CpExchange how, const CpScratch& scratch, Tensor out,
                      Tensor lse, Tensor q, Tensor k, Tensor v, int64_t seq_len,
                      DocStarts docs = {});
// dq, dk, dv ASSIGNED: this rank's share of the sequence's gradients (its queries', and the sums
// every rank's queries put on its keys and values), from forward's out and lse.
void cp_attention_bwd(Ctx& ctx, Comm& cp, CpExchange how, const CpScratch& scratch, Tensor dq,
                      Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse, Tensor q, Tensor k,
                      Tensor v, int64_t seq_len, DocStarts docs = {});

}  // namespace tr
