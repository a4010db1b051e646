// One family of check macros for failures that must stop every rank (library calls that
// fail, broken invariants). Recoverable input problems use absl::Status instead.
#pragma once

#include <string>

namespace tr {

// Prints "[rank R host H] FATAL <kind>: `expr` failed: detail (file:line)" to stderr, runs
// the abort hook (MPI_Abort once MPI is up, so srun never hangs) and aborts.
[[noreturn]] void fatal_error(const char* kind, const char* expr, const std::string& detail,
                              const char* file, int line);

// Prints "[rank R host H] error: <line>" to stderr and ends the job with `exit_code` (through
// the abort hook: MPI_Abort ends every rank). For failures with their own documented exit code
// (core/exit_codes.h), e.g. a collective past parallel.timeout_s.
[[noreturn]] void end_job(int exit_code, const std::string& line);

// The rank printed by fatal_error; set once the launcher is known. -1 = not yet known.
void set_error_rank(int rank);
// Called by fatal_error before std::abort(); the parallel layer installs MPI_Abort here.
using AbortHook = void (*)(int exit_code);
void set_abort_hook(AbortHook hook);
// Run by fatal_error and end_job before the abort hook, in the order added (e.g. removing this
// process's lock files, which no destructor will): must not throw, allocate much or block.
using CleanupHook = void (*)();
void add_fatal_cleanup(CleanupHook hook);

}  // namespace tr

// Generic: `ok` is an expression over `_v`, the value `expr` returned; `detail` a string.
#define TR_CHECK_GEN(kind, expr, ok, detail)                               \
  do {                                                                     \
    auto _v = (expr);                                                      \
    if (!(ok)) ::tr::fatal_error(kind, #expr, detail, __FILE__, __LINE__); \
  } while (0)

// Invariant of the program (not of the input).
#define TR_ASSERT(cond, msg)                                                               \
  do {                                                                                     \
    if (!(cond)) ::tr::fatal_error("ASSERT", #cond, std::string(msg), __FILE__, __LINE__); \
  } while (0)

// HDF5 calls return negative herr_t/hid_t on failure.
#define H5_CHECK(expr) TR_CHECK_GEN("HDF5", expr, _v >= 0, "negative return")
