// The one registry of debug and bisect switches (TR_* environment variables), and the one place
// the process environment is read.
//
// A switch is on when its variable is "1", off when it is unset, empty or "0"; any other value is
// a bad input (validate_switches() names it). The environment is parsed once, on first use;
// tests flip a switch in process with ScopedSwitch, and every place that takes a switch's other
// path says so with take(), so a test can prove the switch still changes what runs
// (taken_count()). Valued settings (an integer or a fault spec) work the same way. docs/debug.md
// lists them all (generated from this table: switch_docs_markdown()).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace tr {

enum class Switch : int {
  xent_3pass,         // TR_XENT_3PASS
  rope_fp64,          // TR_ROPE_FP64
  adamw_per_tensor,   // TR_ADAMW_PER_TENSOR
  norm_per_tensor,    // TR_NORM_PER_TENSOR
  grad_zero,          // TR_GRAD_ZERO
  trace_pipeline,     // TR_TRACE_PIPELINE
  trace_dp,           // TR_TRACE_DP
  trace_tp,           // TR_TRACE_TP
  test_poison_grads,  // TR_TEST_POISON_GRADS
  test_compute_copy,  // TR_TEST_COMPUTE_COPY
  test_small_shapes,  // TR_TEST_SMALL_SHAPES
  count_
};

enum class Setting : int {
  loss_chunk_tokens,  // TR_LOSS_CHUNK_TOKENS
  test_fault,         // TR_TEST_FAULT
  test_crash_point,   // TR_TEST_CRASH_POINT
  node_name,          // TR_NODE_NAME
  test_source_dir,    // TR_SOURCE_DIR
  count_
};

// What a switch is for: a kernel or code path to bisect against, a trace, or a test hook.
enum class SwitchKind { kernel, trace, test };

struct SwitchInfo {
  const char* env;  // the variable, e.g. "TR_XENT_3PASS"
  SwitchKind kind;
  const char* doc;       // one line: what =1 does (a setting: what its value means)
  bool integer = false;  // a setting whose value is an integer >= 0
};

const SwitchInfo& switch_info(Switch s);

// The one on/off rule: "1" is on; "" (unset) and "0" are off; anything else is nullopt (malformed).
std::optional<bool> parse_switch_value(std::string_view value);

// Whether `s` is on (reads nothing but the registry once the environment is parsed).
bool switch_on(Switch s);
// At a decision point: whether to take `s`'s other path, counting each time it is taken.
bool take(Switch s);
// How often take(s) returned true in this process.
int64_t taken_count(Switch s);

// The value of a setting; "" when unset.
std::string setting(Setting s);
// An integer setting's value; 0 when unset (validate_switches() refuses a malformed one).
int64_t setting_int(Setting s);

// The first malformed switch in the environment (a value other than "", "0" or "1"; an integer
// setting that is not an integer >= 0), as one line naming the variable and the fix; OK when all
// are well formed. The trainer checks it at start-up (exit 2).
absl::Status validate_switches();

// Every switch that is on and every setting that is set, as "TR_NAME=value" (printed with the
// resolved config, so a log says which paths ran).
std::vector<std::string> active_switches();

// Every switch whose other path was taken in this process, as "TR_NAME (N times)" (the trainer
// prints them as it ends, so a test of the process can see that a switch changed what ran).
std::vector<std::string> taken_switches();

// The markdown table of every switch and setting (docs/debug.md holds it; a test checks).
std::string switch_docs_markdown();

// Sets a switch (or setting) for this scope and restores the previous value after: tests flip
// switches in process with these instead of the environment.
class ScopedSwitch {
 public:
  ScopedSwitch(Switch s, bool on);
  ~ScopedSwitch();
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  Switch s_;
  bool prev_;
};

class ScopedSetting {
 public:
  ScopedSetting(Setting s, std::string value);
  ~ScopedSetting();
  ScopedSetting(const ScopedSetting&) = delete;
  ScopedSetting& operator=(const ScopedSetting&) = delete;

 private:
  Setting s_;
  std::string prev_;
};

// A variable set by the launcher or the scheduler (SLURM_JOB_ID, OMPI_COMM_WORLD_SIZE, ...): not a
// switch, read here so that the environment has one home. nullopt when unset.
std::optional<std::string> launcher_env(const char* name);

}  // namespace tr
