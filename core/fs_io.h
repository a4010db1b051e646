// POSIX file helpers for crash-safe output (checkpoints, datasets): durable writes, fsync of
// files and directories, renames, checksums. Every error is one line naming the path and the
// OS reason.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tr::fs {

// `dir`/`name`, without doubling a trailing slash of `dir`.
inline std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

// mkdir -p.
absl::Status make_dirs(const std::string& path);
// rm -rf; OK when `path` does not exist.
absl::Status remove_all(const std::string& path);
// True when `path` exists (any type).
bool exists(const std::string& path);
bool is_directory(const std::string& path);

// A file being written: created or truncated by open(), appended to, then made durable by
// sync_and_close(). Closed on destruction if still open (nothing synced).
class WriteFile {
 public:
  static absl::StatusOr<WriteFile> open(const std::string& path);
  WriteFile(WriteFile&& other) noexcept;
  WriteFile& operator=(WriteFile&& other) noexcept;
  WriteFile(const WriteFile&) = delete;
  WriteFile& operator=(const WriteFile&) = delete;
  ~WriteFile();
  absl::Status append(const void* data, size_t bytes);
  // fsync + close; the file is closed even when fsync fails.
  absl::Status sync_and_close();
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  WriteFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// Creates or truncates `path`, writes `bytes`, fsyncs it. Does not fsync the directory.
absl::Status write_file_durable(const std::string& path, std::string_view bytes);
// fsync of an existing file or directory.
absl::Status fsync_path(const std::string& path);
// fsync of the directory holding `path` (makes a rename or create there durable).
absl::Status fsync_parent(const std::string& path);
// Writes `bytes` to path.tmp, fsyncs, renames it over `path`, fsyncs the directory: readers see
// the old file or the whole new one, never a part.
absl::Status write_file_atomic(const std::string& path, std::string_view bytes);
// rename(2); the caller fsyncs the parent directory.
absl::Status rename_path(const std::string& from, const std::string& to);
// Atomically swaps two existing paths (renameat2 RENAME_EXCHANGE). FailedPrecondition when
// the filesystem cannot.
absl::Status exchange_paths(const std::string& a, const std::string& b);

// Whole file as a string; NotFound when it does not exist.
absl::StatusOr<std::string> read_file(const std::string& path);

// The zlib crc32 of `bytes`, continuing `crc` (0 to start): any length (zlib's counts are 32-bit).
uint32_t crc32_of(std::string_view bytes, uint32_t crc = 0);

// Size and zlib crc32 of a file's bytes.
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};
absl::StatusOr<FileDigest> digest_file(const std::string& path);

// One run of bytes to place in a file at `offset`.
struct FileRegion {
  uint64_t offset = 0;
  const void* data = nullptr;
  uint64_t bytes = 0;
};
// Writes `regions` (not overlapping) into the existing file `path`, whose other bytes are final
// already (a container's metadata, written by its own library), fsyncs it, and returns the
// digest of the whole file as digest_file() would compute it: the regions' CRC from memory, the
// other bytes read back (they are small), in file order, so nothing large is read again. Where
// the file system allows (O_DIRECT: not tmpfs), the whole file goes straight to the disk as one
// stream of 32 MiB writes (the regions from memory, the bytes between them read back), through
// two aligned staging buffers, one filling while the other is written, instead of through the
// page cache, whose fresh pages cost more than the disk; only the last partial page goes
// through the page cache. `progress(done, total)` after each region.
absl::StatusOr<FileDigest> write_regions_durable(
    const std::string& path, std::vector<FileRegion> regions,
    const std::function<void(size_t, size_t)>& progress = {});
// Size only (stat).
absl::StatusOr<uint64_t> file_size(const std::string& path);

// The current UTC time formatted by strftime's `format` (for names and records of files that
// say when they were made, e.g. "%Y%m%dT%H%M%SZ").
std::string utc_now(const char* format);

// This machine's host name ("?" when it cannot be read), for messages and lock records.
std::string host_name();

}  // namespace tr::fs
