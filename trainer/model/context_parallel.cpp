// Qwen2Model's attention under context parallelism (parallel.cp > 1): each sequence of the
// micro-batch meets the CP group's other chunks through parallel/cp_attention.h. One sequence's
// q, k and v are split out of the packed qkv rows and its dq, dk, dv joined back into dqkv; out
// and lse are already one sequence's contiguous block (lse in cp_attention's chunk-major order).
#include "kernels/op_log.h"
#include "parallel/cp_attention.h"
#include "trainer/model/model.h"
#include "trainer/model/model_acts.h"

namespace tr {

DocStarts Qwen2Model::doc_starts(int slot, int64_t b) const {
  return a_->slots[slot].docs.doc_start.slice(b * seq_len_, seq_len_);
}

void Qwen2Model::context_attention_fwd(int slot, int64_t l) {
  const ModelDims& d = dims_;
  TR_ASSERT(cp_ != nullptr && cp_->size() == d.cp, "context parallelism needs set_cp_comm()");
  const Acts::Layer& L = a_->layer(slot, layer_pos_[l]);
  Acts& a = *a_;
  const int64_t S = seq_len_, nh = d.heads, hd = d.head_dim;
  for (int64_t b = 0; b < batch_; ++b) {
    qkv_split(ctx_, a.q, a.k, a.v, L.qkv.slice(b * S, S));
    const OpLog::Compound op(ctx_, {"cp_attention_fwd", S, nh * hd, seq_total_});
    cp_attention_fwd(ctx_, *cp_, d.cp_exchange, a.cp, L.att.slice(b * S, S).view({S, nh, hd}),
                     L.lse.slice(b, 1), a.q, a.k, a.v, seq_total_, doc_starts(slot, b));
  }
}

void Qwen2Model::context_attention_bwd(int slot, int64_t l) {
  const ModelDims& d = dims_;
  const Acts::Layer& L = a_->layer(slot, layer_pos_[l]);
  Acts& a = *a_;
  const int64_t S = seq_len_, nh = d.heads, hd = d.head_dim;
  for (int64_t b = 0; b < batch_; ++b) {
    qkv_split(ctx_, a.q, a.k, a.v, L.qkv.slice(b * S, S));
    {  // one op on the model's list, whatever blocks it runs
      const OpLog::Compound op(ctx_, {"cp_attention_bwd", S, nh * hd, seq_total_});
      cp_attention_bwd(ctx_, *cp_, d.cp_exchange, a.cp, a.dq, a.dk, a.dv,
                       a.datt.slice(b * S, S).view({S, nh, hd}),
                       L.att.slice(b * S, S).view({S, nh, hd}), L.lse.slice(b, 1), a.q, a.k, a.v,
                       seq_total_, doc_starts(slot, b));
    }
    qkv_join(ctx_, a.dqkv.slice(b * S, S), a.dq, a.dk, a.dv);
  }
}

}  // namespace tr
