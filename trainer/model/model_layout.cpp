// The model's shapes on one rank and its parameters' layout in the flat buffers.
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "trainer/family/family.h"
#include "trainer/model/model.h"

namespace tr {
namespace {
// The vocabulary is padded to a multiple of this times tp (GEMM-friendly shard sizes).
constexpr int64_t kVocabMultiple = 128;
}  // namespace

int64_t ModelDims::chunk_begin(int c) const {
  int64_t at = 0;
  for (int i = 0; i < c; ++i) at += chunks[i].layers;
  return at;
}

std::vector<int64_t> ModelDims::global_layers() const {
  std::vector<int64_t> out;
  for (const Chunk& c : chunks)
    for (int64_t i = 0; i < c.layers; ++i) out.push_back(c.first_layer + i);
  return out;
}

ModelDims ModelDims::from(const ModelConfig& m, const Topology& topo, bool sequence_parallel,
                          const std::vector<int64_t>& stage_layers, int virtual_stages) {
  ModelDims d;
  d.hidden = m.hidden_size;
  d.inter = m.intermediate_size / topo.tp;
  const int stages = topo.pp * virtual_stages;
  TR_ASSERT(stage_layers.empty() || static_cast<int>(stage_layers.size()) == stages,
            "one layer count per (virtual) stage");
  auto layers_of = [&](int vs) {
    return stage_layers.empty() ? m.num_layers / stages : stage_layers[vs];
  };
  d.chunks.clear();
  d.layers = 0;
  for (int c = 0; c < virtual_stages; ++c) {
    const int vs = c * topo.pp + topo.pp_rank;
    Chunk chunk;
    for (int i = 0; i < vs; ++i) chunk.first_layer += layers_of(i);
    chunk.layers = layers_of(vs);
    d.layers += chunk.layers;
    d.chunks.push_back(chunk);
  }
  d.first_stage = topo.first_stage();
  d.last_stage = topo.last_stage();
  d.heads = m.num_heads / topo.tp;
  d.kv_heads = m.num_kv_heads / topo.tp;
  d.head_dim = m.head_dim;
  d.total_layers = m.num_layers;
  d.vocab = m.vocab_size;
  const int64_t multiple = kVocabMultiple * topo.tp;
  d.vocab_padded = (m.vocab_size + multiple - 1) / multiple * multiple;
  d.vocab_local = d.vocab_padded / topo.tp;
  d.vocab_offset = d.vocab_local * topo.tp_rank;
  d.tp = topo.tp;
  d.tp_rank = topo.tp_rank;
  d.sequence_parallel = sequence_parallel && topo.tp > 1;
  d.cp = topo.cp;
  d.cp_rank = topo.cp_rank;
  d.eps = static_cast<float>(m.rms_norm_eps);
  d.rope = m.rope();
  d.tied = m.tie_embeddings;
  const Family& family = family_of(m.family);
  d.qkv_bias = family.qkv_bias;
  d.qk_norm = family.qk_norm;
  if (m.num_experts > 0) {
    d.moe = {.experts = m.num_experts,
             .ep = topo.ep,
             .ep_rank = topo.ep_rank(),
             .local = m.num_experts / topo.ep,
             .offset = m.num_experts / topo.ep * topo.ep_rank(),
             .top_k = m.experts_per_token,
             .inter = m.moe_intermediate_size / topo.tp,
             .normalize = m.norm_topk_prob,
             .aux_coef = m.router_aux_loss_coef,
             .capacity_factor = m.capacity_factor,
             .sparse_layers = m.sparse_layers(),
             .sparse = {}};
    for (int64_t i = 0; i < m.num_layers; ++i) d.moe.sparse.push_back(m.sparse_layer(i) ? 1 : 0);
  }
  return d;
}

ModelDims ModelDims::from(const Config& c, const Topology& topo) {
  ModelDims d = from(c.model, topo, c.parallel.sequence_parallel, c.parallel.pipeline_layers,
                     static_cast<int>(c.parallel.virtual_stages));
  d.cp_exchange = c.parallel.cp_comm == "ring" ? CpExchange::ring : CpExchange::all_gather;
  const TrainConfig& t = c.train;
  d.recompute_selective = t.recompute == "selective";
  if (t.recompute == "full") {
    const std::vector<int64_t>& n = t.recompute_layers;
    d.recompute_full = n.empty() ? d.layers : n[n.size() == 1 ? 0 : topo.pp_rank];
  }
  return d;
}

ParamLayout ParamLayout::make(const ModelDims& d, int64_t multiple) {
  ParamLayout l;
  // The experts' tensors, laid out after the dense ones (their region starts at a multiple).
  std::vector<ParamInfo> experts;
  // split: -1 replicated, 0 rows, 1 columns; the global shape multiplies the split dim by tp.
  auto add = [&](std::string name, std::vector<int64_t> shape, bool decay, int split) {
    ParamInfo p;
    p.name = std::move(name);
    p.shape = shape;
    p.global_shape = shape;
    if (split >= 0) {
      p.global_shape[split] *= d.tp;
      p.split_dim = split;
      p.split_offset = shape[split] * d.tp_rank;
    }
    p.offset = l.total;
    p.numel = 1;
    for (int64_t s : shape) p.numel *= s;
    p.decay = decay;
    l.total += p.numel;
    l.tensors.push_back(std::move(p));
  };
  const int64_t H = d.hidden, hd = d.head_dim;
  auto vocab_table = [&](const std::string& name) {  // vocab-parallel rows; padding not stored
    add(name, {d.vocab_local, H}, true, 0);
    l.tensors.back().global_shape[0] = d.vocab;
  };
  if (d.first_stage) vocab_table("embed_tokens/weight");
  for (int64_t i : d.global_layers()) {
    const std::string p = absl::StrCat("layers/", i, "/");
    add(p + "input_layernorm/weight", {H}, false, -1);
    // q, k, v adjacent so that [q; k; v] is one [(nh + 2 nkv) hd, H] matrix; biases likewise.
    // Column-parallel: each TP rank holds whole heads.
    add(p + "self_attn/q_proj/weight", {d.heads * hd, H}, true, 0);
    add(p + "self_attn/k_proj/weight", {d.kv_heads * hd, H}, true, 0);
    add(p + "self_attn/v_proj/weight", {d.kv_heads * hd, H}, true, 0);
    if (d.qkv_bias) {
      add(p + "self_attn/q_proj/bias", {d.heads * hd}, false, 0);
      add(p + "self_attn/k_proj/bias", {d.kv_heads * hd}, false, 0);
      add(p + "self_attn/v_proj/bias", {d.kv_heads * hd}, false, 0);
    }
    if (d.qk_norm) {  // one [hd] weight for every q head, one for every k head: on every TP rank
      add(p + "self_attn/q_norm/weight", {hd}, false, -1);
      add(p + "self_attn/k_norm/weight", {hd}, false, -1);
    }
    add(p + "self_attn/o_proj/weight", {H, d.heads * hd}, true, 1);  // row-parallel
    add(p + "post_attention_layernorm/weight", {H}, false, -1);
    if (!d.sparse(i)) {
      add(p + "mlp/gate_proj/weight", {d.inter, H}, true, 0);  // gate then up: one [2I, H]
      add(p + "mlp/up_proj/weight", {d.inter, H}, true, 0);
      add(p + "mlp/down_proj/weight", {H, d.inter}, true, 1);  // row-parallel
      continue;
    }
    // The router, whole on every TP rank (it reads the whole sequence), then each expert as a
    // dense MLP of its own size, under Hugging Face's per-expert names.
    add(p + "mlp/gate/weight", {d.moe.experts, H}, true, -1);
    l.tensors.back().tp_whole_grad = true;
    // This rank's experts (all of them without expert parallelism), by their global index.
    const size_t dense = l.tensors.size();
    const int64_t dense_total = l.total;
    for (int64_t e = d.moe.offset; e < d.moe.offset + d.moe.local; ++e) {
      const std::string x = absl::StrCat(p, "mlp/experts/", e, "/");
      add(x + "gate_proj/weight", {d.moe.inter, H}, true, 0);
      add(x + "up_proj/weight", {d.moe.inter, H}, true, 0);
      add(x + "down_proj/weight", {H, d.moe.inter}, true, 1);
    }
    for (size_t t = dense; t < l.tensors.size(); ++t) experts.push_back(std::move(l.tensors[t]));
    l.tensors.resize(dense);
    l.total = dense_total;
  }
  if (d.last_stage) {
    add("norm/weight", {H}, false, -1);
    if (!d.tied) {
      vocab_table("lm_head/weight");
    } else if (!d.first_stage) {
      vocab_table("embed_tokens/weight");
      l.tensors.back().tied_copy = true;
    }
  }
  auto round_up = [&](int64_t n) { return (n + multiple - 1) / multiple * multiple; };
  if (!experts.empty()) {
    l.total = l.expert_begin = round_up(l.total);
    for (ParamInfo& p : experts) {
      p.offset = l.total;
      p.expert = true;
      l.total += p.numel;
      l.tensors.push_back(std::move(p));
    }
  }
  l.capacity = round_up(l.total);
  if (experts.empty()) l.expert_begin = l.capacity;
  for (size_t i = 0; i < l.tensors.size(); ++i)
    l.index_.emplace(l.tensors[i].name, static_cast<int64_t>(i));
  return l;
}

int64_t ParamLayout::index_of(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

const ParamInfo& ParamLayout::find(const std::string& name) const {
  const int64_t i = index_of(name);
  TR_ASSERT(i >= 0, "no parameter named " + name);
  return tensors[static_cast<size_t>(i)];
}

int64_t loss_chunk_tokens(int64_t tokens, int64_t vocab_local, DType logits_dtype) {
  const double row =
      static_cast<double>(vocab_local) * static_cast<double>(dtype_size(logits_dtype));
  const auto fit = static_cast<int64_t>(kLossChunkBudgetBytes / row);
  return std::max<int64_t>(1, std::min(tokens, std::max(fit, kMinLossChunkTokens)));
}

}  // namespace tr
