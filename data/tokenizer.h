// Tokenizer interface and ByteTokenizer (the Hugging Face byte-level BPE: data/hf_tokenizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tr::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text -> token ids; never appends the end-of-document token (callers do).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Ids -> text. Special tokens such as end-of-document render as nothing; ids outside
  // [0, vocab_size()) render as U+FFFD.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int32_t eod_id() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string name() const = 0;
};

// Ids 0..255 are the bytes of the text; 256 is the end of a document. Vocabulary 257.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEod = 256;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t eod_id() const override { return kEod; }
  int64_t vocab_size() const override { return kEod + 1; }
  std::string name() const override { return "byte"; }
};

// "byte" -> ByteTokenizer; a path to a Hugging Face tokenizer.json -> its byte-level BPE
// (data/hf_tokenizer.h), with `eod_token` (default <|endoftext|>) as the end of a document.
// Anything else is an error listing the choices.
absl::StatusOr<std::unique_ptr<Tokenizer>> make_tokenizer(std::string_view name,
                                                          const std::string& eod_token = "");

}  // namespace tr::data
