#include "trainer/model/moe_block.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "parallel/tp_region.h"

namespace tr {
MoeMlp::MoeMlp(const ModelDims& dims, DType dtype, int64_t tokens)
    : T_(tokens),
      H_(dims.hidden),
      E_(dims.moe.experts),
      El_(dims.moe.local),
      e0_(dims.moe.offset),
      k_(dims.moe.top_k),
      I_(dims.moe.inter),
      normalize_(dims.moe.normalize),
      tp_size_(dims.tp),
      tp_rank_(dims.tp_rank),
      ep_size_(dims.moe.ep),
      ep_rank_(dims.moe.ep_rank),
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
  for (int64_t e = e0_; e < e0_ + El_; ++e) {  // this rank's experts
    const std::string x = absl::StrCat(prefix, "mlp/experts/", e, "/");
    // The fused gate and up view starts at gate_proj and spans up_proj after it.
    w.gateup.push_back(at(x + "gate_proj/weight", {2 * I_, H_}));
    w.down.push_back(at(x + "down_proj/weight", {H_, I_}));
  }
  return w;
}

namespace {

// A tensor of a store: rows x cols of dtype (cols 0: a vector of rows).
struct Part {
  DType dtype;
  int64_t rows, cols;
};

size_t part_bytes(const Part& p) {
  return arena_bytes(p.dtype, p.rows * std::max<int64_t>(p.cols, 1));
}

// The parts laid out back to back in `store` (grown to hold them), each as the arena aligns it.
std::vector<Tensor> carve(RoutedStore& store, Device device, std::initializer_list<Part> parts) {
  size_t bytes = 0;
  for (const Part& p : parts) bytes += part_bytes(p);
  char* at = store.reserve(bytes);
  std::vector<Tensor> out;
  for (const Part& p : parts) {
    out.push_back(p.cols > 0 ? Tensor(at, p.dtype, device, {p.rows, p.cols})
                             : Tensor(at, p.dtype, device, {p.rows}));
    at += part_bytes(p);
  }
  return out;
}

// A store carved from the arena for `parts` at a balanced routing's rows.
std::shared_ptr<RoutedStore> routed_store(Arena& ar, std::initializer_list<Part> parts) {
  size_t bytes = 0;
  for (const Part& p : parts) bytes += part_bytes(p);
  return std::make_shared<RoutedStore>(
      ar.alloc(DType::f32, {static_cast<int64_t>((bytes + 3) / 4)}));
}

// Under expert parallelism the experts' rows are as many as the routing sent this rank: an op
// over them is recorded at the op list's shape (every routed row of a micro-batch, what a rank
// receives on average) as a compound, its collectives with it (kernels/op_log.h).
class AtListShape {
 public:
  AtListShape(const Ctx& ctx, bool routed, OpKey key) {
    if (routed) op_.emplace(ctx, std::move(key), /*routed=*/true);
  }

 private:
  std::optional<OpLog::Compound> op_;
};

}  // namespace

char* RoutedStore::reserve(size_t bytes) {
  if (bytes <= base_.nbytes()) return static_cast<char*>(base_.data);
  if (grown_.bytes() < bytes) grown_ = Buffer(bytes + bytes / 4, base_.device);
  return static_cast<char*>(grown_.data());
}

void MoeMlp::share_recomputed(MoeActs& dst, const MoeActs& rc) {
  dst.act = rc.act;
  dst.recomputed = rc.recomputed;
}

void MoeMlp::alloc_recomputed(Arena& ar, MoeActs& a) const {
  if (ep())
    a.recomputed = routed_store(ar, {{dtype_, routed_rows(), I_}});
  else
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
  if (ep())  // the projections' input and gateup of the rows this rank's experts receive
    a.kept = routed_store(ar, {{dtype_, R, H_}, {dtype_, R, 2 * I_}});
  else
    a.gateup = ar.alloc(dtype_, {R, 2 * I_});
}

void MoeMlp::alloc_split(Arena& ar, MoeActs& a, bool fresh_dgateup) const {
  const int64_t R = routed_rows();
  a.dlogits = ar.alloc(dtype_, {T_, E_});
  if (ep()) {  // dgateup apart from gateup always (the split backward's own)
    a.split = routed_store(ar, {{dtype_, R, H_}, {dtype_, R, 2 * I_}});
    return;
  }
  a.dys = ar.alloc(dtype_, {R, H_});
  a.dgateup = fresh_dgateup ? ar.alloc(dtype_, {R, 2 * I_}) : a.gateup;
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
  dots_ = ar.alloc(sdtype_, {R});
  dweights_ = ar.alloc(dtype_, {T_, k_});
  dlogits_ = ar.alloc(dtype_, {T_, E_});
  if (ep()) {
    ep_counts_ = ar.alloc(DType::i32, {ep_size_, E_});
    scratch_ = routed_store(
        ar,
        {{dtype_, R, H_}, {dtype_, R, I_}, {dtype_, R, 2 * I_}, {dtype_, R, H_}, {sdtype_, R, 0}});
  }
}

void MoeMlp::route(MoeActs& a) const {
  // The experts' row counts on the host: the grouped projections' shapes (a device sync on a
  // GPU, as every dropless dispatcher has).
  const int64_t n = ep() ? ep_size_ * E_ : E_;
  std::vector<int32_t> counts(static_cast<size_t>(n));
  if (ep()) ep_comm_->all_gather(ep_counts_, a.counts.view({1, E_}));
  copy_tensor(Tensor(counts.data(), DType::i32, Device::cpu, {n}), ep() ? ep_counts_ : a.counts);
  if (!ep()) {
    a.group_rows.assign(counts.begin(), counts.end());
    a.received = routed_rows();
    return;
  }
  a.ep_counts.assign(counts.begin(), counts.end());
  a.group_rows.assign(static_cast<size_t>(El_), 0);
  for (int s = 0; s < ep_size_; ++s)
    for (int64_t l = 0; l < El_; ++l)
      a.group_rows[static_cast<size_t>(l)] += a.ep_counts[static_cast<size_t>(s * E_ + e0_ + l)];
  a.received = 0;
  for (int64_t r : a.group_rows) a.received += r;
}

MoeMlp::Side MoeMlp::side(const MoeActs& a) const {
  if (!ep())
    return {.in = xs_,
            .gateup = a.gateup,
            .act = a.act,
            .out = ys_,
            .dys = a.dys,
            .dgateup = a.dgateup,
            .dact = dact_,
            .dgateup_scratch = dgateup_,
            .dxs = dxs_,
            .dots = dots_};
  // At least a row: ops refuse empty tensors, and a rank whose experts no token chose still runs
  // its (empty) groups, which zero their gradients under GradWrite::assign.
  const int64_t n = std::max<int64_t>(a.received, 1);
  const Device dev = ep_counts_.device;
  Side s;
  const std::vector<Tensor> kept = carve(*a.kept, dev, {{dtype_, n, H_}, {dtype_, n, 2 * I_}});
  s.in = kept[0];
  s.gateup = kept[1];
  s.act = carve(*a.recomputed, dev, {{dtype_, n, I_}})[0];
  if (a.split != nullptr) {
    const std::vector<Tensor> split = carve(*a.split, dev, {{dtype_, n, H_}, {dtype_, n, 2 * I_}});
    s.dys = split[0];
    s.dgateup = split[1];
  }
  const std::vector<Tensor> scratch = carve(
      *scratch_, dev,
      {{dtype_, n, H_}, {dtype_, n, I_}, {dtype_, n, 2 * I_}, {dtype_, n, H_}, {sdtype_, n, 0}});
  s.out = scratch[0];  // the forward's output rows, or the backward's dys
  s.dact = scratch[1];
  s.dgateup_scratch = scratch[2];
  s.dxs = scratch[3];
  s.dots = scratch[4];
  return s;
}

void MoeMlp::exchange(Ctx& ctx, const MoeActs& a, Tensor routed, Tensor experts, bool back) const {
  if (!ep()) return;
  const int me = ep_rank_, n = ep_size_;
  const auto count = [&](int s, int64_t e) { return a.ep_counts[static_cast<size_t>(s * E_ + e)]; };
  // This rank's routed rows of expert e start at mine[e] (expert-major); the rows its local
  // expert l received from rank s at theirs[l * n + s] (by local expert, then source rank).
  std::vector<int64_t> mine(static_cast<size_t>(E_) + 1, 0), theirs(El_ * n + 1, 0);
  for (int64_t e = 0; e < E_; ++e) mine[e + 1] = mine[e] + count(me, e);
  for (int64_t l = 0; l < El_; ++l)
    for (int s = 0; s < n; ++s) theirs[l * n + s + 1] = theirs[l * n + s] + count(s, e0_ + l);
  const AtListShape op(
      ctx, true, {collective_kernel("ep", CommOp::exchange, Lane::in_order), routed.numel(), 1});
  // To and from each other rank, expert by expert in the order both ends agree on; empty blocks
  // are not sent (both ends know the counts).
  std::vector<P2P> ops;
  const auto to_experts = back ? P2P::recv : P2P::send, from_peer = back ? P2P::send : P2P::recv;
  for (int j = 0; j < n; ++j) {
    for (int64_t l = 0; l < El_; ++l) {
      const int64_t e = j * El_ + l, rows = count(me, e);
      if (j == me || rows == 0) continue;
      ops.push_back({to_experts, routed.slice(mine[e], rows), j});
    }
    for (int64_t l = 0; l < El_; ++l) {
      const int64_t rows = count(j, e0_ + l);
      if (j == me || rows == 0) continue;
      ops.push_back({from_peer, experts.slice(theirs[l * n + j], rows), j});
    }
  }
  for (int64_t l = 0; l < El_; ++l) {  // this rank's own rows for its own experts
    const int64_t e = e0_ + l, rows = count(me, e);
    if (rows == 0) continue;
    const Tensor src = routed.slice(mine[e], rows), dst = experts.slice(theirs[l * n + me], rows);
    if (back)
      cast(ctx, src, dst);
    else
      cast(ctx, dst, src);
  }
  if (!ops.empty()) ep_comm_->exchange(ops);
}

void MoeMlp::forward_in(Ctx& ctx, MoeActs& a, const MoeWeights& w, Tensor in) const {
  linear_fwd(ctx, logits_, in, w.router, Tensor());
  moe_router_fwd(ctx, a.probs, a.experts, a.weights, a.stats.slice(0, 1).view({E_}),
                 a.stats.slice(1, 1).view({E_}), logits_, normalize_);
  moe_dispatch(ctx, a.counts, a.rows, a.experts, a.weights, capacity_);
  moe_permute(ctx, xs_, in, a.rows);
  route(a);
  const Side x = side(a);
  exchange(ctx, a, xs_, x.in, /*back=*/false);
  {
    const AtListShape op(ctx, ep(), {"grouped_linear_fwd", routed_rows(), 2 * I_, H_});
    grouped_linear_fwd(ctx, x.gateup, x.in, w.gateup, a.group_rows);
  }
  recompute(ctx, a);
}

void MoeMlp::forward_out(Ctx& ctx, const MoeActs& a, const MoeWeights& w, Tensor out) const {
  const Side x = side(a);
  {
    const AtListShape op(ctx, ep(), {"grouped_linear_fwd", routed_rows(), H_, I_});
    grouped_linear_fwd(ctx, x.out, x.act, w.down, a.group_rows);
  }
  exchange(ctx, a, ys_, x.out, /*back=*/true);
  moe_unpermute(ctx, out, ys_, a.weights, a.rows);
}

// Over every routed row, kept or not (with a capacity the dropped ones hold no one's values and
// no product reads them): the op's shape stays the op list's whatever the routing.
void MoeMlp::recompute(Ctx& ctx, const MoeActs& a) const {
  const Side x = side(a);
  const AtListShape op(ctx, ep(), {"swiglu_fwd", routed_rows(), I_});
  swiglu_fwd(ctx, x.act, x.gateup);
}

void MoeMlp::backward(Ctx& ctx, const MoeActs& a, const MoeWeights& w, const MoeWeights& g,
                      Tensor dy, Tensor in, Tensor aux_grad, const BlockBackward& how,
                      const MoeBackward& m) const {
  const bool whole = how.weights;  // else a B pass: the W pass's inputs kept in `a`
  const std::vector<Tensor> none;
  const Side x = side(a);
  const int64_t R = routed_rows();
  // The routed rows' gradient (dys_), at the experts (the same rows without expert parallelism).
  const Tensor dys = whole ? (ep() ? x.out : dys_) : x.dys,
               dgateup = whole ? x.dgateup_scratch : x.dgateup,
               dlogits = whole ? dlogits_ : a.dlogits;
  moe_unpermute_bwd(ctx, ep() ? dys_ : dys, Tensor(), dy, Tensor(), a.weights, a.rows);
  exchange(ctx, a, dys_, dys, /*back=*/false);
  {
    const AtListShape op(ctx, ep(), {"grouped_linear_bwd.din", R, I_, H_});
    grouped_linear_bwd(ctx, x.dact, none, dys, x.act, w.down, a.group_rows, how.write);
  }
  if (whole) {
    const AtListShape op(ctx, ep(), {"grouped_linear_bwd.dweight", H_, I_, R});
    grouped_linear_bwd(ctx, Tensor(), g.down, dys, x.act, w.down, a.group_rows, how.write);
  }
  {
    const AtListShape op(ctx, ep(), {"moe_row_dots", R, I_});
    moe_row_dots(ctx, x.dots, x.act, x.dact);
  }
  exchange(ctx, a, dots_.view({R, 1}), x.dots.view({x.dots.numel(), 1}), /*back=*/true);
  moe_choice_grads(ctx, dweights_, dots_, a.weights, a.rows);
  // Each TP rank's act and its gradient hold its intermediate shard: the choices' gradients are
  // partial sums.
  if (tp_size_ > 1) tp::sum(tp_, dweights_);
  {
    const AtListShape op(ctx, ep(), {"swiglu_bwd", R, I_});
    swiglu_bwd(ctx, dgateup, x.dact, x.gateup);
  }
  // The gate and up projections' input: the routed rows again (with expert parallelism, kept).
  if (!ep()) moe_permute(ctx, xs_, in, a.rows);
  {
    const AtListShape op(ctx, ep(), {"grouped_linear_bwd.din", R, H_, 2 * I_});
    grouped_linear_bwd(ctx, x.dxs, none, dgateup, x.in, w.gateup, a.group_rows, how.write);
  }
  if (whole) {
    const AtListShape op(ctx, ep(), {"grouped_linear_bwd.dweight", 2 * I_, H_, R});
    grouped_linear_bwd(ctx, Tensor(), g.gateup, dgateup, x.in, w.gateup, a.group_rows, how.write);
  }
  exchange(ctx, a, dxs_, x.dxs, /*back=*/true);
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
  const Side x = side(a);
  const int64_t R = routed_rows();
  {
    const AtListShape op(ctx, ep(), {"grouped_linear_bwd.dweight", H_, I_, R});
    grouped_linear_bwd(ctx, Tensor(), g.down, x.dys, x.act, w.down, a.group_rows, write);
  }
  if (!ep()) moe_permute(ctx, xs_, in, a.rows);
  {
    const AtListShape op(ctx, ep(), {"grouped_linear_bwd.dweight", 2 * I_, H_, R});
    grouped_linear_bwd(ctx, Tensor(), g.gateup, x.dgateup, x.in, w.gateup, a.group_rows, write);
  }
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
  if (ep()) {  // the routed rows to their experts' ranks (at the op list's shape: what is sent)
    ops.collective("experts: rows per expert gathered" + r.suffix, r.phase, layers, r.count, "ep",
                   CommOp::all_gather, Lane::in_order, ep_size_, E_, DType::i32);
    ops.set_routed(true);  // what a rank receives and runs: the routing's
    ops.collective("experts: tokens to their experts' ranks" + r.suffix, r.phase, layers, r.count,
                   "ep", CommOp::exchange, Lane::in_order, Rn * H_, 1, dtype_);
  }
  ops.grouped_fwd("experts: gate and up projections: forward" + r.suffix, r.phase, r.count, Rn,
                  2 * I_, H_);
  ops.pass("experts: swiglu: forward" + r.suffix, "swiglu_fwd", r.phase, layers, r.count, Rn, I_,
           3 * i * R);
  if (!out) return ops.set_routed(false);
  ops.grouped_fwd("experts: down projections: forward", r.phase, r.count, Rn, H_, I_);
  if (ep())
    ops.collective("experts: outputs back to their tokens' ranks", r.phase, layers, r.count, "ep",
                   CommOp::exchange, Lane::in_order, Rn * H_, 1, dtype_);
  ops.set_routed(false);
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
  ops.set_routed(ep());  // what a rank receives and runs: the routing's
  if (ep())
    ops.collective("experts: output gradients to their experts' ranks", bwd, layers, mb, "ep",
                   CommOp::exchange, Lane::in_order, Rn * H_, 1, dtype_);
  ops.grouped_bwd("experts: down projections", mb, split ? 0 : mb, Rn, H_, I_, El_);
  ops.add({.name = "experts: choices' weight gradients: row dots",
           .key = {"moe_row_dots", Rn, I_},
           .cls = OpClass::memory,
           .phase = bwd,
           .count = mb,
           .bytes = 2 * R * i * x + R * s});
  if (ep())
    ops.collective("experts: row dots back to their tokens' ranks", bwd, layers, mb, "ep",
                   CommOp::exchange, Lane::in_order, Rn, 1, sdtype_);
  ops.set_routed(false);
  ops.add({.name = "experts: choices' weight gradients",
           .key = {"moe_choice_grads", T_, k_},
           .cls = OpClass::memory,
           .phase = bwd,
           .count = mb,
           .bytes = R * s + t * k * (4 + 2 * x)});
  if (tp_size_ > 1)
    ops.collective("router: top-k weights' gradient summed", bwd, layers, mb, "tp",
                   CommOp::all_reduce, Lane::in_order, T_, k_, dtype_);
  ops.set_routed(ep());
  ops.pass("experts: swiglu: backward", "swiglu_bwd", bwd, layers, mb, Rn, I_, 5 * i * R);
  // The gate and up projections' input again (kept under expert parallelism).
  ops.pass("experts: tokens permuted (backward)", "moe_permute", bwd, layers,
           ep() ? 0 : mb * (split ? 2 : 1), Rn, H_, 2 * R * h);
  ops.grouped_bwd("experts: gate and up projections", mb, split ? 0 : mb, Rn, 2 * I_, H_, El_);
  if (ep())
    ops.collective("experts: input gradients back to their tokens' ranks", bwd, layers, mb, "ep",
                   CommOp::exchange, Lane::in_order, Rn * H_, 1, dtype_);
  ops.set_routed(false);
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
    ops.set_routed(ep());
    ops.grouped_bwd("experts: down projections (W)", 0, mb, Rn, H_, I_, El_);
    ops.grouped_bwd("experts: gate and up projections (W)", 0, mb, Rn, 2 * I_, H_, El_);
    ops.set_routed(false);
  }
}

}  // namespace tr
