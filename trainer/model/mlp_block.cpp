#include "trainer/model/mlp_block.h"

namespace tr {

DenseMlp::DenseMlp(const ModelDims& dims, DType dtype, int64_t tokens, const LayerGemm& gemm)
    : T_(tokens), H_(dims.hidden), I_(dims.inter), dtype_(dtype), gemm_(&gemm) {}

MlpWeights DenseMlp::views(
    const std::function<Tensor(const std::string&, std::initializer_list<int64_t>)>& at,
    const std::string& prefix) const {
  // The fused gate and up view starts at gate_proj and spans up_proj after it.
  return {.gateup_w = at(prefix + "mlp/gate_proj/weight", {2 * I_, H_}),
          .down_w = at(prefix + "mlp/down_proj/weight", {H_, I_})};
}

void DenseMlp::alloc_recomputed(Arena& ar, MlpActs& a) const {
  a.act = ar.alloc(dtype_, {T_, I_});
}

void DenseMlp::alloc_kept(Arena& ar, MlpActs& a) const {
  a.gateup = ar.alloc(dtype_, {T_, 2 * I_});
}

void DenseMlp::alloc_split(Arena& ar, MlpActs& a, bool fresh_dgateup) const {
  a.dy_down = ar.alloc(dtype_, {T_, H_});
  a.dgateup = fresh_dgateup ? ar.alloc(dtype_, {T_, 2 * I_}) : a.gateup;
}

void DenseMlp::alloc_scratch(Arena& ar) {
  dgateup_ = ar.alloc(dtype_, {T_, 2 * I_});
  dact_ = ar.alloc(dtype_, {T_, I_});
}

void DenseMlp::forward_in(Ctx& ctx, const MlpActs& a, const MlpWeights& w, Tensor in) const {
  gemm_->fwd(ctx, a.gateup, in, w.gateup_w, Tensor());
  swiglu_fwd(ctx, a.act, a.gateup);
}

void DenseMlp::forward_out(Ctx& ctx, const MlpActs& a, const MlpWeights& w, Tensor out) const {
  gemm_->fwd(ctx, out, a.act, w.down_w, Tensor());
}

void DenseMlp::recompute(Ctx& ctx, const MlpActs& a) const {
  swiglu_fwd(ctx, a.act, a.gateup);
}

void DenseMlp::backward(Ctx& ctx, const MlpActs& a, const MlpWeights& w, const MlpWeights& g,
                        Tensor dy, Tensor in, const BlockBackward& how) const {
  const auto weight_grad = [&](const Tensor& t) { return how.weights ? t : Tensor(); };
  dy = how.keep(dy, a.dy_down);
  gemm_->bwd(ctx, dact_, weight_grad(g.down_w), Tensor(), dy, a.act, w.down_w, how.write);
  swiglu_bwd(ctx, dgateup_, dact_, a.gateup);
  const Tensor dgateup = how.keep(dgateup_, a.dgateup);  // (gateup is not read after this)
  how.column(dgateup, in, w.gateup_w, weight_grad(g.gateup_w), Tensor());
}

void DenseMlp::weight_grads(Ctx& ctx, const MlpActs& a, const MlpWeights& w, const MlpWeights& g,
                            Tensor in, GradWrite write) const {
  gemm_->bwd(ctx, Tensor(), g.down_w, Tensor(), a.dy_down, a.act, w.down_w, write);
  gemm_->bwd(ctx, Tensor(), g.gateup_w, Tensor(), a.dgateup, in, w.gateup_w, write);
}

void DenseMlp::forward_ops(OpLister& ops, const Run& r, bool down) const {
  const double T = static_cast<double>(T_), i = static_cast<double>(I_);
  ops.linear_fwd("gate and up projection: forward" + r.suffix, r.phase, OpPlace::layers, r.count,
                 T_, 2 * I_, H_);
  ops.pass("swiglu: forward" + r.suffix, "swiglu_fwd", r.phase, OpPlace::layers, r.count, T_, I_,
           3 * i * T);
  if (down)
    ops.linear_fwd("down projection: forward" + r.suffix, r.phase, OpPlace::layers, r.count, T_, H_,
                   I_);
}

void DenseMlp::alloc_weight_codes(Arena& ar, LayerGemm& gemm, const MlpWeights* w) const {
  gemm.alloc_weight_codes(ar, w ? w->gateup_w.data : nullptr, 2 * I_, H_);
  gemm.alloc_weight_codes(ar, w ? w->down_w.data : nullptr, H_, I_);
}

void DenseMlp::final_ops(OpLister& ops) const {
  ops.weight_cast("gate and up projection", 2 * I_, H_);
  ops.weight_cast("down projection", H_, I_);
}

void DenseMlp::backward_ops(OpLister& ops, double din, double dweight, double kept) const {
  const double T = static_cast<double>(T_), i = static_cast<double>(I_),
               h = static_cast<double>(H_);
  const OpPhase bwd = OpPhase::backward;
  const OpPlace layers = OpPlace::layers;
  ops.pass("down projection: output gradient kept", "cast", bwd, layers, kept, T_, H_, 2 * h * T);
  ops.linear_bwd("down projection", layers, bwd, din, dweight, T_, H_, I_);
  ops.pass("swiglu: backward", "swiglu_bwd", bwd, layers, din, T_, I_, 5 * i * T);
  ops.pass("gate and up projection: output gradient kept", "cast", bwd, layers, kept, T_, 2 * I_,
           4 * i * T);
  ops.linear_bwd("gate and up projection", layers, bwd, din, dweight, T_, 2 * I_, H_,
                 /*column_parallel=*/true);
}

}  // namespace tr
