#include "core/switches.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tr {
namespace {

constexpr int kSwitches = static_cast<int>(Switch::count_);
constexpr int kSettings = static_cast<int>(Setting::count_);

// In the order of enum Switch.
const std::array<SwitchInfo, kSwitches> kSwitchTable = {{
    {"TR_XENT_3PASS", SwitchKind::kernel,
     "cross-entropy in three passes (row max, sums, loss and gradient; with tp > 1 two TP "
     "all-reduces) instead of the fused online pass"},
    {"TR_ROPE_FP64", SwitchKind::kernel,
     "GPU RoPE computes its angles in fp64 per element instead of reading the fp32 cos/sin table"},
    {"TR_ADAMW_PER_TENSOR", SwitchKind::kernel,
     "AdamW as one double-precision kernel per tensor with clipping as a pass of its own, "
     "instead of the multi-tensor fp32 update"},
    {"TR_NORM_PER_TENSOR", SwitchKind::kernel,
     "the squared gradient norm as one reduction per tensor instead of one pass over the pieces "
     "table"},
    {"TR_GRAD_ZERO", SwitchKind::kernel,
     "zero the whole gradient buffer before each step and accumulate, instead of the first "
     "micro-batch assigning"},
    {"TR_TRACE_PIPELINE", SwitchKind::trace,
     "each pipeline stage's first TP/DP rank prints the forward/backward order it executed"},
    {"TR_TRACE_DP", SwitchKind::trace,
     "world rank 0 prints, per step, the DP buckets started during backward and the weight "
     "buckets completed by the forward"},
    {"TR_TRACE_TP", SwitchKind::trace,
     "world rank 0 prints, per step, how many column-parallel input-gradient reductions ran "
     "beside their weight gradients (parallel.overlap_tp)"},
    {"TR_TEST_POISON_GRADS", SwitchKind::test,
     "every gradient is NaN before each step (proves the step assigns what it does not zero)"},
    {"TR_TEST_COMPUTE_COPY", SwitchKind::test,
     "CPU ranks keep a separate compute copy of the weights, the GPU's layout (ZeRO-1 then "
     "shards the fp32 masters)"},
    {"TR_TEST_SMALL_SHAPES", SwitchKind::test,
     "the GPU op tests leave out shapes with operands over 1M elements (for compute-sanitizer)"},
}};

const std::array<SwitchInfo, kSettings> kSettingTable = {{
    {"TR_LOSS_CHUNK_TOKENS", SwitchKind::kernel,
     "N: tokens per loss chunk (LM head and cross-entropy) instead of the size from the memory "
     "budget (0: that size)",
     /*integer=*/true},
    {"TR_TEST_FAULT", SwitchKind::test,
     "KIND:STEP[:COUNT[:ARG]]: injects a fault at STEP for COUNT steps (grad_nan, loss_nan, "
     "loss_spike, hang, kill, slow, sigterm; trainer/step/faults.h says what ARG means for each)"},
    {"TR_TEST_CRASH_POINT", SwitchKind::test,
     "STAGE[@N]: dies by SIGKILL at that stage of a checkpoint save's commit (N: of the save of "
     "step N), or after the Nth move of a start-over or roll-back (STAGE move_aside)"},
    {"TR_NODE_NAME", SwitchKind::test,
     "NAME: this process's node for the node-local checkpoints instead of the host name (so that "
     "CPU tests run several nodes on one machine)"},
    {"TR_SOURCE_DIR", SwitchKind::test,
     "PATH: the source tree whose configs, docs, tools and fixtures the tests read, instead of "
     "the nearest one above the test executable (a build moved elsewhere: tools/gpu_pack.sh)"},
}};

struct Registry {
  std::array<std::atomic<bool>, kSwitches> on{};
  std::array<std::atomic<int64_t>, kSwitches> taken{};
  std::mutex mu;  // guards settings
  std::array<std::string, kSettings> settings;
  // The first malformed switch or setting in the environment, as one line; "" when none.
  std::string malformed;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    for (int i = 0; i < kSwitches; ++i) {
      const char* v = std::getenv(kSwitchTable[i].env);
      const std::string value = v == nullptr ? "" : v;
      const std::optional<bool> on = parse_switch_value(value);
      reg->on[i] = on.value_or(false);
      if (!on && reg->malformed.empty())
        reg->malformed = absl::StrCat("debug switch ", kSwitchTable[i].env, "='", value,
                                      "': set it to 1 (on) or 0 (off), or unset it");
    }
    for (int i = 0; i < kSettings; ++i) {
      const char* v = std::getenv(kSettingTable[i].env);
      reg->settings[i] = v == nullptr ? "" : v;
      int64_t n = 0;
      if (kSettingTable[i].integer && !reg->settings[i].empty() && reg->malformed.empty() &&
          (!absl::SimpleAtoi(reg->settings[i], &n) || n < 0))
        reg->malformed = absl::StrCat("debug setting ", kSettingTable[i].env, "='",
                                      reg->settings[i], "': expected an integer >= 0, or unset it");
    }
    return reg;
  }();
  return *r;
}

const char* kind_name(SwitchKind k) {
  switch (k) {
    case SwitchKind::kernel:
      return "kernel";
    case SwitchKind::trace:
      return "trace";
    case SwitchKind::test:
      return "test";
  }
  return "?";
}

}  // namespace

std::optional<bool> parse_switch_value(std::string_view value) {
  if (value.empty() || value == "0") return false;
  if (value == "1") return true;
  return std::nullopt;
}

const SwitchInfo& switch_info(Switch s) {
  return kSwitchTable[static_cast<int>(s)];
}

bool switch_on(Switch s) {
  return registry().on[static_cast<int>(s)].load();
}

bool take(Switch s) {
  if (!switch_on(s)) return false;
  registry().taken[static_cast<int>(s)].fetch_add(1);
  return true;
}

int64_t taken_count(Switch s) {
  return registry().taken[static_cast<int>(s)].load();
}

std::string setting(Setting s) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return r.settings[static_cast<int>(s)];
}

int64_t setting_int(Setting s) {
  int64_t n = 0;
  return absl::SimpleAtoi(setting(s), &n) && n >= 0 ? n : 0;
}

absl::Status validate_switches() {
  const Registry& r = registry();
  if (r.malformed.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(r.malformed, " (docs/debug.md)"));
}

std::vector<std::string> active_switches() {
  std::vector<std::string> out;
  for (int i = 0; i < kSwitches; ++i)
    if (switch_on(static_cast<Switch>(i))) out.push_back(absl::StrCat(kSwitchTable[i].env, "=1"));
  for (int i = 0; i < kSettings; ++i)
    if (std::string v = setting(static_cast<Setting>(i)); !v.empty())
      out.push_back(absl::StrCat(kSettingTable[i].env, "=", v));
  return out;
}

std::vector<std::string> taken_switches() {
  std::vector<std::string> out;
  for (int i = 0; i < kSwitches; ++i)
    if (const int64_t n = taken_count(static_cast<Switch>(i)); n > 0)
      out.push_back(absl::StrCat(kSwitchTable[i].env, " (", n, " times)"));
  return out;
}

std::string switch_docs_markdown() {
  std::string md =
      "| variable | kind | what it does |\n"
      "|---|---|---|\n";
  for (const SwitchInfo& s : kSwitchTable)
    absl::StrAppend(&md, "| `", s.env, "=1` | ", kind_name(s.kind), " | ", s.doc, " |\n");
  for (const SwitchInfo& s : kSettingTable)
    absl::StrAppend(&md, "| `", s.env, "` | ", kind_name(s.kind), " | ", s.doc, " |\n");
  return md;
}

ScopedSwitch::ScopedSwitch(Switch s, bool on)
    : s_(s), prev_(registry().on[static_cast<int>(s)].exchange(on)) {}

ScopedSwitch::~ScopedSwitch() {
  registry().on[static_cast<int>(s_)] = prev_;
}

ScopedSetting::ScopedSetting(Setting s, std::string value) : s_(s) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  prev_ = std::exchange(r.settings[static_cast<int>(s)], std::move(value));
}

ScopedSetting::~ScopedSetting() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.settings[static_cast<int>(s_)] = std::move(prev_);
}

std::optional<std::string> launcher_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

}  // namespace tr
