// CPU reference backend: fp32 and fp64 implementations of every op in kernels/ops.h, with the
// same signatures and gradient rules. Callers go through the tr:: entry points in ops.h, which
// check preconditions and dispatch here; these functions trust their arguments' shapes.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/core/ctx.h"
#include "kernels/core/tensor.h"
#include "kernels/ops.h"

namespace tr::cpu {

void embedding_fwd(Ctx& ctx, Tensor out, Tensor tokens, Tensor table, int64_t vocab_offset);
void embedding_bwd(Ctx& ctx, Tensor dtable, Tensor dout, Tensor tokens, int64_t vocab_offset);

void rmsnorm_fwd(Ctx& ctx, Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps);
void rmsnorm_bwd(Ctx& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight,
                 Tensor rstd, bool accumulate_din, bool assign_dweight);
void add_rmsnorm_fwd(Ctx& ctx, Tensor sum, Tensor out, Tensor rstd, Tensor a, Tensor b,
                     Tensor weight, float eps);

void linear_fwd(Ctx& ctx, Tensor out, Tensor in, Tensor weight, Tensor bias);
void linear_bwd(Ctx& ctx, Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in,
                Tensor weight, bool assign_dweight);

void rope_fwd(Ctx& ctx, Tensor x, int n_rope_heads, int seq_len, float theta);
void rope_bwd(Ctx& ctx, Tensor dx, int n_rope_heads, int seq_len, float theta);

void attention_fwd(Ctx& ctx, Tensor out, Tensor lse, Tensor qkv, int batch, int seq_len,
                   int n_heads, int n_kv_heads, int head_dim);
void attention_bwd(Ctx& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv,
                   int batch, int seq_len, int n_heads, int n_kv_heads, int head_dim);

void swiglu_fwd(Ctx& ctx, Tensor out, Tensor gateup);
void swiglu_bwd(Ctx& ctx, Tensor dgateup, Tensor dout, Tensor gateup);

void add(Ctx& ctx, Tensor out, Tensor a, Tensor b);
void scale_(Ctx& ctx, Tensor x, float s);
void zero_(Ctx& ctx, Tensor x);
double sum_squares(Ctx& ctx, Tensor x);
void accumulate_sum(Ctx& ctx, Tensor acc, Tensor x, bool squares);
void accumulate_sum_squares_pieces(Ctx& ctx, Tensor acc, Tensor x, Tensor pieces, int64_t base);

void cross_entropy_fwd_bwd(Ctx& ctx, Tensor losses, Tensor logits, Tensor targets,
                           int64_t vocab_valid, float grad_scale, bool compute_grad);

void xent_row_max(Ctx& ctx, Tensor row_max, Tensor logits, int64_t vocab_valid);
void xent_sums(Ctx& ctx, Tensor sums, Tensor logits, Tensor targets, Tensor row_max,
               int64_t vocab_offset, int64_t vocab_valid);
void xent_shard_stats(Ctx& ctx, Tensor stats, Tensor logits, Tensor targets, int64_t vocab_offset,
                      int64_t vocab_valid);
void xent_combine(Ctx& ctx, Tensor row_max, Tensor sums, Tensor all_stats);
void xent_loss_grad(Ctx& ctx, Tensor losses, Tensor logits, Tensor targets, Tensor row_max,
                    Tensor sums, int64_t vocab_offset, int64_t vocab_valid, float grad_scale,
                    bool compute_grad);

void adamw_update_pieces(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v,
                         Tensor compute_copy, Tensor pieces, AdamWIndex index, const AdamWParams& p,
                         float grad_scale);
void adamw_update(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p,
                  Tensor compute_copy);
void cast(Ctx& ctx, Tensor out, Tensor in);

// Calls f(float{}) or f(double{}) for dtype f32 or f64, so a generic lambda can pick the
// template instance: dispatch_float(t.dtype, "op", [&](auto tag) { impl<decltype(tag)>(...); }).
template <class F>
void dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32:
      f(float{});
      return;
    case DType::f64:
      f(double{});
      return;
    default:
      break;
  }
  TR_ASSERT(false,
            std::string(op) + ": the CPU backend runs f32 and f64, not " + dtype_name(dtype));
}

}  // namespace tr::cpu
