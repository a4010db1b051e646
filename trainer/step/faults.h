// Fault injection for the reliability tests, at named points of the step. TR_TEST_FAULT=
// KIND:STEP[:COUNT[:ARG]] makes steps STEP .. STEP+COUNT-1 go wrong, as a faulty GPU or a
// diverging run would:
//   hang        world rank ARG stops itself (SIGSTOP, as `kill -STOP` does) at the step's start
//   kill        world rank ARG kills itself (SIGKILL, as `kill -9` does) at the step's start
//   slow        world rank ARG sleeps 0.1 s in each step (a straggler)
//   sigterm     world rank ARG raises SIGTERM once the step has begun (after the step-start
//               agreement), so that a stop poll inside the step sees it first
//   grad_nan    world rank ARG writes NaN into the first element of its reduced gradients
//               (after the data-parallel reduction, which it would race on GPUs)
//   loss_nan    world rank ARG, if it is on the last stage, makes its loss NaN
//   loss_spike  every rank multiplies the step's (reduced) loss by ARG
// ARG defaults to 0. TR_TEST_POISON_GRADS=1 is poison_grads below.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "trainer/model/param_buffer.h"

namespace tr {

class FaultInjector {
 public:
  // From TR_TEST_FAULT (unset: injects nothing); a malformed value is bad input.
  static absl::StatusOr<FaultInjector> from_switches();

  // The hook points, in the order a step reaches them; `rank` is the caller's world rank.
  void at_step_start(int64_t step, int rank) const;         // hang, kill, slow, sigterm act here
  bool nan_in_reduced_grads(int64_t step, int rank) const;  // grad_nan
  bool nan_loss(int64_t step, int rank) const;              // loss_nan
  double loss_factor(int64_t step) const;                   // loss_spike's ARG, else 1

 private:
  bool at(int64_t step, const char* kind) const;
  bool on(int64_t step, const char* kind, int rank) const;
  std::string kind_;
  int64_t step_ = 0, count_ = 1;
  double arg_ = 0;
};

// TR_TEST_POISON_GRADS=1 (tests): every gradient is NaN before the step begins, so a gradient
// that the step's first write does not assign (or that begin_step_grads does not zero) poisons
// the loss or the weights.
void poison_grads(ParamBuffer& params);

}  // namespace tr
