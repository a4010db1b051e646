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

namespace tr {

enum class CpExchange { all_gather, ring };

// out [L, nh, hd] and lse [nh, L] ASSIGNED, for a sequence of seq_len tokens split over `cp`.
void cp_attention_fwd(Comm& cp, CpExchange how, Tensor out, Tensor lse, Tensor q, Tensor k,
                      Tensor v, int64_t seq_len);
// dq, dk, dv ASSIGNED: this rank's share of the sequence's gradients (its queries', and the sums
// every rank's queries put on its keys and values), from forward's out and lse.
void cp_attention_bwd(Comm& cp, CpExchange how, Tensor dq, Tensor dk, Tensor dv, Tensor dout,
                      Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, int64_t seq_len);

}  // namespace tr
