// The step guard: decides, before the update, whether a step's loss and gradient norm may be
// applied, and when a run of skipped steps means the run has diverged. Pure logic over the
// step's (loss, gradient norm), which are the same on every rank (both are all-reduced), so
// every rank decides alike; the training loop still agrees on the verdict over the world.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "trainer/config/config.h"

namespace tr {

// Losses of accepted steps averaged for the spike test (train.spike_factor): the last 20, or as
// many as there are; only a run's very first step has none and is not judged (a loss that
// jumps from 5.5 to 727 at step 3 is a spike however short the history).
inline constexpr int kSpikeWindow = 20;

class StepGuard {
 public:
  // The ranks agree on the highest value: a step without targets is that on every rank.
  enum class Verdict { apply, skip_non_finite, skip_spike, skip_no_targets };

  explicit StepGuard(const TrainConfig& t)
      : max_skipped_(t.max_skipped_steps), spike_(t.spike_factor) {}

  // The verdict for a step with this loss, (pre-clipping) gradient norm and count of targets
  // the loss keeps over the global batch, and why (for the warning line: "the gradient norm is
  // nan", "the loss 48.2 is over 10 x the mean 4.81 of the last 20 steps"; "" for apply). A step
  // without targets (all masked by data.eod_mask_loss) has nothing to learn: only weight decay
  // would act.
  Verdict judge(double loss, double grad_norm, double targets, std::string* why) const;
  // Records the verdict the ranks agreed on for a step with this loss.
  void record(Verdict v, double loss);
  // Steps skipped in a row (0 after an applied step) and in all, in this run (a resumed run
  // continues the counts its checkpoint kept).
  int64_t skipped_in_a_row() const { return in_a_row_; }
  int64_t skipped_total() const { return total_; }
  // The verdict of the last skipped step (apply before any).
  Verdict last_skip() const { return last_skip_; }
  // The losses of the last applied steps, oldest first (at most kSpikeWindow).
  std::vector<double> window() const { return {window_.begin(), window_.end()}; }
  // Continues from a checkpoint's state: its window (the newest kSpikeWindow losses kept) and
  // counts.
  void restore(const std::vector<double>& window, int64_t in_a_row, int64_t total);
  // True when skipped_in_a_row() reached train.max_skipped_steps: the run must stop.
  bool diverged() const { return in_a_row_ >= max_skipped_; }
  // The mean loss of the window; 0 before any step was accepted.
  double mean() const;

 private:
  int64_t max_skipped_;
  double spike_;
  std::deque<double> window_;  // losses of the last kSpikeWindow applied steps
  int64_t in_a_row_ = 0, total_ = 0;
  Verdict last_skip_ = Verdict::apply;
};

// The metrics' name of a skip verdict: "non_finite", "spike" or "no_targets" ("" for apply).
const char* skip_name(StepGuard::Verdict v);

}  // namespace tr
