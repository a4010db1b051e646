#include "data/tokenizer.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "data/hf_tokenizer.h"

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

absl::StatusOr<std::unique_ptr<Tokenizer>> make_tokenizer(std::string_view name,
                                                          const std::string& eod_token) {
  if (name == "byte") {
    if (!eod_token.empty())
      return absl::InvalidArgumentError("the byte tokenizer's end of document is always 256");
    return std::make_unique<ByteTokenizer>();
  }
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::string(name), ec))
    return load_hf_tokenizer(std::string(name), eod_token);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tokenizer '", std::string(name),
                   "': not 'byte' and not a file; give byte or the path to a Hugging Face "
                   "tokenizer.json"));
}

}  // namespace tr::data
