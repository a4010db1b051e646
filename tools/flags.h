// The tools' command line: each tool defines its flags with ABSL_FLAG in its own file, and this
// parser sets them from argv and writes --help from those definitions (name, type, default,
// help text). One parser for prepare_data, preflight, bench_ops and bench_data, so that they read
// and refuse arguments alike.
//
// What the parser reads:
//   --name=VALUE, --name VALUE   a dash and an underscore inside a name are the same
//                                (--min-bytes, --min_bytes); --help shows dashes
//   --name, --noname             a bool flag: true, false; --name=true|false (or yes|no, 1|0)
//                                too, but a bool never takes the next argument as its value
//   --help, -h                   prints the help (stdout) and exits 0
//   --                           every argument after it is positional
//   anything else                a positional argument (an error for a tool that takes none)
// A tool's flags are those ABSL_FLAG defines in its own file (Usage::file): the flags of a
// library it links, and Abseil's built-ins (--flagfile, --helpfull), are unknown flags to it.
// A bad argument is one line naming the flag and the fix, and exit 2 (parse_or_exit).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tr::tools {

// Flag types beyond Abseil's own; each checks its value where it is parsed, so that a bad one is
// refused with the flag's name and the reason (e.g. "--max-bytes 'lots' is not a size ...").
// std::optional of each (std::nullopt as the default: the tool picks one) works too.

// A size in bytes: an integer >= 0 with an optional K, M or G suffix (binary: 64K = 65536).
struct Bytes {
  int64_t value = 0;
};
bool AbslParseFlag(absl::string_view text, Bytes* out, std::string* error);
std::string AbslUnparseFlag(Bytes b);

// An integer >= 0.
struct Count {
  int64_t value = 0;
};
bool AbslParseFlag(absl::string_view text, Count* out, std::string* error);
std::string AbslUnparseFlag(Count c);

// An integer >= 1.
struct Positive {
  int64_t value = 1;
};
bool AbslParseFlag(absl::string_view text, Positive* out, std::string* error);
std::string AbslUnparseFlag(Positive p);

// An optional flag's value (of the types above), or `fallback` where it was not given.
template <typename T>
int64_t value_or(const std::optional<T>& flag, int64_t fallback) {
  return flag ? flag->value : fallback;
}

// A flag given any number of times: every value, whole (commas included), in order. (An Abseil
// flag holds one value, parsed afresh each time; the parser hands a Repeated flag all its values
// so far, each ended by '\0', which no argument can contain.)
struct Repeated {
  std::vector<std::string> values;
};
bool AbslParseFlag(absl::string_view text, Repeated* out, std::string* error);
std::string AbslUnparseFlag(const Repeated& r);

// What a tool's help says besides its flags, and whose flags they are.
struct Usage {
  std::string tool;          // the program's name, in the usage line and the error lines
  std::string file;          // __FILE__ of the file that defines the tool's ABSL_FLAGs
  std::string synopsis;      // the usage line(s) after "usage: ", one per form
  std::string about;         // what the tool does, after the usage line(s)
  bool positionals = false;  // whether it takes arguments besides flags
  std::string error_prefix;  // before each error line: "TOOL: " or "TOOL: error: "
};

struct Parsed {
  bool help = false;  // --help or -h: nothing after it was read
  std::vector<std::string> positionals;
};

// Sets the tool's flags from argv[1..argc); on a bad argument, the error line (without the
// prefix), naming the flag and the fix.
absl::StatusOr<Parsed> parse_flags(int argc, const char* const* argv, const Usage& usage);

// The usage line(s), the about text, then each of the tool's flags (sorted by name) with its type,
// default and help text.
std::string help_text(const Usage& usage);

// parse_flags for a tool's main(): --help prints help_text to stdout and exits 0, a bad argument
// exits through bad_input; else the positional arguments.
std::vector<std::string> parse_or_exit(int argc, char** argv, const Usage& usage);

// The project's answer to bad input: one line on stderr (the prefix, then `message`), exit 2.
[[noreturn]] void bad_input(const Usage& usage, absl::string_view message);

}  // namespace tr::tools
