#include "trainer/step/trace.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/fs_io.h"
#include "kernels/device.h"
#include "nlohmann/json.hpp"

namespace tr {
namespace {

// Microseconds since the epoch, by the wall clock, of steady-clock time points: the ranks of a
// job share the wall clock (to the accuracy of its synchronisation), not the steady one.
class WallClock {
 public:
  WallClock()
      : offset_us_(us(std::chrono::system_clock::now().time_since_epoch()) -
                   us(PhaseClock::Clock::now().time_since_epoch())) {}
  double operator()(PhaseClock::Clock::time_point t) const {
    return us(t.time_since_epoch()) + offset_us_;
  }

 private:
  template <class D>
  static double us(D d) {
    return std::chrono::duration<double, std::micro>(d).count();
  }
  double offset_us_;
};

std::string rank_file(const std::string& dir, int rank) {
  return fs::join(dir, absl::StrFormat("rank_%05d.json", rank));
}

// The events of one rank, comma-separated: its process and thread names, a span per step on
// thread 1, and a complete event per phase interval on thread 0.
std::string rank_events(const Topology& t, const std::vector<PhaseInterval>& intervals,
                        const std::vector<std::pair<int64_t, size_t>>& steps,
                        const WallClock& wall_us, double t0_us) {
  using nlohmann::json;
  const int pid = t.rank;
  const std::string name = absl::StrFormat("rank %d (tp %d, cp %d, dp %d, pp %d)", pid, t.tp_rank,
                                           t.cp_rank, t.dp_rank, t.pp_rank);
  std::vector<json> events = {
      {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}},
      {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}},
      {{"name", "thread_name"},
       {"ph", "M"},
       {"pid", pid},
       {"tid", 0},
       {"args", {{"name", "phases"}}}},
      {{"name", "thread_name"},
       {"ph", "M"},
       {"pid", pid},
       {"tid", 1},
       {"args", {{"name", "steps"}}}}};
  auto slice = [&](const std::string& what, const char* cat, int tid, double from, double to,
                   int64_t step) {
    events.push_back({{"name", what},
                      {"cat", cat},
                      {"ph", "X"},
                      {"pid", pid},
                      {"tid", tid},
                      {"ts", from - t0_us},
                      {"dur", to - from},
                      {"args", {{"step", step}}}});
  };
  for (size_t k = 0; k < steps.size(); ++k) {
    const size_t begin = steps[k].second;
    const size_t end = k + 1 < steps.size() ? steps[k + 1].second : intervals.size();
    if (begin == end) continue;
    const int64_t step = steps[k].first;
    slice(absl::StrCat("step ", step), "step", 1, wall_us(intervals[begin].begin),
          wall_us(intervals[end - 1].end), step);
    for (size_t i = begin; i < end; ++i)
      slice(phase_name(intervals[i].phase), "phase", 0, wall_us(intervals[i].begin),
            wall_us(intervals[i].end), step);
  }
  std::string out;
  for (const json& e : events) absl::StrAppend(&out, out.empty() ? "" : ",\n", e.dump());
  return out;
}

// A log.*_steps window [first, last] cut at train.steps ({0, 0}: none). The logger (rank 0) warns
// when it lies past the run or is cut; `who` prefixes the line, `done` is what the window's steps
// are.
std::pair<int64_t, int64_t> run_window(const Config& cfg, bool logger, const char* key,
                                       const std::vector<int64_t>& w, const char* who,
                                       const char* done) {
  if (w.size() != 2) return {0, 0};
  const long long first = w[0], last = w[1], steps = cfg.train.steps;
  if (logger && first > steps)
    std::printf("warning: %s: %s starts at step %lld, after train.steps %lld: nothing is %s\n", who,
                key, first, steps, done);
  else if (logger && last > steps)
    std::printf(
        "warning: %s: %s ends at step %lld, after train.steps %lld: only steps %lld to %lld are "
        "%s\n",
        who, key, last, steps, first, steps, done);
  return {w[0], std::min(w[1], cfg.train.steps)};
}

}  // namespace

ProfileWindow::ProfileWindow(const Config& cfg, bool logger, Device device)
    : logger_(logger), gpu_(device == Device::cuda) {
  std::tie(first_, last_) =
      run_window(cfg, logger, "log.profile_steps", cfg.log.profile_steps, "profiler", "captured");
}

ProfileWindow::~ProfileWindow() {
  if (capturing_ && gpu_) profiler_capture(false);
}

void ProfileWindow::before_step(int64_t step) {
  if (first_ <= 0 || capturing_ || done_ || step < first_ || step > last_) return;
  if (gpu_) profiler_capture(true);
  capturing_ = true;
  if (logger_)
    std::printf("profiler: capturing steps %lld to %lld (cudaProfilerStart)\n",
                static_cast<long long>(step), static_cast<long long>(last_));
}

void ProfileWindow::after_step(int64_t step) {
  if (!capturing_ || step < last_) return;
  if (gpu_) profiler_capture(false);
  capturing_ = false;
  done_ = true;
  if (logger_)
    std::printf("profiler: capture stopped after step %lld (cudaProfilerStop)\n",
                static_cast<long long>(step));
}

StepTrace::StepTrace(const Config& cfg, const Topology& topo) : topo_(topo), log_dir_(cfg.log.dir) {
  std::tie(first_, last_) =
      run_window(cfg, topo.rank == 0, "log.trace_steps", cfg.log.trace_steps, "trace", "traced");
}

StepTrace::~StepTrace() {
  phase_clock().record_into(nullptr);
}

void StepTrace::before_step(int64_t step) {
  if (first_ <= 0 || written_ || step < first_ || step > last_) return;
  steps_.emplace_back(step, intervals_.size());
  phase_clock().record_into(&intervals_);
}

void StepTrace::after_step(Comm& world, int64_t step) {
  if (first_ <= 0 || written_ || step < first_) return;
  phase_clock().record_into(nullptr);
  if (step < last_) return;
  if (steps_.empty())  // resumed past the window: nothing recorded, nothing to write
    written_ = true;
  else
    write(world);  // the same on every rank: they ran the same steps
}

void StepTrace::write(Comm& world) {
  written_ = true;
  const WallClock wall_us;
  // The time axis starts at the earliest interval of any rank (the max of minus each first).
  double minus_t0 = intervals_.empty() ? -std::numeric_limits<double>::infinity()
                                       : -wall_us(intervals_.front().begin);
  world.all_reduce(Tensor(&minus_t0, DType::f64, Device::cpu, {1}), ReduceOp::max);
  const double t0 = -minus_t0;
  const std::string dir = fs::join(log_dir_, "trace");
  absl::Status st = fs::make_dirs(dir);
  const std::string mine = rank_events(topo_, intervals_, steps_, wall_us, t0);
  if (st.ok())
    st = fs::write_file_atomic(rank_file(dir, topo_.rank),
                               absl::StrCat("{\"traceEvents\": [\n", mine, "\n]}\n"));
  if (!st.ok())
    std::fprintf(stderr, "warning: rank %d: trace not written: %s\n", topo_.rank,
                 std::string(st.message()).c_str());
  world.barrier();
  if (topo_.rank != 0) return;
  // Rank 0 merges every rank's events it can read (all of them when log.dir is shared).
  std::string merged = "{\"traceEvents\": [\n" + mine;
  int ranks = 1;
  for (int r = 1; r < world.size(); ++r) {
    absl::StatusOr<std::string> text = fs::read_file(rank_file(dir, r));
    const size_t open = text.ok() ? text->find("[\n") : std::string::npos;
    const size_t close = text.ok() ? text->rfind("\n]}") : std::string::npos;
    if (open == std::string::npos || close == std::string::npos || close < open + 2) continue;
    absl::StrAppend(&merged, ",\n", text->substr(open + 2, close - open - 2));
    ++ranks;
  }
  merged += "\n]}\n";
  const std::string path = fs::join(log_dir_, "trace.json");
  st = fs::write_file_atomic(path, merged);
  if (!st.ok()) {
    std::fprintf(stderr, "warning: trace not written: %s\n", std::string(st.message()).c_str());
    return;
  }
  std::printf(
      "trace: steps %lld-%lld of %d of %d ranks in %s (chrome://tracing, "
      "ui.perfetto.dev)\n",
      static_cast<long long>(first_), static_cast<long long>(last_), ranks, world.size(),
      path.c_str());
}

}  // namespace tr
