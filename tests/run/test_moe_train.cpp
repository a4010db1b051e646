// Mixture-of-experts training on the CPU backend (model.family qwen3_moe, trainer/model/
// moe_block.h): the tiny model trains and logs its load-balancing loss and expert imbalance, a
// run resumes bit for bit, and a capacity factor changes the training (tokens skip their full
// experts) without breaking it.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "core/exit_codes.h"
#include "tests/cli_util.h"
#include "trainer/run/run.h"

namespace tr {
namespace {

// The tiny model with 4 experts of intermediate size 32 in each layer, 2 chosen per token.
const std::vector<std::string> kMoe = {
    "model.family=qwen3_moe",          "model.num_experts=4",
    "model.experts_per_token=2",       "model.moe_intermediate_size=32",
    "model.router_aux_loss_coef=0.01", "log.tensorboard=false"};

// The trainer's run() on `dir` with kMoe and `sets` (a fresh start, or --resume auto).
int train(const test::RunDir& dir, const std::vector<std::string>& sets, bool resume = false) {
  CliOptions opts;
  opts.config = dir.config;
  opts.resume = resume ? "auto" : "none";
  opts.sets = kMoe;
  opts.sets.insert(opts.sets.end(), sets.begin(), sets.end());
  return run(opts);
}

std::vector<double> values(const test::RunDir& dir, const char* key) {
  std::vector<double> out;
  for (const nlohmann::json& m : dir.metrics())
    if (m.contains(key)) out.push_back(m[key].get<double>());
  return out;
}

// 20 steps of the licence texts straight, and 10 + a stop + 10 resumed: the same losses, router
// metrics and checkpoint bit for bit. The load-balancing loss is logged every step: its share of
// the loss 0.01 x aux, aux near k = 2 at balance and at most E = 4; the imbalance between 1 and
// E / k = 2.
TEST_CASE("moe: the tiny qwen3_moe model logs its router and resumes bit for bit", "[model]") {
  test::RunDir straight(20), split(20);
  test::write_licence_texts(straight.dir / "train");
  test::write_licence_texts(split.dir / "train");
  REQUIRE(train(straight, {}) == kExitOk);
  REQUIRE(train(split, {"train.exit_interval=10"}) == kExitStopped);
  REQUIRE(train(split, {}, /*resume=*/true) == kExitOk);
  const std::vector<double> loss = values(straight, "loss");
  REQUIRE(loss.size() == 20);
  CHECK(values(split, "loss") == loss);
  const std::vector<double> aux = values(straight, "moe_aux_loss"),
                            imbalance = values(straight, "moe_imbalance");
  REQUIRE(aux.size() == 20);
  REQUIRE(imbalance.size() == 20);
  CHECK(values(split, "moe_aux_loss") == aux);
  CHECK(values(split, "moe_imbalance") == imbalance);
  for (size_t i = 0; i < aux.size(); ++i) {
    INFO("step " << i + 1 << ": aux " << aux[i] << ", imbalance " << imbalance[i]);
    CHECK(aux[i] > 0.01 * 1.5);
    CHECK(aux[i] <= 0.01 * 4);
    CHECK(imbalance[i] >= 1);
    CHECK(imbalance[i] <= 2 + 1e-9);
  }
  CHECK(loss.back() < loss.front());
  test::check_same_checkpoint(straight.config, straight.dir / "ckpt/step_00000020", split.config,
                              split.dir / "ckpt/step_00000020", kMoe);
}

// A capacity factor of 0.5 (each expert takes at most half its balanced share of a micro-batch's
// tokens): the run trains, finite, to another loss than dropless from the first step on; a
// dense model logs no router metrics.
TEST_CASE("moe: a capacity factor drops tokens and still trains, and dense runs log no router",
          "[model]") {
  test::RunDir dropless(5), capped(5), dense(5);
  REQUIRE(train(dropless, {}) == kExitOk);
  REQUIRE(train(capped, {"model.capacity_factor=0.5"}) == kExitOk);
  const std::vector<double> a = values(dropless, "loss"), b = values(capped, "loss");
  REQUIRE(b.size() == 5);
  for (double x : b) CHECK(std::isfinite(x));
  CHECK(a[0] != b[0]);
  CliOptions opts;
  opts.config = dense.config;
  opts.sets = {"log.tensorboard=false"};
  REQUIRE(run(opts) == kExitOk);
  REQUIRE(dense.metrics().size() == 5);
  for (const nlohmann::json& m : dense.metrics()) {
    CHECK_FALSE(m.contains("moe_aux_loss"));
    CHECK_FALSE(m.contains("moe_imbalance"));
  }
}

}  // namespace
}  // namespace tr
