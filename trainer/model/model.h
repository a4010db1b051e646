// The model room: the decoder model (here), its layers' blocks (attention_block.h, mlp_block.h),
// its op list (op_list.h), its parameter layout (model_layout.h) and buffer (param_buffer.h),
// initialisation (init.h) and the step's staged tokens (step_io.h). It uses the config room only.
//
// Decoder with explicit forward and backward over preallocated buffers (no autograd): the
// embedding, layers of an attention block and an MLP block each behind an RMSNorm on the
// residual stream, the final norm and the LM head with the loss, on a pipeline stage's chunks. Its
// weights and gradients are views into a ParamBuffer (trainer/model/param_buffer.h) at the offsets
// ParamLayout records; the optimizer's state is the optimizer's (trainer/optim/optim.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/ctx.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/dp_shards.h"
#include "parallel/topology.h"
#include "trainer/config/config.h"
#include "trainer/model/attention_block.h"
#include "trainer/model/mlp_block.h"
#include "trainer/model/model_layout.h"
#include "trainer/model/moe_block.h"
#include "trainer/model/param_buffer.h"

namespace tr {

// Views of one copy of the parameters (weights or gradients) as the model uses them.
struct LayerWeights {
  Tensor ln1;             // [H]
  AttentionWeights attn;  // the attention block's (trainer/model/attention_block.h)
  Tensor ln2;             // [H]
  MlpWeights mlp;         // a dense layer's MLP block's (trainer/model/mlp_block.h)
  MoeWeights moe;         // a sparse layer's (trainer/model/moe_block.h)
};
struct Weights {
  Tensor embed;  // [Vl, H] (first stage)
  std::vector<LayerWeights> layers;
  Tensor norm;     // [H] (last stage)
  Tensor lm_head;  // [Vl, H] (last stage); the embedding's memory when tied
};

// Loss chunks: the LM head and the cross-entropy run over chunks of this many tokens: the whole
// micro-batch when its logits fit kLossChunkBudgetBytes, else as many tokens as fit, but never
// fewer than kMinLossChunkTokens (so that the LM head's GEMMs stay compute-bound and its fp32
// weight gradient is read and written a few times per micro-batch, not dozens). The model and,
// through it, the planner ask here.
inline constexpr double kLossChunkBudgetBytes = 2.0 * (1 << 30);
inline constexpr int64_t kMinLossChunkTokens = 4096;
int64_t loss_chunk_tokens(int64_t tokens, int64_t vocab_local, DType logits_dtype);

// How a rank's model, its parameter buffer and its optimizer are built besides the shapes; a
// run's come from model_options() (trainer/layout/run_layout.h), so the trainer and the planner
// build the same ones.
struct ModelOptions {
  int64_t batch = 1, seq_len = 1;  // a micro-batch: samples of seq_len tokens
  // What the ops compute in (activations and the weights they read). Mixed precision: with
  // bf16 the master weights and the gradients are f32 and the ops read a bf16 compute copy of
  // the weights (the optimizer writes it in the same pass as the update); saved statistics
  // (rstd, lse, losses) are f32. With f32 or f64 the weights are their own masters, unless
  // `separate_compute_copy` asks for the bf16 layout anyway (to test that plumbing on the CPU).
  DType dtype = DType::f32;
  bool separate_compute_copy = false;
  int64_t loss_chunk = 0;     // tokens per loss chunk; 0 = loss_chunk_tokens()
  int64_t flat_multiple = 1;  // the flat buffers hold a multiple of this (ZeRO-1's alignment)
  // Activation slots, each holding one chunk's layers for one micro-batch: the pipeline
  // schedule's count of (chunk, micro-batch) pairs in flight at once.
  int slots = 1;
  // The backward runs as two passes (zero-bubble pipelines): backward_input, then later
  // backward_weight; each slot keeps the linears' output gradients in between.
  bool split_backward = false;
  // A whole backward reduces each column-parallel layer's input gradient over TP beside the
  // layer's weight-gradient GEMM (parallel.overlap_tp).
  bool overlap_tp = false;
  // Block-causal attention over packed documents (data.document_mask: block_causal): its ragged
  // graphs are prepared with the others.
  bool documents = false;
  // Allocate nothing: the arenas only measure (for the planner, which sizes a 72B rank on a
  // laptop); such a model answers activation_bytes() and loss_chunk() and nothing else.
  bool plan_only = false;
  // ZeRO-1 (Megatron's distributed optimizer): this rank's share of the flat buffer
  // (parallel/dp_shards.h; its capacity must be the layout's, so flat_multiple a multiple of
  // DpShards::capacity_multiple(dp)). With separate masters and more than one shard, the
  // optimizer keeps the fp32 masters of this rank's shard only (capacity / dp elements, in the
  // shard's order); the compute copy stays whole. Where the masters are the compute weights
  // they are whole.
  FlatShards shards = FlatShards();
  // The layers' projections in FP8 (train.precision: fp8), and the output gradients' format.
  GemmPrecision gemm = {};
};

// Tokens per loss chunk of a model of `dims` built with `options`: options.loss_chunk (at most a
// micro-batch's tokens), or loss_chunk_tokens() when that is 0.
int64_t loss_chunk_of(const ModelDims& dims, const ModelOptions& options);

// The parameter buffer a model of `dims` built with `options` computes with: its layout (padded to
// options.flat_multiple), weights in options.dtype. The trainer holds it in its Session beside the
// model and the optimizer; tests and the planner beside their model.
ParamBuffer make_param_buffer(const ModelDims& dims, const ModelOptions& options, Device device);

// A micro-batch's documents as the model reads them (data.document_mask, reset_position_ids):
// i32 [tokens_per_micro_batch()] each, or empty.
struct MicroBatchDocs {
  // Block-causal attention's document starts of the tokens, positions in their sequence, on the
  // device and the host (kernels/ops.h DocStarts).
  DocStarts doc_start;
  // RoPE's position of each token (restarting in each document); empty: its position in the
  // sequence (this rank's positions of it under context parallelism).
  Tensor positions;
};

// The model holds the math and its activations; it reads its weights from and writes its
// gradients into a ParamBuffer it does not own.
class DecoderModel {
 public:
  DecoderModel(const ModelDims& dims, const ModelOptions& options, ParamBuffer& params, Ctx ctx);
  ~DecoderModel();

  int64_t loss_chunk() const { return chunk_; }            // tokens per loss chunk
  int activation_slots() const { return options_.slots; }  // ModelOptions::slots
  // The tensor-parallel group (size dims.tp); needed before forward when tp > 1.
  void set_tp_comm(Comm* tp);
  // The context-parallel group (size dims.cp, ordered by cp_rank); needed when cp > 1.
  void set_cp_comm(Comm* cp);
  // The expert-parallel group (size dims.moe.ep, ordered by ep_rank); needed when ep > 1.
  void set_ep_comm(Comm* ep);
  // The one subscriber to what the model reports about the flat buffer as it runs (the
  // distributed optimizer), set once; null = none.
  void set_param_events(ParamEvents* events) { events_ = events; }
  // Records every op the model dispatches on `log` (kernels/op_log.h; null: stops recording):
  // its kernels, and the collectives it starts on the TP and CP groups (parallel/comm.h
  // logged_comm). Set after the groups.
  void set_op_log(OpLog* log);

  const ModelDims& dims() const { return dims_; }
  const ModelOptions& options() const { return options_; }
  Ctx ctx() const { return ctx_; }
  // Tokens of a micro-batch on this rank: batch x its seq_len / cp tokens of each sequence.
  int64_t tokens_per_micro_batch() const { return options_.batch * seq_len_; }
  ParamBuffer& params() const { return params_; }
  const ParamLayout& layout() const { return params_.layout(); }

  // Starts a step's gradients without a zeroing pass over them: each parameter gradient's first
  // write of the step (the LM head's first loss chunk, the first backward_stage) assigns, later
  // ones add; only what no op assigns (the embedding's scatter, unless the tied LM head on this
  // stage wrote it first) is zeroed. Without it, backward adds to what grads() holds.
  // TR_GRAD_ZERO=1 zeroes the whole buffer and adds (to bisect on a GPU). It also says the
  // weights changed (weights_changed).
  void begin_step_grads();
  // The weights changed since the last forward (an optimizer step before an evaluation): with
  // FP8 projections each weight is cast again at its next product, the casts otherwise reused
  // for the whole step (trainer/model/layer_gemm.h).
  void weights_changed() { gemm_.new_weights(); }

  // Pipeline stages, one micro-batch at a time in activation slot `slot`, one chunk of this
  // rank's layers (ModelDims::chunks; 0 when it holds one) at a time; `tokens` and `targets`
  // are i32 [tokens_per_micro_batch()] where the ops read them (trainer/model/step_io.h; under
  // context parallelism this rank's positions of each sequence, parallel/context_parallel.h):
  // forward_stage embeds `tokens` on the first stage's chunk 0, else starts from
  // stage_input(slot, chunk) (the previous virtual stage's output); stage_loss (the last chunk
  // of the last stage) adds the LM head and the loss (its sum added to `loss_sum`, f64 [1] on
  // the device: no host sync), and with `grad` the head's backward; backward_stage starts from
  // the loss on the last chunk of the last stage, else from recv_grad_buffer() (the next virtual
  // stage's input gradient), and leaves the chunk's input gradient in send_grad_buffer() (or in
  // the embedding's gradient on the first stage's chunk 0). `last_of_step`: the step's last
  // backward of the chunk, after which each of its layers' gradients are final; the model
  // reports each layer to the subscriber as it finishes it (under sequence parallelism having
  // summed its norms' gradients over TP first).
  // `docs`: the micro-batch's documents (MicroBatchDocs), kept with the slot for its backward.
  void forward_stage(int slot, Tensor tokens, int chunk = 0, MicroBatchDocs docs = {});
  // `moe_sums` (f64 [2] on the device, or empty): with `grad`, a mixture of experts' load-balancing
  // loss (its share of loss_sum) and the micro-batch's expert imbalance (the most-routed expert's
  // tokens over the mean, pooled over the sparse layers) are added to it.
  void stage_loss(int slot, Tensor targets, float grad_scale, bool grad, Tensor loss_sum,
                  Tensor moe_sums = {});
  void backward_stage(int slot, Tensor tokens, bool last_of_step, int chunk = 0);
  // With ModelOptions::split_backward, backward_stage in two passes: backward_input (B: the
  // input gradient, sent upstream, and the norms' and embedding's gradients) and, any time
  // before the slot's next forward, backward_weight (W: the matrices' and biases' gradients;
  // activation recomputation runs again for it). The same values as backward_stage.
  void backward_input(int slot, Tensor tokens, int chunk = 0);
  void backward_weight(int slot, bool last_of_step, int chunk = 0);
  Tensor stage_input(int slot, int chunk = 0) const;   // [T, H]
  Tensor stage_output(int slot, int chunk = 0) const;  // [T, H]
  Tensor recv_grad_buffer() const;                     // [T, H]
  Tensor send_grad_buffer() const;                     // [T, H]
  // What a pipeline message carries besides the activation or its gradient, sent and received
  // with it (empty when nothing): a mixture-of-experts model with a load-balancing loss passes
  // its micro-batch's router statistics so far downstream (stage_side_input/output, [2, E]: each
  // expert's probability sums and routed tokens over the layers up to here) and the loss's
  // gradient per expert upstream (recv/send_side_grad_buffer, [E]); statistics' dtype.
  Tensor stage_side_input(int slot, int chunk = 0) const;
  Tensor stage_side_output(int slot, int chunk = 0) const;
  Tensor recv_side_grad_buffer() const;
  Tensor send_side_grad_buffer() const;
  // After the last backward of a step: with sequence parallelism, sums the gradients of the
  // replicated tensors (the norms, which each saw only this rank's tokens) over TP, those the
  // step's last backward has not summed already (it sums each layer's as it finishes it).
  void sync_replicated_grads();

  // Logits of the last forward's final hidden states for tokens [begin, begin + n): [n, vocab]
  // (padding dropped). For tests and debugging; runs the LM head again.
  std::vector<float> logits(int64_t begin, int64_t n);
  // Bytes of the activation and scratch buffers, by the arena's own accounting (alignment
  // included); a plan-only model measures them without allocating.
  size_t activation_bytes() const { return activation_bytes_; }
  // Bytes of workspace the attention backend holds for this model's shape (cuDNN), 0 on CPU.
  size_t attention_workspace_bytes() const { return attention_.workspace_bytes; }
  // Whether attention's backward is deterministic (cuDNN may have built only the other mode).
  bool attention_bwd_deterministic() const { return attention_.deterministic_bwd; }
  // The column-parallel input-gradient reductions that ran beside their weight gradients since
  // the last call (parallel.overlap_tp; TR_TRACE_TP), and resets the count.
  int64_t take_tp_overlapped() { return std::exchange(tp_overlapped_, 0); }

 private:
  struct Acts;
  Weights views(Tensor flat) const;
  void alloc_acts(Arena& arena);     // every activation and scratch buffer, in one fixed order
  void alloc_scratch(Arena& arena);  // of them the buffers every micro-batch shares
  Comm* tp_group() const;            // the TP group (asserted set when tp > 1)
  Comm* cp_group() const;            // the CP group (asserted set when cp > 1)
  // The load-balancing loss of the micro-batch in `slot` and its gradient (stage_loss).
  void moe_aux_loss(int slot, float grad_scale, Tensor loss_sum, Tensor moe_sums);
  void tp_sum(Tensor t);               // all-reduce over the TP group (no-op when tp == 1)
  Tensor full_or(Tensor local) const;  // the [T, H] buffer for a [Tl, H] one
  void reduce_to_local(Tensor partial, Tensor local);  // end of a TP region
  Tensor gather_tokens(Tensor local, Tensor full);     // start of a TP region
  // Layer l of micro-batch slot `slot` from its normed input (ln1, all-gathered) to its MLP
  // block's input side (forward_in; the down projection and the residual add are the caller's).
  void layer_fwd(int slot, int64_t l);
  // What attention reads of the micro-batch in `slot` besides its activations: RoPE's positions
  // (its own, MicroBatchDocs::positions, else this rank's of the sequence) and its documents.
  AttentionInput attention_input(int slot) const;
  // Before layer l's backward: its activations that recomputation dropped, again.
  void recompute_layer(int slot, int64_t l);
  void chunk_loss(Tensor losses, Tensor logits, Tensor targets, float grad_scale, bool grad);
  // A chunk's backward: whole (`weights`), or its B pass.
  void backward_pass(int slot, Tensor tokens, int chunk, bool weights, bool last_of_step);
  void layer_final(int64_t l);              // layer l's gradients are final for the step
  Tensor resid(int slot, int64_t l) const;  // the residual stream entering local layer l
  bool holds_head(int chunk) const;         // the final norm and the LM head follow `chunk`

  ModelDims dims_;
  ModelOptions options_;
  int64_t seq_len_;                 // tokens of each sequence on this rank (options_.seq_len / cp)
  int64_t chunk_ = 0;               // tokens per loss chunk (C)
  int64_t tp_overlapped_ = 0;       // input-gradient reductions run beside dW, since last asked
  std::vector<int64_t> layer_pos_;  // each local layer's place in its chunk (and in a slot)
  Comm* tp_ = nullptr;
  Comm* cp_ = nullptr;
  Comm* ep_ = nullptr;
  // With an op log: the TP, CP and EP groups noting what the model starts on them.
  std::unique_ptr<Comm> tp_logged_, cp_logged_, ep_logged_;
  ParamEvents* events_ = nullptr;
  void need(const Tensor& w);  // events_->weights_needed over the flat range of w (a view of w_)
  // Per layer: its flat [begin, end) in the dense region, and its experts' in the expert
  // region (empty for a dense layer).
  struct LayerRanges {
    std::pair<int64_t, int64_t> dense, experts;
  };
  std::vector<LayerRanges> layer_ranges_;
  bool layer_norms_summed_ = false;  // this step's layer norm gradients are summed over TP
  // How the next writes of the LM head's and of the other gradients go (begin_step_grads).
  GradWrite head_write_ = GradWrite::add;
  std::vector<GradWrite> body_write_;    // per chunk: backward_stage's, or B's (the norms)
  std::vector<GradWrite> weight_write_;  // per chunk: W's
  Ctx ctx_;
  DType dtype_;   // compute: activations and the weights the ops read
  DType sdtype_;  // saved statistics and losses (f32, f64 for f64 compute)
  ParamBuffer& params_;
  std::unique_ptr<Arena> act_arena_;
  size_t activation_bytes_ = 0;
  AttentionPlan attention_;
  LayerGemm gemm_;       // how the layers' projections multiply (before the blocks using it)
  AttentionBlock attn_;  // every layer's attention block
  DenseMlp mlp_;         // every dense layer's MLP block
  MoeMlp moe_;           // every sparse layer's (model.num_experts > 0)
  bool sparse(int64_t l) const { return dims_.sparse(global_[l]); }  // local layer l
  std::vector<int64_t> global_;  // each local layer's index in the whole model
  // The load-balancing loss of mixture-of-experts layers: its weight is not zero.
  bool aux_loss() const { return dims_.moe.aux_loss(); }
  Weights w_, g_;
  std::unique_ptr<Acts> a_;
};

}  // namespace tr
