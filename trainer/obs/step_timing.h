// Where a step's time goes: each part of the step runs under one phase, and a phase clock
// charges the wall time to whichever phase is current (the innermost: a TP collective inside a
// forward is TP time, not forward time), so the phases add up to the step time exactly. The
// communicators of the tp, cp, pp and dp groups charge their calls to their phase themselves
// (timed_comm), the step code marks forward, backward, optimizer and data wait.
//
// The clock's timers are the host's: on the CPU backend they measure the work. On GPUs the host
// only queues an asynchronous step, so there DevicePhaseTimes times the phases as the device ran
// them (CUDA events at each change of phase, read at the step's one host sync), and NVTX ranges of
// the same phases show them in Nsight Systems.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/ctx.h"
#include "parallel/comm.h"

namespace tr {

enum class Phase : int {
  other,          // everything not below: the step's agreements, norms, bookkeeping
  data_wait,      // waiting for the step's batch
  forward,        // the forward of the stage's layers and the loss
  backward,       // their backward
  pipeline_wait,  // sending and receiving activations and gradients between stages
  tp_comm,        // tensor-parallel collectives
  cp_comm,        // context parallelism's exchange of keys and values (and their gradients)
  dp_wait,        // the data-parallel gradient reduction and ZeRO-1's weight all-gather, as
                  // far as the step waits for them (the overlapped part is charged elsewhere)
  optimizer,      // clipping and the update
};
inline constexpr int kPhases = 9;

// A phase's name as traces show it ("forward", "tp collective"; NVTX and log.trace_steps).
const char* phase_name(Phase p);

struct PhaseInterval;

// This thread's phase clock (the training thread's is the one the step reads).
class PhaseClock {
 public:
  using Clock = std::chrono::steady_clock;
  // Starts a step: every phase at 0, the current phase `other`.
  void start();
  // Ends a step: the marker hears of no change of phase until the next start().
  void stop();
  // Told of every change of phase within a step (start() is a change to `other`), and of the
  // step's end (stop(): kPhases); empty = none. DevicePhaseTimes sets it.
  void set_marker(std::function<void(int)> marker) { marker_ = std::move(marker); }
  // Makes `p` current and returns the phase it replaces; the time so far goes to that one.
  Phase enter(Phase p);
  // The seconds of each phase since start(), the current one's running time included.
  std::array<double, kPhases> seconds();
  // While set, each interval a step charges to a phase is appended to `out` (log.trace_steps,
  // trainer/step/trace.h); null = none.
  void record_into(std::vector<PhaseInterval>* out) { record_ = out; }

 private:
  void charge();
  std::array<double, kPhases> s_{};
  Phase current_ = Phase::other;
  Clock::time_point since_ = Clock::now();
  std::function<void(int)> marker_;
  bool in_step_ = false;
  std::vector<PhaseInterval>* record_ = nullptr;
};
PhaseClock& phase_clock();

// One stretch of a step's time and the phase it was charged to.
struct PhaseInterval {
  Phase phase;
  PhaseClock::Clock::time_point begin, end;
};

// Runs its scope in phase `p` and restores the phase before it. In a CUDA build the scope is also
// an NVTX range named after the phase, so that Nsight Systems shows the phases on its timeline.
class ScopedPhase {
 public:
  explicit ScopedPhase(Phase p);
  ~ScopedPhase();
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  Phase prev_;
};

// The phases of each step as a GPU ran them (train.backend=cuda): the phase clock of the thread
// that makes it queues a CUDA event on the compute stream at each change of phase within a step,
// and collect(), called after the step's one host sync, sums the intervals by phase (no new host
// sync). A step's parts are the device's work queued between the previous step's sync and its
// own: the previous step's update, then this step's forward and backward. The cut is at the
// sync, not at whatever the device happens to have finished when collect() asks, so the update
// counts in the next step whether or not it is done by then; the time between steps
// (evaluation, saves) counts in none.
class DevicePhaseTimes {
 public:
  // Null on the CPU backend and in builds without CUDA.
  static std::unique_ptr<DevicePhaseTimes> make(const Ctx& ctx);
  ~DevicePhaseTimes();
  // Called right after the step's host sync: the marks made so far are complete.
  void at_sync();
  // The seconds of each phase among the intervals up to the last at_sync() not yet collected.
  std::array<double, kPhases> collect();

 private:
  struct Impl;
  explicit DevicePhaseTimes(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int64_t synced_marks_ = 0;
};

// A step's parts from the device's phase times: the named phases as the device ran them, and
// `other` the rest of the step's wall time (at least 0), so that the parts add up to it.
std::array<double, kPhases> fit_to_step(std::array<double, kPhases> device, double step_time_s);

// `inner` with every call charged to phase `p`.
std::unique_ptr<Comm> timed_comm(std::unique_ptr<Comm> inner, Phase p);

}  // namespace tr
