#include "data/tokenizer.h"

#include "absl/strings/str_cat.h"

namespace tr::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (id != kEod) {
      text += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
    }
  }
  return text;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> make_tokenizer(std::string_view name) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tokenizer '", std::string(name), "'; known tokenizers: byte"));
}

}  // namespace tr::data
