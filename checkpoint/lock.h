// One run owns a checkpoint directory: `<dir>/trainer.lock` names its holder (host, boot, pid and
// the process's start time, Slurm job id, start time, heartbeat interval), and a thread of the
// holder touches it every few seconds (the heartbeat), whatever the trainer is doing (loading,
// evaluating, saving). A second trainer on the same directory is refused with one line naming
// the holder, unless the holder is gone:
//   * on this host (and boot): its process no longer exists, is a zombie, or its pid now names
//     another process (another start time). A live process holds the lock whatever its
//     heartbeat says (a 72B load, a long evaluation or a clock step never let a second trainer
//     in); one that is exiting is waited for a few seconds;
//   * it was this Slurm job (an earlier incarnation: requeued, or a job step that died);
//   * on another host: its heartbeat is older than `stale_after_s` and does not move while this
//     taker watches it for two heartbeat intervals and the file system's attribute cache time
//     (so a clock step between hosts is not taken for a dead holder).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tr::ckpt {

inline constexpr char kLockFile[] = "trainer.lock";

struct LockHolder {
  std::string host;
  std::string boot_id;  // the host's boot (Linux); "" when unknown
  long long pid = 0;
  long long pid_start = 0;       // the process's start time (clock ticks after boot); 0: unknown
  std::string slurm_job;         // SLURM_JOB_ID, "" outside Slurm
  std::string started;           // UTC, ISO 8601
  double heartbeat_s = 0;        // how often the holder touches the file; 0: unknown
  double age_s = 0;              // seconds since the last heartbeat (the file's mtime)
  std::string describe() const;  // "pid 123 on host n1 (Slurm job 42), started ..., 3 s ago"
};

struct LockOptions {
  const char* what = "checkpoint.dir";  // the directory's config key, for messages
  double stale_after_s = 300;  // another host's holder with a heartbeat this old may be gone
  double heartbeat_s = 10;     // how often this holder touches the file
  double wait_dying_s = 5;     // how long to wait for a holder of this host that is exiting
  // Added to the two heartbeats a taker watches another host's old-looking lock for: a shared
  // file system may cache a file's mtime this long (NFS acregmax).
  double attr_cache_s = 61;
};

class DirLock {
 public:
  // Takes the lock of `dir` (created if missing) and starts the heartbeat. A lock whose holder
  // is gone is taken over and `*note` says whose it was; a live holder is Unavailable (busy)
  // naming it and the way out.
  static absl::StatusOr<std::unique_ptr<DirLock>> acquire(const std::string& dir,
                                                          const LockOptions& options,
                                                          std::string* note);
  ~DirLock();  // stops the heartbeat; removes the lock file when it is still ours
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  struct Heartbeat;
  DirLock(std::string path, std::string content, double heartbeat_s);
  std::string path_, content_;
  std::unique_ptr<Heartbeat> heartbeat_;
};

// The holder recorded in a lock file; NotFound when there is none.
absl::StatusOr<LockHolder> read_lock(const std::string& dir);

}  // namespace tr::ckpt
