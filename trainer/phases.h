// Where a step's time goes: each part of the step runs under one phase, and a phase clock
// charges the wall time to whichever phase is current (the innermost: a TP collective inside a
// forward is TP time, not forward time), so the phases add up to the step time exactly. The
// communicators of the tp, pp and dp groups charge their calls to their phase themselves
// (timed_comm), the step code marks forward, backward, optimizer and data wait.
//
// These are host timers: on the CPU backend they measure the work; on GPUs they measure the
// host's side of an asynchronous step (queueing, and the waits), and the NVTX ranges of the same
// phases show the device's side in Nsight Systems.
#pragma once

#include <array>
#include <chrono>
#include <memory>

#include "parallel/comm.h"

namespace tr {

enum class Phase : int {
  other,          // everything not below: the step's agreements, norms, bookkeeping
  data_wait,      // waiting for the step's batch
  forward,        // the forward of the stage's layers and the loss
  backward,       // their backward
  pipeline_wait,  // sending and receiving activations and gradients between stages
  tp_comm,        // tensor-parallel collectives
  dp_wait,        // the data-parallel gradient reduction and ZeRO-1's weight all-gather, as
                  // far as the step waits for them (the overlapped part is charged elsewhere)
  optimizer,      // clipping and the update
};
inline constexpr int kPhases = 8;

// This thread's phase clock (the training thread's is the one the step reads).
class PhaseClock {
 public:
  using Clock = std::chrono::steady_clock;
  // Starts a step: every phase at 0, the current phase `other`.
  void start();
  // Makes `p` current and returns the phase it replaces; the time so far goes to that one.
  Phase enter(Phase p);
  // The seconds of each phase since start(), the current one's running time included.
  std::array<double, kPhases> seconds();

 private:
  void charge();
  std::array<double, kPhases> s_{};
  Phase current_ = Phase::other;
  Clock::time_point since_ = Clock::now();
};
PhaseClock& phase_clock();

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

// `inner` with every call charged to phase `p`.
std::unique_ptr<Comm> timed_comm(std::unique_ptr<Comm> inner, Phase p);

}  // namespace tr
