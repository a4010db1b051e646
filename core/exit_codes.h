// The trainer's exit codes, in one place: the trainer returns them and the parallel layer's
// watchdogs end the job with kExitCommTimeout. Documented in the README.
#pragma once

namespace tr {

inline constexpr int kExitOk = 0;        // train.steps reached
inline constexpr int kExitFailure = 1;   // a failure while running (I/O, library error)
inline constexpr int kExitBadInput = 2;  // invalid config, flag, data file or checkpoint
// Stopped before train.steps with a checkpoint saved (a signal, train.exit_interval): requeue
// and resume with --resume auto.
inline constexpr int kExitStopped = 3;
inline constexpr int kExitDiverged = 4;  // train.max_skipped_steps steps in a row were skipped
// A collective or point-to-point exchange unfinished after parallel.timeout_s (a rank hung,
// stopped or died): the job was ended by the watchdog.
inline constexpr int kExitCommTimeout = 5;
// checkpoint.dir is held by a live trainer (its lock): try again later, e.g. once a previous
// incarnation of the job has finished exiting.
inline constexpr int kExitBusy = 6;

}  // namespace tr
