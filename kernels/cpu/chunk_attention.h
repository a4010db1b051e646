// Causal GQA attention in chunks, the CPU reference for context parallelism (parallel.cp): each
// rank holds query chunks and meets the sequence's key/value chunks one at a time (all-gathered
// or passed around a ring). A chunk's partial result is its softmax-weighted values with the
// log-sum-exp of its scaled scores; partials merge by their log-sum-exps into exactly the
// attention over the union of the chunks. The backward takes the merged output and log-sum-exp
// and gives each chunk's share of dq, dk and dv (flash-attention's dS = P (dP - rowsum(dO O))),
// so dk and dv can be sent back to the rank that owns the chunk.
//
// Layouts: q, out, dq, dout [Sq, nh, hd]; k, v, dk, dv [Sk, nkv, hd]; lse [nh, Sq] (f64 with f64
// tensors, f32 otherwise). Query head h reads KV head h / (nh / nkv); scale hd^-0.5. Positions
// are global token positions within the sequence: key j is visible to query i when
// k_pos[j] <= q_pos[i].
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace tr::cpu {

// out, lse ASSIGNED: the attention of every query over this key chunk's visible keys; a query
// that sees none gets out 0 and lse -inf.
// With `q_first` (one per query, or empty) key j is visible to query i only when also
// k_pos[j] >= q_first[i]: the start of the query's document (block-causal attention).
void chunk_attention_fwd(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                         std::span<const int64_t> q_pos, std::span<const int64_t> k_pos,
                         std::span<const int64_t> q_first = {});

// The merge of two partials is the backend op attention_merge (kernels/ops.h): lse =
// log(e^lse + e^lse2) and out the two weighted by e^(lse_i - lse); any order gives the same
// result up to rounding. The blocks of a causal sequence (attention_block_fwd/bwd) are these
// functions at positions that make every key visible, or the causal diagonal.

// This key chunk's share of the gradients, given the merged out and lse of the queries: dq, dk
// and dv ACCUMULATE (summed over the key chunks for dq, over the query chunks for dk and dv).
void chunk_attention_bwd(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse,
                         Tensor q, Tensor k, Tensor v, std::span<const int64_t> q_pos,
                         std::span<const int64_t> k_pos, std::span<const int64_t> q_first = {});

}  // namespace tr::cpu
