// defines: a model family (model.family, Hugging Face's model_type): what its decoder layer is,
// its presets, and how its config.json differs from the others'; and the table of families.
// The lowest trainer room: the config room applies presets and checks model.family by it.
//
// A new family is one file here (its Family record, presets and Hugging Face hooks), a row of
// the table (families.cpp), its configs/ and its tests.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json_fwd.hpp"

namespace tr {

// The MLP of a family's layers.
enum class MlpKind {
  dense_swiglu,        // down(silu(gate(x)) * up(x)), one MLP per layer
  mixture_of_experts,  // a router choosing experts (each a dense SwiGLU) per token; see
                       // ModelConfig::sparse_layer for which layers
};

// A mixture-of-experts model's numbers (Hugging Face's num_experts, num_experts_per_tok,
// moe_intermediate_size); experts 0: a dense model.
struct MoePreset {
  int64_t experts = 0, experts_per_token = 0, inter = 0;
};

// Llama 3's RoPE scaling (Hugging Face's rope_scaling with rope_type llama3); factor 0: none.
struct Llama3Rope {
  double factor = 0;
  double low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_position_embeddings = 8192;
};

// One released model's numbers, as its Hugging Face config.json gives them.
struct Preset {
  const char* name;  // model.preset, and configs/<name>.yaml
  int64_t hidden, inter, layers, heads, kv_heads, head_dim, vocab;
  double eps;  // rms_norm_eps
  bool tied;   // tie_word_embeddings
  double rope_theta;
  Llama3Rope llama3 = {};
  MoePreset moe = {};
};

struct Family {
  const char* name;             // model.family and Hugging Face's model_type: "qwen2"
  const char* title;            // in messages: "Qwen2 / Qwen2.5"
  const char* layer_doc;        // its layer in model.family's doc: "biases on q, k and v"
  const char* hf_architecture;  // config.json's architectures: "Qwen2ForCausalLM"
  bool qkv_bias;                // the q, k and v projections have biases
  bool qk_norm;                 // an RMSNorm over each q and k head (weight [hd]) before RoPE
  MlpKind mlp;
  int64_t max_positions;  // its presets' max_seq_len
  std::span<const Preset> presets;
  // A config.json of this model_type asking for what the family does not implement: an error
  // saying which key (the caller names the file); OK otherwise. A value of another JSON type
  // than the key has may throw nlohmann::json::exception.
  absl::Status (*hf_refusal)(const nlohmann::json& config);
  // Adds the family's own keys to an exported config.json that holds the generic ones.
  void (*hf_extra_keys)(nlohmann::ordered_json& config);
};

// Every family, in the order of messages and of preset_names().
std::span<const Family* const> families();
// The family named `name`; nullptr when there is none.
const Family* find_family(const std::string& name);
// The family named `name`, which the config has checked (an unknown name is a bug: aborts).
const Family& family_of(const std::string& name);
// The families' names, in order.
std::vector<std::string> family_names();
// Each family as `text` says it (its index in families() beside it), joined for a sentence:
// "a, b and c" with `last` " and ".
std::string join_families(const std::function<std::string(const Family&, size_t)>& text,
                          const char* last);

// The refusal of families whose projections have no biases: attention_bias or mlp_bias true.
absl::Status refuse_biases(const nlohmann::json& config, const char* family);
// The keys of Qwen's config.json saying that every layer attends over the whole sequence.
void full_attention_keys(nlohmann::ordered_json& config);

}  // namespace tr
