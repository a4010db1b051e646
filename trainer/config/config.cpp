#include "trainer/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "trainer/config/config_fields.h"

namespace tr {

namespace config_detail {

// ---- "did you mean" ----
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string suggest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(3, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best.empty() ? "" : absl::StrCat("; did you mean '", best, "'?");
}

std::string fmt_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "nothing";
}

}  // namespace config_detail

namespace {

using absl::InvalidArgumentError;
using absl::Status;
using config_detail::Field;
using config_detail::fields;
using config_detail::fmt_double;
using config_detail::Kind;
using config_detail::kMaxI;
using config_detail::scalar_text;
using config_detail::section_names;
using config_detail::suggest;

std::vector<std::string> keys_of(const std::string& section) {
  std::vector<std::string> k;
  for (const auto& f : fields())
    if (section == f.section) k.push_back(f.key);
  return k;
}

// ---- scalar parsing ----

// A float as YAML 1.1 readers (PyYAML) take it for a float, and shortest round-trip: "1.0e-06",
// not "1e-06" (a string there); "3.0", not "3" (an int).
std::string yaml_float(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  std::string s = fmt_double(v);
  if (s.find('.') != std::string::npos) return s;
  const size_t e = s.find('e');
  return e == std::string::npos ? s + ".0" : s.substr(0, e) + ".0" + s.substr(e);
}

// Names the bound the value broke: below the lowest ("> 0" for positive-only fields), above the
// highest, or the whole range where both are ordinary numbers. `text` is the value as given: an
// int64 near its top does not survive a round trip through a double.
Status range_error(const std::string& name, double v, const std::string& text,
                   const config_detail::ValueSpec& f) {
  auto num = [&](double x) {
    return f.kind == Kind::Float ? fmt_double(x) : absl::StrCat(static_cast<int64_t>(x));
  };
  std::string lo = num(f.lo), hi = num(f.hi);
  const std::string got = absl::StrCat(" (got ", text, ")");
  if (f.hi >= kMaxI && v > f.hi)
    return InvalidArgumentError(absl::StrCat(name, " must be at most ", hi, got));
  if (f.lo == 1e-300) return InvalidArgumentError(absl::StrCat(name, " must be > 0", got));
  if (f.hi >= kMaxI) return InvalidArgumentError(absl::StrCat(name, " must be >= ", lo, got));
  return InvalidArgumentError(absl::StrCat(name, " must be in [", lo, ", ", hi, "]", got));
}

Status parse_sources(const YAML::Node& n, const std::string& name, std::vector<DataSource>* out) {
  out->clear();
  if (n.IsNull()) return absl::OkStatus();
  if (!n.IsSequence())
    return InvalidArgumentError(
        absl::StrCat(name, ": expected a list of {path: PREFIX, weight: W}, got ", scalar_text(n)));
  for (size_t i = 0; i < n.size(); ++i) {
    const YAML::Node& e = n[i];
    std::string item = absl::StrCat(name, "[", i, "]");
    DataSource s;
    if (e.IsScalar()) {
      s.path = e.Scalar();
    } else if (e.IsMap()) {
      for (const auto& kv : e) {
        if (!kv.first.IsScalar())
          return InvalidArgumentError(
              absl::StrCat(item, ": keys must be path or weight, got ", scalar_text(kv.first)));
        const std::string k = kv.first.Scalar();
        if (k == "path") {
          if (!kv.second.IsScalar())
            return InvalidArgumentError(absl::StrCat(item, ".path: expected a string"));
          s.path = kv.second.Scalar();
        } else if (k == "weight") {
          try {
            s.weight = kv.second.as<double>();
          } catch (const YAML::Exception&) {
            return InvalidArgumentError(
                absl::StrCat(item, ".weight: expected a number, got ", scalar_text(kv.second)));
          }
        } else {
          return InvalidArgumentError(
              absl::StrCat("unknown key '", k, "' in ", item, suggest(k, {"path", "weight"})));
        }
      }
    } else {
      return InvalidArgumentError(absl::StrCat(item, ": expected {path: PREFIX, weight: W}"));
    }
    if (s.path.empty())
      return InvalidArgumentError(absl::StrCat(item, ".path is missing or empty"));
    if (!(s.weight > 0))
      return InvalidArgumentError(
          absl::StrCat(item, ".weight must be > 0 (got ", fmt_double(s.weight), ")"));
    out->push_back(s);
  }
  return absl::OkStatus();
}

}  // namespace

namespace config_detail {

Status parse_value(const ValueSpec& f, const std::string& name, const YAML::Node& n, void* p) {
  try {
    switch (f.kind) {
      case Kind::IntOrAuto:
        if (n.IsScalar() && n.Scalar() == "auto") {
          *static_cast<int64_t*>(p) = 0;
          return absl::OkStatus();
        }
        [[fallthrough]];
      case Kind::Int: {
        if (!n.IsScalar()) throw YAML::Exception(YAML::Mark(), "");
        int64_t v = n.as<int64_t>();
        if (v < f.lo || v > f.hi)
          return range_error(name, static_cast<double>(v), absl::StrCat(v), f);
        *static_cast<int64_t*>(p) = v;
        return absl::OkStatus();
      }
      case Kind::Float: {
        if (!n.IsScalar()) throw YAML::Exception(YAML::Mark(), "");
        double v = n.as<double>();
        if (!(v >= f.lo && v <= f.hi)) return range_error(name, v, fmt_double(v), f);
        *static_cast<double*>(p) = v;
        return absl::OkStatus();
      }
      case Kind::Bool:
        if (!n.IsScalar()) throw YAML::Exception(YAML::Mark(), "");
        *static_cast<bool*>(p) = n.as<bool>();
        return absl::OkStatus();
      case Kind::String: {
        if (!n.IsScalar() && !n.IsNull()) throw YAML::Exception(YAML::Mark(), "");
        std::string v = n.IsNull() ? "" : n.Scalar();
        if (!f.choices.empty() &&
            std::find(f.choices.begin(), f.choices.end(), v) == f.choices.end())
          return InvalidArgumentError(absl::StrCat(name, " must be one of ",
                                                   absl::StrJoin(f.choices, "|"), " (got '", v,
                                                   "')", suggest(v, f.choices)));
        *static_cast<std::string*>(p) = v;
        return absl::OkStatus();
      }
      case Kind::Sources:
        return parse_sources(n, name, static_cast<std::vector<DataSource>*>(p));
      case Kind::RopeScaling:
        return config_detail::parse_rope_scaling(n, name, static_cast<RopeScaling*>(p));
      case Kind::IntList: {
        if (!n.IsSequence() && !n.IsNull()) throw YAML::Exception(YAML::Mark(), "");
        std::vector<int64_t> v;
        for (size_t i = 0; n.IsSequence() && i < n.size(); ++i) {
          const int64_t x = n[i].as<int64_t>();
          if (x < f.lo || x > f.hi)
            return range_error(absl::StrCat(name, "[", i, "]"), static_cast<double>(x),
                               absl::StrCat(x), f);
          v.push_back(x);
        }
        *static_cast<std::vector<int64_t>*>(p) = v;
        return absl::OkStatus();
      }
    }
  } catch (const YAML::Exception&) {
    const char* want = f.kind == Kind::Int         ? "an integer"
                       : f.kind == Kind::IntOrAuto ? "an integer or auto"
                       : f.kind == Kind::Float     ? "a number"
                       : f.kind == Kind::Bool      ? "true or false"
                       : f.kind == Kind::IntList   ? "a list of integers"
                                                   : "a string";
    return InvalidArgumentError(absl::StrCat(name, ": expected ", want, ", got ", scalar_text(n)));
  }
  return absl::OkStatus();
}

// A mapping's keys as strings: every key a scalar, none repeated.
absl::StatusOr<std::vector<std::string>> map_keys(const YAML::Node& map, const std::string& where) {
  std::vector<std::string> keys;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar())
      return InvalidArgumentError(
          absl::StrCat(where, ": keys must be plain names, got ", scalar_text(kv.first)));
    const std::string k = kv.first.Scalar();
    if (std::find(keys.begin(), keys.end(), k) != keys.end())
      return InvalidArgumentError(absl::StrCat(where, ": key '", k, "' appears twice"));
    keys.push_back(k);
  }
  return keys;
}

}  // namespace config_detail

namespace {

using config_detail::map_keys;

Status parse_field(const Field& f, const YAML::Node& n, Config& cfg) {
  return config_detail::parse_value(f.value(), absl::StrCat(f.section, ".", f.key), n,
                                    f.member(cfg));
}

// ---- overrides: "section.key=value", value parsed as YAML ----
Status apply_override(YAML::Node& root, const std::string& set) {
  size_t eq = set.find('=');
  size_t dot = set.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq || dot == 0 || dot + 1 == eq)
    return InvalidArgumentError(absl::StrCat(
        "--set '", set, "': expected section.key=value, e.g. --set train.micro_batch=2"));
  std::string section = set.substr(0, dot), key = set.substr(dot + 1, eq - dot - 1);
  YAML::Node value;
  try {
    value = YAML::Load(set.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(
        absl::StrCat("--set '", set, "': value is not valid YAML: ", e.msg));
  }
  if (root[section] && !root[section].IsMap())
    return InvalidArgumentError(absl::StrCat("section '", section, "' must be a mapping"));
  root[section][key] = value;
  return absl::OkStatus();
}

// ---- validation: the model's shape given, then each key's rules (config_fields.cpp) ----
Status validate(const Config& c) {
  const ModelConfig& m = c.model;
  for (auto [v, n] : {std::pair{m.hidden_size, "hidden_size"},
                      {m.intermediate_size, "intermediate_size"},
                      {m.num_layers, "num_layers"},
                      {m.num_heads, "num_heads"},
                      {m.num_kv_heads, "num_kv_heads"},
                      {m.head_dim, "head_dim"},
                      {m.vocab_size, "vocab_size"},
                      {m.max_seq_len, "max_seq_len"}})
    if (v == 0)
      return InvalidArgumentError(absl::StrCat("model.", n,
                                               " is not set: give it or choose a model.preset (",
                                               absl::StrJoin(preset_names(), ", "), ")"));
  for (const Field& f : fields())
    if (f.check != nullptr)
      if (Status st = f.check(c); !st.ok()) return st;
  return absl::OkStatus();
}

// ---- YAML output ----
void emit_field(YAML::Emitter& out, const Field& f, Config& c) {
  void* p = f.member(c);
  out << YAML::Key << f.key << YAML::Value;
  switch (f.kind) {
    case Kind::IntOrAuto:
      if (*static_cast<int64_t*>(p) == 0) {
        out << "auto";
        break;
      }
      [[fallthrough]];
    case Kind::Int:
      out << *static_cast<int64_t*>(p);
      break;
    case Kind::Float:
      out << yaml_float(*static_cast<double*>(p));
      break;
    case Kind::Bool:
      out << *static_cast<bool*>(p);
      break;
    case Kind::String:
      out << YAML::DoubleQuoted << *static_cast<std::string*>(p);
      break;
    case Kind::Sources:
      out << YAML::BeginSeq;
      for (const DataSource& s : *static_cast<std::vector<DataSource>*>(p))
        out << YAML::Flow << YAML::BeginMap << YAML::Key << "path" << YAML::Value
            << YAML::DoubleQuoted << s.path << YAML::Key << "weight" << YAML::Value
            << yaml_float(s.weight) << YAML::EndMap;
      out << YAML::EndSeq;
      break;
    case Kind::IntList:
      out << YAML::Flow << *static_cast<std::vector<int64_t>*>(p);
      break;
    case Kind::RopeScaling: {
      const RopeScaling& r = *static_cast<RopeScaling*>(p);
      if (r.type == "llama3") {
        out << YAML::Flow << YAML::BeginMap << YAML::Key << "type" << YAML::Value << r.type
            << YAML::Key << "factor" << YAML::Value << yaml_float(r.factor) << YAML::Key
            << "low_freq_factor" << YAML::Value << yaml_float(r.low_freq_factor) << YAML::Key
            << "high_freq_factor" << YAML::Value << yaml_float(r.high_freq_factor) << YAML::Key
            << "original_max_position_embeddings" << YAML::Value
            << r.original_max_position_embeddings << YAML::EndMap;
        break;
      }
      if (r.type != "yarn") {
        out << "none";
        break;
      }
      out << YAML::Flow << YAML::BeginMap << YAML::Key << "type" << YAML::Value << r.type
          << YAML::Key << "factor" << YAML::Value << yaml_float(r.factor) << YAML::Key
          << "original_max_position_embeddings" << YAML::Value << r.original_max_position_embeddings
          << YAML::Key << "beta_fast" << YAML::Value << yaml_float(r.beta_fast) << YAML::Key
          << "beta_slow" << YAML::Value << yaml_float(r.beta_slow) << YAML::Key
          << "attention_factor" << YAML::Value << yaml_float(r.attention_factor) << YAML::Key
          << "truncate" << YAML::Value << r.truncate << YAML::EndMap;
      break;
    }
  }
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Int:
      return "int";
    case Kind::IntOrAuto:
      return "int or auto";
    case Kind::Float:
      return "float";
    case Kind::Bool:
      return "bool";
    case Kind::String:
      return "string";
    case Kind::Sources:
      return "list";
    case Kind::IntList:
      return "list of int";
    case Kind::RopeScaling:
      return "none or map";
  }
  return "?";
}

// Every section and key known, each once; values are checked by parse_field.
Status check_keys(const YAML::Node& root, const std::string& origin) {
  absl::StatusOr<std::vector<std::string>> sections = map_keys(root, origin);
  if (!sections.ok()) return sections.status();
  for (const std::string& s : *sections) {
    if (std::find(section_names().begin(), section_names().end(), s) == section_names().end())
      return InvalidArgumentError(
          absl::StrCat("unknown section '", s, "' in ", origin, suggest(s, section_names())));
    const YAML::Node sec = root[s];
    if (sec.IsNull()) continue;
    if (!sec.IsMap())
      return InvalidArgumentError(
          absl::StrCat("section '", s, "' in ", origin, " must be a mapping"));
    absl::StatusOr<std::vector<std::string>> keys =
        map_keys(sec, absl::StrCat(origin, ": section '", s, "'"));
    if (!keys.ok()) return keys.status();
    const std::vector<std::string> known = keys_of(s);
    for (const std::string& k : *keys)
      if (std::find(known.begin(), known.end(), k) == known.end())
        return InvalidArgumentError(
            absl::StrCat("unknown key '", s, ".", k, "' in ", origin, suggest(k, known)));
  }
  return absl::OkStatus();
}

// The section and key an override names (apply_override has checked its shape), each known, or
// an error that names the override (not the file it overrides).
Status check_override_key(const std::string& set) {
  const size_t dot = set.find('.'), eq = set.find('=');
  if (dot == std::string::npos || eq == std::string::npos || dot > eq) return absl::OkStatus();
  const std::string s = set.substr(0, dot), k = set.substr(dot + 1, eq - dot - 1);
  const std::string origin = absl::StrCat("--set '", set, "'");
  if (std::find(section_names().begin(), section_names().end(), s) == section_names().end())
    return InvalidArgumentError(
        absl::StrCat("unknown section '", s, "' in ", origin, suggest(s, section_names())));
  const std::vector<std::string> known = keys_of(s);
  if (std::find(known.begin(), known.end(), k) == known.end())
    return InvalidArgumentError(
        absl::StrCat("unknown key '", s, ".", k, "' in ", origin, suggest(k, known)));
  return absl::OkStatus();
}

const Field& field_named(const std::string& section, const std::string& key) {
  for (const Field& f : fields())
    if (section == f.section && key == f.key) return f;
  TR_ASSERT(false, "no config field " + section + "." + key);
}

Status parse_root(const YAML::Node& root, const std::string& origin, Config* cfg) {
  if (!root.IsMap())
    return InvalidArgumentError(
        absl::StrCat(origin, ": the top level must be a mapping of sections"));
  if (Status st = check_keys(root, origin); !st.ok()) return st;
  // The preset first, so that explicit model fields override it.
  if (root["model"] && root["model"]["preset"]) {
    if (Status st = parse_field(field_named("model", "preset"), root["model"]["preset"], *cfg);
        !st.ok())
      return st;
    if (!cfg->model.preset.empty())
      if (Status st = apply_model_preset(cfg->model.preset, &cfg->model); !st.ok()) return st;
  }
  for (const Field& f : fields()) {
    if (std::string(f.key) == "preset") continue;
    YAML::Node sec = root[f.section];
    if (!sec || !sec[f.key]) continue;
    if (Status st = parse_field(f, sec[f.key], *cfg); !st.ok()) return st;
  }
  return validate(*cfg);
}

}  // namespace

absl::StatusOr<Config> parse_config(const std::string& yaml_text,
                                    const std::vector<std::string>& sets,
                                    const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(absl::StrCat(origin, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                             ": invalid YAML: ", e.msg));
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  // The file's own keys first, so that an error names the file or the override it is in.
  if (root.IsMap())
    if (Status st = check_keys(root, origin); !st.ok()) return st;
  for (const std::string& s : sets) {
    if (Status st = apply_override(root, s); !st.ok()) return st;
    if (Status st = check_override_key(s); !st.ok()) return st;
  }
  Config cfg;
  try {
    if (Status st = parse_root(root, origin, &cfg); !st.ok()) return st;
  } catch (const YAML::Exception& e) {  // a shape of document the checks above did not foresee
    return InvalidArgumentError(absl::StrCat(origin, ":", e.mark.line + 1, ": ", e.msg));
  }
  return cfg;
}

absl::StatusOr<Config> load_config(const std::string& path, const std::vector<std::string>& sets) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    return absl::InvalidArgumentError(
        absl::StrCat("config '", path, "' is not a file; --config takes a YAML file"));
  std::ifstream in(path);
  if (!in)
    return absl::NotFoundError(
        absl::StrCat("config file '", path, "' cannot be read; check --config"));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), sets, path);
}

std::string to_yaml(const Config& cfg_in) {
  Config cfg = cfg_in;
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const std::string& sec : section_names()) {
    out << YAML::Key << sec << YAML::Value << YAML::BeginMap;
    for (const Field& f : fields())
      if (sec == f.section) emit_field(out, f, cfg);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::vector<std::string> config_differences(const std::string& before_yaml,
                                            const std::string& after_yaml) {
  std::vector<std::string> out;
  YAML::Node a, b;
  try {
    a = YAML::Load(before_yaml);
    b = YAML::Load(after_yaml);
  } catch (const YAML::Exception&) {
    return {"the checkpoint's config is not valid YAML"};
  }
  auto text = [](const YAML::Node& n) {
    if (!n) return std::string("(absent)");
    YAML::Emitter e;
    e << YAML::Flow << n;
    return std::string(e.c_str());
  };
  // Numbers by value: "1e-06" (an older trainer's YAML) and "1.0e-06" are the same float.
  auto same_number = [](const YAML::Node& x, const YAML::Node& y) {
    double u = 0, v = 0;
    return x && y && x.IsScalar() && y.IsScalar() && YAML::convert<double>::decode(x, u) &&
           YAML::convert<double>::decode(y, v) && u == v;
  };
  for (const Field& f : fields()) {
    const YAML::Node xa = a[f.section][f.key], yb = b[f.section][f.key];
    std::string x = text(xa), y = text(yb);
    if (x != y && !(f.kind == Kind::Float && same_number(xa, yb)))
      out.push_back(absl::StrCat(f.section, ".", f.key, ": ", x, " -> ", y));
  }
  return out;
}

std::string config_docs_markdown() {
  Config defaults;
  std::string md = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const Field& f : fields()) {
    YAML::Emitter e;
    e << YAML::BeginMap;
    emit_field(e, f, defaults);
    e << YAML::EndMap;
    std::string def =
        YAML::Load(e.c_str())[f.key].IsSequence() ? "[]" : YAML::Load(e.c_str())[f.key].Scalar();
    if (def.empty()) def = "\"\"";
    std::string doc = f.doc;
    if (!f.choices.empty()) doc += " (" + absl::StrJoin(f.choices, " \\| ") + ")";
    md += absl::StrCat("| `", f.section, ".", f.key, "` | ", kind_name(f.kind), " | `", def, "` | ",
                       doc, " |\n");
  }
  return md;
}

}  // namespace tr
