// Token sources: a memory-mapped, validated token file seen as one stream of int32 tokens
// (documents back to back, each already ending with the end-of-document token).
// Two on-disk formats reduce to "a contiguous typed array inside a mapped file":
//   - Megatron indexed dataset PREFIX.bin + PREFIX.idx (any of the 8 .idx token dtypes),
//   - llm.c shards (v1 uint16, v7 uint32).
// Everything that can be checked cheaply is checked at open; token values are checked as they
// are read (ids must be whole numbers in [0, limit)), so a bad file never crashes the reader.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/mapped_file.h"
#include "data/formats.h"

namespace tr::data {

enum class SourceFormat { auto_detect, megatron, llmc };

// "auto" | "megatron" | "llmc".
absl::StatusOr<SourceFormat> parse_source_format(std::string_view name);
const char* source_format_name(SourceFormat format);

// The smallest and largest token id of a stream (lo > hi: it has none); not known when the
// scan was skipped (u16 tokens under a limit above 65535 all fit).
struct IdRange {
  int64_t lo = 0, hi = -1;
  bool known = false;
  // Every token is `id` (or there is none): what a check for any other token needs to know.
  bool only(int64_t id) const { return known && (lo > hi || (lo == id && hi == id)); }
};

class TokenSource {
 public:
  // Opens `path`: a Megatron prefix (PREFIX.bin + PREFIX.idx) or an llm.c shard file.
  // auto_detect picks Megatron when PREFIX.idx exists, llm.c when `path` is a file whose
  // header magic is an llm.c magic.
  static absl::StatusOr<std::unique_ptr<TokenSource>> open(const std::string& path,
                                                           SourceFormat format);

  // The path as given (a prefix for Megatron), used in messages.
  const std::string& path() const { return path_; }
  // The file the tokens live in (PREFIX.bin or the shard).
  const std::string& token_file() const { return tokens_.path(); }
  SourceFormat format() const { return format_; }
  TokenDType dtype() const { return dtype_; }
  int64_t num_tokens() const { return num_tokens_; }
  // Documents per the .idx document index; -1 for llm.c shards (not recorded there).
  int64_t num_documents() const { return num_documents_; }

  // out[i] = token begin + i, converted to int32. Errors (one line, naming the file and the
  // token position) when the range is outside the stream or a value is not a whole number in
  // [0, limit); limit <= 0 means [0, 2^31).
  absl::Status read(int64_t begin, std::span<int32_t> out, int64_t limit = 0) const;

  // Every token of the stream a whole number in [0, limit) (limit <= 0: [0, 2^31)): a scan of the
  // mapped file for its smallest and largest id (memory bandwidth: data/id_check.h), and only
  // where those fail, the error read() gives for the first bad token. Returns that range.
  absl::StatusOr<IdRange> check_ids(int64_t limit) const;

 private:
  TokenSource() = default;
  static absl::StatusOr<std::unique_ptr<TokenSource>> open_megatron(const std::string& prefix);
  static absl::StatusOr<std::unique_ptr<TokenSource>> open_llmc(const std::string& path);

  std::string path_;
  SourceFormat format_ = SourceFormat::megatron;
  TokenDType dtype_ = TokenDType::u16;
  fs::MappedFile tokens_;   // the file holding the tokens
  size_t first_byte_ = 0;   // byte offset of token 0 in tokens_
  int64_t num_tokens_ = 0;  // tokens in the stream
  int64_t num_documents_ = -1;
};

}  // namespace tr::data
