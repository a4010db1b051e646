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
    absl::StatusOr<Config> c =
        parse_preset("qwen2.5-0.5b", {std::string("model.family=") + f->name});
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

}  // namespace
}  // namespace tr
