// Qwen2 decoder with explicit forward and backward over preallocated buffers (no autograd).
// Parameters, gradients and Adam states are flat buffers; every tensor is a view into them at
// an offset recorded in ParamLayout, so DP buckets, ZeRO ranges and checkpoint I/O see one
// contiguous range each.
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
#include "trainer/config.h"

namespace tr {

// Shapes of the model as one rank holds it: heads, intermediate size and vocabulary are this
// rank's tensor-parallel shard.
struct ModelDims {
  int64_t hidden, inter, layers, heads, kv_heads, head_dim;
  int64_t total_layers;  // of the whole model (for the output-projection init scale)
  int64_t vocab;         // real vocabulary
  int64_t vocab_padded;  // whole padded vocabulary: a multiple of 128 * tp
  int64_t vocab_local;   // vocab_padded / tp rows of the embedding and LM head on this rank
  int64_t vocab_offset;  // first vocabulary id of this rank's rows
  int tp = 1, tp_rank = 0;
  // Sequence parallelism (tp > 1): outside the TP regions (norms, residual stream) each TP rank
  // holds T / tp tokens; all-gather before the column-parallel layers, reduce-scatter after
  // the row-parallel ones.
  bool sequence_parallel = false;
  // Pipeline stage: layers [first_layer, first_layer + layers) of the model. The first stage
  // holds the input embedding, the last the final norm and the LM head (with tied embeddings
  // and pp > 1, its own copy of embed_tokens, kept equal by an all-reduce of the gradients).
  int64_t first_layer = 0;
  bool first_stage = true, last_stage = true;
  float eps, theta;
  bool tied;
  // Activation recomputation (train.recompute): the first `recompute_full` layers of this stage
  // keep only their input and run their forward again in backward; with `recompute_selective`
  // every layer drops its norm outputs and SwiGLU output and recomputes them in backward.
  // Gradients are the same bits either way.
  int64_t recompute_full = 0;
  bool recompute_selective = false;
  int64_t qkv_out() const { return (heads + 2 * kv_heads) * head_dim; }
  // Real (unpadded) vocabulary rows among this rank's vocab_local.
  int64_t vocab_valid_local() const {
    return std::clamp<int64_t>(vocab - vocab_offset, 0, vocab_local);
  }

  // `stage_layers`: layers of each pipeline stage (empty = num_layers / pp each).
  static ModelDims from(const ModelConfig& m, const Topology& topo, bool sequence_parallel = false,
                        const std::vector<int64_t>& stage_layers = {});
  // Everything the run's config says about this rank's model: the above, and recomputation.
  static ModelDims from(const Config& c, const Topology& topo);
};

// One parameter tensor: where it lives in the flat buffers and how it is checkpointed.
struct ParamInfo {
  std::string name;                   // "layers/0/self_attn/q_proj/weight" (HF name, '/'-separated)
  std::vector<int64_t> shape;         // as stored on this rank (vocab padded)
  std::vector<int64_t> global_shape;  // in checkpoints: real vocab, all TP shards
  int64_t offset = 0;                 // elements into the flat buffers
  int64_t numel = 0;
  bool decay = true;  // AdamW weight decay (false for norms and biases)
  // Tensor parallelism: -1 = replicated on every TP rank; 0 = rows split (column-parallel
  // layers, vocabulary); 1 = columns split (row-parallel layers). This rank's slice starts at
  // index `split_offset` of that dimension of the (vocab-padded) global tensor.
  int split_dim = -1;
  int64_t split_offset = 0;
  bool tied_copy = false;  // the last stage's copy of the tied embedding (pp > 1): not saved,
                           // not counted twice in the gradient norm
};

struct ParamLayout {
  std::vector<ParamInfo> tensors;
  int64_t total = 0;     // elements
  int64_t capacity = 0;  // total rounded up to `multiple` (ZeRO-1 shards); the tail stays zero
  static ParamLayout make(const ModelDims& d, int64_t multiple = 1);
  const ParamInfo& find(const std::string& name) const;
};

// Views of one copy of the parameters (weights or gradients) as the model uses them.
struct LayerWeights {
  Tensor ln1;       // [H]
  Tensor qkv_w;     // [(nh + 2 nkv) hd, H]: q_proj, k_proj, v_proj rows back to back
  Tensor qkv_b;     // [(nh + 2 nkv) hd]
  Tensor o_w;       // [H, nh hd]
  Tensor ln2;       // [H]
  Tensor gateup_w;  // [2I, H]: gate_proj rows then up_proj rows
  Tensor down_w;    // [H, I]
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

// How a rank's model is built besides its shapes; a run's come from model_options()
// (trainer/facts.h), so the trainer and the planner build the same model.
struct ModelOptions {
  int64_t batch = 1, seq_len = 1;  // a micro-batch: samples of seq_len tokens
  // What the ops compute in (activations and the weights they read). Mixed precision: with
  // bf16 the master weights and the gradients are f32 and the ops read a bf16 compute copy of
  // the weights (the optimizer writes it in the same pass as the update); saved statistics
  // (rstd, lse, losses) are f32. With f32 or f64 the weights are their own compute copy, unless
  // `separate_compute_copy` asks for the bf16 layout anyway (to test that plumbing on the CPU).
  DType dtype = DType::f32;
  bool separate_compute_copy = false;
  int64_t loss_chunk = 0;     // tokens per loss chunk; 0 = loss_chunk_tokens()
  int64_t flat_multiple = 1;  // the flat buffers hold a multiple of this (ZeRO-1's alignment)
  int slots = 1;  // micro-batches in flight at once (pipeline stages keep their activations)
  // Allocate nothing: the arenas only measure (for the planner, which sizes a 72B rank on a
  // laptop); such a model answers memory() and nothing else.
  bool plan_only = false;
  // ZeRO-1 (Megatron's distributed optimizer): this rank's share of the flat buffer
  // (parallel/dp_shards.h; its capacity must be the layout's, so flat_multiple a multiple of
  // DpShards::capacity_multiple(dp)). With a separate compute copy and more than one shard, this
  // rank keeps the fp32 masters of its shard only (capacity / dp elements, in the shard's
  // order); the compute copy stays whole. Where the masters are the compute copy they are whole.
  DpShards shards = DpShards();
};

// What a model reports about its flat buffer as it runs, to one subscriber (the distributed
// optimizer: ZeRO-1's weight all-gather and the data-parallel gradient buckets).
class ParamEvents {
 public:
  // The forward is about to read the weights in [begin, end) of the flat buffer.
  virtual void weights_needed(int64_t begin, int64_t end) = 0;
  // The step's last backward has finished the gradients in [begin, end) (each range once).
  virtual void grads_final(int64_t begin, int64_t end) = 0;

 protected:
  ~ParamEvents() = default;
};

class Qwen2Model {
 public:
  Qwen2Model(const ModelDims& dims, const ModelOptions& options, Ctx ctx);

  // Bytes of this rank's model buffers, by the arenas' own accounting (alignment included).
  struct Memory {
    size_t weights = 0, compute_copy = 0, grads = 0, activations = 0;
  };
  Memory memory() const { return memory_; }
  int64_t loss_chunk() const { return chunk_; }  // tokens per loss chunk
  // The tensor-parallel group (size dims.tp); needed before forward when tp > 1.
  void set_tp_comm(Comm* tp) { tp_ = tp; }
  // The one subscriber to what the model reports about the flat buffer as it runs (the
  // distributed optimizer), set once; null = none.
  void set_param_events(ParamEvents* events) { events_ = events; }
  ~Qwen2Model();

  const ModelDims& dims() const { return dims_; }
  Ctx ctx() const { return ctx_; }
  int64_t tokens_per_micro_batch() const { return batch_ * seq_len_; }
  const ParamLayout& layout() const { return layout_; }
  // The fp32 masters this rank keeps: [capacity], or its ZeRO-1 shard of it (shards()' order).
  Tensor masters() const { return params_; }
  // ZeRO-1's shards of the flat buffer (one rank's whole buffer without ZeRO-1).
  const DpShards& shards() const { return shards_; }
  bool masters_sharded() const { return params_.numel() < layout_.capacity; }
  // The whole masters (not sharded): [P] flat.
  Tensor params() const;
  Tensor grads() const { return grads_.slice(0, layout_.total); }  // [P] flat
  Tensor params_padded() const;                    // [capacity]: params() and a zero tail
  Tensor grads_padded() const { return grads_; }   // [capacity]
  Tensor param(const ParamInfo& p) const;          // view of p in params() (whole masters)
  Tensor compute_param(const ParamInfo& p) const;  // view of p in the compute copy
  Tensor grad(const ParamInfo& p) const;           // view of p in grads()
  // The weights the ops read: [capacity] in the compute dtype; empty when the masters are
  // their own compute copy.
  Tensor compute_copy() const { return compute_is_master() ? Tensor() : compute_; }
  bool compute_is_master() const { return compute_.data == params_.data; }
  // Rewrites the compute copy from whole masters (after they change other than through AdamW:
  // a broadcast). All of it, or only tensor `p`.
  void refresh_compute_copy(const ParamInfo* p = nullptr);
  // The whole masters on the host (a copy when they live on a device).
  std::vector<float> params_to_host() const;
  // Sets the weights from all of this rank's values on the host ([P] f32: initialisation, a
  // checkpoint or Hugging Face load): the masters it keeps and the whole compute copy.
  void params_from_host(const std::vector<float>& host);

  // Normal(0, std) matrices and embedding (output projections std / sqrt(2 L)), zero biases,
  // unit norms; each value a pure function of (seed, tensor name, element index).
  void init_weights(uint64_t seed, double std);

  // Starts a step's gradients without a zeroing pass over them: each parameter gradient's first
  // write of the step (the LM head's first loss chunk, the first backward_stage) assigns, later
  // ones add; only what no op assigns (the embedding's scatter, unless the tied LM head on this
  // stage wrote it first) is zeroed. Without it, backward adds to what grads() holds.
  // TR_GRAD_ZERO=1 zeroes the whole buffer and adds (to bisect on a GPU).
  void begin_step_grads();

  // Pipeline stages, one micro-batch at a time in activation slot `slot`; `tokens` and `targets`
  // are i32 [batch * seq_len] where the ops read them (trainer/step_io.h):
  // forward_stage embeds `tokens` on the first stage, else starts from stage_input(slot) (the
  // previous stage's output); stage_loss (last stage) adds the LM head and the loss (its sum
  // added to `loss_sum`, f64 [1] on the device: no host sync), and with `grad` the head's
  // backward; backward_stage starts from the loss on the last stage, else from recv_grad_buffer()
  // (the next stage's input gradient), and leaves this stage's input gradient in
  // send_grad_buffer() (or in the embedding's gradient on the first stage). `last_of_step`: the
  // step's last backward on this stage, after which each layer's gradients are final; the model
  // reports each layer to the subscriber as it finishes it (under sequence parallelism having
  // summed its norms' gradients over TP first).
  void forward_stage(int slot, Tensor tokens);
  void stage_loss(int slot, Tensor targets, float grad_scale, bool grad, Tensor loss_sum);
  void backward_stage(int slot, Tensor tokens, bool last_of_step);
  Tensor stage_input(int slot) const;   // [T, H]
  Tensor stage_output(int slot) const;  // [T, H]
  Tensor recv_grad_buffer() const;      // [T, H]
  Tensor send_grad_buffer() const;      // [T, H]
  // After the last backward of a step: with sequence parallelism, sums the gradients of the
  // replicated tensors (the norms, which each saw only this rank's tokens) over TP, those the
  // step's last backward has not summed already (it sums each layer's as it finishes it).
  void sync_replicated_grads();

  // Logits of the last forward's final hidden states for tokens [begin, begin + n): [n, vocab]
  // (padding dropped). For tests and debugging; runs the LM head again.
  std::vector<float> logits(int64_t begin, int64_t n);
  // Bytes of the activation and scratch buffers (for the start-up memory breakdown).
  size_t activation_bytes() const;
  // Bytes of workspace the attention backend holds for this model's shape (cuDNN), 0 on CPU.
  size_t attention_workspace_bytes() const { return attention_.workspace_bytes; }
  // Whether attention's backward is deterministic (cuDNN may have built only the other mode).
  bool attention_bwd_deterministic() const { return attention_.deterministic_bwd; }

 private:
  struct Acts;
  Weights views(Tensor flat) const;
  void alloc_acts(Arena& arena);       // every activation and scratch buffer, in one fixed order
  Comm* tp_group() const;              // the TP group (asserted set when tp > 1)
  void tp_sum(Tensor t);               // all-reduce over the TP group (no-op when tp == 1)
  Tensor full_or(Tensor local) const;  // the [T, H] buffer for a [Tl, H] one
  void reduce_to_local(Tensor partial, Tensor local);  // end of a TP region
  Tensor gather_tokens(Tensor local, Tensor full);     // start of a TP region
  // Layer l of micro-batch slot `slot` from its normed input (ln1, all-gathered) to its SwiGLU
  // output (act).
  void layer_fwd(int slot, int64_t l);
  // Before layer l's backward: its activations that recomputation dropped, again.
  void recompute_layer(int slot, int64_t l);
  void chunk_loss(Tensor losses, Tensor logits, Tensor targets, float grad_scale, bool grad);

  ModelDims dims_;
  int64_t batch_, seq_len_;
  int64_t chunk_ = 0;  // tokens per loss chunk (C)
  int slots_ = 1;
  Comm* tp_ = nullptr;
  ParamEvents* events_ = nullptr;
  void need(const Tensor& w);  // events_->weights_needed over the flat range of w (a view of w_)
  std::vector<std::pair<int64_t, int64_t>> layer_ranges_;  // per layer: flat [begin, end)
  bool layer_norms_summed_ = false;  // this step's layer norm gradients are summed over TP
  // How the next writes of the LM head's and of the other gradients go (begin_step_grads).
  GradWrite head_write_ = GradWrite::add, body_write_ = GradWrite::add;
  Ctx ctx_;
  DType dtype_;   // compute: activations and the weights the ops read
  DType mdtype_;  // masters and gradients (f32 under bf16 compute)
  DType sdtype_;  // saved statistics and losses (f32, f64 for f64 compute)
  ParamLayout layout_;
  std::unique_ptr<Arena> param_arena_, act_arena_;
  Tensor params_, grads_, compute_;
  DpShards shards_;
  AttentionPlan attention_;
  Memory memory_;
  Weights w_, g_;
  std::unique_ptr<Acts> a_;
};

}  // namespace tr
