// defines: the table of model families, and what every family uses.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "nlohmann/json.hpp"
#include "trainer/family/family.h"

namespace tr {

// Each family's record, in its own file.
extern const Family kQwen2Family;
extern const Family kLlamaFamily;
extern const Family kQwen3Family;
extern const Family kQwen3MoeFamily;

std::span<const Family* const> families() {
  static constexpr const Family* kTable[] = {&kQwen2Family, &kLlamaFamily, &kQwen3Family,
                                             &kQwen3MoeFamily};
  return kTable;
}

const Family* find_family(const std::string& name) {
  for (const Family* f : families())
    if (name == f->name) return f;
  return nullptr;
}

const Family& family_of(const std::string& name) {
  const Family* f = find_family(name);
  TR_ASSERT(f != nullptr, "model.family is one of families() (the config checks it)");
  return *f;
}

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const Family* f : families()) names.emplace_back(f->name);
  return names;
}

std::string join_families(const std::function<std::string(const Family&, size_t)>& text,
                          const char* last) {
  const std::span<const Family* const> all = families();
  std::string out;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i > 0) out += i + 1 == all.size() ? last : ", ";
    out += text(*all[i], i);
  }
  return out;
}

absl::Status refuse_biases(const nlohmann::json& config, const char* family) {
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (config.value(key, false))
      return absl::InvalidArgumentError(
          absl::StrCat(key, " is true; the trainer's ", family, " family has none"));
  return absl::OkStatus();
}

void full_attention_keys(nlohmann::ordered_json& config) {
  config["use_sliding_window"] = false;
  config["sliding_window"] = nullptr;
  // A copy first: adding a key may move the others.
  const nlohmann::ordered_json layers = config.at("num_hidden_layers");
  config["max_window_layers"] = layers;
}

}  // namespace tr
