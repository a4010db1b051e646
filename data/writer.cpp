#include "data/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tr::data {
namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;

absl::Status io_error(std::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat("cannot ", std::string(what), " '", path, "': ", std::strerror(errno)));
}

absl::StatusOr<int> open_for_write(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("create", path);
  return fd;
}

absl::Status write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return io_error("write", path);
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// fsync + close; closes even when fsync fails.
absl::Status sync_close(int fd, const std::string& path) {
  if (::fsync(fd) != 0) {
    absl::Status st = io_error("fsync", path);
    ::close(fd);
    return st;
  }
  if (::close(fd) != 0) return io_error("close", path);
  return absl::OkStatus();
}

// Makes the renames in `file`'s directory durable.
absl::Status sync_parent_dir(const std::string& file) {
  const std::filesystem::path parent = std::filesystem::path(file).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error("open directory", dir);
  return sync_close(fd, dir);
}

absl::Status rename_file(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return io_error("rename to " + to, from);
  return absl::OkStatus();
}

template <class T>
void append(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

// Writes bytes to path via path.tmp + fsync + rename + directory fsync.
absl::Status write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string tmp = path + ".tmp";
  auto fd = open_for_write(tmp);
  if (!fd.ok()) return fd.status();
  if (auto st = write_all(*fd, bytes.data(), bytes.size(), tmp); !st.ok()) {
    ::close(*fd);
    ::unlink(tmp.c_str());
    return st;
  }
  if (auto st = sync_close(*fd, tmp); !st.ok()) return st;
  if (auto st = rename_file(tmp, path); !st.ok()) return st;
  return sync_parent_dir(path);
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
  auto fd = open_for_write(prefix + ".bin.tmp");
  if (!fd.ok()) return fd.status();
  w->bin_fd_ = *fd;
  w->buffer_.reserve(kBufferBytes);
  return w;
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finished_) abandon();
}

void IndexedDatasetWriter::abandon() {
  if (bin_fd_ >= 0) ::close(bin_fd_);
  bin_fd_ = -1;
  ::unlink((prefix_ + ".bin.tmp").c_str());
  ::unlink((prefix_ + ".idx.tmp").c_str());
}

absl::Status IndexedDatasetWriter::flush() {
  auto st = write_all(bin_fd_, buffer_.data(), buffer_.size(), prefix_ + ".bin.tmp");
  buffer_.clear();
  return st;
}

absl::Status IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  if (finished_ || bin_fd_ < 0)
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
  if (finished_ || bin_fd_ < 0)
    return absl::FailedPreconditionError(absl::StrCat("writer for ", prefix_, " is closed"));
  const std::string bin_tmp = prefix_ + ".bin.tmp", idx_tmp = prefix_ + ".idx.tmp";
  if (auto st = flush(); !st.ok()) return st;
  const int fd = std::exchange(bin_fd_, -1);
  if (auto st = sync_close(fd, bin_tmp); !st.ok()) return st;

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

  auto ifd = open_for_write(idx_tmp);
  if (!ifd.ok()) return ifd.status();
  if (auto st = write_all(*ifd, idx.data(), idx.size(), idx_tmp); !st.ok()) {
    ::close(*ifd);
    return st;
  }
  if (auto st = sync_close(*ifd, idx_tmp); !st.ok()) return st;
  // Old .idx first: from here until the last rename no complete-looking pair exists.
  if (::unlink((prefix_ + ".idx").c_str()) != 0 && errno != ENOENT)
    return io_error("remove", prefix_ + ".idx");
  if (auto st = rename_file(bin_tmp, prefix_ + ".bin"); !st.ok()) return st;
  if (auto st = rename_file(idx_tmp, prefix_ + ".idx"); !st.ok()) return st;
  if (auto st = sync_parent_dir(prefix_ + ".idx"); !st.ok()) return st;
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
  return write_file_atomic(path, bytes);
}

}  // namespace tr::data
