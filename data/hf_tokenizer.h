// A Hugging Face `tokenizer.json` of the byte-level BPE kind (GPT-2, Qwen2/2.5, Llama 3): the
// added tokens split out of the raw text, the NFC normalizer, the pre-tokenizer's regex (PCRE2
// in UTF/UCP mode), the byte-level mapping and the BPE merges (our own loop over byte ids).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "data/tokenizer.h"

namespace tr::data {

// Loads `path`; `eod_token` names the end-of-document token (default <|endoftext|>). Anything
// the file asks for that this reader does not implement is an error naming it.
absl::StatusOr<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& path,
                                                             const std::string& eod_token = "");

}  // namespace tr::data
