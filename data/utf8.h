// replace_malformed_utf8: text made valid UTF-8 as Python's bytes.decode("utf-8", "replace").
#pragma once

#include <string>

namespace tr::data {

// Replaces each maximal subpart of an ill-formed sequence with U+FFFD (Unicode 3.9, "U+FFFD
// Substitution of Maximal Subparts"; Python's errors="replace"): "\xE2\x82" is one U+FFFD,
// "\xED\xA0\x80" (a surrogate) and "\xC0\xAF" (overlong) one per byte. Valid text is untouched.
void replace_malformed_utf8(std::string& text);

}  // namespace tr::data
