#include "trainer/step/faults.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <iterator>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/switches.h"
#include "kernels/ops.h"

namespace tr {

absl::StatusOr<FaultInjector> FaultInjector::from_switches() {
  FaultInjector f;
  const std::string env = setting(Setting::test_fault);
  if (env.empty()) return f;
  std::vector<std::string> parts = absl::StrSplit(env, ':');
  bool ok = parts.size() >= 2 && parts.size() <= 4 && absl::SimpleAtoi(parts[1], &f.step_) &&
            (parts.size() < 3 || absl::SimpleAtoi(parts[2], &f.count_)) &&
            (parts.size() < 4 || absl::SimpleAtod(parts[3], &f.arg_));
  f.kind_ = parts[0];
  const char* kinds[] = {"grad_nan", "loss_nan", "loss_spike", "hang", "kill", "slow", "sigterm"};
  if (!ok || std::find(std::begin(kinds), std::end(kinds), f.kind_) == std::end(kinds))
    return absl::InvalidArgumentError(
        absl::StrCat("TR_TEST_FAULT='", env,
                     "': expected KIND:STEP[:COUNT[:ARG]] with KIND grad_nan, loss_nan, "
                     "loss_spike, hang, slow or sigterm"));
  return f;
}

bool FaultInjector::at(int64_t step, const char* kind) const {
  return kind_ == kind && step >= step_ && step < step_ + count_;
}

bool FaultInjector::on(int64_t step, const char* kind, int rank) const {
  return at(step, kind) && rank == static_cast<int>(arg_);
}

void FaultInjector::at_step_start(int64_t step, int rank) const {
  if (on(step, "hang", rank)) std::raise(SIGSTOP);
  if (on(step, "kill", rank)) std::raise(SIGKILL);
  if (on(step, "slow", rank)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (on(step, "sigterm", rank)) std::raise(SIGTERM);
}

bool FaultInjector::nan_in_reduced_grads(int64_t step, int rank) const {
  return on(step, "grad_nan", rank);
}

bool FaultInjector::nan_loss(int64_t step, int rank) const {
  return on(step, "loss_nan", rank);
}

double FaultInjector::loss_factor(int64_t step) const {
  return at(step, "loss_spike") ? arg_ : 1.0;
}

void poison_grads(ParamBuffer& params) {
  const int64_t n = params.grads().numel();
  std::vector<float> nan(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
  copy_tensor(params.grads(), Tensor(nan.data(), DType::f32, Device::cpu, {n}));
}

}  // namespace tr
