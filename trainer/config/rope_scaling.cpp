#include "trainer/config/rope_scaling.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainer/config/config_fields.h"

namespace tr {
namespace {

// One field of a rope block: the types that take it, whether they require it, and its range
// (lo excluded when lo_open). Exactly one of the members is set: its kind.
struct RopeField {
  const char* key;
  std::vector<std::string> types;
  bool required;
  double lo, hi;
  bool lo_open;
  double RopeScaling::*number = nullptr;
  int64_t RopeScaling::*whole = nullptr;
  bool RopeScaling::*flag = nullptr;
};

constexpr double kMaxFactor = 1e6;  // finite, and far above any published model's

const std::vector<RopeField>& rope_fields() {
  static const std::vector<RopeField> f = {
      {"factor", {"yarn", "llama3"}, true, 1, kMaxFactor, false, &RopeScaling::factor},
      {"original_max_position_embeddings",
       {"yarn", "llama3"},
       true,
       1,
       1 << 24,
       false,
       nullptr,
       &RopeScaling::original_max_position_embeddings},
      {"low_freq_factor", {"llama3"}, true, 0, kMaxFactor, true, &RopeScaling::low_freq_factor},
      {"high_freq_factor", {"llama3"}, true, 0, kMaxFactor, true, &RopeScaling::high_freq_factor},
      {"beta_fast", {"yarn"}, false, 0, kMaxFactor, true, &RopeScaling::beta_fast},
      {"beta_slow", {"yarn"}, false, 0, kMaxFactor, true, &RopeScaling::beta_slow},
      // 0: 0.1 ln(factor) + 1, as Hugging Face computes it when absent.
      {"attention_factor", {"yarn"}, false, 0, kMaxFactor, false, &RopeScaling::attention_factor},
      {"truncate", {"yarn"}, false, 0, 0, false, nullptr, nullptr, &RopeScaling::truncate},
  };
  return f;
}

bool takes(const RopeField& f, const std::string& type) {
  return std::find(f.types.begin(), f.types.end(), type) != f.types.end();
}

// "factor, original_max_position_embeddings, ..." of `type`, the required ones when `required`.
std::string keys_of(const std::string& type, bool required) {
  std::vector<std::string> k;
  for (const RopeField& f : rope_fields())
    if (takes(f, type) && (f.required || !required)) k.push_back(f.key);
  return k.empty() ? "no keys" : absl::StrJoin(k, ", ");
}

// Stores `v` as field `f` of `r`, or says why it cannot be.
absl::Status set_field(const RopeField& f, const RopeValue& v, const std::string& name,
                       RopeScaling& r) {
  if (f.flag) {
    if (!v.flag)
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected a bool, got ", v.text));
    r.*f.flag = *v.flag;
    return absl::OkStatus();
  }
  const std::optional<double>& x = v.number;
  const bool in_range = x && std::isfinite(*x) && (f.lo_open ? *x > f.lo : *x >= f.lo) &&
                        *x <= f.hi && (!f.whole || std::floor(*x) == *x);
  if (!in_range)
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s must be a finite %s in %c%g, %g] (got %s)", name, f.whole ? "whole number" : "number",
        f.lo_open ? '(' : '[', f.lo, f.hi, v.text));
  if (f.whole)
    r.*f.whole = static_cast<int64_t>(*x);
  else
    r.*f.number = *x;
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> rope_keys() {
  std::vector<std::string> k;
  for (const RopeField& f : rope_fields()) k.push_back(f.key);
  return k;
}

absl::StatusOr<RopeScaling> make_rope_scaling(
    const std::string& type, const std::vector<std::pair<std::string, RopeValue>>& keys,
    const std::string& where) {
  if (type != "yarn" && type != "llama3" && type != "none")
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".type must be yarn, llama3 or none (got '", type,
                     "'); other Hugging Face rope types are not supported"));
  RopeScaling r;
  r.type = type;
  for (const auto& [key, value] : keys) {
    const std::string name = absl::StrCat(where, ".", key);
    auto f = std::find_if(rope_fields().begin(), rope_fields().end(),
                          [&](const RopeField& x) { return key == x.key; });
    if (f == rope_fields().end()) {
      const std::string hint = config_detail::suggest(key, rope_keys());
      return absl::InvalidArgumentError(absl::StrCat(
          name, " is not a rope_scaling key",
          hint.empty() ? absl::StrCat("; a ", type, " block has ", keys_of(type, false)) : hint));
    }
    if (!takes(*f, type))
      return absl::InvalidArgumentError(absl::StrCat(name, " is not a key of a ", type,
                                                     " block, which has ", keys_of(type, false)));
    if (absl::Status st = set_field(*f, value, name, r); !st.ok()) return st;
  }
  for (const RopeField& f : rope_fields()) {
    const bool given =
        std::any_of(keys.begin(), keys.end(), [&](const auto& kv) { return kv.first == f.key; });
    if (f.required && takes(f, type) && !given)
      return absl::InvalidArgumentError(absl::StrCat(where, ".", f.key, " is missing; a ", type,
                                                     " block needs ", keys_of(type, true)));
  }
  if (type == "llama3" && !(r.high_freq_factor > r.low_freq_factor))
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: llama3 needs low_freq_factor < high_freq_factor (got %g and %g)",
                        where, r.low_freq_factor, r.high_freq_factor));
  return r;
}

std::string RopeScaling::text() const {
  if (type == "llama3")
    return absl::StrFormat(
        "{type: llama3, factor: %g, low_freq_factor: %g, high_freq_factor: %g, "
        "original_max_position_embeddings: %d}",
        factor, low_freq_factor, high_freq_factor, original_max_position_embeddings);
  if (type != "yarn") return "none";
  return absl::StrFormat(
      "{type: yarn, factor: %g, original_max_position_embeddings: %d, beta_fast: %g, "
      "beta_slow: %g, attention_factor: %g, truncate: %s}",
      factor, original_max_position_embeddings, beta_fast, beta_slow, attention_factor,
      truncate ? "true" : "false");
}

}  // namespace tr
