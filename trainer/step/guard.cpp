#include "trainer/step/guard.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace tr {

double StepGuard::mean() const {
  double sum = 0;
  for (double l : window_) sum += l;
  return window_.empty() ? 0.0 : sum / static_cast<double>(window_.size());
}

StepGuard::Verdict StepGuard::judge(double loss, double grad_norm, double targets,
                                    std::string* why) const {
  why->clear();
  if (!(targets > 0)) {
    *why = "the global batch has no target to learn from (every one masked by data.eod_mask_loss)";
    return Verdict::skip_no_targets;
  }
  if (!std::isfinite(loss)) {
    *why = absl::StrFormat("the loss is %g", loss);
    return Verdict::skip_non_finite;
  }
  if (!std::isfinite(grad_norm)) {
    *why = absl::StrFormat("the gradient norm is %g", grad_norm);
    return Verdict::skip_non_finite;
  }
  if (spike_ > 0 && !window_.empty() && loss > spike_ * mean()) {
    *why = absl::StrFormat("the loss %.6g is over %g x the mean %.6g of the last %d step%s", loss,
                           spike_, mean(), static_cast<int>(window_.size()),
                           window_.size() == 1 ? "" : "s");
    return Verdict::skip_spike;
  }
  return Verdict::apply;
}

void StepGuard::restore(const std::vector<double>& window, int64_t in_a_row, int64_t total) {
  const size_t keep = std::min(window.size(), static_cast<size_t>(kSpikeWindow));
  window_.assign(window.end() - static_cast<std::ptrdiff_t>(keep), window.end());
  in_a_row_ = in_a_row;
  total_ = total;
}

void StepGuard::record(Verdict v, double loss) {
  if (v != Verdict::apply) {
    ++in_a_row_;
    ++total_;
    last_skip_ = v;
    return;
  }
  in_a_row_ = 0;
  window_.push_back(loss);
  if (static_cast<int>(window_.size()) > kSpikeWindow) window_.pop_front();
}

const char* skip_name(StepGuard::Verdict v) {
  switch (v) {
    case StepGuard::Verdict::skip_non_finite:
      return "non_finite";
    case StepGuard::Verdict::skip_spike:
      return "spike";
    case StepGuard::Verdict::skip_no_targets:
      return "no_targets";
    case StepGuard::Verdict::apply:
      break;
  }
  return "";
}

}  // namespace tr
