// defines: the qwen3_moe family (Qwen3-MoE): Qwen3's attention (no biases, QK-norm) and
// mixture-of-experts MLPs (a softmax router over the experts, top-k, no shared expert); the
// Qwen3-MoE presets.
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "trainer/family/family.h"

namespace tr {
namespace {

// Hugging Face's config.json of the Qwen3-MoE base models (intermediate_size is their dense
// MLP's, used by layers in mlp_only_layers: none in either).
constexpr Preset kPresets[] = {
    {.name = "qwen3-30b-a3b",
     .hidden = 2048,
     .inter = 6144,
     .layers = 48,
     .heads = 32,
     .kv_heads = 4,
     .head_dim = 128,
     .vocab = 151936,
     .eps = 1e-6,
     .tied = false,
     .rope_theta = 1e6,
     .moe = {.experts = 128, .experts_per_token = 8, .inter = 768}},
    {.name = "qwen3-235b-a22b",
     .hidden = 4096,
     .inter = 12288,
     .layers = 94,
     .heads = 64,
     .kv_heads = 4,
     .head_dim = 128,
     .vocab = 151936,
     .eps = 1e-6,
     .tied = false,
     .rope_theta = 1e6,
     .moe = {.experts = 128, .experts_per_token = 8, .inter = 1536}},
};

absl::Status hf_refusal(const nlohmann::json& j) {
  if (absl::Status s = refuse_biases(j, "qwen3_moe"); !s.ok()) return s;
  // Routing the trainer does not implement: shared experts (Qwen2-MoE's), grouped routing.
  for (const char* key : {"shared_expert_intermediate_size", "n_shared_experts",
                          "num_shared_experts", "n_group", "topk_group"})
    if (j.contains(key) && !j.at(key).is_null() && !(j.at(key).is_number() && j.at(key) == 0))
      return absl::InvalidArgumentError(
          absl::StrCat(key,
                       " is set; the trainer's qwen3_moe routes to its experts alone (no "
                       "shared experts, no expert groups)"));
  return absl::OkStatus();
}

void hf_extra_keys(nlohmann::ordered_json& j) {
  j["attention_bias"] = false;
  full_attention_keys(j);
}

}  // namespace

// Its row of the table (families.cpp); constinit: set before any static initializer runs.
extern constinit const Family kQwen3MoeFamily = {
    .name = "qwen3_moe",
    .title = "Qwen3-MoE",
    .layer_doc =
        "Qwen3's attention; a router choosing experts_per_token of num_experts SwiGLU "
        "experts per token",
    .hf_architecture = "Qwen3MoeForCausalLM",
    .qkv_bias = false,
    .qk_norm = true,
    .mlp = MlpKind::mixture_of_experts,
    .max_positions = 40960,
    .presets = kPresets,
    .hf_refusal = hf_refusal,
    .hf_extra_keys = hf_extra_keys,
};

}  // namespace tr
