// The config's keys as one table: section, key, kind, range, meaning and where each lives in
// Config. Parsing, validation messages, the resolved YAML, config differences and
// docs/config.md are all generated from it (config.cpp). Internal to trainer/.
#pragma once

#include <string>
#include <vector>

#include "trainer/config.h"

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

// Every key, in the order of docs/config.md and of the resolved YAML.
const std::vector<Field>& fields();
// The sections, in order.
const std::vector<std::string>& section_names();

}  // namespace tr::config_detail
