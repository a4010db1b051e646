#include "trainer/step/agree.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/exit_codes.h"

namespace tr {

volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_stop_notice = 1;
namespace {
volatile std::sig_atomic_t g_interrupts = 0;  // SIGINTs this process received

// write(2) of a literal: all a signal handler may do to print.
template <size_t N>
void say_now(const char (&text)[N]) {
  if (g_stop_notice) (void)!write(STDERR_FILENO, text, N - 1);
}
}  // namespace

extern "C" void on_stop_signal(int sig) {
  if (sig == SIGINT) g_interrupts = g_interrupts + 1;
  if (sig == SIGINT && g_interrupts >= 2) {
    say_now(
        "trainer: Ctrl-C again: stopping now, without saving; the last committed checkpoint "
        "stands\n");
    _exit(128 + SIGINT);
  }
  if (g_stop_signal == 0)
    say_now(
        "trainer: stop requested: finishing the current micro-batch, then saving the last "
        "applied step and exiting with code 3 (Ctrl-C again: stop now, without saving)\n");
  g_stop_signal = sig;
}

bool adopt_stop_signal(int32_t agreed) {
  if (agreed != 0 && g_stop_signal == 0) g_stop_signal = agreed;
  return agreed != 0;
}

Agreed agree(Comm& world, int32_t value) {
  int32_t v[2] = {value, static_cast<int32_t>(g_stop_signal)};
  world.all_reduce(Tensor(v, DType::i32, Device::cpu, {2}), ReduceOp::max);
  return {v[0], adopt_stop_signal(v[1])};
}

bool all_ok(Comm& world, bool ok) {
  int32_t failed = ok ? 0 : 1;
  world.all_reduce(Tensor(&failed, DType::i32, Device::cpu, {1}), ReduceOp::max);
  return failed == 0;
}

StepOutcome agree_on_step(Comm& world, int code, absl::Status status) {
  const Agreed a = agree(world, code);
  return {a.value, code, std::move(status), a.stop};
}

int agree_on_exit(Comm& w, int code, const absl::Status& status) {
  int32_t v[2] = {code, code != kExitOk ? -w.rank() : -w.size()};  // max of -rank = min rank
  w.all_reduce(Tensor(v, DType::i32, Device::cpu, {2}), ReduceOp::max);
  if (code != kExitOk && -v[1] == w.rank() && !status.message().empty()) {
    const std::string who = w.size() > 1 ? absl::StrCat("rank ", w.rank(), ": ") : "";
    std::fprintf(stderr, "error: %s%s\n", who.c_str(), std::string(status.message()).c_str());
  }
  return v[0];
}

}  // namespace tr
