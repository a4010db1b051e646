// defines: the qwen2 family (Qwen2 / Qwen2.5): biases on q, k and v; the Qwen2.5 presets.
#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "trainer/family/family.h"

namespace tr {
namespace {

// Hugging Face's config.json of the Qwen2.5 base models.
constexpr Preset kPresets[] = {
    {"qwen2.5-0.5b", 896, 4864, 24, 14, 2, 64, 151936, 1e-6, true, 1e6},
    {"qwen2.5-1.5b", 1536, 8960, 28, 12, 2, 128, 151936, 1e-6, true, 1e6},
    {"qwen2.5-3b", 2048, 11008, 36, 16, 2, 128, 151936, 1e-6, true, 1e6},
    {"qwen2.5-7b", 3584, 18944, 28, 28, 4, 128, 152064, 1e-6, false, 1e6},
    {"qwen2.5-14b", 5120, 13824, 48, 40, 8, 128, 152064, 1e-5, false, 1e6},
    {"qwen2.5-32b", 5120, 27648, 64, 40, 8, 128, 152064, 1e-5, false, 1e6},
    {"qwen2.5-72b", 8192, 29568, 80, 64, 8, 128, 152064, 1e-5, false, 1e6},
};

// Every key Qwen2's config.json has is read by the generic reader.
absl::Status hf_refusal(const nlohmann::json&) {
  return absl::OkStatus();
}

}  // namespace

// Its row of the table (families.cpp); constinit: set before any static initializer runs.
extern constinit const Family kQwen2Family = {
    .name = "qwen2",
    .title = "Qwen2 / Qwen2.5",
    .layer_doc = "biases on q, k and v",
    .hf_architecture = "Qwen2ForCausalLM",
    .qkv_bias = true,
    .qk_norm = false,
    .mlp = MlpKind::dense_swiglu,
    .max_positions = 32768,
    .presets = kPresets,
    .hf_refusal = hf_refusal,
    .hf_extra_keys = full_attention_keys,
};

}  // namespace tr
