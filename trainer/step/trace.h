// log.trace_steps: [a, b]: the phases of steps a to b on every rank as a Chrome trace (the JSON
// that chrome://tracing and ui.perfetto.dev open), for reading one step's timeline: forward and
// backward of each micro-batch, pipeline waits, TP, CP and DP collectives, the optimizer and the
// data wait, each as the phase clock charged it (trainer/obs/step_timing.h).
//
// Every rank writes its own trace, log.dir/trace/rank_RRRRR.json (a process per rank, named by
// its tp, cp, dp and pp coordinates; times in microseconds from the earliest interval of any
// rank, by the wall clock); rank 0 then merges those it can read (all of them when log.dir is
// shared) into log.dir/trace.json. The times are the host's: on GPUs they show when the host
// queued the work, not when the device ran it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm.h"
#include "parallel/topology.h"
#include "trainer/config/config.h"
#include "trainer/obs/step_timing.h"

namespace tr {

// log.profile_steps: [a, b]: steps a to b run between cudaProfilerStart and cudaProfilerStop on
// every rank, so that a profiler started with capture off records those steps and not the
// start-up, the warm-up steps or the saves: `ncu --profile-from-start off` (a table of every
// kernel's time: tools/gpu_check.sh profile), `nsys profile --capture-range=cudaProfilerApi`.
// Rank 0 logs where the capture starts and stops; on the CPU backend nothing is captured.
class ProfileWindow {
 public:
  // `logger`: rank 0, which says where the capture starts and stops.
  ProfileWindow(const Config& cfg, bool logger, Device device);
  ~ProfileWindow();  // a run that ends inside the window stops the capture
  ProfileWindow(const ProfileWindow&) = delete;
  ProfileWindow& operator=(const ProfileWindow&) = delete;
  void before_step(int64_t step);
  void after_step(int64_t step);

 private:
  int64_t first_ = 0, last_ = 0;  // the window; first_ 0 = none
  bool capturing_ = false, done_ = false, logger_ = false;
  bool gpu_ = false;  // the CUDA backend: only there is there a capture to start
};

class StepTrace {
 public:
  // This rank's place in the grid, which names its process in the trace.
  StepTrace(const Config& cfg, const Topology& topo);
  ~StepTrace();  // the phase clock stops recording into this trace (a run ended mid-window)
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;
  // Before step `step`: records its phases when it is in the window.
  void before_step(int64_t step);
  // After step `step`: stops recording; after the window's last step (or the run's, when that
  // comes first) writes the traces. Collective over the world (one all-reduce, one barrier).
  void after_step(Comm& world, int64_t step);

 private:
  void write(Comm& world);
  Topology topo_;
  std::string log_dir_;
  int64_t first_ = 0, last_ = 0;  // the window; first_ 0 = none
  bool written_ = false;
  std::vector<PhaseInterval> intervals_;
  std::vector<std::pair<int64_t, size_t>> steps_;  // each recorded step and its first interval
};

}  // namespace tr
