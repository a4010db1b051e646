#include "trainer/model/moe_block.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "parallel/tp_region.h"

namespace tr {
MoeMlp::MoeMlp(const ModelDims& dims, DType dtype, int64_t tokens)
    : T_(tokens),
      H_(dims.hidden),
      E_(dims.moe.experts),
      k_(dims.moe.top_k),
      I_(dims.moe.inter),
      normalize_(dims.moe.normalize),
      tp_size_(dims.tp),
      tp_rank_(dims.tp_rank),
      dtype_(dtype),
      sdtype_(stat_dtype(dtype)) {
  if (dims.moe.capacity_factor > 0 && E_ > 0)
    capacity_ = static_cast<int64_t>(std::ceil(
        dims.moe.capacity_factor * static_cast<double>(T_ * k_) / static_cast<double>(E_)));
}

MoeWeights MoeMlp::views(
    const std::function<Tensor(const std::string&, std::initializer_list<int64_t>)>& at,
    const std::string& prefix) const {
  MoeWeights w;
  w.router = at(prefix + "mlp/gate/weight", {E_, H_});
  for (int64_t e = 0; e < E_; ++e) {
    const std::string x = absl::StrCat(prefix, "mlp/experts/", e, "/");
    // The fused gate and up view starts at gate_proj and spans up_proj after it.
    w.gateup.push_back(at(x + "gate_proj/weight", {2 * I_, H_}));
    w.down.push_back(at(x + "down_proj/weight", {H_, I_}));
  }
  return w;
}

void MoeMlp::alloc_recomputed(Arena& ar, MoeActs& a) const {
  a.act = ar.alloc(dtype_, {routed_rows(), I_});
}

void MoeMlp::alloc_kept(Arena& ar, MoeActs& a) const {
  const int64_t R = routed_rows();
  a.probs = ar.alloc(sdtype_, {T_, E_});
  a.experts = ar.alloc(DType::i32, {T_, k_});
  a.weights = ar.alloc(dtype_, {T_, k_});
  a.rows = ar.alloc(DType::i32, {T_, k_});
  a.counts = ar.alloc(DType::i32, {E_});
  a.stats = ar.alloc(sdtype_, {2, E_});
  a.gateup = ar.alloc(dtype_, {R, 2 * I_});
}

void MoeMlp::alloc_split(Arena& ar, MoeActs& a, bool fresh_dgateup) const {
  const int64_t R = routed_rows();
  a.dys = ar.alloc(dtype_, {R, H_});
  a.dgateup = fresh_dgateup ? ar.alloc(dtype_, {R, 2 * I_}) : a.gateup;
  a.dlogits = ar.alloc(dtype_, {T_, E_});
}

void MoeMlp::alloc_scratch(Arena& ar) {
  const int64_t R = routed_rows();
  logits_ = ar.alloc(dtype_, {T_, E_});
  xs_ = ar.alloc(dtype_, {R, H_});
  dxs_ = ar.alloc(dtype_, {R, H_});
  ys_ = ar.alloc(dtype_, {R, H_});
  dact_ = ar.alloc(dtype_, {R, I_});
  dgateup_ = ar.alloc(dtype_, {R, 2 * I_});
  dys_ = ar.alloc(dtype_, {R, H_});
  dweights_ = ar.alloc(dtype_, {T_, k_});
  dlogits_ = ar.alloc(dtype_, {T_, E_});
}

void MoeMlp::forward_in(Ctx& ctx, MoeActs& a, const MoeWeights& w, Tensor in) const {
  linear_fwd(ctx, logits_, in, w.router, Tensor());
  moe_router_fwd(ctx, a.probs, a.experts, a.weights, a.stats.slice(0, 1).view({E_}),
                 a.stats.slice(1, 1).view({E_}), logits_, normalize_);
  moe_dispatch(ctx, a.counts, a.rows, a.experts, a.weights, capacity_);
  // The experts' row counts on the host: the grouped projections' shapes (a device sync on a
  // GPU, as every dropless dispatcher has).
  std::vector<int32_t> counts(static_cast<size_t>(E_));
  copy_tensor(Tensor(counts.data(), DType::i32, Device::cpu, {E_}), a.counts);
  a.group_rows.assign(counts.begin(), counts.end());
  moe_permute(ctx, xs_, in, a.rows);
  grouped_linear_fwd(ctx, a.gateup, xs_, w.gateup, a.group_rows);
  recompute(ctx, a);
}

void MoeMlp::forward_out(Ctx& ctx, const MoeActs& a, const MoeWeights& w, Tensor out) const {
  grouped_linear_fwd(ctx, ys_, a.act, w.down, a.group_rows);
  moe_unpermute(ctx, out, ys_, a.weights, a.rows);
}

// Over every routed row, kept or not (with a capacity the dropped ones hold no one's values and
// no product reads them): the op's shape stays the op list's whatever the routing.
void MoeMlp::recompute(Ctx& ctx, const MoeActs& a) const {
  swiglu_fwd(ctx, a.act, a.gateup);
}

void MoeMlp::backward(Ctx& ctx, const MoeActs& a, const MoeWeights& w, const MoeWeights& g,
                      Tensor dy, Tensor in, Tensor aux_grad, const BlockBackward& how,
                      const MoeBackward& m) const {
  const bool whole = how.weights;  // else a B pass: the W pass's inputs kept in `a`
  const std::vector<Tensor> none;
  const Tensor dys = whole ? dys_ : a.dys, dgateup = whole ? dgateup_ : a.dgateup,
               dlogits = whole ? dlogits_ : a.dlogits;
  moe_unpermute_bwd(ctx, dys, Tensor(), dy, Tensor(), a.weights, a.rows);
  grouped_linear_bwd(ctx, dact_, whole ? g.down : none, dys, a.act, w.down, a.group_rows,
                     how.write);
  moe_choice_grads(ctx, dweights_, dact_, a.act, a.weights, a.rows);
  // Each TP rank's act and its gradient hold its intermediate shard: the choices' gradients are
  // partial sums.
  if (tp_size_ > 1) tp::sum(tp_, dweights_);
  swiglu_bwd(ctx, dgateup, dact_, a.gateup);
  moe_permute(ctx, xs_, in, a.rows);  // the gate and up projections' input, again
  grouped_linear_bwd(ctx, dxs_, whole ? g.gateup : none, dgateup, xs_, w.gateup, a.group_rows,
                     how.write);
  moe_router_bwd(ctx, dlogits, dweights_, a.probs, a.experts, normalize_, aux_grad, 1.0);
  // The router's input gradient is whole on every TP rank: TP rank 0 adds it to the sum.
  const Tensor din = m.din();
  const bool first = tp_rank_ == 0;
  if (first || whole)
    linear_bwd(ctx, first ? din : Tensor(), whole ? g.router : Tensor(), Tensor(), dlogits, in,
               w.router, how.write);
  moe_permute_bwd(ctx, din, dxs_, a.rows, /*accumulate=*/first);
  m.reduce_din();
}

void MoeMlp::weight_grads(Ctx& ctx, const MoeActs& a, const MoeWeights& w, const MoeWeights& g,
                          Tensor in, GradWrite write) const {
  grouped_linear_bwd(ctx, Tensor(), g.down, a.dys, a.act, w.down, a.group_rows, write);
  moe_permute(ctx, xs_, in, a.rows);
  grouped_linear_bwd(ctx, Tensor(), g.gateup, a.dgateup, xs_, w.gateup, a.group_rows, write);
  linear_bwd(ctx, Tensor(), g.router, Tensor(), a.dlogits, in, w.router, write);
}

void MoeMlp::forward_ops(OpLister& ops, const Run& r, bool out) const {
  const double R = static_cast<double>(routed_rows()), t = static_cast<double>(T_),
               e = static_cast<double>(E_), k = static_cast<double>(k_),
               h = static_cast<double>(H_), i = static_cast<double>(I_);
  const int64_t Rn = routed_rows();
  const OpPlace layers = OpPlace::layers;
  const double s = static_cast<double>(dtype_size(sdtype_)), x = ops.elem_bytes();
  ops.linear_fwd("router: forward" + r.suffix, r.phase, layers, r.count, T_, E_, H_);
  ops.add({.name = "router: softmax and top-k" + r.suffix,
           .key = {"moe_router_fwd", T_, E_, k_},
           .cls = OpClass::memory,
           .phase = r.phase,
           .count = r.count,
           .bytes = t * e * (x + s) + t * k * (4 + x)});
  ops.add({.name = "experts: dispatch" + r.suffix,
           .key = {"moe_dispatch", T_, k_, E_},
           .cls = OpClass::memory,
           .phase = r.phase,
           .count = r.count,
           .bytes = t * k * (8 + x) + 4 * e});
  ops.pass("experts: tokens permuted" + r.suffix, "moe_permute", r.phase, layers, r.count, Rn, H_,
           2 * R * h);
  ops.grouped_fwd("experts: gate and up projections: forward" + r.suffix, r.phase, r.count, Rn,
                  2 * I_, H_);
  ops.pass("experts: swiglu: forward" + r.suffix, "swiglu_fwd", r.phase, layers, r.count, Rn, I_,
           3 * i * R);
  if (!out) return;
  ops.grouped_fwd("experts: down projections: forward", r.phase, r.count, Rn, H_, I_);
  ops.pass("experts: weighted return", "moe_unpermute", r.phase, layers, r.count, T_, H_,
           (R + t) * h);
}

void MoeMlp::backward_ops(OpLister& ops, double mb, bool split) const {
  const double R = static_cast<double>(routed_rows()), t = static_cast<double>(T_),
               e = static_cast<double>(E_), k = static_cast<double>(k_),
               h = static_cast<double>(H_), i = static_cast<double>(I_);
  const int64_t Rn = routed_rows();
  const OpPhase bwd = OpPhase::backward;
  const OpPlace layers = OpPlace::layers;
  const double s = static_cast<double>(dtype_size(sdtype_)), x = ops.elem_bytes();
  ops.add({.name = "experts: weighted return: backward",
           .key = {"moe_unpermute_bwd", T_, H_, k_},
           .cls = OpClass::memory,
           .phase = bwd,
           .count = mb,
           .bytes = (t + R) * h * x});
  ops.grouped_bwd("experts: down projections", mb, split ? 0 : mb, Rn, H_, I_, E_);
  ops.add({.name = "experts: choices' weight gradients",
           .key = {"moe_choice_grads", T_, I_, k_},
           .cls = OpClass::memory,
           .phase = bwd,
           .count = mb,
           .bytes = 2 * R * i * x});
  if (tp_size_ > 1)
    ops.collective("router: top-k weights' gradient summed", bwd, layers, mb, "tp",
                   CommOp::all_reduce, Lane::in_order, T_, k_, dtype_);
  ops.pass("experts: swiglu: backward", "swiglu_bwd", bwd, layers, mb, Rn, I_, 5 * i * R);
  ops.pass("experts: tokens permuted (backward)", "moe_permute", bwd, layers, mb * (split ? 2 : 1),
           Rn, H_, 2 * R * h);
  ops.grouped_bwd("experts: gate and up projections", mb, split ? 0 : mb, Rn, 2 * I_, H_, E_);
  ops.add({.name = "router: backward",
           .key = {"moe_router_bwd", T_, E_, k_},
           .cls = OpClass::memory,
           .phase = bwd,
           .count = mb,
           .bytes = t * e * (x + s) + t * k * (4 + x)});
  // The router's input gradient on TP rank 0 (whole on every rank, summed once), its weight
  // gradient on each (in the W pass of a split backward).
  ops.linear_bwd("router", layers, bwd, tp_rank_ == 0 ? mb : 0, mb, T_, E_, H_);
  ops.pass("experts: tokens returned (backward)", "moe_permute_bwd", bwd, layers, mb, T_, H_,
           (R + t) * h);
  if (split) {
    ops.grouped_bwd("experts: down projections (W)", 0, mb, Rn, H_, I_, E_);
    ops.grouped_bwd("experts: gate and up projections (W)", 0, mb, Rn, 2 * I_, H_, E_);
  }
}

}  // namespace tr
