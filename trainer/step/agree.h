// Agreement between ranks: each rank passes its own view (an exit code, a verdict, whether a
// stop signal arrived) and every rank gets the same answer back from one all-reduce over the
// world, so that all of them take the same branch.
#pragma once

#include <csignal>
#include <cstdint>

#include "absl/status/status.h"
#include "parallel/comm.h"

namespace tr {

// Set by SIGTERM, SIGINT, SIGUSR1 or SIGUSR2 (Slurm sends SIGTERM before a time limit or
// preemption, or the --signal of the job); the ranks agree on it at the next micro-batch
// boundary (stop polls) or step boundary, save the last applied step and exit kExitStopped.
extern volatile std::sig_atomic_t g_stop_signal;
// The handler of those signals. The first says at once, on stderr, what will happen (when
// g_stop_notice: world rank 0, or a lone process); a second SIGINT (Ctrl-C again) while the
// stop is under way ends the process at once with 128 + SIGINT, without saving: the last
// committed checkpoint stands.
extern "C" void on_stop_signal(int sig);
extern volatile std::sig_atomic_t g_stop_notice;

// A stop signal agreed by the ranks (the max of theirs; 0 = none) becomes this rank's too, so
// that every rank reports and acts on the same one. Returns whether one was agreed.
bool adopt_stop_signal(int32_t agreed);

// The max over the ranks of `value`, and whether any rank has a stop signal (adopted here).
struct Agreed {
  int32_t value = 0;
  bool stop = false;
};
Agreed agree(Comm& world, int32_t value);

// What a step (or an evaluation) came to, as the ranks agreed it.
struct StepOutcome {
  int code = 0;         // the worst exit code of any rank (kExitOk: none failed)
  int own = 0;          // this rank's own exit code (for agree_on_exit: who reports)
  absl::Status status;  // this rank's own error, if any
  bool stop = false;    // a rank received a stop signal: save and exit
  bool ran = true;      // the step was applied (false: stopped before or within it)
};
// True on every rank when `ok` is true on every rank (one all-reduce).
bool all_ok(Comm& world, bool ok);

// Agrees on this rank's exit code and the stop signals.
StepOutcome agree_on_step(Comm& world, int code, absl::Status status);

// Every rank passes its own outcome (exit code and status); all get the worst exit code back.
// Only the lowest-numbered failing rank prints its error, so a config error shared by all
// ranks is one line, and a rank that fails alone (a missing file on its node) still ends the
// job instead of leaving the others waiting in a collective.
int agree_on_exit(Comm& world, int code, const absl::Status& status);

}  // namespace tr
