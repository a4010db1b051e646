// Writers of token files: the Megatron indexed dataset (PREFIX.bin + PREFIX.idx) and, for
// tests and small tools, llm.c shards.
//
// Crash safety of IndexedDatasetWriter: tokens stream into PREFIX.bin.tmp; finish() writes
// PREFIX.idx.tmp, fsyncs both, removes any old PREFIX.idx, renames the .bin, then the .idx,
// and fsyncs the directory. Readers key on PREFIX.idx, so at every instant the final names
// hold either the old pair, no dataset (no .idx), or the complete new pair.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/fs_io.h"
#include "data/formats.h"

namespace tr::data {

class IndexedDatasetWriter {
 public:
  // Token dtype as Megatron chooses it: u16 when vocab_size < 65500, else i32.
  static absl::StatusOr<std::unique_ptr<IndexedDatasetWriter>> create(const std::string& prefix,
                                                                      int64_t vocab_size);
  // An unfinished writer removes its temporary files.
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One document (one sequence) of token ids in [0, vocab_size); written as given, so the
  // caller appends the end-of-document token.
  absl::Status add_document(std::span<const int32_t> tokens);
  // Writes the index and moves both files to their final names. Call once.
  absl::Status finish();

  TokenDType dtype() const { return dtype_; }
  int64_t num_documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_tokens() const { return num_tokens_; }
  // Bytes of .bin + .idx once finish() succeeded.
  int64_t bytes_written() const { return bytes_written_; }

 private:
  IndexedDatasetWriter() = default;
  absl::Status flush();
  void abandon();

  std::string prefix_;
  int64_t vocab_size_ = 0;
  TokenDType dtype_ = TokenDType::u16;
  std::optional<fs::WriteFile> bin_;  // PREFIX.bin.tmp while writing
  std::vector<uint8_t> buffer_;       // pending .bin bytes
  std::vector<int32_t> lengths_;      // tokens per sequence
  int64_t num_tokens_ = 0;
  int64_t bytes_written_ = 0;
  bool finished_ = false;
};

// Writes an llm.c shard: version 1 (magic 20240520, uint16 tokens) or version 7 (magic
// 20240801, uint32 tokens), via a temporary file and rename.
absl::Status write_llmc_shard(const std::string& path, std::span<const int32_t> tokens,
                              int version);

}  // namespace tr::data
