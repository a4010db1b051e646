// The model section's rules: the Qwen2.5, Llama 3 and Qwen3 presets and the rope_scaling block's
// rules.
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainer/config/config.h"
#include "trainer/config/config_fields.h"

namespace tr {
namespace {

// ---- presets (Hugging Face config.json of the Qwen2.5, Llama 3.1 / 3.2 and Qwen3 base models)
// ----
struct Preset {
  const char* name;
  const char* family;
  int64_t hidden, inter, layers, heads, kv, hd, vocab;
  double eps;
  bool tied;
  double llama3_factor;  // Llama 3's rope_scaling factor over 8192 trained positions; 0: none
};
constexpr Preset kPresets[] = {
    {"qwen2.5-0.5b", "qwen2", 896, 4864, 24, 14, 2, 64, 151936, 1e-6, true, 0},
    {"qwen2.5-1.5b", "qwen2", 1536, 8960, 28, 12, 2, 128, 151936, 1e-6, true, 0},
    {"qwen2.5-3b", "qwen2", 2048, 11008, 36, 16, 2, 128, 151936, 1e-6, true, 0},
    {"qwen2.5-7b", "qwen2", 3584, 18944, 28, 28, 4, 128, 152064, 1e-6, false, 0},
    {"qwen2.5-14b", "qwen2", 5120, 13824, 48, 40, 8, 128, 152064, 1e-5, false, 0},
    {"qwen2.5-32b", "qwen2", 5120, 27648, 64, 40, 8, 128, 152064, 1e-5, false, 0},
    {"qwen2.5-72b", "qwen2", 8192, 29568, 80, 64, 8, 128, 152064, 1e-5, false, 0},
    {"llama-3.2-1b", "llama", 2048, 8192, 16, 32, 8, 64, 128256, 1e-5, true, 32},
    {"llama-3.2-3b", "llama", 3072, 8192, 28, 24, 8, 128, 128256, 1e-5, true, 32},
    {"llama-3.1-8b", "llama", 4096, 14336, 32, 32, 8, 128, 128256, 1e-5, false, 8},
    {"llama-3.1-70b", "llama", 8192, 28672, 80, 64, 8, 128, 128256, 1e-5, false, 8},
    {"qwen3-0.6b", "qwen3", 1024, 3072, 28, 16, 8, 128, 151936, 1e-6, true, 0},
    {"qwen3-1.7b", "qwen3", 2048, 6144, 28, 16, 8, 128, 151936, 1e-6, true, 0},
    {"qwen3-4b", "qwen3", 2560, 9728, 36, 32, 8, 128, 151936, 1e-6, true, 0},
    {"qwen3-8b", "qwen3", 4096, 12288, 36, 32, 8, 128, 151936, 1e-6, false, 0},
    {"qwen3-14b", "qwen3", 5120, 17408, 40, 40, 8, 128, 151936, 1e-6, false, 0},
    {"qwen3-32b", "qwen3", 5120, 25600, 64, 64, 8, 128, 151936, 1e-6, false, 0},
};

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> n;
  for (const Preset& p : kPresets) n.push_back(p.name);
  return n;
}

absl::Status apply_model_preset(const std::string& name, ModelConfig* m) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    m->hidden_size = p.hidden;
    m->intermediate_size = p.inter;
    m->num_layers = p.layers;
    m->num_heads = p.heads;
    m->num_kv_heads = p.kv;
    m->head_dim = p.hd;
    m->vocab_size = p.vocab;
    m->family = p.family;
    m->rms_norm_eps = p.eps;
    m->tie_embeddings = p.tied;
    m->rope_scaling = RopeScaling{};
    if (p.llama3_factor > 0) {  // Llama 3.1 / 3.2: 128K positions by Llama 3's RoPE rule
      m->max_seq_len = 131072;
      m->rope_theta = 5e5;
      m->rope_scaling.type = "llama3";
      m->rope_scaling.factor = p.llama3_factor;
      m->rope_scaling.low_freq_factor = 1;
      m->rope_scaling.high_freq_factor = 4;
      m->rope_scaling.original_max_position_embeddings = 8192;
    } else {  // Qwen2.5: 32K positions; Qwen3: 40K
      m->max_seq_len = m->family == "qwen3" ? 40960 : 32768;
      m->rope_theta = 1e6;
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "model.preset '", name, "' is unknown; known presets: ", absl::StrJoin(preset_names(), ", "),
      config_detail::suggest(name, preset_names())));
}

namespace config_detail {

// model.rope_scaling: none (or null), or a mapping as Hugging Face's config.json has it.
absl::Status parse_rope_scaling(const YAML::Node& n, const std::string& name, RopeScaling* out) {
  if (n.IsNull() || (n.IsScalar() && n.Scalar() == "none")) {
    *out = RopeScaling{};
    return absl::OkStatus();
  }
  if (!n.IsMap())
    return absl::InvalidArgumentError(absl::StrCat(
        name,
        ": expected none, {type: yarn, factor: F, original_max_position_embeddings: N} or "
        "{type: llama3, factor: F, low_freq_factor: L, high_freq_factor: H, "
        "original_max_position_embeddings: N}, got ",
        scalar_text(n)));
  // The type keys here; the rest is the block's, checked where its fields are listed.
  std::string type = "none";
  std::vector<std::pair<std::string, RopeValue>> keys;
  for (const auto& kv : n) {
    const std::string k = kv.first.IsScalar() ? kv.first.Scalar() : "";
    const YAML::Node& v = kv.second;
    if (k == "type" || k == "rope_type") {
      if (!v.IsScalar())
        return absl::InvalidArgumentError(
            absl::StrCat(name, ".", k, ": expected yarn, llama3 or none, got ", scalar_text(v)));
      type = v.Scalar();
      continue;
    }
    RopeValue value;
    value.text = scalar_text(v);
    double x = 0;
    bool b = false;
    if (v.IsScalar() && YAML::convert<double>::decode(v, x)) value.number = x;
    if (v.IsScalar() && YAML::convert<bool>::decode(v, b)) value.flag = b;
    keys.emplace_back(k, value);
  }
  absl::StatusOr<RopeScaling> r = make_rope_scaling(type, keys, name);
  if (!r.ok()) return r.status();
  *out = *r;
  return absl::OkStatus();
}

}  // namespace config_detail

}  // namespace tr
