// The config's keys as one table: section, key, kind, range, meaning and where each lives in
// Config. Parsing, validation messages, the resolved YAML, config differences and
// docs/config.md are all generated from it (config.cpp). Internal to trainer/.
#pragma once

#include <string>
#include <vector>

#include "trainer/config/config.h"

namespace YAML {
class Node;
}

namespace tr::config_detail {

enum class Kind { Int, IntOrAuto, Float, Bool, String, Sources, IntList, RopeScaling };

struct Field {
  const char* section;
  const char* key;
  Kind kind;
  double lo, hi;  // inclusive range for numbers
  const char* doc;
  void* (*member)(Config&);
  std::vector<std::string> choices = {};  // allowed strings, when non-empty
};

constexpr double kInf = 1e300;
constexpr double kMaxI = 9.0e18;

// A YAML node as it reads in an error message.
std::string scalar_text(const YAML::Node& n);
// model.rope_scaling's value (trainer/config/model_config.cpp).
absl::Status parse_rope_scaling(const YAML::Node& n, const std::string& name, RopeScaling* out);

// " (did you mean 'x'?)"-style hint for `word` among `candidates`, or "".
std::string suggest(const std::string& word, const std::vector<std::string>& candidates);

// Every key, in the order of docs/config.md and of the resolved YAML.
const std::vector<Field>& fields();
// The sections, in order.
const std::vector<std::string>& section_names();

}  // namespace tr::config_detail
