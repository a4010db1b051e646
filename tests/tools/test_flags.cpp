// The tools' command-line parser (tools/flags.h) in process, over flags of this file: the
// syntax it reads, the one-line errors, the types of its own, and --help from the definitions.
#include <catch2/catch.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "tools/flags.h"

ABSL_FLAG(std::string, output, "out", "where it goes");
ABSL_FLAG(int32_t, threads, 1, "how many threads");
ABSL_FLAG(double, rate, 0.5, "a fraction");
ABSL_FLAG(bool, verbose, false, "says more");
ABSL_FLAG(tr::tools::Bytes, max_bytes, tr::tools::Bytes{1024}, "the largest size");
ABSL_FLAG(std::optional<tr::tools::Positive>, stage, std::nullopt, "a stage (default: the last)");
ABSL_FLAG(tr::tools::Count, warmup, tr::tools::Count{5}, "untimed runs");
ABSL_FLAG(tr::tools::Repeated, set, {}, "K=V, any number of times");
ABSL_FLAG(std::vector<std::string>, ops, std::vector<std::string>({"a", "b"}), "which ops");

namespace tr::tools {
namespace {

const Usage kUsage{.tool = "tool",
                   .file = __FILE__,
                   .synopsis = "tool [--output FILE] INPUT...",
                   .about = "Does a thing.",
                   .positionals = true,
                   .error_prefix = "tool: "};

absl::StatusOr<Parsed> parse(const std::vector<std::string>& args, const Usage& usage = kUsage) {
  std::vector<const char*> argv = {"tool"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parse_flags(static_cast<int>(argv.size()), argv.data(), usage);
}

// The error line of `args`, "" when they parse.
std::string error_of(const std::vector<std::string>& args, const Usage& usage = kUsage) {
  absl::StatusOr<Parsed> p = parse(args, usage);
  return p.ok() ? "" : std::string(p.status().message());
}

TEST_CASE("flags: --name=VALUE, --name VALUE and positional arguments in any order", "[tools]") {
  absl::FlagSaver restore;
  // Not given: the default; an optional flag's is none.
  REQUIRE(parse({}).ok());
  CHECK(absl::GetFlag(FLAGS_warmup).value == 5);
  CHECK_FALSE(absl::GetFlag(FLAGS_stage).has_value());
  absl::StatusOr<Parsed> p = parse({"in1", "--output=a=b", "--threads", "4", "in2", "--max-bytes",
                                    "64K", "--stage=3", "--", "--rate", "-h"});
  REQUIRE(p.ok());
  CHECK_FALSE(p->help);
  CHECK(p->positionals == std::vector<std::string>{"in1", "in2", "--rate", "-h"});
  CHECK(absl::GetFlag(FLAGS_output) == "a=b");  // split at the first '='
  CHECK(absl::GetFlag(FLAGS_threads) == 4);
  CHECK(absl::GetFlag(FLAGS_max_bytes).value == 65536);
  CHECK(absl::GetFlag(FLAGS_stage)->value == 3);
  CHECK(absl::GetFlag(FLAGS_rate) == 0.5);  // after "--": positional, not the flag
  // A dash and an underscore inside a name are the same; a value may start with "--".
  REQUIRE(parse({"--max_bytes", "1G", "--output", "--threads"}).ok());
  CHECK(absl::GetFlag(FLAGS_max_bytes).value == int64_t{1} << 30);
  CHECK(absl::GetFlag(FLAGS_output) == "--threads");
  CHECK(absl::GetFlag(FLAGS_threads) == 4);
  // --help and -h stop the parse, whatever follows.
  for (const char* help : {"--help", "-h"}) {
    p = parse({"--threads", "2", help, "--threads=x", "--bogus"});
    REQUIRE(p.ok());
    CHECK(p->help);
  }
}

TEST_CASE("flags: an unknown flag is one line naming it, and the flag it is a typo of", "[tools]") {
  absl::FlagSaver restore;
  CHECK(error_of({"in", "--outptu", "x"}) ==
        "unknown flag --outptu; did you mean --output? (--help lists them)");
  CHECK(error_of({"--max-byte=4"}) ==
        "unknown flag --max-byte; did you mean --max-bytes? (--help lists them)");
  CHECK(error_of({"--zzzzzzzz"}) == "unknown flag --zzzzzzzz (--help lists them)");
  // Only the tool's own flags, those defined in its file, are known to it.
  const Usage elsewhere{.tool = "other",
                        .file = "tools/other.cpp",
                        .synopsis = "other",
                        .about = "",
                        .positionals = false,
                        .error_prefix = "other: "};
  CHECK(error_of({"--output=x"}, elsewhere) == "unknown flag --output (--help lists them)");
  CHECK(error_of({"--flagfile=x"}) == "unknown flag --flagfile (--help lists them)");
  // A tool without positional arguments names the first one.
  CHECK(error_of({"--threads", "2", "stray", "more"}, Usage{.tool = "tool",
                                                            .file = __FILE__,
                                                            .synopsis = "tool",
                                                            .about = "",
                                                            .positionals = false,
                                                            .error_prefix = "tool: "}) ==
        "unexpected argument 'stray'; see --help");
}

TEST_CASE("flags: a bad value is one line naming the flag, the value and what it must be",
          "[tools]") {
  absl::FlagSaver restore;
  CHECK(error_of({"--threads=abc"}) == "--threads 'abc' is not an integer");
  CHECK(error_of({"--threads", "99999999999"}) == "--threads '99999999999' is not an integer");
  CHECK(error_of({"--rate=fast"}) == "--rate 'fast' is not a number");
  CHECK(error_of({"--verbose=maybe"}) == "--verbose 'maybe' is not true or false");
  CHECK(error_of({"--max-bytes", "lots"}) ==
        "--max-bytes 'lots' is not a size (e.g. 4096, 64K, 1G)");
  CHECK(error_of({"--max-bytes=-1K"}) == "--max-bytes '-1K' is not a size (e.g. 4096, 64K, 1G)");
  CHECK(error_of({"--max-bytes=99999999999G"}) ==
        "--max-bytes '99999999999G' is not a size (e.g. 4096, 64K, 1G)");
  CHECK(error_of({"--stage=0"}) == "--stage '0' is not a positive integer");
  CHECK(error_of({"--warmup=-1"}) == "--warmup '-1' is not a non-negative integer");
  CHECK(error_of({"in", "--output"}) == "--output needs a value; see --help");
  // A refused value leaves the flag as it was.
  CHECK(absl::GetFlag(FLAGS_threads) == 1);
  CHECK(absl::GetFlag(FLAGS_max_bytes).value == 1024);
}

TEST_CASE("flags: a bool is --name, --noname or --name=true|false, never the next argument",
          "[tools]") {
  absl::FlagSaver restore;
  absl::StatusOr<Parsed> p = parse({"--verbose", "false"});
  REQUIRE(p.ok());
  CHECK(absl::GetFlag(FLAGS_verbose));
  CHECK(p->positionals == std::vector<std::string>{"false"});
  REQUIRE(parse({"--noverbose"}).ok());
  CHECK_FALSE(absl::GetFlag(FLAGS_verbose));
  REQUIRE(parse({"--verbose=true"}).ok());
  CHECK(absl::GetFlag(FLAGS_verbose));
  REQUIRE(parse({"--verbose=no"}).ok());
  CHECK_FALSE(absl::GetFlag(FLAGS_verbose));
  CHECK(error_of({"--noverbose=true"}) == "--noverbose takes no value");
  // --no before a flag that is not a bool is no flag.
  CHECK(error_of({"--nothreads"}) ==
        "unknown flag --nothreads; did you mean --threads? (--help lists them)");
}

TEST_CASE("flags: a Repeated flag keeps every value whole, a list flag splits at commas",
          "[tools]") {
  absl::FlagSaver restore;
  CHECK(absl::GetFlag(FLAGS_set).values.empty());
  REQUIRE(parse({"--set", "a=[1, 2]", "--ops=x,y", "--set=", "--set", "b=3"}).ok());
  CHECK(absl::GetFlag(FLAGS_set).values == std::vector<std::string>{"a=[1, 2]", "", "b=3"});
  CHECK(absl::GetFlag(FLAGS_ops) == std::vector<std::string>{"x", "y"});
  // The types' own text round-trips (the help's defaults are written with it).
  for (const char* size : {"0", "1000", "1K", "3M", "2G", "1536"}) {
    Bytes b;
    std::string error;
    REQUIRE(AbslParseFlag(size, &b, &error));
    CHECK(AbslUnparseFlag(b) == size);
  }
  Repeated r;
  std::string error;
  REQUIRE(AbslParseFlag(AbslUnparseFlag(Repeated{{"x,y", "", "z"}}), &r, &error));
  CHECK(r.values == std::vector<std::string>{"x,y", "", "z"});
}

TEST_CASE("flags: --help is the usage, then each of the tool's flags with type, default and help",
          "[tools]") {
  CHECK(help_text(kUsage) ==
        "usage: tool [--output FILE] INPUT...\n"
        "  Does a thing.\n"
        "flags (--name=VALUE or --name VALUE):\n"
        "  --max-bytes (size; default 1K)\n"
        "      the largest size\n"
        "  --ops (comma-separated list; default a,b)\n"
        "      which ops\n"
        "  --output (string; default out)\n"
        "      where it goes\n"
        "  --rate (number; default 0.5)\n"
        "      a fraction\n"
        "  --set (string, repeatable)\n"
        "      K=V, any number of times\n"
        "  --stage (positive integer)\n"
        "      a stage (default: the last)\n"
        "  --threads (integer; default 1)\n"
        "      how many threads\n"
        "  --verbose (bool; default false)\n"
        "      says more\n"
        "  --warmup (non-negative integer; default 5)\n"
        "      untimed runs\n");
  // Long lines wrap at 100 columns; a usage line's [...] parts stay whole.
  const Usage long_usage{.tool = "tool",
                         .file = "nowhere.cpp",
                         .synopsis = "tool " + std::string(80, 'x') + " [--a B] [--c D]",
                         .about = std::string(60, 'y') + " " + std::string(60, 'z'),
                         .positionals = false,
                         .error_prefix = "tool: "};
  CHECK(help_text(long_usage) == "usage: tool " + std::string(80, 'x') +
                                     " [--a B]\n"
                                     "            [--c D]\n"
                                     "  " +
                                     std::string(60, 'y') + "\n  " + std::string(60, 'z') +
                                     "\nflags (--name=VALUE or --name VALUE):\n");
}

}  // namespace
}  // namespace tr::tools
