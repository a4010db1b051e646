#include "checkpoint/lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/core/fs_io.h"
#include "kernels/core/switches.h"

namespace tr::ckpt {
namespace {

std::string slurm_job() {
  return launcher_env("SLURM_JOB_ID").value_or("");
}

// This process as a holder, as the lock file's JSON.
std::string my_record() {
  nlohmann::json j = {{"host", fs::host_name()},
                      {"pid", static_cast<long long>(getpid())},
                      {"slurm_job", slurm_job()},
                      {"started", fs::utc_now("%Y-%m-%dT%H:%M:%SZ")}};
  return j.dump() + "\n";
}

// Why `h` no longer holds the lock; "" when it may still.
std::string stale_reason(const LockHolder& h, double stale_after_s) {
  if (h.host == fs::host_name() && h.pid > 0 && kill(static_cast<pid_t>(h.pid), 0) != 0 &&
      errno == ESRCH)
    return "its process is gone";
  if (!h.slurm_job.empty() && h.slurm_job == slurm_job())
    return "it was an earlier run of this Slurm job";
  if (h.age_s > stale_after_s) return absl::StrFormat("its heartbeat stopped %.0f s ago", h.age_s);
  return "";
}

}  // namespace

std::string LockHolder::describe() const {
  return absl::StrCat("pid ", pid, " on host ", host,
                      slurm_job.empty() ? "" : absl::StrCat(" (Slurm job ", slurm_job, ")"),
                      ", started ", started, absl::StrFormat(", last heartbeat %.0f s ago", age_s));
}

absl::StatusOr<LockHolder> read_lock(const std::string& dir) {
  const std::string path = fs::join(dir, kLockFile);
  absl::StatusOr<std::string> text = fs::read_file(path);
  if (!text.ok()) return text.status();
  LockHolder h;
  try {
    const nlohmann::json j = nlohmann::json::parse(*text);
    h.host = j.at("host").get<std::string>();
    h.pid = j.at("pid").get<long long>();
    h.slurm_job = j.at("slurm_job").get<std::string>();
    h.started = j.at("started").get<std::string>();
  } catch (const nlohmann::json::exception&) {
    h.host.assign(1, '?');  // unreadable (half written): judged by its age alone
  }
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) h.age_s = std::difftime(std::time(nullptr), st.st_mtime);
  return h;
}

absl::StatusOr<std::unique_ptr<DirLock>> DirLock::acquire(const std::string& dir,
                                                          double stale_after_s, std::string* note) {
  if (absl::Status st = fs::make_dirs(dir); !st.ok()) return st;
  const std::string path = fs::join(dir, kLockFile);
  const std::string mine = my_record();
  const std::string tmp = absl::StrCat(path, ".", getpid(), ".tmp");
  if (absl::Status st = fs::write_file_durable(tmp, mine); !st.ok()) return st;
  // link() creates the lock only when there is none, atomically (NFS included).
  if (link(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    if (err != EEXIST) {
      unlink(tmp.c_str());
      return absl::ErrnoToStatus(err, absl::StrCat("cannot create ", path));
    }
    absl::StatusOr<LockHolder> holder = read_lock(dir);
    const std::string why = holder.ok() ? stale_reason(*holder, stale_after_s) : "it vanished";
    if (why.empty()) {
      unlink(tmp.c_str());
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir '", dir, "' is in use by another trainer: ", holder->describe(),
          "; wait for it, use another checkpoint.dir, or remove ", path, " if that run is gone"));
    }
    if (holder.ok())
      *note = absl::StrCat("took over the stale lock ", path, " (", why, "): ", holder->describe());
    if (absl::Status st = fs::rename_path(tmp, path); !st.ok()) return st;
  } else {
    unlink(tmp.c_str());
  }
  return std::unique_ptr<DirLock>(new DirLock(path, mine));
}

DirLock::~DirLock() {
  absl::StatusOr<std::string> now = fs::read_file(path_);
  if (now.ok() && *now == content_) unlink(path_.c_str());
}

void DirLock::heartbeat() {
  utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);
}

}  // namespace tr::ckpt
