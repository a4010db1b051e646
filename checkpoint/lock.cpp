#include "checkpoint/lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/check.h"
#include "core/fs_io.h"
#include "core/switches.h"

namespace tr::ckpt {
namespace {

using Clock = std::chrono::steady_clock;

std::string slurm_job() {
  return launcher_env("SLURM_JOB_ID").value_or("");
}

// This host's boot (Linux: a random id per boot); "" where the kernel does not say.
std::string boot_id() {
  absl::StatusOr<std::string> id = fs::read_file("/proc/sys/kernel/random/boot_id");
  return id.ok() ? std::string(absl::StripAsciiWhitespace(*id)) : "";
}

// A process of this host as /proc/PID/stat shows it.
struct Proc {
  bool exists = false;
  char state = '?';      // R, S, D, Z (zombie), X (dead), ...
  long long start = 0;   // start time, clock ticks after boot
  bool exiting = false;  // running its exit (PF_EXITING), or SIGKILL is pending
};

Proc proc(long long pid) {
  Proc p;
  static const bool procfs = access("/proc/self/stat", R_OK) == 0;
  if (!procfs) {  // no /proc here: only whether the pid exists
    p.exists = kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
    return p;
  }
  absl::StatusOr<std::string> stat = fs::read_file(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat.ok()) return p;  // no /proc entry: gone
  p.exists = true;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; fields follow the last ')'.
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return p;
  const std::vector<std::string> f =
      absl::StrSplit(stat->substr(close + 1), ' ', absl::SkipWhitespace());
  if (f.size() < 20) return p;
  p.state = f[0][0];  // field 3
  unsigned long long flags = 0;
  if (absl::SimpleAtoi(f[6], &flags)) p.exiting = (flags & 0x4) != 0;  // field 9: PF_EXITING
  (void)absl::SimpleAtoi(f[19], &p.start);                             // field 22
  // A SIGKILL pending (to the thread group or the main thread): it is about to exit.
  absl::StatusOr<std::string> status = fs::read_file(absl::StrCat("/proc/", pid, "/status"));
  for (absl::string_view line : absl::StrSplit(status.ok() ? *status : "", '\n')) {
    unsigned long long mask = 0;
    if ((absl::StartsWith(line, "ShdPnd:") || absl::StartsWith(line, "SigPnd:")) &&
        absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line.substr(7)), &mask) &&
        (mask & (1ull << (SIGKILL - 1))) != 0)
      p.exiting = true;
  }
  return p;
}

// This process as a holder, as the lock file's JSON.
std::string my_record(double heartbeat_s) {
  nlohmann::json j = {{"host", fs::host_name()},
                      {"boot_id", boot_id()},
                      {"pid", static_cast<long long>(getpid())},
                      {"pid_start", proc(getpid()).start},
                      {"slurm_job", slurm_job()},
                      {"started", fs::utc_now("%Y-%m-%dT%H:%M:%SZ")},
                      {"heartbeat_s", heartbeat_s}};
  return j.dump() + "\n";
}

// Why a holder of this host is gone; "" while its process lives (exiting or not).
std::string local_gone(const LockHolder& h) {
  const Proc p = proc(h.pid);
  if (!p.exists) return "its process is gone";
  if (p.state == 'Z' || p.state == 'X') return "its process has exited (a zombie)";
  if (h.pid_start != 0 && p.start != 0 && p.start != h.pid_start)
    return "its pid now belongs to another process";
  return "";
}

timespec mtime_of(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return {};
  return st.st_mtim;
}

// Why holder `h` of `path` no longer holds it; "" when it may still.
std::string gone_reason(const LockHolder& h, const std::string& path, const LockOptions& o) {
  if (!h.slurm_job.empty() && h.slurm_job == slurm_job())
    return "it was an earlier run of this Slurm job";
  if (h.host == fs::host_name()) {
    const std::string boot = boot_id();
    if (!h.boot_id.empty() && !boot.empty() && h.boot_id != boot)
      return "this host has rebooted since";
    // A live process holds the lock, whatever its heartbeat; one that is exiting (or has a kill
    // pending) is given wait_dying_s to finish.
    const auto deadline = Clock::now() + std::chrono::duration<double>(o.wait_dying_s);
    for (;;) {
      if (std::string why = local_gone(h); !why.empty()) return why;
      if (!proc(h.pid).exiting || Clock::now() >= deadline) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  if (h.age_s <= o.stale_after_s) return "";  // (a half-written record: by its age alone)
  // Another host whose heartbeat looks old by this host's clock: gone only if it does not move
  // for two of its intervals (the clocks of two hosts may disagree; a live holder touches it).
  if (h.heartbeat_s > 0) {
    const timespec before = mtime_of(path);
    std::this_thread::sleep_for(
        std::chrono::duration<double>(std::min(2 * h.heartbeat_s, 120.0) + o.attr_cache_s));
    const timespec after = mtime_of(path);
    if (after.tv_sec != before.tv_sec || after.tv_nsec != before.tv_nsec) return "";
  }
  return absl::StrFormat("its heartbeat stopped %.0f s ago", h.age_s);
}

// The lock files this process holds, for fatal_error and end_job to remove: a run that ends on
// a failure (an allocation that fails, a library error) leaves no lock behind it. Fixed storage:
// the cleanup runs on the way to an abort.
constexpr int kMaxHeld = 4;
std::mutex g_held_mu;
char g_held[kMaxHeld][4096] = {};

void remove_held_locks() {
  // Without g_held_mu: the slots are only written while a lock is taken or freed, which does
  // not end the process this way.
  for (char* path : g_held)
    if (path[0] != '\0') ::unlink(path);
}

void hold(const std::string& path, bool held) {
  std::lock_guard lock(g_held_mu);
  for (char* slot : g_held) {
    if (held && slot[0] == '\0' && path.size() < sizeof(g_held[0])) {
      std::memcpy(slot, path.c_str(), path.size() + 1);
      add_fatal_cleanup(remove_held_locks);
      return;
    }
    if (!held && path == slot) {
      slot[0] = '\0';
      return;
    }
  }
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
    h.boot_id = j.value("boot_id", "");
    h.pid_start = j.value("pid_start", 0LL);
    h.heartbeat_s = j.value("heartbeat_s", 0.0);
  } catch (const nlohmann::json::exception&) {
    h.host.assign(1, '?');  // unreadable (half written): judged by its age alone
  }
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) h.age_s = std::difftime(std::time(nullptr), st.st_mtime);
  return h;
}

// Touches the lock file every heartbeat_s while it is still ours, from a thread of its own.
struct DirLock::Heartbeat {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread;
};

DirLock::DirLock(std::string path, std::string content, double heartbeat_s)
    : path_(std::move(path)), content_(std::move(content)), heartbeat_(new Heartbeat) {
  hold(path_, true);
  heartbeat_->thread = std::thread([this, heartbeat_s] {
    Heartbeat& h = *heartbeat_;
    std::unique_lock lock(h.mu);
    while (
        !h.cv.wait_for(lock, std::chrono::duration<double>(heartbeat_s), [&] { return h.stop; })) {
      absl::StatusOr<std::string> now = fs::read_file(path_);
      if (now.ok() && *now == content_) utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);
    }
  });
}

absl::StatusOr<std::unique_ptr<DirLock>> DirLock::acquire(const std::string& dir,
                                                          const LockOptions& options,
                                                          std::string* note) {
  if (absl::Status st = fs::make_dirs(dir); !st.ok()) return st;
  const std::string path = fs::join(dir, kLockFile);
  const std::string mine = my_record(options.heartbeat_s);
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
    const std::string why = holder.ok() ? gone_reason(*holder, path, options) : "it vanished";
    if (why.empty()) {
      unlink(tmp.c_str());
      return absl::UnavailableError(absl::StrCat(
          options.what, " '", dir, "' is in use by another trainer: ", holder->describe(),
          "; wait for it, use another ", options.what, ", or remove ", path,
          " if that run is gone"));
    }
    if (holder.ok())
      *note = absl::StrCat("took over the stale lock ", path, " (", why, "): ", holder->describe());
    if (absl::Status st = fs::rename_path(tmp, path); !st.ok()) return st;
  } else {
    unlink(tmp.c_str());
  }
  return std::unique_ptr<DirLock>(new DirLock(path, mine, options.heartbeat_s));
}

DirLock::~DirLock() {
  {
    std::lock_guard lock(heartbeat_->mu);
    heartbeat_->stop = true;
  }
  heartbeat_->cv.notify_all();
  heartbeat_->thread.join();
  hold(path_, false);
  absl::StatusOr<std::string> now = fs::read_file(path_);
  if (now.ok() && *now == content_) unlink(path_.c_str());
}

}  // namespace tr::ckpt
