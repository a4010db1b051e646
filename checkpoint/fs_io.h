// POSIX file helpers for the commit protocol: durable writes, fsync of files and
// directories, renames, checksums. Internal to tr_checkpoint. Every error is one line
// naming the path and the OS reason.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tr::ckpt::fs {

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

// Creates or truncates `path`, writes `bytes`, fsyncs it. Does not fsync the directory.
absl::Status write_file_durable(const std::string& path, std::string_view bytes);
// fsync of an existing file or directory.
absl::Status fsync_path(const std::string& path);
// rename(2); the caller fsyncs the parent directory.
absl::Status rename_path(const std::string& from, const std::string& to);
// Atomically swaps two existing paths (renameat2 RENAME_EXCHANGE). FailedPrecondition when
// the filesystem cannot.
absl::Status exchange_paths(const std::string& a, const std::string& b);

// Whole file as a string; NotFound when it does not exist.
absl::StatusOr<std::string> read_file(const std::string& path);

// Size and zlib crc32 of a file's bytes.
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};
absl::StatusOr<FileDigest> digest_file(const std::string& path);
// Size only (stat).
absl::StatusOr<uint64_t> file_size(const std::string& path);

}  // namespace tr::ckpt::fs
