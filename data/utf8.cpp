#include "data/utf8.h"

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

namespace tr::data {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// The length of the well-formed sequence at s[at] (Unicode Table 3-7), or, when it is
// ill-formed, minus the length of its maximal subpart (at least 1 byte).
int sequence_at(std::string_view s, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t lead = byte(at);
  if (lead < 0x80) return 1;
  int len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    len = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    len = 3;
    if (lead == 0xE0) lo = 0xA0;  // not overlong
    if (lead == 0xED) hi = 0x9F;  // not a surrogate
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    len = 4;
    if (lead == 0xF0) lo = 0x90;  // not overlong
    if (lead == 0xF4) hi = 0x8F;  // not above U+10FFFF
  } else {
    return -1;  // a continuation byte, C0, C1 or F5..FF
  }
  for (int i = 1; i < len; ++i) {
    if (at + i >= s.size()) return -i;
    const uint8_t b = byte(at + i);
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) return -i;
  }
  return len;
}

}  // namespace

void replace_malformed_utf8(std::string& text) {
  size_t at = 0;
  int n = 0;
  while (at < text.size() && (n = sequence_at(text, at)) > 0) at += static_cast<size_t>(n);
  if (at == text.size()) return;  // valid: no copy
  std::string out(text, 0, at);
  out.reserve(text.size() + kReplacement.size());
  while (at < text.size()) {
    n = sequence_at(text, at);
    if (n > 0) {
      out.append(text, at, static_cast<size_t>(n));
    } else {
      out += kReplacement;
      n = -n;
    }
    at += static_cast<size_t>(n);
  }
  text = std::move(out);
}

}  // namespace tr::data
