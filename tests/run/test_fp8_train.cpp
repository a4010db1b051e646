// FP8 training on the CPU backend (train.precision: fp8, trainer/model/layer_gemm.h): the tiny
// models train to fp32's loss within a stated tolerance without being fp32, a run resumes bit for
// bit, and a run may change precision when it resumes.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "core/exit_codes.h"
#include "tests/cli_util.h"
#include "trainer/run/run.h"

namespace tr {
namespace {

// The trainer's run() on `dir` with `sets` (a fresh start, or --resume auto).
int train(const test::RunDir& dir, std::vector<std::string> sets, bool resume = false) {
  CliOptions opts;
  opts.config = dir.config;
  opts.resume = resume ? "auto" : "none";
  sets.push_back("log.tensorboard=false");
  opts.sets = std::move(sets);
  return run(opts);
}

std::vector<double> losses(const test::RunDir& dir) {
  std::vector<double> out;
  for (const nlohmann::json& m : dir.metrics()) out.push_back(m["loss"].get<double>());
  return out;
}

// The mean of the last n values.
double tail_mean(const std::vector<double>& v, size_t n) {
  double sum = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) sum += v[i];
  return sum / static_cast<double>(n);
}

std::vector<std::string> with(std::vector<std::string> sets, const std::string& set) {
  sets.push_back(set);
  return sets;
}

// The tiny model (head_dim 16, hybrid: E5M2 output gradients) and one of head_dim 64 (all
// E4M3), 80 steps of the licence texts from the same start in fp32 and in FP8. Over the last 20
// steps FP8's mean loss stays within 2% of fp32's (both fall from ln 257 = 5.55 to about 3.3;
// at 100 steps the largest gap measured was 0.4%); and FP8 is not fp32: the first step's loss
// already differs.
TEST_CASE("fp8: the tiny models train in FP8 to fp32's loss, and not as fp32", "[model]") {
  struct Case {
    std::vector<std::string> shape;
    std::vector<const char*> formats;
  };
  const Case cases[] = {
      {{}, {"hybrid"}},
      {{"model.num_heads=2", "model.num_kv_heads=1", "model.head_dim=64"}, {"e4m3"}}};
  constexpr int kSteps = 80;
  for (const Case& c : cases) {
    test::RunDir fp32(kSteps);
    test::write_licence_texts(fp32.dir / "train");
    REQUIRE(train(fp32, with(c.shape, "train.precision=bf16")) == kExitOk);
    const std::vector<double> want = losses(fp32);
    REQUIRE(want.size() == kSteps);
    for (const char* format : c.formats) {
      INFO("shape: " << (c.shape.empty() ? "head_dim 16" : "head_dim 64") << ", fp8 " << format);
      test::RunDir fp8(kSteps);
      test::write_licence_texts(fp8.dir / "train");
      REQUIRE(train(fp8, with(with(c.shape, "train.precision=fp8"),
                              std::string("train.fp8_format=") + format)) == kExitOk);
      const std::vector<double> got = losses(fp8);
      REQUIRE(got.size() == kSteps);
      const double a = tail_mean(want, 20), b = tail_mean(got, 20);
      INFO("fp32 " << a << ", fp8 " << b << " (mean loss of the last 20 steps)");
      CHECK(a < 3.6);
      CHECK(std::abs(b - a) / a < 0.02);
      CHECK(got[0] == Approx(want[0]).epsilon(0.01));
      CHECK(std::abs(got[0] - want[0]) > 1e-7);
    }
  }
}

// FP8 resumes bit for bit: 10 steps, a stop, 10 more equal 20 straight (the losses and the
// checkpoint's weights and moments). A run may change precision when it resumes, both ways: fp32
// for 10 steps, then FP8 from the same checkpoint (its 11th loss FP8's over the fp32 run's
// weights, close to and not the fp32 run's own 11th); and FP8, then fp32.
TEST_CASE("fp8: a run resumes bit for bit, and may change precision on resume", "[checkpoint]") {
  const std::vector<std::string> fp8 = {"train.precision=fp8"};
  test::RunDir straight(20), split(20), fp32(20), switched(20);
  REQUIRE(train(straight, fp8) == kExitOk);
  REQUIRE(train(split, with(fp8, "train.exit_interval=10")) == kExitStopped);
  REQUIRE(train(split, fp8, /*resume=*/true) == kExitOk);
  const std::vector<double> a = losses(straight), b = losses(split);
  REQUIRE(a.size() == 20);
  CHECK(a == b);
  test::check_same_checkpoint(straight.config, straight.dir / "ckpt/step_00000020", split.config,
                              split.dir / "ckpt/step_00000020");
  REQUIRE(train(fp32, {}) == kExitOk);
  REQUIRE(train(switched, {"train.exit_interval=10"}) == kExitStopped);
  REQUIRE(train(switched, fp8, /*resume=*/true) == kExitOk);
  const std::vector<double> want = losses(fp32), got = losses(switched);
  REQUIRE(got.size() == 20);
  for (size_t i = 0; i < 10; ++i) CHECK(got[i] == want[i]);
  CHECK(got[10] != want[10]);
  CHECK(got[10] == Approx(want[10]).epsilon(0.01));
  // And back: FP8 for 10 steps (split's first 10), then fp32 from its checkpoint.
  test::RunDir back(20);
  REQUIRE(train(back, with(fp8, "train.exit_interval=10")) == kExitStopped);
  REQUIRE(train(back, {}, /*resume=*/true) == kExitOk);
  const std::vector<double> c = losses(back);
  REQUIRE(c.size() == 20);
  for (size_t i = 0; i < 10; ++i) CHECK(c[i] == a[i]);
  CHECK(c[10] != a[10]);
  CHECK(c[10] == Approx(a[10]).epsilon(0.01));
}

}  // namespace
}  // namespace tr
