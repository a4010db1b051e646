// The training loop around train_step (step.h): evaluation, checkpoints (interval, exit_interval,
// on a stop signal), the straggler report, metrics, and the end of a diverged run.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/fs_io.h"
#include "core/switches.h"
#include "kernels/ops.h"
#include "parallel/schedule.h"
#include "trainer/checkpoint/local_ckpt.h"
#include "trainer/checkpoint/saver.h"
#include "trainer/session/session.h"
#include "trainer/step/guard.h"
#include "trainer/step/step.h"
#include "trainer/step/trace.h"

namespace tr {

namespace {

double peak_mem_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB
}

// Saves the state at s.state.step unless that is already saved or in flight; with `wait`, the
// save (and one in flight) is committed before it returns. Returns the agreed exit code.
int save_step(Session& s, Saver& saver, bool wait) {
  absl::Status st = wait ? saver.settle(true) : absl::OkStatus();  // it may be this very step
  if (st.ok() && s.last_saved_step != s.state.step) st = saver.save();
  if (st.ok() && wait) st = saver.settle(true);
  return agree_on_exit(*s.groups.world, st.ok() ? kExitOk : kExitFailure, st);
}

// A stop signal: the last applied step is saved (unless it is already) and the run ends with
// kExitStopped, so that a requeue script can tell it from a finished run.
int stop_and_save(Session& s, Saver& saver, bool step_applied) {
  const int sig = static_cast<int>(g_stop_signal);
  const std::string when = step_applied ? absl::StrCat("after step ", s.state.step)
                                        : absl::StrCat("within step ", s.state.step + 1,
                                                       " at a micro-batch boundary (not applied)");
  if (s.state.step > 0)
    if (int code = save_step(s, saver, true); code != kExitOk) return code;
  std::printf("stopped by signal %d (%s) %s; last checkpoint: %s; resume with --resume auto\n", sig,
              strsignal(sig), when.c_str(), s.last_checkpoint().c_str());
  std::fflush(stdout);
  return kExitStopped;
}

// The straggler report, every log.interval steps: each rank's own work per step (its step time
// minus its time blocked in MPI calls; on NCCL ranks the whole step) is gathered, and the
// slowest rank goes into the metrics, with a console line when it is more than
// log.straggler_percent over the median. Collective over world.
void report_stragglers(Session& s, StepMetrics& m, double busy_per_step) {
  Comm& w = *s.groups.world;
  std::vector<double> all(static_cast<size_t>(w.size()));
  w.all_gather(Tensor(all.data(), DType::f64, Device::cpu, {w.size()}),
               Tensor(&busy_per_step, DType::f64, Device::cpu, {1}));
  const auto slowest = std::max_element(all.begin(), all.end());
  std::vector<double> sorted = all;
  const size_t mid = static_cast<size_t>(w.size() - 1) / 2;  // the lower median
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(mid), sorted.end());
  m.slowest_rank = static_cast<int>(slowest - all.begin());
  m.slowest_busy_s = *slowest;
  m.median_busy_s = sorted[mid];
  const double pct = s.cfg.log.straggler_percent;
  if (pct > 0 && s.logger() && m.slowest_busy_s > m.median_busy_s * (1 + pct / 100)) {
    const Topology t = s.topo().of_rank(m.slowest_rank);
    std::printf(
        "straggler: rank %d (tp %d, pp %d, dp %d) worked %.3f s per step over the last %lld "
        "steps, %.0f%% over the median rank's %.3f s (log.straggler_percent=%g)\n",
        m.slowest_rank, t.tp_rank, t.pp_rank, t.dp_rank, m.slowest_busy_s,
        static_cast<long long>(s.cfg.log.interval), 100 * (m.slowest_busy_s / m.median_busy_s - 1),
        m.median_busy_s, pct);
  }
}

// The exit-4 error of a diverged run: it names the last checkpoint from before the skips (or
// says there is none) and the --resume that continues from it.
absl::Status diverged_error(const Session& s, const StepGuard& guard, int64_t step,
                            int64_t before_skips) {
  // Steps without a target are the data's fault, not the run's: no resume helps.
  if (guard.last_skip() == StepGuard::Verdict::skip_no_targets)
    return absl::AbortedError(absl::StrFormat(
        "training stopped: %d steps in a row skipped (train.max_skipped_steps) up to step %d, the "
        "last with no target to learn from (every target masked: data.eod_mask_loss over "
        "end-of-document tokens); check data.eod_id and the data's documents",
        guard.skipped_in_a_row(), step));
  if (before_skips < 0)
    return absl::AbortedError(absl::StrFormat(
        "training diverged: %d steps in a row skipped (train.max_skipped_steps) up to step %d, "
        "before any checkpoint; start again with a lower optim.lr",
        guard.skipped_in_a_row(), step));
  return absl::AbortedError(absl::StrFormat(
      "training diverged: %d steps in a row skipped (train.max_skipped_steps) up to step %d; the "
      "last checkpoint before them is %s: resume from it with --resume %s and a lower optim.lr, "
      "or from an earlier one",
      guard.skipped_in_a_row(), step, ckpt::step_dir_name(before_skips),
      fs::join(s.cfg.checkpoint.dir, ckpt::step_dir_name(before_skips))));
}

// What the loop keeps between steps.
struct LoopState {
  Clock::time_point start = Clock::now();
  StepMetrics m;
  StepGuard guard;
  Saver saver;
  LocalCheckpoints local;
  StepTrace trace;
  ProfileWindow profile;
  // The newest checkpoint from before the current run of skipped steps: interval saves pause
  // while steps are being skipped, so a diverging run never pushes its good checkpoints out.
  int64_t before_skips = -1;
  double busy_s = 0;  // this rank's own work since the last straggler report
  int64_t fast_fallbacks = attention_fast_fallbacks();    // as of the last step
  int64_t ragged_launches = attention_ragged_launches();  // the same
  LoopState(Session& s)
      : guard(s.cfg.train),
        saver(s),
        local(s),
        trace(s.cfg, s.topo()),
        profile(s.cfg, s.logger(), s.ctx.device),
        before_skips(s.last_saved_step) {
    m.total_steps = s.cfg.train.steps;
    m.peak_flops = device_info(s.ctx).peak_bf16_flops;
    if (s.ctx.device == Device::cuda)
      m.attention_bwd = s.model->attention_bwd_deterministic() ? "deterministic" : "fast";
    m.world = s.topo().world;
    guard.restore(s.state.loss_window, s.state.skipped_in_a_row, s.state.skipped_total);
    local.prepare();
  }
};

// After an applied step: its asynchronous save's commit, the straggler report and the metrics
// line. Returns the agreed exit code.
int account_step(Session& s, LoopState& l, double blocked_before) {
  StepMetrics& m = l.m;
  if (l.saver.in_flight()) {  // an asynchronous save commits once every rank has written it
    absl::Status st = l.saver.settle(false);
    if (int code = agree_on_exit(*s.groups.world, st.ok() ? kExitOk : kExitFailure, st);
        code != kExitOk)
      return code;
  }
  l.busy_s += m.step_time_s - (mpi_blocked_seconds() - blocked_before);
  ++m.steps_done_here;
  m.slowest_rank = -1;
  if (s.topo().world > 1 && m.step % s.cfg.log.interval == 0) {
    report_stragglers(s, m, l.busy_s / static_cast<double>(s.cfg.log.interval));
    l.busy_s = 0;
  }
  m.elapsed_s = seconds_since(l.start);
  if (s.ctx.device == Device::cuda) {
    // Fast where asked for, or where cuDNN ran the fast backward for some of this step's
    // attention (a micro-batch of packed documents, kernels/ops.h attention_fast_fallbacks).
    const int64_t fallbacks = attention_fast_fallbacks();
    m.attention_bwd = s.model->attention_bwd_deterministic() && fallbacks == l.fast_fallbacks
                          ? "deterministic"
                          : "fast";
    l.fast_fallbacks = fallbacks;
    if (s.cfg.data.document_mask == "block_causal") {
      const int64_t launches = attention_ragged_launches();
      m.attention_ragged = launches - l.ragged_launches;
      l.ragged_launches = launches;
    }
  }
  m.peak_mem_mib = peak_mem_mib();
  if (s.ctx.device != Device::cpu) m.device_mem_mib = device_info(s.ctx).memory_used_mib;
  if (s.log.writes())  // rank 0, and with log.tensorboard_all_ranks every rank's event file
    s.log.step(m, m.step % s.cfg.log.interval == 0 || m.step == s.cfg.train.steps || m.step == 1 ||
                      *m.skipped != '\0');
  return kExitOk;
}

// An evaluation when train.eval_interval says so. Returns the agreed exit code, or -1 to go on.
int maybe_evaluate(Session& s, LoopState& l) {
  const TrainConfig& t = s.cfg.train;
  const int64_t step = l.m.step;
  if (t.eval_interval <= 0 || (step % t.eval_interval != 0 && step != t.steps)) return -1;
  const auto e0 = Clock::now();
  double val = 0;
  StepOutcome eval = evaluate(s, &val);
  if (eval.code != kExitOk) return agree_on_exit(*s.groups.world, eval.own, eval.status);
  if (eval.stop) return stop_and_save(s, l.saver, true);  // the step was applied
  if (s.logger()) s.log.eval(step, val, seconds_since(e0));
  return -1;
}

// The saves after an applied step: interval, exit_interval and the last step's (unless
// checkpoint.save_at_end is off); a stop signal saves and ends the run. Returns the exit code,
// or -1 to go on.
int save_after_step(Session& s, LoopState& l, bool stop) {
  const TrainConfig& t = s.cfg.train;
  const int64_t step = l.m.step;
  // No interval save while steps are being skipped (the weights are those of the last applied
  // step, already saved or about to be after the skips end).
  const bool interval = s.cfg.checkpoint.interval > 0 && step % s.cfg.checkpoint.interval == 0 &&
                        l.guard.skipped_in_a_row() == 0;
  const bool exit_now = t.exit_interval > 0 && step % t.exit_interval == 0 && step < t.steps;
  const bool last = step == t.steps;
  if (stop) return stop_and_save(s, l.saver, true);
  if (interval || exit_now || (last && s.cfg.checkpoint.save_at_end)) {
    if (int code = save_step(s, l.saver, exit_now || last); code != kExitOk) return code;
  } else if (last) {  // no save at the end: an earlier one still in flight commits first
    const absl::Status st = l.saver.settle(true);
    if (int code = agree_on_exit(*s.groups.world, st.ok() ? kExitOk : kExitFailure, st);
        code != kExitOk)
      return code;
  }
  if (exit_now) {
    std::printf(
        "exit_interval: stopping after step %lld (exit code %d); resume with --resume auto\n",
        static_cast<long long>(step), kExitStopped);
    return kExitStopped;
  }
  if (l.guard.skipped_in_a_row() == 0) l.before_skips = s.last_saved_step;
  return -1;
}

int train_loop_steps(Session& s) {
  absl::StatusOr<FaultInjector> fault = FaultInjector::from_switches();
  if (!fault.ok()) return agree_on_exit(*s.groups.world, kExitBadInput, fault.status());
  LoopState l(s);
  while (s.state.step < s.cfg.train.steps) {
    const double blocked_before = mpi_blocked_seconds();
    l.trace.before_step(s.state.step + 1);
    l.profile.before_step(s.state.step + 1);
    StepOutcome out = train_step(s, l.m, l.guard, *fault);
    if (out.code != kExitOk) return agree_on_exit(*s.groups.world, out.own, out.status);
    if (!out.ran) return stop_and_save(s, l.saver, false);
    l.trace.after_step(*s.groups.world, l.m.step);
    if (int code = account_step(s, l, blocked_before); code != kExitOk) return code;
    l.profile.after_step(l.m.step);  // after the step's log line
    // The same on every rank: the verdicts were agreed.
    if (l.guard.diverged())
      return agree_on_exit(*s.groups.world, kExitDiverged,
                           diverged_error(s, l.guard, l.m.step, l.before_skips));
    if (int code = maybe_evaluate(s, l); code >= 0) return code;
    if (int code = save_after_step(s, l, out.stop); code >= 0) return code;
    l.local.settle(false);  // a local part written by every rank counts from here
    if (l.local.due(l.m.step) && l.guard.skipped_in_a_row() == 0) l.local.save();
  }
  l.local.settle(true);  // a finished run's last local part counts
  std::printf("done: %lld steps, last loss %.4f, %s; last checkpoint: %s%s\n",
              static_cast<long long>(s.state.step), l.m.loss,
              format_duration(seconds_since(l.start)).c_str(), s.last_checkpoint().c_str(),
              s.cfg.checkpoint.save_at_end ? "" : " (checkpoint.save_at_end: false)");
  return kExitOk;
}

}  // namespace

int train_loop(Session& s) {
  const int code = train_loop_steps(s);
  s.opt->finish_weights();  // ZeRO-1: no weight all-gather outlives the run
  return code;
}

}  // namespace tr
