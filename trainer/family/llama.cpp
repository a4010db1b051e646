// defines: the llama family (Llama 3.x): no biases, Llama 3's RoPE scaling; the Llama 3.1 and
// 3.2 presets.
#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "trainer/family/family.h"

namespace tr {
namespace {

// Hugging Face's config.json of the Llama 3.1 / 3.2 base models: 128K positions by Llama 3's
// RoPE rule over 8192 trained ones.
constexpr Preset kPresets[] = {
    {"llama-3.2-1b", 2048, 8192, 16, 32, 8, 64, 128256, 1e-5, true, 5e5, {.factor = 32}},
    {"llama-3.2-3b", 3072, 8192, 28, 24, 8, 128, 128256, 1e-5, true, 5e5, {.factor = 32}},
    {"llama-3.1-8b", 4096, 14336, 32, 32, 8, 128, 128256, 1e-5, false, 5e5, {.factor = 8}},
    {"llama-3.1-70b", 8192, 28672, 80, 64, 8, 128, 128256, 1e-5, false, 5e5, {.factor = 8}},
};

absl::Status hf_refusal(const nlohmann::json& j) {
  if (absl::Status st = refuse_biases(j, "llama"); !st.ok()) return st;
  if (j.value("pretraining_tp", 1) != 1)
    return absl::InvalidArgumentError(
        "pretraining_tp is not 1; re-save the model with pretraining_tp 1");
  return absl::OkStatus();
}

void hf_extra_keys(nlohmann::ordered_json& j) {
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["pretraining_tp"] = 1;
}

}  // namespace

// Its row of the table (families.cpp); constinit: set before any static initializer runs.
extern constinit const Family kLlamaFamily = {
    .name = "llama",
    .title = "Llama 3.x",
    .layer_doc = "no biases",
    .hf_architecture = "LlamaForCausalLM",
    .qkv_bias = false,
    .qk_norm = false,
    .mlp = MlpKind::dense_swiglu,
    .max_positions = 131072,
    .presets = kPresets,
    .hf_refusal = hf_refusal,
    .hf_extra_keys = hf_extra_keys,
};

}  // namespace tr
