// The model section's rules: the presets (each family's, trainer/family/) and the rope_scaling
// block's rules.
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainer/config/config.h"
#include "trainer/config/config_fields.h"
#include "trainer/family/family.h"

namespace tr {
namespace {

// Sets every model field a preset of family `f` decides.
void apply_preset(const Family& f, const Preset& p, ModelConfig* m) {
  m->hidden_size = p.hidden;
  m->intermediate_size = p.inter;
  m->num_layers = p.layers;
  m->num_heads = p.heads;
  m->num_kv_heads = p.kv_heads;
  m->head_dim = p.head_dim;
  m->vocab_size = p.vocab;
  m->family = f.name;
  m->rms_norm_eps = p.eps;
  m->tie_embeddings = p.tied;
  m->max_seq_len = f.max_positions;
  m->rope_theta = p.rope_theta;
  m->num_experts = p.moe.experts;
  m->experts_per_token = p.moe.experts_per_token;
  m->moe_intermediate_size = p.moe.inter;
  // Every released mixture-of-experts preset routes in every layer, renormalises its top-k and
  // weighs the load-balancing loss 1e-3 (Qwen3-MoE's config.json).
  m->norm_topk_prob = true;
  m->router_aux_loss_coef = 1e-3;
  m->decoder_sparse_step = 1;
  m->mlp_only_layers.clear();
  m->rope_scaling = RopeScaling{};
  if (const Llama3Rope& r = p.llama3; r.factor > 0)
    m->rope_scaling = {.type = "llama3",
                       .factor = r.factor,
                       .original_max_position_embeddings = r.original_max_position_embeddings,
                       .low_freq_factor = r.low_freq_factor,
                       .high_freq_factor = r.high_freq_factor};
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> n;
  for (const Family* f : families())
    for (const Preset& p : f->presets) n.push_back(p.name);
  return n;
}

absl::Status apply_model_preset(const std::string& name, ModelConfig* m) {
  for (const Family* f : families())
    for (const Preset& p : f->presets)
      if (name == p.name) {
        apply_preset(*f, p, m);
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
