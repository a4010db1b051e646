#include "tools/flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace tr::tools {

bool AbslParseFlag(absl::string_view text, Bytes* out, std::string* error) {
  int64_t unit = 1;
  if (!text.empty()) {
    switch (absl::ascii_tolower(text.back())) {
      case 'k':
        unit = int64_t{1} << 10;
        break;
      case 'm':
        unit = int64_t{1} << 20;
        break;
      case 'g':
        unit = int64_t{1} << 30;
        break;
      default:
        break;
    }
  }
  if (unit != 1) text.remove_suffix(1);
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < 0 || v > std::numeric_limits<int64_t>::max() / unit) {
    *error = "is not a size (e.g. 4096, 64K, 1G)";
    return false;
  }
  out->value = v * unit;
  return true;
}

std::string AbslUnparseFlag(Bytes b) {
  for (const auto& [shift, suffix] : {std::pair{30, "G"}, {20, "M"}, {10, "K"}})
    if (b.value > 0 && b.value % (int64_t{1} << shift) == 0)
      return absl::StrCat(b.value >> shift, suffix);
  return absl::StrCat(b.value);
}

namespace {

// An integer of at least `min`, or the reason it is not.
bool parse_at_least(absl::string_view text, int64_t min, int64_t* out, std::string* error) {
  if (absl::SimpleAtoi(text, out) && *out >= min) return true;
  *error = min > 0 ? "is not a positive integer" : "is not a non-negative integer";
  return false;
}

}  // namespace

bool AbslParseFlag(absl::string_view text, Count* out, std::string* error) {
  return parse_at_least(text, 0, &out->value, error);
}
std::string AbslUnparseFlag(Count c) {
  return absl::StrCat(c.value);
}
bool AbslParseFlag(absl::string_view text, Positive* out, std::string* error) {
  return parse_at_least(text, 1, &out->value, error);
}
std::string AbslUnparseFlag(Positive p) {
  return absl::StrCat(p.value);
}

bool AbslParseFlag(absl::string_view text, Repeated* out, std::string*) {
  out->values = absl::StrSplit(text, '\0');
  if (out->values.back().empty()) out->values.pop_back();  // after the last value's '\0'
  return true;
}
std::string AbslUnparseFlag(const Repeated& r) {
  std::string s;
  for (const std::string& v : r.values) absl::StrAppend(&s, v, absl::string_view("\0", 1));
  return s;
}

namespace {

// A flag's name as the command line and the help spell it.
std::string dashed(absl::string_view name) {
  return absl::StrReplaceAll(name, {{"_", "-"}});
}

// Abseil's CommandLineFlag does not name its type: the types the tools use, by their ids, with
// what --help calls them and why a value of theirs fails to parse when Abseil gives no reason.
struct TypeName {
  std::string name, not_a;
};
template <typename T>
bool is(const absl::CommandLineFlag& f) {
  return f.IsOfType<T>() || f.IsOfType<std::optional<T>>();
}
TypeName type_of(const absl::CommandLineFlag& f) {
  if (f.IsOfType<bool>()) return {"bool", "is not true or false"};
  if (is<int32_t>(f) || is<int64_t>(f)) return {"integer", "is not an integer"};
  if (is<double>(f)) return {"number", "is not a number"};
  if (is<std::string>(f)) return {"string", ""};
  if (is<std::vector<std::string>>(f)) return {"comma-separated list", ""};
  if (is<Bytes>(f)) return {"size", ""};
  if (is<Count>(f)) return {"non-negative integer", ""};
  if (is<Positive>(f)) return {"positive integer", ""};
  if (f.IsOfType<Repeated>()) return {"string, repeatable", ""};
  return {"value", "is not a valid value"};
}

// Whether ABSL_FLAG defined `f` in `file`. Abseil reports a flag's file without the leading
// slashes of its path: compared alike.
bool defined_in(const absl::CommandLineFlag& f, absl::string_view file) {
  auto trimmed = [](absl::string_view path) {
    return path.substr(std::min(path.find_first_not_of("/\\"), path.size()));
  };
  return !f.IsRetired() && trimmed(f.Filename()) == trimmed(file);
}

// The tool's flags, by name.
std::vector<absl::CommandLineFlag*> flags_of(const Usage& usage) {
  std::vector<absl::CommandLineFlag*> out;
  for (const auto& [name, flag] : absl::GetAllFlags())
    if (defined_in(*flag, usage.file)) out.push_back(flag);
  std::sort(out.begin(), out.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  return out;
}

absl::CommandLineFlag* find(const Usage& usage, absl::string_view name) {
  absl::CommandLineFlag* f = absl::FindCommandLineFlag(absl::StrReplaceAll(name, {{"-", "_"}}));
  return f != nullptr && defined_in(*f, usage.file) ? f : nullptr;
}

size_t edit_distance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// "unknown flag --outptu; did you mean --output? (--help lists them)": the nearest of the tool's
// flags by edit distance, when it is near enough to be a typo.
absl::Status unknown_flag(const Usage& usage, absl::string_view name) {
  const std::string given = dashed(name);
  std::string nearest;
  size_t best = std::max<size_t>(2, given.size() / 3) + 1;
  for (const absl::CommandLineFlag* f : flags_of(usage)) {
    const std::string candidate = dashed(f->Name());
    if (const size_t d = edit_distance(given, candidate); d < best) {
      best = d;
      nearest = candidate;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown flag --", name,
                   nearest.empty() ? "" : absl::StrCat("; did you mean --", nearest, "?"),
                   " (--help lists them)"));
}

// Abseil's parse error says "Illegal value 'V' specified for flag 'N'; REASON": REASON, or the
// type's own when Abseil gives none, or Abseil's whole text when it is worded otherwise.
std::string reason(const absl::CommandLineFlag& f, absl::string_view value,
                   absl::string_view error) {
  const std::string head =
      absl::StrCat("Illegal value '", value, "' specified for flag '", f.Name(), "'");
  if (!absl::StartsWith(error, head)) return std::string(error);
  absl::string_view rest = absl::StripPrefix(error.substr(head.size()), "; ");
  return rest.empty() ? type_of(f).not_a : std::string(rest);
}

}  // namespace

absl::StatusOr<Parsed> parse_flags(int argc, const char* const* argv, const Usage& usage) {
  Parsed parsed;
  std::map<const absl::CommandLineFlag*, std::string> so_far;  // a Repeated flag's values
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      parsed.help = true;
      return parsed;
    }
    if (arg == "--") {
      parsed.positionals.insert(parsed.positionals.end(), argv + i + 1, argv + argc);
      break;
    }
    if (!absl::StartsWith(arg, "--")) {
      parsed.positionals.emplace_back(arg);
      continue;
    }
    absl::string_view name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != absl::string_view::npos) {
      value = std::string(name.substr(eq + 1));
      name = name.substr(0, eq);
    }
    absl::CommandLineFlag* flag = find(usage, name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {  // --noname: a bool flag's false
      flag = find(usage, name.substr(2));
      if (flag == nullptr || !flag->IsOfType<bool>()) return unknown_flag(usage, name);
      if (value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      value = "false";
    }
    if (flag == nullptr) return unknown_flag(usage, name);
    if (!value && flag->IsOfType<bool>()) value = "true";
    if (!value && i + 1 == argc)
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value; see --help"));
    if (!value) value = argv[++i];
    std::string text = *value, error;
    if (flag->IsOfType<Repeated>()) text = so_far[flag] += *value + '\0';
    if (!flag->ParseFrom(text, &error))
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " '", *value, "' ", reason(*flag, text, error)));
  }
  if (!usage.positionals && !parsed.positionals.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parsed.positionals[0], "'; see --help"));
  return parsed;
}

namespace {

// The words of `text`: split at spaces, but not inside [...] when `groups` (a usage line's
// optional parts stay whole).
std::vector<std::string> words(absl::string_view text, bool groups) {
  std::vector<std::string> out(1);
  int depth = 0;
  for (const char c : text) {
    depth += groups && c == '[' ? 1 : groups && c == ']' && depth > 0 ? -1 : 0;
    if (c != ' ' || depth > 0)
      out.back() += c;
    else if (!out.back().empty())
      out.emplace_back();
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

// `text` in lines of at most `width` characters (a longer word alone): the first after `first`,
// the others after `rest`.
std::string wrap(absl::string_view text, size_t width, absl::string_view first,
                 absl::string_view rest, bool groups = false) {
  std::string out, line;
  auto flush = [&] {
    absl::StrAppend(&out, out.empty() ? first : rest, line, "\n");
    line.clear();
  };
  for (const std::string& word : words(text, groups)) {
    const size_t indent = (out.empty() ? first : rest).size();
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) flush();
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) flush();
  return out;
}

}  // namespace

std::string help_text(const Usage& usage) {
  std::string out;
  // Each form of the usage line; its continuation lines start below the tool's arguments.
  const std::string below(std::string("usage: ").size() + usage.tool.size() + 1, ' ');
  for (absl::string_view form : absl::StrSplit(usage.synopsis, '\n', absl::SkipEmpty()))
    absl::StrAppend(&out, wrap(form, 100, out.empty() ? "usage: " : "       ", below, true));
  for (absl::string_view paragraph : absl::StrSplit(usage.about, '\n', absl::SkipEmpty()))
    absl::StrAppend(&out, wrap(paragraph, 100, "  ", "  "));
  absl::StrAppend(&out, "flags (--name=VALUE or --name VALUE):\n");
  for (const absl::CommandLineFlag* f : flags_of(usage)) {
    const std::string def = f->DefaultValue();
    absl::StrAppend(&out, "  --", dashed(f->Name()), " (", type_of(*f).name,
                    def.empty() ? "" : absl::StrCat("; default ", def), ")\n",
                    wrap(f->Help(), 100, "      ", "      "));
  }
  return out;
}

std::vector<std::string> parse_or_exit(int argc, char** argv, const Usage& usage) {
  absl::StatusOr<Parsed> parsed = parse_flags(argc, argv, usage);
  if (!parsed.ok()) bad_input(usage, parsed.status().message());
  if (parsed->help) {
    std::fputs(help_text(usage).c_str(), stdout);
    std::exit(0);
  }
  return std::move(parsed->positionals);
}

void bad_input(const Usage& usage, absl::string_view message) {
  std::fprintf(stderr, "%s%.*s\n", usage.error_prefix.c_str(), static_cast<int>(message.size()),
               message.data());
  std::exit(2);
}

}  // namespace tr::tools
