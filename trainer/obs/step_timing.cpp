#include "trainer/obs/step_timing.h"

#include <algorithm>
#include <string>
#include <utility>

#include "kernels/device.h"

namespace tr {

void PhaseClock::start() {
  s_.fill(0);
  current_ = Phase::other;
  since_ = Clock::now();
  in_step_ = true;
  if (marker_) marker_(static_cast<int>(Phase::other));
}

void PhaseClock::stop() {
  if (in_step_ && marker_) marker_(kPhases);
  in_step_ = false;
}

void PhaseClock::charge() {
  const Clock::time_point now = Clock::now();
  s_[static_cast<int>(current_)] += std::chrono::duration<double>(now - since_).count();
  if (record_ != nullptr && in_step_ && now > since_) record_->push_back({current_, since_, now});
  since_ = now;
}

const char* phase_name(Phase p) {
  static const char* const names[kPhases] = {"other",         "data wait",     "forward",
                                             "backward",      "pipeline wait", "tp collective",
                                             "cp collective", "dp wait",       "optimizer"};
  return names[static_cast<int>(p)];
}

Phase PhaseClock::enter(Phase p) {
  charge();
  if (in_step_ && marker_ && p != current_) marker_(static_cast<int>(p));
  return std::exchange(current_, p);
}

std::array<double, kPhases> PhaseClock::seconds() {
  charge();
  return s_;
}

PhaseClock& phase_clock() {
  thread_local PhaseClock clock;
  return clock;
}

ScopedPhase::ScopedPhase(Phase p) : prev_(phase_clock().enter(p)) {
  profiler_range_push(phase_name(p));
}

ScopedPhase::~ScopedPhase() {
  profiler_range_pop();
  phase_clock().enter(prev_);
}

// The timeline's first ring, collected every step; it doubles when a step makes more marks (a
// 72B stage's: TP collectives of 40 layers, forward and backward, 128 micro-batches, about
// 10^5 changes of phase).
constexpr int kDeviceMarks = 1 << 15;

struct DevicePhaseTimes::Impl {
  explicit Impl(const Ctx& ctx) : timeline(ctx, kDeviceMarks) {}
  cuda::EventTimeline timeline;
};

std::unique_ptr<DevicePhaseTimes> DevicePhaseTimes::make(const Ctx& ctx) {
  if (ctx.device != Device::cuda) return nullptr;
  auto impl = std::make_unique<Impl>(ctx);
  cuda::EventTimeline* timeline = &impl->timeline;
  phase_clock().set_marker([timeline](int tag) { timeline->mark(tag); });
  return std::unique_ptr<DevicePhaseTimes>(new DevicePhaseTimes(std::move(impl)));
}

DevicePhaseTimes::DevicePhaseTimes(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DevicePhaseTimes::~DevicePhaseTimes() {
  phase_clock().set_marker({});
}

void DevicePhaseTimes::at_sync() {
  synced_marks_ = impl_->timeline.marked();
}

std::array<double, kPhases> DevicePhaseTimes::collect() {
  std::array<double, kPhases> s{};
  impl_->timeline.collect(s.data(), kPhases, synced_marks_);
  return s;
}

std::array<double, kPhases> fit_to_step(std::array<double, kPhases> device, double step_time_s) {
  double named = 0;
  for (int p = 0; p < kPhases; ++p)
    if (p != static_cast<int>(Phase::other)) named += device[p];
  device[static_cast<int>(Phase::other)] = std::max(0.0, step_time_s - named);
  return device;
}

namespace {

// A communicator whose every call runs in one phase.
class TimedComm final : public Comm {
 public:
  TimedComm(std::unique_ptr<Comm> inner, Phase p) : inner_(std::move(inner)), phase_(p) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  Ticket start(const CommOp& op, Lane lane) override {
    return timed([&] { return inner_->start(op, lane); });
  }
  void wait(Ticket ticket) override {
    timed([&] { inner_->wait(ticket); });
  }
  void wait_all() override {
    timed([&] { inner_->wait_all(); });
  }

 private:
  template <class F>
  auto timed(F&& f) -> decltype(f()) {
    const ScopedPhase in(phase_);
    return f();
  }
  std::unique_ptr<Comm> inner_;
  Phase phase_;
};

}  // namespace

std::unique_ptr<Comm> timed_comm(std::unique_ptr<Comm> inner, Phase p) {
  return std::make_unique<TimedComm>(std::move(inner), p);
}

}  // namespace tr
