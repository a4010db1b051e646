// replace_malformed_utf8 (data/utf8.h) against Python's bytes.decode("utf-8", "replace"), run
// here on every short ill-formed shape and on random bytes.
#include <catch2/catch.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "data/utf8.h"
#include "tests/test_util.h"

namespace tr::data {
namespace {

std::string replaced(std::string s) {
  replace_malformed_utf8(s);
  return s;
}

// Every byte alone and before 'A'; every lead byte with two following bytes from each range
// Table 3-7 distinguishes; every prefix of valid sequences at the end and mid-text; random
// strings over those bytes.
std::vector<std::string> cases() {
  const std::vector<int> kinds = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0,
                                  0xBF, 0xC0, 0xC2, 0xE0, 0xED, 0xF0, 0xF4, 0xFF};
  std::vector<std::string> out;
  const auto ch = [](int b) { return std::string(1, static_cast<char>(b)); };
  for (int b = 0; b < 256; ++b) {
    out.push_back(ch(b));
    out.push_back(ch(b) + "A");
  }
  for (int lead = 0x80; lead < 256; ++lead)
    for (int b2 : kinds) {
      out.push_back(ch(lead) + ch(b2));
      for (int b3 : kinds) {
        out.push_back(ch(lead) + ch(b2) + ch(b3));
        out.push_back(ch(lead) + ch(b2) + ch(b3) + "\x80" + "A");
      }
    }
  // U+0080, U+07FF, U+0800, U+20AC, U+D7FF, U+E000, U+FFFF, U+10000, U+10FFFF.
  for (const std::string v :
       {"\xC2\x80", "\xDF\xBF", "\xE0\xA0\x80", "\xE2\x82\xAC", "\xED\x9F\xBF", "\xEE\x80\x80",
        "\xEF\xBF\xBF", "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF"})
    for (size_t n = 1; n <= v.size(); ++n) {
      out.push_back(v.substr(0, n));
      out.push_back("x" + v.substr(0, n) + "y" + v.substr(0, n));
    }
  std::mt19937 rng(56);
  std::vector<int> alphabet = kinds;
  for (int b : {0x81, 0xBE, 0xC1, 0xDF, 0xE1, 0xEC, 0xEE, 0xEF, 0xF1, 0xF3, 0xF5, 0xF8})
    alphabet.push_back(b);
  for (int i = 0; i < 5000; ++i) {
    std::string s;
    for (size_t n = rng() % 16; n > 0; --n) s += ch(alphabet[rng() % alphabet.size()]);
    out.push_back(s);
  }
  return out;
}

TEST_CASE("data: malformed UTF-8 is replaced as Python's errors=\"replace\" does", "[data]") {
  // The maximal-subpart rule on the shapes that tell it apart.
  CHECK(replaced("a\xE2\x82") == "a\xEF\xBF\xBD");
  CHECK(replaced("\xE2\x82"
                 "A") ==
        "\xEF\xBF\xBD"
        "A");
  CHECK(replaced("\xF0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(replaced("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(replaced("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(replaced("ok \xE2\x82\xAC") == "ok \xE2\x82\xAC");

  // Everything else against Python itself: hex in, hex of the replaced text back.
  const std::vector<std::string> in = cases();
  test::TempDir dir;
  std::string lines;
  for (const std::string& s : in) lines += absl::BytesToHexString(s) + "\n";
  test::write_file(dir / "in.txt", lines);
  test::write_file(dir / "py.py", R"(import sys
for line in open(sys.argv[1]):
    b = bytes.fromhex(line.strip())
    print(b.decode("utf-8", "replace").encode("utf-8").hex())
)");
  const test::CmdResult r =
      test::run_cmd(test::python_bin() + " " + (dir / "py.py") + " " + (dir / "in.txt"));
  REQUIRE(r.exit_code == 0);
  std::istringstream want(r.output);
  size_t differ = 0;
  for (const std::string& s : in) {
    std::string hex;
    REQUIRE(std::getline(want, hex));
    const std::string got = absl::BytesToHexString(replaced(s));
    if (got != hex && differ++ < 5)
      FAIL_CHECK(absl::BytesToHexString(s) << ": " << got << " != " << hex);
  }
  CHECK(differ == 0);
}

}  // namespace
}  // namespace tr::data
