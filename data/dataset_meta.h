// PREFIX.meta.json beside a dataset's .bin/.idx: which tokenizer made it, so that the trainer
// can refuse data that does not fit the model (ids past model.vocab_size, byte data under a
// Qwen preset, sources made by different tokenizers). Written by prepare_data; datasets made
// elsewhere (Megatron's tools) have none and are not checked.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace tr::data {

struct DatasetMeta {
  std::string tokenizer;  // "byte", "hf-bpe" (a tokenizer.json) or "synthetic"
  std::string source;     // the tokenizer file as given to prepare_data ("" for byte)
  uint64_t source_bytes = 0;
  uint32_t source_crc32 = 0;  // identifies the tokenizer file
  int64_t vocab_size = 0;     // ids are below this
  int32_t eod_id = -1;        // the end-of-document id appended to every document (-1: none)
  bool same_tokenizer(const DatasetMeta& o) const {
    return tokenizer == o.tokenizer && source_crc32 == o.source_crc32 &&
           vocab_size == o.vocab_size && eod_id == o.eod_id;
  }
  std::string describe() const;  // "tokenizer.json (hf-bpe, 151669 ids, end of document 151643)"
};

std::string dataset_meta_path(const std::string& prefix);
absl::Status write_dataset_meta(const std::string& prefix, const DatasetMeta& meta);
// nullopt when the dataset has no PREFIX.meta.json; an error when it is malformed.
absl::StatusOr<std::optional<DatasetMeta>> read_dataset_meta(const std::string& prefix);

}  // namespace tr::data
