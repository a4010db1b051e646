// defines: model.rope_scaling's block (Hugging Face's rope_scaling), its fields listed once with
// their rope types, ranges and required-ness, and the one builder that the YAML reader and the
// config.json reader both use.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tr {

// model.rope_scaling, as Hugging Face's config.json spells it: {type: yarn, factor: 4.0,
// original_max_position_embeddings: 32768} (beta_fast 32, beta_slow 1, attention_factor
// 0.1 ln(factor) + 1 and truncate true unless given).
struct RopeScaling {
  std::string type = "none";  // none | yarn | llama3
  double factor = 1;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32, beta_slow = 1;              // yarn
  double attention_factor = 0;                       // yarn; 0: from factor
  bool truncate = true;                              // yarn
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  bool operator==(const RopeScaling&) const = default;
  std::string text() const;  // as one line for messages: none, or {type: yarn, ...}
};

// A rope block's value as its reader found it: a number, a boolean, or neither.
struct RopeValue {
  std::optional<double> number;
  std::optional<bool> flag;
  std::string text;  // as written, for messages
};

// The block of rope type `type` (none, yarn or llama3) from its other keys: each a field of that
// type, every required field given, each value finite and in its range. Errors are one line
// naming the field under `where` ("model.rope_scaling", "DIR/config.json: rope_scaling").
absl::StatusOr<RopeScaling> make_rope_scaling(
    const std::string& type, const std::vector<std::pair<std::string, RopeValue>>& keys,
    const std::string& where);

// The keys of every rope type, for suggestions.
std::vector<std::string> rope_keys();

}  // namespace tr
