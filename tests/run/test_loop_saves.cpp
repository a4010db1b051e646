// The training loop's saves in process (trainer/run/loop.cpp): checkpoint.save_at_end, which
// benchmarks turn off, and the saves it leaves alone.
#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/exit_codes.h"
#include "core/switches.h"
#include "tests/cli_util.h"
#include "trainer/run/run.h"
#include "trainer/step/agree.h"

namespace tr {
namespace {

namespace fs = std::filesystem;

// The trainer's run() on `dir` (a fresh start), its config with `sets`.
int train(const test::RunDir& dir, std::vector<std::string> sets) {
  CliOptions opts;
  opts.config = dir.config;
  opts.resume = "none";
  sets.push_back("log.tensorboard=false");
  opts.sets = std::move(sets);
  return run(opts);
}

// The committed step directories under `root`, by name.
std::vector<std::string> step_dirs(const std::string& root) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec))
    if (e.path().filename().string().rfind("step_", 0) == 0)
      names.push_back(e.path().filename().string());
  return names;
}

// RunDir's interval is 10, so a 6-step run saves only at its end.
TEST_CASE("saves: checkpoint.save_at_end false ends with no checkpoint, true with one",
          "[checkpoint]") {
  for (const bool at_end : {false, true}) {
    INFO("checkpoint.save_at_end=" << at_end);
    test::RunDir dir(6);
    REQUIRE(train(dir, {std::string("checkpoint.save_at_end=") + (at_end ? "true" : "false")}) ==
            kExitOk);
    CHECK(dir.metrics().size() == 6);
    const absl::StatusOr<std::string> latest = ckpt::find_latest(dir.dir / "ckpt");
    REQUIRE(latest.ok());
    CHECK(*latest == (at_end ? dir.dir / "ckpt/step_00000006" : std::string()));
    CHECK(step_dirs(dir.dir / "ckpt").size() == (at_end ? 1u : 0u));
  }
}

// Off, the interval saves stay (an asynchronous one still in flight is committed before the run
// ends), and so does a stop signal's.
TEST_CASE("saves: with checkpoint.save_at_end false, interval and stop-signal saves remain",
          "[checkpoint]") {
  {
    test::RunDir dir(6);
    REQUIRE(train(dir, {"checkpoint.save_at_end=false", "checkpoint.interval=5",
                        "checkpoint.async=true"}) == kExitOk);
    const absl::StatusOr<std::string> latest = ckpt::find_latest(dir.dir / "ckpt");
    REQUIRE(latest.ok());
    CHECK(*latest == dir.dir / "ckpt/step_00000005");
    CHECK(ckpt::verify(*latest).ok());
  }
  {
    test::RunDir dir(6);
    const ScopedSetting fault(Setting::test_fault, "sigterm:4");  // SIGTERM within step 4
    const int code = train(dir, {"checkpoint.save_at_end=false"});
    g_stop_signal = 0;  // the handler's flag outlives run() in this process
    REQUIRE(code == kExitStopped);
    const absl::StatusOr<std::string> latest = ckpt::find_latest(dir.dir / "ckpt");
    REQUIRE(latest.ok());
    CHECK(*latest == dir.dir / "ckpt/step_00000003");  // the last applied step
  }
}

}  // namespace
}  // namespace tr
