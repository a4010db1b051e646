// The step's timing by phase (trainer/obs/step_timing.h) in process.
#include <hdf5.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/clock.h"
#include "core/switches.h"
#include "kernels/ops.h"
#include "tests/test_util.h"
#include "trainer/checkpoint/ownership.h"
#include "trainer/config/config.h"
#include "trainer/layout/run_layout.h"
#include "trainer/model/init.h"
#include "trainer/model/model.h"
#include "trainer/model/step_io.h"
#include "trainer/obs/step_timing.h"
#include "trainer/obs/tensorboard.h"
#include "trainer/optim/optim.h"
#include "trainer/plan/memory_fit.h"
#include "trainer/plan/plan.h"
#include "trainer/plan/resilience.h"
#include "trainer/session/session.h"

namespace tr {
namespace {
// The phase clock tells its marker (the GPU's event timeline) of every change of phase within a
// step, in order, the step's end once, and nothing between steps (evaluation, saves); a step's
// parts from device times add up to its wall time, `other` taking the rest.
TEST_CASE("phases: the marker hears each change within a step, and device parts fit the step",
          "[model]") {
  std::vector<int> marks;
  PhaseClock& clock = phase_clock();
  clock.set_marker([&](int tag) { marks.push_back(tag); });
  const auto tag = [](Phase p) { return static_cast<int>(p); };
  {
    const ScopedPhase outside(Phase::forward);  // before any step: unheard
  }
  CHECK(marks.empty());
  clock.start();
  {
    const ScopedPhase fwd(Phase::forward);
    const ScopedPhase tp(Phase::tp_comm);
  }
  { const ScopedPhase upd(Phase::optimizer); }
  clock.stop();
  clock.stop();  // once
  {
    const ScopedPhase eval(Phase::tp_comm);  // between steps: unheard
  }
  clock.set_marker({});
  CHECK(marks == std::vector<int>{tag(Phase::other), tag(Phase::forward), tag(Phase::tp_comm),
                                  tag(Phase::forward), tag(Phase::other), tag(Phase::optimizer),
                                  tag(Phase::other), kPhases});
  std::array<double, kPhases> device{};
  device[tag(Phase::forward)] = 0.3;
  device[tag(Phase::backward)] = 0.5;
  device[tag(Phase::other)] = 9;  // replaced by the step's remainder
  const std::array<double, kPhases> parts = fit_to_step(device, 1.0);
  CHECK(parts[tag(Phase::forward)] == 0.3);
  CHECK(parts[tag(Phase::other)] == Approx(0.2));
  CHECK(fit_to_step(device, 0.5)[tag(Phase::other)] == 0.0);  // never negative
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// Readers take event files in name order: a file opened in a directory whose last file has a
// later time (a resume within the same second, or a clock that stepped back) still sorts after it.
TEST_CASE("tensorboard: a new event file sorts after the directory's earlier ones", "[obs]") {
  test::TempDir dir;
  const int64_t later = static_cast<int64_t>(unix_time()) + 100;
  test::write_file(dir / ("events.out.tfevents." + std::to_string(later) + ".host.99999"), "");
  EventFileWriter w;
  REQUIRE(w.open(dir.path(), 0).ok());
  const std::string name = std::filesystem::path(w.path()).filename().string();
  CHECK(name.starts_with("events.out.tfevents." + std::to_string(later + 1) + "."));
}

}  // namespace
}  // namespace tr
