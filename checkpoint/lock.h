// One run owns a checkpoint directory: `<dir>/trainer.lock` names its holder (host, pid, Slurm
// job id, start time), and the holder touches it as it trains (a heartbeat). A second trainer
// on the same directory is refused with one line naming the holder, unless the lock is stale:
//   * its holder ran on this host and that pid is gone;
//   * its holder was this Slurm job (an earlier incarnation: requeued, or a job step that died);
//   * its heartbeat is older than `stale_after_s` (a holder on another host that died).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tr::ckpt {

inline constexpr char kLockFile[] = "trainer.lock";

struct LockHolder {
  std::string host;
  long long pid = 0;
  std::string slurm_job;         // SLURM_JOB_ID, "" outside Slurm
  std::string started;           // UTC, ISO 8601
  double age_s = 0;              // seconds since the last heartbeat (the file's mtime)
  std::string describe() const;  // "pid 123 on host n1 (Slurm job 42), started ..., 3 s ago"
};

class DirLock {
 public:
  // Takes the lock of `dir` (created if missing). A stale lock is taken over and `*note` says
  // whose it was; a live one is FailedPrecondition naming its holder and the way out.
  static absl::StatusOr<std::unique_ptr<DirLock>> acquire(const std::string& dir,
                                                          double stale_after_s, std::string* note);
  ~DirLock();  // removes the lock file when it is still ours
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  void heartbeat();  // touches the lock file

 private:
  explicit DirLock(std::string path, std::string content)
      : path_(std::move(path)), content_(std::move(content)) {}
  std::string path_, content_;
};

// The holder recorded in a lock file; NotFound when there is none.
absl::StatusOr<LockHolder> read_lock(const std::string& dir);

}  // namespace tr::ckpt
