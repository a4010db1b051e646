// The config's keys as one table: section, key, kind, range, meaning, where each lives in Config
// and the rules it keeps with other keys. Parsing, validation, the resolved YAML, config
// differences and docs/config.md are all generated from it (config.cpp). Internal to trainer/.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "trainer/config/config.h"

namespace YAML {
class Node;
}

namespace tr::config_detail {

enum class Kind { Int, IntOrAuto, Float, Bool, String, Sources, IntList, RopeScaling };

// What a key's value must be: its kind, inclusive range (numbers) and allowed strings (when
// any). A Field's, or a key of another file read the same way (trainer/plan/hardware_file.cpp).
struct ValueSpec {
  Kind kind;
  double lo, hi;
  std::vector<std::string> choices = {};
};

// A rule between a key and others, run on the parsed config: OK, or the one-line error.
using Check = absl::Status (*)(const Config&);

struct Field {
  const char* section;
  const char* key;
  Kind kind;
  double lo, hi;  // inclusive range for numbers
  const char* doc;
  void* (*member)(Config&);
  std::vector<std::string> choices = {};  // allowed strings, when non-empty
  Check check = nullptr;                  // the key's rules with other keys, if any
  ValueSpec value() const { return {kind, lo, hi, choices}; }
  // This entry with `c` as its rules: TR_FIELD(...).rule(c).
  Field rule(Check c) && {
    check = c;
    return std::move(*this);
  }
};

constexpr double kInf = 1e300;
constexpr double kMaxI = 9.0e18;

// A float as an error message prints it: shortest round trip ("3e-04", "1").
std::string fmt_double(double v);
// A YAML node as it reads in an error message.
std::string scalar_text(const YAML::Node& n);
// model.rope_scaling's value (trainer/config/model_config.cpp).
absl::Status parse_rope_scaling(const YAML::Node& n, const std::string& name, RopeScaling* out);

// Reads `n` as `spec` says into *out, or the one-line error naming `name`. *out is the kind's
// type: int64_t (Int, IntOrAuto: auto is 0), double, bool, std::string, std::vector<DataSource>,
// std::vector<int64_t> or RopeScaling.
absl::Status parse_value(const ValueSpec& spec, const std::string& name, const YAML::Node& n,
                         void* out);
// A mapping's keys as strings: each a plain scalar, none repeated; else the error naming `where`.
absl::StatusOr<std::vector<std::string>> map_keys(const YAML::Node& map, const std::string& where);

// "; did you mean 'x'?"-style hint for `word` among `candidates`, or "".
std::string suggest(const std::string& word, const std::vector<std::string>& candidates);

// Every key, in the order of docs/config.md and of the resolved YAML.
const std::vector<Field>& fields();
// The sections, in order.
const std::vector<std::string>& section_names();

}  // namespace tr::config_detail
