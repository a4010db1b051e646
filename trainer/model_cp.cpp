// Qwen2Model's attention under context parallelism (parallel.cp > 1): each sequence of the
// micro-batch meets the CP group's other chunks through parallel/cp_attention.h. The packed qkv
// rows of one sequence are unpacked into q, k and v for it, and its dq, dk, dv packed back into
// dqkv; out and lse are already one sequence's contiguous block. CPU ranks only (the GPU's
// chunk attention is not built).
#include <cstring>

#include "parallel/cp_attention.h"
#include "trainer/model.h"
#include "trainer/model_acts.h"

namespace tr {
namespace {

// Heads [first, first + part.shape[1]) of every token of packed rows [S, heads, hd] copied into
// part [S, n, hd], or (`pack`) from part into the rows.
void copy_heads(Tensor rows, int64_t heads, int64_t first, Tensor part, bool pack) {
  const int64_t S = part.shape[0], n = part.shape[1], hd = part.shape[2];
  const size_t es = dtype_size(part.dtype), span = static_cast<size_t>(n * hd) * es;
  auto* packed = static_cast<char*>(rows.data);
  auto* mine = static_cast<char*>(part.data);
  for (int64_t t = 0; t < S; ++t) {
    char* at = packed + static_cast<size_t>((t * heads + first) * hd) * es;
    char* own = mine + static_cast<size_t>(t) * span;
    if (pack)
      std::memcpy(at, own, span);
    else
      std::memcpy(own, at, span);
  }
}

}  // namespace

void Qwen2Model::context_attention_fwd(int slot, int64_t l) {
  const ModelDims& d = dims_;
  const Acts::Layer& L = a_->slots[slot].layers[l];
  TR_ASSERT(cp_ != nullptr && cp_->size() == d.cp, "context parallelism needs set_cp_comm()");
  Acts& a = *a_;
  const int64_t S = seq_len_, nh = d.heads, nkv = d.kv_heads, hd = d.head_dim;
  const int64_t heads = nh + 2 * nkv;
  for (int64_t b = 0; b < batch_; ++b) {
    const Tensor rows = L.qkv.slice(b * S, S);
    copy_heads(rows, heads, 0, a.q, false);
    copy_heads(rows, heads, nh, a.k, false);
    copy_heads(rows, heads, nh + nkv, a.v, false);
    cp_attention_fwd(*cp_, d.cp_exchange, a.cp, L.att.slice(b * S, S).view({S, nh, hd}),
                     L.lse.slice(b, 1).view({nh, S}), a.q, a.k, a.v, seq_total_);
  }
}

void Qwen2Model::context_attention_bwd(int slot, int64_t l) {
  const ModelDims& d = dims_;
  const Acts::Layer& L = a_->slots[slot].layers[l];
  Acts& a = *a_;
  const int64_t S = seq_len_, nh = d.heads, nkv = d.kv_heads, hd = d.head_dim;
  const int64_t heads = nh + 2 * nkv;
  for (int64_t b = 0; b < batch_; ++b) {
    const Tensor rows = L.qkv.slice(b * S, S), drows = a.dqkv.slice(b * S, S);
    copy_heads(rows, heads, 0, a.q, false);
    copy_heads(rows, heads, nh, a.k, false);
    copy_heads(rows, heads, nh + nkv, a.v, false);
    cp_attention_bwd(*cp_, d.cp_exchange, a.cp, a.dq, a.dk, a.dv,
                     a.datt.slice(b * S, S).view({S, nh, hd}),
                     L.att.slice(b * S, S).view({S, nh, hd}), L.lse.slice(b, 1).view({nh, S}), a.q,
                     a.k, a.v, seq_total_);
    copy_heads(drows, heads, 0, a.dq, true);
    copy_heads(drows, heads, nh, a.dk, true);
    copy_heads(drows, heads, nh + nkv, a.dv, true);
  }
}

}  // namespace tr
