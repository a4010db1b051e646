// A layer's MLP block: what the model needs of an MLP, and the dense SwiGLU one every family has
// today (gate and up projection, silu(gate) * up, down projection). The model hands the block its
// normed input with the whole sequence (after the TP region's gather) and reduces the block's
// output, its partial sums over the TP ranks' intermediate shards; the norm, the residual stream
// and the TP regions are the model's. A new kind of MLP (a mixture of experts) is a new block
// beside this one.
#pragma once

#include <functional>

#include "core/ctx.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "trainer/model/layer_gemm.h"
#include "trainer/model/model_layout.h"
#include "trainer/model/op_lister.h"

namespace tr {

// The block's weights (or their gradients) of one layer.
struct MlpWeights {
  Tensor gateup_w;  // [2I, H]: gate_proj rows then up_proj rows (column-parallel)
  Tensor down_w;    // [H, I] (row-parallel)
};

// The block's activations of one layer and micro-batch (T tokens: the whole sequence here).
struct MlpActs {
  Tensor gateup;  // [T, 2I]
  Tensor act;     // [T, I] silu(gate) * up; selective recomputation remakes it in backward
  // Split backward: the projections' output gradients from the B pass to the W pass ([T, H],
  // [T, 2I]; the latter in gateup's memory where W does not read gateup again).
  Tensor dy_down, dgateup;
};

// How the model runs a backward through a block: `keep(dy, store)` is dy itself in a whole
// backward, or its copy in `store` (kept for the W pass) in a B pass; `column(dout, in, weight,
// dweight, dbias)` is a column-parallel projection's backward, its input gradient left in the
// model's input-gradient buffer and reduced over TP (beside the weight gradient under
// parallel.overlap_tp).
struct BlockBackward {
  GradWrite write;
  bool weights;  // the weight gradients in this pass (whole), or not (B)
  std::function<Tensor(Tensor dy, Tensor store)> keep;
  std::function<void(Tensor dout, Tensor in, Tensor weight, Tensor dweight, Tensor dbias)> column;
};

class DenseMlp {
 public:
  // `tokens`: T of a micro-batch on this rank; activations in `dtype`.
  // Its projections multiply through `gemm` (the model's; it must outlive the block).
  DenseMlp(const ModelDims& dims, DType dtype, int64_t tokens, const LayerGemm& gemm);

  // The layer's weights at `prefix` ("layers/3/") of a flat buffer, by name.
  MlpWeights views(const std::function<Tensor(const std::string& name,
                                              std::initializer_list<int64_t> shape)>& at,
                   const std::string& prefix) const;
  // Its activations: those selective recomputation drops (act), those every mode but full
  // recomputation keeps per micro-batch (gateup), and the split backward's (`fresh_dgateup`:
  // dgateup its own buffer, else gateup's memory).
  void alloc_recomputed(Arena& arena, MlpActs& acts) const;
  void alloc_kept(Arena& arena, MlpActs& acts) const;
  void alloc_split(Arena& arena, MlpActs& acts, bool fresh_dgateup) const;
  // The scratch shared by every layer and micro-batch: act's and gateup's gradients.
  void alloc_scratch(Arena& arena);

  // Forward from the normed input `in` [T, H] to act (what full recomputation runs again), then
  // the down projection's partial sums into `out` [T, H].
  void forward_in(Ctx& ctx, const MlpActs& acts, const MlpWeights& w, Tensor in) const;
  void forward_out(Ctx& ctx, const MlpActs& acts, const MlpWeights& w, Tensor out) const;
  // Selective recomputation: act again from gateup.
  void recompute(Ctx& ctx, const MlpActs& acts) const;
  // Backward from the output gradient `dy` [T, H] (the whole sequence) to the input's, through
  // `how.column` (the gate and up projection's); `g` the gradients the pass writes.
  void backward(Ctx& ctx, const MlpActs& acts, const MlpWeights& w, const MlpWeights& g, Tensor dy,
                Tensor in, const BlockBackward& how) const;
  // The W pass of a split backward: the weight gradients from the kept output gradients.
  void weight_grads(Ctx& ctx, const MlpActs& acts, const MlpWeights& w, const MlpWeights& g,
                    Tensor in, GradWrite write) const;

  // The ops of the above as the model's op list has them (trainer/model/op_list.h): the forward
  // run `r` (with the down projection unless recomputing); the backward with `din` passes
  // computing the input gradient, `dweight` the weight gradients and `kept` keeping the output
  // gradients for a W pass.
  void forward_ops(OpLister& ops, const Run& r, bool down = true) const;
  void backward_ops(OpLister& ops, double din, double dweight, double kept) const;
  // Its projections' weights' FP8 codes in `gemm` (LayerGemm::alloc_weight_codes; `w` null for
  // a plan-only model).
  void alloc_weight_codes(Arena& arena, LayerGemm& gemm, const MlpWeights* w) const;
  // Once a step: the projections' weights cast to FP8 (with FP8 projections).
  void final_ops(OpLister& ops) const;

 private:
  int64_t T_, H_, I_;
  DType dtype_;
  const LayerGemm* gemm_;
  Tensor dgateup_, dact_;  // scratch: [T, 2I], [T, I]
};

}  // namespace tr
