// A sparse layer's MLP block: a mixture of experts (Qwen3-MoE's). The router, a linear layer
// [E, H] whole on every TP rank, turns each token's normed input into expert probabilities
// (softmax), chooses the k most probable experts and weighs them (renormalised to sum to 1 when
// the family says so); the token's rows go to their experts in expert-major order, each expert
// (a SwiGLU MLP of moe_intermediate_size, its intermediate split over TP like the dense one's)
// runs over its rows as one grouped projection, and the weighted rows come back to their tokens.
// Dropless by default; with a capacity factor an expert keeps its highest-weight tokens
// (kernels/ops.h moe_dispatch). The model hands the block the whole sequence and reduces its
// output over TP, as for the dense block; the router's input gradient, whole on every TP rank,
// joins the sum on TP rank 0 only.
//
// The load-balancing loss (Hugging Face's load_balancing_loss_func, pooled over the model's
// sparse layers and a micro-batch's tokens) needs every sparse layer's statistics: the block
// leaves its layer's (each expert's probability sum and routed tokens) in its activations, the
// model pools them and hands each backward the loss's gradient per expert.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/ctx.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "trainer/model/layer_gemm.h"
#include "trainer/model/mlp_block.h"
#include "trainer/model/model_layout.h"
#include "trainer/model/op_lister.h"

namespace tr {

// A sparse layer's weights (or their gradients).
struct MoeWeights {
  Tensor router;               // [E, H]
  std::vector<Tensor> gateup;  // per expert [2 Ie, H]: gate_proj rows then up_proj rows
  std::vector<Tensor> down;    // per expert [H, Ie]
};

// Memory for tensors whose rows the routing decides (under expert parallelism, the rows this
// rank's experts receive): carved from the activation arena for a balanced routing (R rows), and
// grown, in a buffer of its own kept for later micro-batches, when one needs more.
class RoutedStore {
 public:
  explicit RoutedStore(Tensor base) : base_(base) {}
  // At least `bytes` bytes (what it held is lost when it grows).
  char* reserve(size_t bytes);

 private:
  Tensor base_;
  Buffer grown_;
};

// A sparse layer's activations of one micro-batch (T tokens, R = T k routed rows).
struct MoeActs {
  Tensor probs;    // [T, E] router probabilities (statistics' dtype)
  Tensor experts;  // i32 [T, k]
  Tensor weights;  // [T, k]
  Tensor rows;     // i32 [T, k] each choice's routed row (-1: dropped)
  Tensor counts;   // i32 [E] rows each expert kept
  Tensor stats;    // [2, E] (statistics' dtype): each expert's probability sum, routed tokens
  // The grouped projections' groups on the host: the rows of each of this rank's experts.
  std::vector<int64_t> group_rows;
  // The experts' side (without expert parallelism, the R routed rows of the tensors below; with
  // it, the rows this rank's experts received from every ep rank, in the stores):
  Tensor gateup;  // [R, 2 Ie]
  Tensor act;     // [R, Ie] silu(gate) * up; selective recomputation remakes it
  // Split backward: what the B pass leaves for the W pass.
  Tensor dys, dgateup;  // [R, H], [R, 2 Ie]
  Tensor dlogits;       // [T, E]
  // The rows of the experts' side (R without expert parallelism). Expert parallelism: the rows
  // every ep rank routed to every expert ([ep x E], all-gathered), and the stores of the
  // experts' side: the
  // projections' input and gateup; act (shared where recomputation shares act); dys and
  // dgateup of a split backward.
  int64_t received = 0;
  std::vector<int64_t> ep_counts;
  std::shared_ptr<RoutedStore> kept, recomputed, split;
};

// How the model runs the block's backward beyond BlockBackward: the buffer the block's input
// gradient goes to (the whole sequence's partial sums) and its reduction over TP.
struct MoeBackward {
  std::function<Tensor()> din;
  std::function<void()> reduce_din;
};

class MoeMlp {
 public:
  // `tokens`: T of a micro-batch on this rank; activations in `dtype`.
  MoeMlp(const ModelDims& dims, DType dtype, int64_t tokens);

  // The TP group (size dims.tp; needed when tp > 1): the top-k weights' gradients, partial sums
  // of the experts' TP shards, are summed over it.
  void set_tp_comm(Comm* tp) { tp_ = tp; }
  // The expert-parallel group (size dims.moe.ep; needed when ep > 1): the routed rows go to their
  // experts' ranks and back over it.
  void set_ep_comm(Comm* ep) { ep_comm_ = ep; }
  // `dst` (a layer's activations) shares what selective recomputation remakes with `rc`.
  static void share_recomputed(MoeActs& dst, const MoeActs& rc);

  // Routed rows of a micro-batch: T k.
  int64_t routed_rows() const { return T_ * k_; }

  MoeWeights views(const std::function<Tensor(const std::string& name,
                                              std::initializer_list<int64_t> shape)>& at,
                   const std::string& prefix) const;
  void alloc_recomputed(Arena& arena, MoeActs& acts) const;  // act
  void alloc_kept(Arena& arena, MoeActs& acts) const;        // the rest of the forward's
  void alloc_split(Arena& arena, MoeActs& acts, bool fresh_dgateup) const;
  void alloc_scratch(Arena& arena);

  // Forward from the normed input `in` [T, H] to act (what full recomputation runs again: the
  // router, the dispatch, the experts' gate and up projections), then the down projections and
  // the weighted return into `out` [T, H] (partial sums over TP). The experts' outputs are not
  // kept: the backward takes each choice's weight gradient from act and its gradient
  // (kernels/ops.h moe_choice_grads).
  void forward_in(Ctx& ctx, MoeActs& acts, const MoeWeights& w, Tensor in) const;
  void forward_out(Ctx& ctx, const MoeActs& acts, const MoeWeights& w, Tensor out) const;
  void recompute(Ctx& ctx, const MoeActs& acts) const;
  // Backward from `dy` [T, H] to the input's gradient (into m.din(), reduced by m.reduce_din());
  // `aux_grad` [E] (statistics' dtype, or empty) the load-balancing loss's gradient with
  // respect to each token's probability of each expert.
  void backward(Ctx& ctx, const MoeActs& acts, const MoeWeights& w, const MoeWeights& g, Tensor dy,
                Tensor in, Tensor aux_grad, const BlockBackward& how, const MoeBackward& m) const;
  void weight_grads(Ctx& ctx, const MoeActs& acts, const MoeWeights& w, const MoeWeights& g,
                    Tensor in, GradWrite write) const;

  // The ops of the above as the model's op list has them (trainer/model/op_list.h): the forward
  // run `r` (with the down projections and the return unless recomputing: `out`); the backward
  // of `mb` micro-batches, whole or (`split`) as a B pass and a W pass.
  void forward_ops(OpLister& ops, const Run& r, bool out = true) const;
  void backward_ops(OpLister& ops, double mb, bool split) const;

 private:
  // The experts' side of a micro-batch: the projections' input and output rows and their
  // gradients (without expert parallelism the routed rows themselves).
  struct Side {
    Tensor in, gateup, act, out;  // [rows, H], [rows, 2 Ie], [rows, Ie], [rows, H]
    Tensor dys, dgateup;          // the split backward's (else the scratch's)
    Tensor dact, dgateup_scratch, dxs, dots;
  };
  // The routing on the host: the grouped projections' groups, and under expert parallelism the
  // rows every ep rank sends every expert (an all-gather over ep) and those this rank receives.
  void route(MoeActs& a) const;
  Side side(const MoeActs& a) const;
  // Under expert parallelism: `from` [R, w] (the routed rows, expert-major) to the experts' ranks
  // into `to` [received, w] (this rank's experts' rows, expert-major then by source rank), or
  // with `back` the reverse; one grouped exchange over ep (this rank's own rows copied).
  void exchange(Ctx& ctx, const MoeActs& a, Tensor routed, Tensor experts, bool back) const;
  bool ep() const { return ep_size_ > 1; }
  int64_t T_, H_, E_;
  int64_t El_, e0_;  // this rank's experts: [e0_, e0_ + El_) (all of them without EP)
  int64_t k_, I_;
  bool normalize_;
  int64_t capacity_ = 0;  // tokens an expert keeps with a capacity factor (0: dropless)
  int tp_size_, tp_rank_;
  int ep_size_, ep_rank_;
  DType dtype_, sdtype_;
  Comm* tp_ = nullptr;
  Comm* ep_comm_ = nullptr;
  Tensor ep_counts_;                      // i32 [ep, E]: the all-gathered counts
  std::shared_ptr<RoutedStore> scratch_;  // the experts' side's scratch (expert parallelism)
  // scratch: router logits [T, E], routed inputs and their gradient [R, H], the experts'
  // outputs [R, H], act's and gateup's gradients, the experts' outputs' gradient, the top-k
  // weights' gradient, the logits'.
  Tensor logits_, xs_, dxs_, ys_, dact_, dgateup_, dys_, dots_, dweights_, dlogits_;
};

}  // namespace tr
