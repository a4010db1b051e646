#include "data/writer.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tr::data {
namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;

template <class T>
void append(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

}  // namespace

absl::StatusOr<std::unique_ptr<IndexedDatasetWriter>> IndexedDatasetWriter::create(
    const std::string& prefix, int64_t vocab_size) {
  if (vocab_size < 1 || vocab_size > int64_t{std::numeric_limits<int32_t>::max()} + 1)
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size ", vocab_size, " is outside [1, 2^31] for an indexed dataset"));
  std::unique_ptr<IndexedDatasetWriter> w(new IndexedDatasetWriter());
  w->prefix_ = prefix;
  w->vocab_size_ = vocab_size;
  w->dtype_ = vocab_size < kMegatronU16VocabLimit ? TokenDType::u16 : TokenDType::i32;
  absl::StatusOr<fs::WriteFile> bin = fs::WriteFile::open(prefix + ".bin.tmp");
  if (!bin.ok()) return bin.status();
  w->bin_.emplace(std::move(*bin));
  w->buffer_.reserve(kBufferBytes);
  return w;
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finished_) abandon();
}

void IndexedDatasetWriter::abandon() {
  bin_.reset();
  ::unlink((prefix_ + ".bin.tmp").c_str());
  ::unlink((prefix_ + ".idx.tmp").c_str());
}

absl::Status IndexedDatasetWriter::flush() {
  absl::Status st = bin_->append(buffer_.data(), buffer_.size());
  buffer_.clear();
  return st;
}

absl::Status IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  if (finished_ || !bin_)
    return absl::FailedPreconditionError(absl::StrCat("writer for ", prefix_, " is closed"));
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return absl::InvalidArgumentError(absl::StrCat("document ", lengths_.size(), " has ",
                                                   tokens.size(), " tokens; at most 2^31-1"));
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab_size_)
      return absl::InvalidArgumentError(absl::StrCat("document ", lengths_.size(), " token ", i,
                                                     " is ", tokens[i], ", outside [0, vocab ",
                                                     vocab_size_, ")"));
  const size_t at = buffer_.size();
  if (dtype_ == TokenDType::u16) {
    buffer_.resize(at + 2 * tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      const auto v = static_cast<uint16_t>(tokens[i]);
      std::memcpy(buffer_.data() + at + 2 * i, &v, sizeof(v));
    }
  } else {
    buffer_.resize(at + 4 * tokens.size());
    if (!tokens.empty()) std::memcpy(buffer_.data() + at, tokens.data(), 4 * tokens.size());
  }
  if (buffer_.size() >= kBufferBytes)
    if (auto st = flush(); !st.ok()) return st;
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  num_tokens_ += static_cast<int64_t>(tokens.size());
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::finish() {
  if (finished_ || !bin_)
    return absl::FailedPreconditionError(absl::StrCat("writer for ", prefix_, " is closed"));
  const std::string bin_tmp = prefix_ + ".bin.tmp", idx_tmp = prefix_ + ".idx.tmp";
  if (auto st = flush(); !st.ok()) return st;
  absl::Status synced = bin_->sync_and_close();
  bin_.reset();
  if (!synced.ok()) return synced;

  const uint64_t s = lengths_.size();
  std::vector<uint8_t> idx(kMegatronMagic, kMegatronMagic + sizeof(kMegatronMagic));
  idx.reserve(kMegatronHeaderBytes + 12 * s + 8 * (s + 1));
  append(idx, kMegatronVersion);
  append(idx, static_cast<uint8_t>(dtype_));
  append(idx, s);
  append(idx, s + 1);  // one document per sequence: doc index 0..S
  for (int32_t len : lengths_) append(idx, len);
  int64_t offset = 0;
  for (int32_t len : lengths_) {
    append(idx, offset);
    offset += int64_t{len} * static_cast<int64_t>(token_dtype_size(dtype_));
  }
  for (uint64_t d = 0; d <= s; ++d) append(idx, static_cast<int64_t>(d));

  const std::string_view idx_bytes(reinterpret_cast<const char*>(idx.data()), idx.size());
  if (auto st = fs::write_file_durable(idx_tmp, idx_bytes); !st.ok()) return st;
  // Old .idx first: from here until the last rename no complete-looking pair exists.
  std::error_code ec;
  std::filesystem::remove(prefix_ + ".idx", ec);  // a file (never a directory's contents)
  if (ec) return absl::ErrnoToStatus(ec.value(), "cannot remove " + prefix_ + ".idx");
  if (auto st = fs::rename_path(bin_tmp, prefix_ + ".bin"); !st.ok()) return st;
  if (auto st = fs::rename_path(idx_tmp, prefix_ + ".idx"); !st.ok()) return st;
  if (auto st = fs::fsync_parent(prefix_ + ".idx"); !st.ok()) return st;
  finished_ = true;
  bytes_written_ = offset + static_cast<int64_t>(idx.size());
  return absl::OkStatus();
}

absl::Status write_llmc_shard(const std::string& path, std::span<const int32_t> tokens,
                              int version) {
  if (version != 1 && version != 7)
    return absl::InvalidArgumentError(
        absl::StrCat("llm.c shard version ", version, " is unknown; use 1 (uint16) or 7 (uint32)"));
  const int64_t max_token = version == 1 ? 65535 : std::numeric_limits<int32_t>::max();
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return absl::InvalidArgumentError("llm.c shards hold at most 2^31-1 tokens");
  std::vector<uint8_t> bytes;
  bytes.reserve(kLlmcHeaderBytes + tokens.size() * (version == 1 ? 2 : 4));
  int32_t header[kLlmcHeaderInts] = {};
  header[0] = version == 1 ? kLlmcMagicV1 : kLlmcMagicV7;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  for (int32_t h : header) append(bytes, h);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > max_token)
      return absl::InvalidArgumentError(absl::StrCat("token ", i, " is ", tokens[i],
                                                     ", outside [0, ", max_token, "] for an ",
                                                     "llm.c v", version, " shard"));
    if (version == 1) {
      append(bytes, static_cast<uint16_t>(tokens[i]));
    } else {
      append(bytes, static_cast<uint32_t>(tokens[i]));
    }
  }
  return fs::write_file_atomic(
      path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace tr::data
