#include "core/fs_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tr::fs {
namespace {

constexpr size_t kReadChunk = size_t{4} << 20;  // bytes per read() while checksumming

absl::Status errno_status(int err, const std::string& what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

// Closes a file descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now and reports the result (close can report a deferred write error).
  int close_now() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

}  // namespace

absl::Status make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return errno_status(ec.value(), "cannot create directory", path);
  return absl::OkStatus();
}

absl::Status remove_all(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return errno_status(ec.value(), "cannot remove", path);
  return absl::OkStatus();
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::StatusOr<WriteFile> WriteFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, "cannot create", path);
  return WriteFile(fd, path);
}

WriteFile::WriteFile(WriteFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

WriteFile& WriteFile::operator=(WriteFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

WriteFile::~WriteFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status WriteFile::append(const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return errno_status(errno, "cannot write", path_);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteFile::sync_and_close() {
  Fd fd(std::exchange(fd_, -1));
  if (::fsync(fd.get()) != 0) return errno_status(errno, "cannot fsync", path_);
  if (fd.close_now() != 0) return errno_status(errno, "cannot close", path_);
  return absl::OkStatus();
}

absl::Status write_file_durable(const std::string& path, std::string_view bytes) {
  absl::StatusOr<WriteFile> f = WriteFile::open(path);
  if (!f.ok()) return f.status();
  if (absl::Status st = f->append(bytes.data(), bytes.size()); !st.ok()) return st;
  return f->sync_and_close();
}

absl::Status write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  if (absl::Status st = write_file_durable(tmp, bytes); !st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  if (absl::Status st = rename_path(tmp, path); !st.ok()) return st;
  return fsync_parent(path);
}

absl::Status fsync_parent(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return fsync_path(parent.empty() ? std::string(".") : parent.string());
}

absl::Status fsync_path(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return errno_status(errno, "cannot open for fsync", path);
  if (::fsync(fd.get()) != 0) return errno_status(errno, "cannot fsync", path);
  return absl::OkStatus();
}

absl::Status rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return errno_status(errno, "cannot rename " + from + " to", to);
  }
  return absl::OkStatus();
}

absl::Status exchange_paths(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) {
    return absl::OkStatus();
  }
  int err = errno;
  if (err == EINVAL || err == ENOSYS || err == ENOTSUP) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot atomically swap ", a, " and ", b,
                     ": the filesystem does not support renameat2(RENAME_EXCHANGE)"));
  }
  return errno_status(err, "cannot swap " + a + " with", b);
}

absl::StatusOr<std::string> read_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return errno_status(errno, "cannot open", path);
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(errno, "cannot read", path);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

uint32_t crc32_of(std::string_view bytes, uint32_t crc) {
  uLong c = crc;
  while (!bytes.empty()) {
    const size_t n = std::min<size_t>(bytes.size(), size_t{1} << 30);
    c = crc32(c, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n));
    bytes.remove_prefix(n);
  }
  return static_cast<uint32_t>(c);
}

absl::StatusOr<FileDigest> digest_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return errno_status(errno, "cannot open", path);
  std::vector<unsigned char> buf(kReadChunk);
  FileDigest d;
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(errno, "cannot read", path);
    if (n == 0) break;
    d.crc32 = crc32_of(
        std::string_view(reinterpret_cast<const char*>(buf.data()), static_cast<size_t>(n)),
        d.crc32);
    d.bytes += static_cast<uint64_t>(n);
  }
  return d;
}

absl::StatusOr<uint64_t> file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno_status(errno, "cannot stat", path);
  return static_cast<uint64_t>(st.st_size);
}

std::string utc_now(const char* format) {
  char text[64];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  return std::string(text, std::strftime(text, sizeof(text), format, &utc));
}

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

}  // namespace tr::fs
