// defines: the qwen3 family (Qwen3 dense): no biases, an RMSNorm over each q and k head before
// RoPE; the Qwen3 presets.
#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "trainer/family/family.h"

namespace tr {
namespace {

// Hugging Face's config.json of the Qwen3 base models.
constexpr Preset kPresets[] = {
    {"qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, 1e-6, true, 1e6},
    {"qwen3-1.7b", 2048, 6144, 28, 16, 8, 128, 151936, 1e-6, true, 1e6},
    {"qwen3-4b", 2560, 9728, 36, 32, 8, 128, 151936, 1e-6, true, 1e6},
    {"qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, 1e-6, false, 1e6},
    {"qwen3-14b", 5120, 17408, 40, 40, 8, 128, 151936, 1e-6, false, 1e6},
    {"qwen3-32b", 5120, 25600, 64, 64, 8, 128, 151936, 1e-6, false, 1e6},
};

absl::Status hf_refusal(const nlohmann::json& j) {
  return refuse_biases(j, "qwen3");
}

void hf_extra_keys(nlohmann::ordered_json& j) {
  j["attention_bias"] = false;
  full_attention_keys(j);
}

}  // namespace

// Its row of the table (families.cpp); constinit: set before any static initializer runs.
extern constinit const Family kQwen3Family = {
    .name = "qwen3",
    .title = "Qwen3 dense",
    .layer_doc = "no biases, an RMSNorm over each head's queries and keys before RoPE",
    .hf_architecture = "Qwen3ForCausalLM",
    .qkv_bias = false,
    .qk_norm = true,
    .mlp = MlpKind::dense_swiglu,
    .max_positions = 40960,
    .presets = kPresets,
    .hf_refusal = hf_refusal,
    .hf_extra_keys = hf_extra_keys,
};

}  // namespace tr
