// The model's shapes on one rank and its parameters' layout in the flat buffers
// (model_layout.cpp): what the model, the parameter buffer, the optimizer, the planner and the
// checkpoints agree on.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kernels/rope.h"
#include "parallel/context_parallel.h"
#include "parallel/topology.h"
#include "trainer/config/config.h"

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
  // Context parallelism (parallel.cp): this rank holds seq_len / cp tokens of every sequence,
  // chunks cp_rank and 2 cp - 1 - cp_rank (parallel/context_parallel.h); attention meets the
  // CP group's other chunks by `cp_exchange`. Everything but attention and RoPE's positions is
  // per token and does not know.
  int cp = 1, cp_rank = 0;
  CpExchange cp_exchange = CpExchange::all_gather;
  // Pipeline: this rank's layers, in chunks of consecutive layers: one, or under the interleaved
  // schedule parallel.virtual_stages of them, chunk c being virtual stage c * pp + pp_rank. The
  // first stage (chunk 0 of pipeline rank 0) holds the input embedding, the last (the last chunk
  // of rank pp - 1) the final norm and the LM head (with tied embeddings and pp > 1, its own copy
  // of embed_tokens, kept equal by an all-reduce of the gradients). `layers` counts them all;
  // locally they are numbered chunk after chunk.
  struct Chunk {
    int64_t first_layer = 0;  // of the whole model
    int64_t layers = 0;
  };
  std::vector<Chunk> chunks = {Chunk{}};
  bool first_stage = true, last_stage = true;
  int num_chunks() const { return static_cast<int>(chunks.size()); }
  int64_t chunk_begin(int c) const;  // local index of chunk c's first layer
  // The model's (global) index of each local layer, in local order.
  std::vector<int64_t> global_layers() const;
  float eps;
  Rope rope;  // model.rope_theta and model.rope_scaling
  bool tied;
  // Activation recomputation (train.recompute): the first `recompute_full` layers of this stage
  // keep only their input and run their forward again in backward; with `recompute_selective`
  // every layer drops its norm outputs and SwiGLU output and recomputes them in backward.
  // Gradients are the same bits either way.
  int64_t recompute_full = 0;
  bool recompute_selective = false;
  bool qkv_bias = true;  // model.family qwen2: q, k and v have biases; llama, qwen3: none
  bool qk_norm = false;  // qwen3: an RMSNorm over each q and k head (weights [hd], replicated)
  // Mixture of experts (model.num_experts > 0): which layers are sparse, and their MLP's shape.
  struct Moe {
    int64_t experts = 0;  // of a sparse layer, all ranks'
    // Expert parallelism (parallel.ep): this rank holds experts [offset, offset + local).
    int ep = 1, ep_rank = 0;
    int64_t local = 0, offset = 0;
    int64_t top_k = 0;           // experts per token
    int64_t inter = 0;           // an expert's intermediate size on this rank (/ tp)
    bool normalize = true;       // the top-k weights renormalised (norm_topk_prob)
    double aux_coef = 0;         // router_aux_loss_coef
    double capacity_factor = 0;  // 0: dropless
    int64_t sparse_layers = 0;   // of the whole model (the load-balancing loss pools them)
    std::vector<char> sparse;    // per layer of the whole model
    // The load-balancing loss is part of the loss: sparse layers and a non-zero weight.
    bool aux_loss() const { return sparse_layers > 0 && aux_coef > 0; }
  };
  Moe moe;
  bool sparse(int64_t global_layer) const {
    return !moe.sparse.empty() && moe.sparse[static_cast<size_t>(global_layer)] != 0;
  }
  int64_t qkv_out() const { return (heads + 2 * kv_heads) * head_dim; }
  // Real (unpadded) vocabulary rows among this rank's vocab_local.
  int64_t vocab_valid_local() const {
    return std::clamp<int64_t>(vocab - vocab_offset, 0, vocab_local);
  }

  // `stage_layers`: layers of each (virtual) stage, pp x virtual_stages of them in virtual-stage
  // order (empty = an even split).
  static ModelDims from(const ModelConfig& m, const Topology& topo, bool sequence_parallel = false,
                        const std::vector<int64_t>& stage_layers = {}, int virtual_stages = 1);
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
  // Replicated over TP (split_dim -1) with every TP rank computing the same whole gradient (a
  // router's, which sees the whole sequence): never summed over TP, unlike the norms'.
  bool tp_whole_grad = false;
  // An expert's tensor: in the layout's expert region, replicated over the expert replicas
  // (Topology::edp) instead of dp x cp.
  bool expert = false;
};

// The flat buffer holds two regions, each a multiple of `multiple` elements: the dense one (every
// tensor but the experts', in model order) from 0, and the experts' (every sparse layer's local
// experts, in model order) from expert_begin, because the two are replicated over different
// ranks (dp x cp; the expert replicas) and each region's gradients reduce and shard over its
// own. Padding (between the regions, and after the last) holds no tensor and stays zero.
struct ParamLayout {
  std::vector<ParamInfo> tensors;
  int64_t total = 0;         // elements up to the end of the last tensor (padding included)
  int64_t capacity = 0;      // total rounded up to `multiple` (ZeRO-1 shards); the tail stays zero
  int64_t expert_begin = 0;  // the expert region [expert_begin, capacity); capacity when none
  static ParamLayout make(const ModelDims& d, int64_t multiple = 1);
  const ParamInfo& find(const std::string& name) const;
  // The index of the tensor named `name` in `tensors`, or -1.
  int64_t index_of(const std::string& name) const;

 private:
  absl::flat_hash_map<std::string, int64_t> index_;  // name -> place in tensors (make())
};

}  // namespace tr
