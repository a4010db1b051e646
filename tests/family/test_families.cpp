// Every family of the table (trainer/family/): its presets apply and no other family has their
// names, model.family takes its name and refuses an unknown one listing them all, and the
// config.json export-hf writes for it reads back as the same family with the same layer.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/safetensors.h"
#include "parallel/topology.h"
#include "tests/test_util.h"
#include "trainer/checkpoint/hf.h"
#include "trainer/config/config.h"
#include "trainer/family/family.h"
#include "trainer/model/model_layout.h"

namespace tr {
namespace {

// A run's config of preset `name` and the overrides `sets`.
absl::StatusOr<Config> parse_preset(const std::string& name, std::vector<std::string> sets = {}) {
  return parse_config(
      "model: {preset: " + name +
          "}\ndata: {train: [x], seq_len: 128}\ntrain: {steps: 1, global_batch: 1}\n",
      sets);
}

Config preset_config(const std::string& name) {
  absl::StatusOr<Config> c = parse_preset(name);
  INFO(c.status().message());
  REQUIRE(c.ok());
  return *c;
}

TEST_CASE("family: each family's presets apply, their names unique across families", "[config]") {
  REQUIRE(families().size() == family_names().size());
  const absl::StatusOr<Topology> one = Topology::make(1, 0, 1, 1, 1);
  REQUIRE(one.ok());
  std::set<std::string> seen;
  for (const Family* f : families()) {
    INFO("family " << f->name);
    CHECK(find_family(f->name) == f);
    CHECK(&family_of(f->name) == f);
    CHECK_FALSE(f->presets.empty());
    for (const Preset& p : f->presets) {
      INFO("preset " << p.name);
      CHECK(seen.insert(p.name).second);
      ModelConfig m;
      m.family.clear();
      REQUIRE(apply_model_preset(p.name, &m).ok());
      CHECK(m.family == f->name);
      CHECK(m.hidden_size == p.hidden);
      CHECK(m.num_layers == p.layers);
      CHECK(m.max_seq_len == f->max_positions);
      CHECK(m.rope_theta == p.rope_theta);
      CHECK(m.rope_scaling.type == (p.llama3.factor > 0 ? "llama3" : "none"));
      // The model's layer is the family's.
      const ModelDims d = ModelDims::from(preset_config(p.name), *one);
      CHECK(d.qkv_bias == f->qkv_bias);
      CHECK(d.qk_norm == f->qk_norm);
    }
  }
  CHECK(seen.size() == preset_names().size());
  CHECK(find_family("qwen4") == nullptr);
}

TEST_CASE("family: model.family takes each family's name and refuses another listing all",
          "[config]") {
  for (const Family* f : families()) {
    std::vector<std::string> sets = {std::string("model.family=") + f->name};
    if (f->mlp == MlpKind::mixture_of_experts)  // its experts besides
      sets.insert(sets.end(), {"model.num_experts=8", "model.experts_per_token=2",
                               "model.moe_intermediate_size=64"});
    absl::StatusOr<Config> c = parse_preset("qwen2.5-0.5b", sets);
    INFO(f->name << ": " << c.status().message());
    REQUIRE(c.ok());
    CHECK(c->model.family == f->name);
  }
  absl::StatusOr<Config> c = parse_preset("qwen2.5-0.5b", {"model.family=qwen4"});
  REQUIRE_FALSE(c.ok());
  const std::string error(c.status().message());
  INFO(error);
  CHECK(error.starts_with("model.family must be one of " + absl::StrJoin(family_names(), "|") +
                          " (got 'qwen4')"));
  for (const Family* f : families()) CHECK(error.find(f->name) != std::string::npos);
}

TEST_CASE("family: each family's config.json reads back as that family", "[hf]") {
  for (const Family* f : families()) {
    INFO("family " << f->name);
    ModelConfig m = preset_config(f->presets.front().name).model;
    test::TempDir dir;
    const std::string text = hf_config_json(m, st::ElemType::bf16, -1);
    test::write_file(dir / "config.json", text);
    INFO(text);
    const absl::Status back = check_hf_config(dir.path(), m);
    INFO(back.message());
    CHECK(back.ok());
    const nlohmann::json j = nlohmann::json::parse(text);
    CHECK(j["architectures"] == nlohmann::json::array({f->hf_architecture}));
    CHECK(j["model_type"] == f->name);
    // transformers' reading of the biases: Qwen2's always, Llama's and Qwen3's by attention_bias.
    CHECK(j.value("attention_bias", true) == f->qkv_bias);
    // Read as any other family, it names its own.
    for (const Family* other : families()) {
      if (other == f) continue;
      ModelConfig as_other = m;
      as_other.family = other->name;
      const absl::Status st = check_hf_config(dir.path(), as_other);
      CHECK_THAT(std::string(st.message()),
                 Catch::Contains(std::string("config.json has model_type ") + f->name +
                                 " but model.family is " + other->name));
    }
    // Asking for q, k and v biases: imported only by a family that has them.
    nlohmann::json biased = j;
    biased["attention_bias"] = true;
    test::write_file(dir / "config.json", biased.dump());
    const absl::Status st = check_hf_config(dir.path(), m);
    INFO(st.message());
    CHECK(st.ok() == f->qkv_bias);
    if (!f->qkv_bias)
      CHECK_THAT(std::string(st.message()),
                 Catch::EndsWith(std::string("attention_bias is true; the trainer's ") + f->name +
                                 " family has none"));
  }
  // A model_type of no family: refused, naming every family.
  test::TempDir dir;
  const ModelConfig m = preset_config(families().front()->presets.front().name).model;
  nlohmann::json other = nlohmann::json::parse(hf_config_json(m, st::ElemType::bf16, -1));
  other["model_type"] = "qwen4";
  test::write_file(dir / "config.json", other.dump());
  const std::string error(check_hf_config(dir.path(), m).message());
  INFO(error);
  CHECK_THAT(error, Catch::Contains("model_type is 'qwen4'; the trainer imports"));
  for (const Family* f : families())
    CHECK_THAT(error, Catch::Contains(absl::StrCat(f->title, " (")) &&
                          Catch::Contains(absl::StrCat(f->name, ")")));
}

// A mixture-of-experts setting the model cannot have: one line naming the key and the fix.
TEST_CASE("family: qwen3_moe's experts are checked, each error one line naming the key",
          "[config]") {
  const auto error = [](std::vector<std::string> sets) {
    absl::StatusOr<Config> c = parse_preset("qwen3-30b-a3b", std::move(sets));
    return c.ok() ? std::string("ok") : std::string(c.status().message());
  };
  CHECK(error({}) == "ok");
  CHECK(preset_config("qwen3-30b-a3b").model.sparse_layers() == 48);
  CHECK_THAT(error({"model.experts_per_token=129"}),
             Catch::StartsWith("model.experts_per_token 129 must be between 1 and "
                               "model.num_experts 128"));
  CHECK_THAT(error({"model.num_experts=0"}),
             Catch::StartsWith("model.family qwen3_moe has mixture-of-experts layers: set "
                               "model.num_experts"));
  CHECK_THAT(error({"model.family=qwen3"}),
             Catch::StartsWith("model.num_experts 128 needs model.family qwen3_moe"));
  CHECK_THAT(error({"parallel.tp=5", "model.num_heads=40", "model.num_kv_heads=5"}),
             Catch::StartsWith("model.moe_intermediate_size 768 is not divisible by parallel.tp "
                               "5"));
  CHECK_THAT(error({"model.mlp_only_layers=[3, 48]"}),
             Catch::StartsWith("model.mlp_only_layers names layer 48 but the model has 48"));
  CHECK_THAT(error({"model.decoder_sparse_step=49"}), Catch::Contains("but no layer is sparse"));
  CHECK_THAT(error({"train.precision=fp8"}),
             Catch::StartsWith("train.precision=fp8 is not implemented for mixture-of-experts"));
  // Which layers are sparse: Hugging Face's rule.
  const Config c = preset_config("qwen3-30b-a3b");
  ModelConfig m = c.model;
  m.decoder_sparse_step = 2;
  m.mlp_only_layers = {5};
  CHECK_FALSE(m.sparse_layer(0));
  CHECK(m.sparse_layer(1));
  CHECK(m.sparse_layer(3));
  CHECK_FALSE(m.sparse_layer(5));
  CHECK(m.sparse_layers() == 23);
}

// Routing the trainer does not implement, and experts of another shape, in a config.json: one
// error naming the key.
TEST_CASE("family: a Qwen3-MoE config.json with other experts or routing is refused", "[hf]") {
  const ModelConfig m = preset_config("qwen3-30b-a3b").model;
  const nlohmann::json j = nlohmann::json::parse(hf_config_json(m, st::ElemType::bf16, -1));
  CHECK(j["num_experts"] == 128);
  CHECK(j["num_experts_per_tok"] == 8);
  CHECK(j["moe_intermediate_size"] == 768);
  CHECK(j["norm_topk_prob"] == true);
  const auto check = [&](const char* key, nlohmann::json value) {
    test::TempDir dir;
    nlohmann::json k = j;
    if (value.is_null())
      k.erase(key);
    else
      k[key] = value;
    test::write_file(dir / "config.json", k.dump());
    return std::string(check_hf_config(dir.path(), m).message());
  };
  CHECK(check("num_experts", 128).empty());
  // transformers 5 writes num_local_experts.
  {
    test::TempDir dir;
    nlohmann::json k = j;
    k.erase("num_experts");
    k["num_local_experts"] = 128;
    test::write_file(dir / "config.json", k.dump());
    CHECK(check_hf_config(dir.path(), m).ok());
  }
  CHECK_THAT(check("num_experts", 64),
             Catch::Contains("config.json has num_experts 64 but model.num_experts is 128"));
  CHECK_THAT(check("num_experts_per_tok", 4),
             Catch::Contains("num_experts_per_tok 4 but model.experts_per_token is 8"));
  CHECK_THAT(check("norm_topk_prob", nullptr),  // transformers' default: false
             Catch::Contains("norm_topk_prob false but model.norm_topk_prob is true"));
  CHECK_THAT(check("mlp_only_layers", {0, 1}),
             Catch::Contains("mlp_only_layers [0, 1] but model.mlp_only_layers is []"));
  CHECK_THAT(check("shared_expert_intermediate_size", 2048),
             Catch::EndsWith("shared_expert_intermediate_size is set; the trainer's qwen3_moe "
                             "routes to its experts alone (no shared experts, no expert groups)"));
}

}  // namespace
}  // namespace tr
