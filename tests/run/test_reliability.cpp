// Reliability of the trainer under faults (nothing poisoned is ever committed, no run
// overwrites another, no hang outlives its timeout, shutdown always saves): the step guard, and
// end-to-end runs with faults injected through TR_TEST_FAULT (trainer/run/loop.cpp).
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/lock.h"
#include "core/exit_codes.h"
#include "core/fs_io.h"
#include "data/dataset_meta.h"
#include "tests/cli_util.h"
#include "trainer/config/cli.h"
#include "trainer/step/guard.h"

namespace tr {
namespace {

using test::CkptTensors;
using test::CmdResult;
using test::read_checkpoint;
using test::run_cmd;
using test::RunDir;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInfinity = std::numeric_limits<double>::infinity();

TEST_CASE("guard: non-finite steps are skipped, spikes past the window's mean too", "[guard]") {
  TrainConfig t;
  t.max_skipped_steps = 3;
  t.spike_factor = 4;
  StepGuard g(t);
  std::string why;
  CHECK(g.judge(kNaN, 1.0, 1, &why) == StepGuard::Verdict::skip_non_finite);
  CHECK(why == "the loss is nan");
  CHECK(g.judge(2.0, kInfinity, 1, &why) == StepGuard::Verdict::skip_non_finite);
  CHECK(why == "the gradient norm is inf");
  // The first step has no history and is not judged; from the second on, the mean of what there
  // is (here one loss).
  CHECK(g.judge(100.0, 1.0, 1, &why) == StepGuard::Verdict::apply);
  CHECK(why.empty());
  g.record(StepGuard::Verdict::apply, 1.0);
  CHECK(g.judge(4.0, 1.0, 1, &why) == StepGuard::Verdict::apply);
  CHECK(g.judge(100.0, 1.0, 1, &why) == StepGuard::Verdict::skip_spike);
  CHECK(why == "the loss 100 is over 4 x the mean 1 of the last 1 step");
  for (int i = 1; i < kSpikeWindow + 5; ++i) g.record(StepGuard::Verdict::apply, 1.0 + (i % 2));
  CHECK(g.mean() == Approx(1.5).epsilon(1e-12));  // 1, then 2, 1, 2, ... (20 values)
  CHECK(g.judge(6.0, 1.0, 1, &why) == StepGuard::Verdict::apply);  // exactly 4 x the mean
  CHECK(g.judge(6.01, 1.0, 1, &why) == StepGuard::Verdict::skip_spike);
  CHECK(why == "the loss 6.01 is over 4 x the mean 1.5 of the last 20 steps");
  // Skips count in a row and in all; an applied step ends the row, not the total.
  g.record(StepGuard::Verdict::skip_spike, 6.01);
  g.record(StepGuard::Verdict::skip_non_finite, kNaN);
  CHECK(g.skipped_in_a_row() == 2);
  CHECK_FALSE(g.diverged());
  CHECK(g.mean() == Approx(1.5).epsilon(1e-12));  // skipped losses never enter the window
  g.record(StepGuard::Verdict::apply, 1.5);
  CHECK(g.skipped_in_a_row() == 0);
  CHECK(g.skipped_total() == 2);
  for (int i = 0; i < 3; ++i) g.record(StepGuard::Verdict::skip_non_finite, kNaN);
  CHECK(g.diverged());
  // spike_factor 0: never a spike.
  t.spike_factor = 0;
  StepGuard off(t);
  for (int i = 0; i < kSpikeWindow; ++i) off.record(StepGuard::Verdict::apply, 1.0);
  CHECK(off.judge(1e6, 1.0, 1, &why) == StepGuard::Verdict::apply);
}

// A global batch whose every target is masked (data.eod_mask_loss) has nothing to learn: the
// guard skips it first, whatever its loss and norm.
TEST_CASE("guard: a step without targets is skipped as no_targets", "[guard]") {
  StepGuard g{TrainConfig{}};
  std::string why;
  CHECK(g.judge(0.0, 0.0, 0, &why) == StepGuard::Verdict::skip_no_targets);
  CHECK(why.find("no target") != std::string::npos);
  CHECK(g.judge(kNaN, 0.0, 0, &why) == StepGuard::Verdict::skip_no_targets);
  CHECK(g.judge(2.0, 1.0, 1, &why) == StepGuard::Verdict::apply);
  CHECK(std::string(skip_name(StepGuard::Verdict::skip_no_targets)) == "no_targets");
}

// run's train data replaced by `eod_docs` documents of 33 end-of-document tokens and, when
// `text`, one document of 40 other tokens (so a sample or two keep targets under eod_mask_loss).
void write_masked_data(const RunDir& run, int eod_docs, bool text) {
  auto w = data::IndexedDatasetWriter::create(run.dir / "train", 257);
  REQUIRE(w.ok());
  for (int d = 0; d < eod_docs; ++d)
    REQUIRE((*w)->add_document(std::vector<int32_t>(33, 256)).ok());
  if (text) {
    std::vector<int32_t> doc(40);
    for (int i = 0; i < 40; ++i) doc[i] = 'a' + i % 26;
    REQUIRE((*w)->add_document(doc).ok());
  }
  REQUIRE((*w)->finish().ok());
}

// Training on nothing is not training: data of nothing but the end-of-document token with
// data.eod_mask_loss is refused at start-up (exit 2, one line), and a step whose global batch
// keeps no target is skipped (counted, said, no update) on 1 rank, under cp 2 and under tp 2,
// on the same steps.
TEST_CASE("reliability: masked-out data is refused, a step without targets is skipped",
          "[cli][mpi]") {
  const std::string masked = "--set data.eod_mask_loss=true --set data.eod_id=256 ";
  {
    RunDir run(6);
    write_masked_data(run, 60, false);
    test::expect_bad_input(run.trainer(masked),
                           "holds no token but the end-of-document 256, so with "
                           "data.eod_mask_loss every target is masked");
    const CmdResult r = run.mpirun(2, masked + "--set parallel.tp=2");  // mpiexec adds lines
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("error: rank 0: data.train") != std::string::npos);
  }
  std::vector<int64_t> skipped_one;
  for (const auto& [ranks, layout] : std::vector<std::pair<int, std::string>>{
           {1, ""}, {2, "--set parallel.cp=2"}, {2, "--set parallel.tp=2"}}) {
    RunDir run(6);
    write_masked_data(run, 60, true);
    const std::string args = masked + "--set train.max_skipped_steps=100 " + layout;
    CmdResult r = ranks == 1 ? run.trainer(args) : run.mpirun(ranks, args);
    INFO(layout << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    std::vector<int64_t> skipped;
    for (const nlohmann::json& j : run.metrics("loss"))
      if (j.contains("skipped")) {
        CHECK(j["skipped"] == "no_targets");
        skipped.push_back(j["step"].get<int64_t>());
      }
    CHECK(skipped.size() >= 3);  // at most 3 of the 6 steps' batches hold the text
    CHECK(r.output.find("skipped, no update: the global batch has no target to learn from") !=
          std::string::npos);
    if (ranks == 1)
      skipped_one = skipped;
    else
      CHECK(skipped == skipped_one);
  }
  // train.max_skipped_steps of them in a row end the run (exit 4) naming the data, not a
  // divergence that a lower learning rate would cure.
  RunDir stop(6);
  write_masked_data(stop, 60, true);
  const CmdResult r = stop.trainer(masked + "--set train.max_skipped_steps=1");
  INFO(r.output);
  CHECK(r.exit_code == kExitDiverged);
  CHECK(r.output.find("the last with no target to learn from") != std::string::npos);
  CHECK(r.output.find("lower optim.lr") == std::string::npos);
}

// data.eod_id outside the vocabulary is refused; one other than the metadata's is a warning.
TEST_CASE("reliability: data.eod_id is checked against the vocabulary and the metadata", "[cli]") {
  RunDir run(6);
  data::DatasetMeta meta;
  meta.tokenizer = "byte";
  meta.vocab_size = 257;
  meta.eod_id = 256;
  REQUIRE(data::write_dataset_meta(run.dir / "train", meta).ok());
  for (const char* id : {"257", "300", "65536", "1099511627776"})
    test::expect_bad_input(run.trainer(std::string("--dry-run --set data.eod_id=") + id),
                           "is not a token of the model's vocabulary (model.vocab_size 257");
  CmdResult r = run.trainer("--dry-run --set data.eod_id=32 --set data.eod_mask_loss=true");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("warning: data.eod_id 32 is not the end-of-document id 256 that") !=
        std::string::npos);
  r = run.trainer("--dry-run --set data.eod_id=256 --set data.eod_mask_loss=true");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("warning: data.eod_id") == std::string::npos);
}

// The step's metrics lines by step number (1-based index = step).
std::vector<nlohmann::json> steps_of(const RunDir& run) {
  return run.metrics("loss");
}

// "Seen: with a non-finite gradient norm and a finite loss, the update ran and step 5 was
// committed with non-finite values." Now the step is skipped: no update (the state saved after
// it equals the state after step 4 of a clean run, bit for bit), the warning names the rank and
// the tensor, the metrics count it, and the run goes on.
TEST_CASE("reliability: a NaN gradient is skipped before the update, never saved", "[cli]") {
  RunDir clean(5), faulty(5);  // the same schedule; the clean run stops after step 4
  REQUIRE(clean.trainer("--set train.exit_interval=4").exit_code == kExitStopped);
  CmdResult r = faulty.trainer("", "TR_TEST_FAULT=grad_nan:5");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("warning: step 5 skipped, no update: the gradient norm is nan; rank 0 (tp "
                      "0, pp 0, dp 0): first non-finite gradient 'embed_tokens/weight'; 1 skipped "
                      "in a row (the run stops at train.max_skipped_steps=5)") !=
        std::string::npos);
  const std::vector<nlohmann::json> m = steps_of(faulty);
  REQUIRE(m.size() == 5);
  CHECK(m[4]["skipped"] == "non_finite");
  CHECK(m[4]["skipped_steps"] == 1);
  CHECK(m[3]["skipped_steps"] == 0);
  CHECK_FALSE(m[3].contains("skipped"));
  const CkptTensors a = read_checkpoint(clean.config, clean.dir / "ckpt/step_00000004");
  const CkptTensors b = read_checkpoint(faulty.config, faulty.dir / "ckpt/step_00000005");
  CHECK(a.p == b.p);
  CHECK(a.m == b.m);
  CHECK(a.v == b.v);
  CHECK(b.state.step == 5);
}

// On 4 ranks (tp 2 x dp 2) a NaN written by rank 3 (tp 1, dp 1) into its reduced gradients (after
// the data-parallel reduction, as a faulty GPU's update would meet it): rank 3 names it, every
// rank skips.
TEST_CASE("reliability: a NaN on one rank is skipped by every rank and named once", "[cli][mpi]") {
  RunDir run(6);
  CmdResult r = run.mpirun(4, "--set parallel.tp=2", "TR_TEST_FAULT=grad_nan:3:1:3");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string want =
      "warning: step 3 skipped, no update: the gradient norm is nan; rank 3 (tp 1, pp 0, dp 1): "
      "first non-finite gradient 'embed_tokens/weight'";
  CHECK(r.output.find(want) != std::string::npos);
  CHECK(r.output.find("warning:") == r.output.rfind("warning:"));  // said once
  const std::vector<nlohmann::json> m = steps_of(run);
  REQUIRE(m.size() == 6);
  CHECK(m[2]["skipped"] == "non_finite");
  CHECK(std::isfinite(m[5]["loss"].get<double>()));
}

// Under tp 2 x pp 2 rank 3 (tp 1, pp 1) first updates a replicated tensor (the first layer norm
// of its stage), which the gradient norm counts on TP rank 0 only: a NaN in rank 3's copy is
// still seen (checked, not counted), the step is skipped on every rank, and rank 3 and the
// tensor are named.
TEST_CASE("reliability: a NaN in a TP rank's copy of a replicated tensor is skipped",
          "[cli][mpi]") {
  RunDir run(5);
  CmdResult r = run.mpirun(4, "--set parallel.tp=2 --set parallel.pp=2 --set train.micro_batch=2",
                           "TR_TEST_FAULT=grad_nan:3:1:3");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("warning: step 3 skipped, no update: the gradient norm is nan; rank 3 (tp 1, "
                      "pp 1, dp 0): first non-finite gradient 'layers/1/input_layernorm/weight'") !=
        std::string::npos);
  CHECK(r.output.find("warning:") == r.output.rfind("warning:"));
  const std::vector<nlohmann::json> m = steps_of(run);
  REQUIRE(m.size() == 5);
  CHECK(m[2]["skipped"] == "non_finite");
  CHECK(m[2]["skipped_steps"] == 1);
  CHECK(std::isfinite(m[4]["loss"].get<double>()));
}

// Steps that keep failing end the run with kExitDiverged and one line naming the last
// checkpoint; nothing from the failing steps is saved.
TEST_CASE("reliability: max_skipped_steps in a row stop the run with exit code 4", "[cli]") {
  RunDir run(20);
  CmdResult r = run.trainer("--set train.max_skipped_steps=3 --set checkpoint.interval=2",
                            "TR_TEST_FAULT=loss_nan:5:100");
  INFO(r.output);
  CHECK(r.exit_code == kExitDiverged);
  CHECK(r.output.find("warning: step 5 skipped, no update: the loss is nan; rank 0 (tp 0, pp 0, "
                      "dp 0): its own loss is not finite") != std::string::npos);
  // No checkpoint is saved while steps are skipped (6 would have been), so the good ones stay;
  // the line names the last one before the skips and how to resume from it.
  CHECK(r.output.find("error: training diverged: 3 steps in a row skipped "
                      "(train.max_skipped_steps) up to step 7; the last checkpoint before them "
                      "is step_00000004: resume from it with --resume " +
                      (run.dir / "ckpt/step_00000004") +
                      " and a lower optim.lr, or from an earlier one\n") != std::string::npos);
  absl::StatusOr<std::string> latest = ckpt::find_latest(run.dir / "ckpt");
  REQUIRE(latest.ok());
  CHECK(*latest == run.dir / "ckpt/step_00000004");
  CHECK(std::filesystem::exists(run.dir / "ckpt/step_00000002"));  // retention kept it
  CHECK_FALSE(std::filesystem::exists(run.dir / "ckpt/step_00000006"));
}

// "Seen: a loss that explodes from 5.5 to 4,856 finishes with rc 0 and no warning." With
// train.spike_factor (default 10) that step is skipped with a warning; with 0 it is applied.
TEST_CASE("reliability: a loss spike is skipped unless train.spike_factor is 0", "[cli]") {
  RunDir run(25), off(25);
  CmdResult r = run.trainer("", "TR_TEST_FAULT=loss_spike:23:1:1000");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("warning: step 23 skipped, no update: the loss ") != std::string::npos);
  CHECK(r.output.find(" is over 10 x the mean ") != std::string::npos);
  std::vector<nlohmann::json> m = steps_of(run);
  REQUIRE(m.size() == 25);
  CHECK(m[22]["skipped"] == "spike");
  CHECK(m[24]["skipped_steps"] == 1);
  r = off.trainer("--set train.spike_factor=0", "TR_TEST_FAULT=loss_spike:23:1:1000");
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("warning:") == std::string::npos);
  CHECK_FALSE(steps_of(off)[22].contains("skipped"));
}

// "The blow-up step itself (loss 5.5 -> 727) is applied because the guard needs 20 steps of
// history": from the second step on it judges against the steps there are.
TEST_CASE("reliability: a spike early in a run is skipped", "[cli]") {
  RunDir run(6);
  CmdResult r = run.trainer("", "TR_TEST_FAULT=loss_spike:3:1:1000");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("warning: step 3 skipped, no update: the loss ") != std::string::npos);
  CHECK(r.output.find(" is over 10 x the mean ") != std::string::npos);
  CHECK(r.output.find(" of the last 2 steps;") != std::string::npos);
  CHECK(steps_of(run)[2]["skipped"] == "spike");
}

// The step guard's state is in the checkpoint: a run stopped at step 20 and resumed judges the
// spike at step 23 against the same 20 losses as the uninterrupted run, skips it too, counts it
// in the same skipped_steps, and ends with the same weights bit for bit.
TEST_CASE("reliability: a resumed run skips the spike the uninterrupted run skips", "[cli]") {
  RunDir straight(25), resumed(25);
  const std::string spike = "TR_TEST_FAULT=loss_spike:23:1:1000";
  CmdResult a = straight.trainer("", spike);
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  REQUIRE(resumed.trainer("--set train.exit_interval=20", spike).exit_code == kExitStopped);
  CmdResult b = resumed.trainer("", spike);
  INFO(b.output);
  REQUIRE(b.exit_code == 0);
  CHECK(b.output.find("warning: step 23 skipped, no update: the loss ") != std::string::npos);
  const std::vector<nlohmann::json> x = steps_of(straight), y = steps_of(resumed);
  REQUIRE(x.size() == 25);
  REQUIRE(y.size() == 25);
  CHECK(x[22]["skipped"] == "spike");
  CHECK(y[22]["skipped"] == "spike");
  CHECK(y[24]["skipped_steps"] == x[24]["skipped_steps"]);
  test::check_same_checkpoint(straight.config, straight.dir / "ckpt/step_00000025", resumed.config,
                              resumed.dir / "ckpt/step_00000025");
  const CkptTensors c = read_checkpoint(resumed.config, resumed.dir / "ckpt/step_00000025");
  CHECK(c.state.loss_window.size() == 20);
  CHECK(c.state.skipped_total == 1);
  CHECK(c.state.skipped_in_a_row == 0);
}

// The checkpoint library refuses to write a NaN or Inf, whole-tensor (save) or as a rank's
// block (write_shard), naming the tensor and the first bad element; nothing is committed.
TEST_CASE("reliability: a save with a non-finite value is refused, nothing committed",
          "[checkpoint]") {
  test::TempDir root;
  std::vector<float> w = {1, 2, 3, 4}, m = {0, 0, 0, 0}, v = {0, 0, 0, std::nanf("")};
  const ckpt::TensorRef pw("w", {4}, w.data()), pm("w", {4}, m.data()), pv("w", {4}, v.data());
  ckpt::SaveRequest req;
  req.root = root.path();
  req.step = 3;
  req.params = {&pw, 1};
  req.exp_avg = {&pm, 1};
  req.exp_avg_sq = {&pv, 1};
  req.state.step = 3;
  absl::Status st = ckpt::save(req);
  CHECK(st.message() == root /
                            "step_00000003.tmp/model.h5: tensor 'w' (/optim/exp_avg_sq/w) "
                            "holds 1 non-finite value (NaN or Inf; the first at element 3): "
                            "refusing to save a poisoned checkpoint");
  CHECK_FALSE(std::filesystem::exists(root / "latest"));
  CHECK_FALSE(std::filesystem::exists(root / "step_00000003"));
  // A rank's block: two infinities in rows 1..2 of a [4, 2] tensor.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> block = {1, inf, -inf, 0};
  ckpt::ShardPiece piece{ckpt::TensorSetId::params, ckpt::TensorRef("x", {4, 2}, block.data())};
  piece.ref.start = {1, 0};
  piece.ref.extent = {2, 2};
  absl::StatusOr<std::string> tmp = ckpt::begin_save(root.path(), 4, 2);
  REQUIRE(tmp.ok());
  absl::StatusOr<fs::FileDigest> d = ckpt::write_shard(*tmp, 0, 4, 0, {&piece, 1});
  CHECK(d.status().message() ==
        *tmp +
            "/shard_00000.h5: tensor 'x' (/model/x) holds 2 non-finite values (NaN or Inf; "
            "the first at element 1 of the block at [1,0]): refusing to save a poisoned "
            "checkpoint");
}

// A checkpoint that holds a NaN (written before this check existed, or corrupted in a way its
// checksums cannot see) is refused on resume with one line, exit 2, and left as it is.
TEST_CASE("reliability: resuming a checkpoint with non-finite weights is refused", "[cli]") {
  RunDir run(10);
  REQUIRE(run.trainer().exit_code == 0);
  const std::string step = run.dir / "ckpt/step_00000010";
  // Overwrite the first weight (embed_tokens/weight[0,0]) in the shard file with a NaN, then
  // re-digest the file in the manifest, as a writer without the check would have.
  const float first = read_checkpoint(run.config, step).p[0];
  std::string bytes = test::read_file(step + "/shard_00000.h5");
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(&first), 4));
  REQUIRE(at != std::string::npos);
  const float nan = std::nanf("");
  bytes.replace(at, 4, std::string(reinterpret_cast<const char*>(&nan), 4));
  test::write_file(step + "/shard_00000.h5", bytes);
  auto manifest = nlohmann::json::parse(test::read_file(step + "/manifest.json"));
  absl::StatusOr<fs::FileDigest> d = fs::digest_file(step + "/shard_00000.h5");
  REQUIRE(d.ok());
  manifest["files"]["shard_00000.h5"]["crc32"] = d->crc32;
  test::write_file(step + "/manifest.json", manifest.dump());
  test::expect_bad_input(
      run.trainer("--set train.steps=20"),
      "checkpoint file " + step +
          "/model.h5: tensor 'embed_tokens/weight' "
          "(/model/embed_tokens/weight) holds 1 non-finite value (NaN or Inf; the "
          "first at element 0 of the block at [0,0]): the checkpoint is poisoned; "
          "resume from an earlier "
          "one with --resume PATH");
  CHECK(test::read_file(step + "/shard_00000.h5") == bytes);  // left as it was
}

// The entries of `dir` whose names start with `prefix`, sorted.
std::vector<std::string> entries(const std::string& dir, const std::string& prefix = "") {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().starts_with(prefix))
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// "Seen: with `latest` missing, --resume auto trains from step 0 and its retention deletes the
// old checkpoints." Now it resumes the newest committed checkpoint that checks, and says so.
TEST_CASE("reliability: --resume auto without latest resumes the newest committed step", "[cli]") {
  RunDir run(20);
  REQUIRE(run.trainer().exit_code == 0);  // step_10, step_20
  const std::string ckpt = run.dir / "ckpt";
  std::filesystem::remove(ckpt + "/latest");
  SECTION("the newest checks") {
    CmdResult r = run.trainer("--set train.steps=25");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("note: checkpoint.dir '" + ckpt +
                        "' has no 'latest': resuming the newest committed checkpoint that "
                        "checks, " +
                        ckpt + "/step_00000020\n") != std::string::npos);
    CHECK(r.output.find("resumed from " + ckpt + "/step_00000020: step 20") != std::string::npos);
    CHECK(entries(ckpt, "step_") == std::vector<std::string>{"step_00000020", "step_00000025"});
  }
  SECTION("the newest is truncated: the one before") {
    std::filesystem::resize_file(ckpt + "/step_00000020/model.h5", 100);
    CmdResult r = run.trainer("--set train.steps=25");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("resuming the newest committed checkpoint that checks, " + ckpt +
                        "/step_00000010 (passed over: checkpoint file " + ckpt +
                        "/step_00000020/model.h5") != std::string::npos);
    CHECK(r.output.find("resumed from " + ckpt + "/step_00000010: step 10") != std::string::npos);
  }
  SECTION("none checks: an error, nothing changed") {
    std::filesystem::resize_file(ckpt + "/step_00000020/model.h5", 100);
    std::filesystem::resize_file(ckpt + "/step_00000010/model.h5", 100);
    CmdResult r = run.trainer("--set train.steps=25");
    test::expect_bad_input(r, "checkpoint.dir '" + ckpt +
                                  "' has no 'latest' and none of its 2 committed checkpoints "
                                  "checks (the newest: checkpoint file " +
                                  ckpt + "/step_00000020/model.h5");
    CHECK(entries(ckpt) ==
          std::vector<std::string>{"data-ids-checked.json", "step_00000010", "step_00000020"});
  }
}

// "Seen: --resume none accepts a directory full of checkpoints." It refuses, also without
// `latest`; with --force it starts over and moves the old checkpoints aside, deleting nothing.
TEST_CASE("reliability: --resume none refuses checkpoints unless --force moves them aside",
          "[cli]") {
  RunDir run(20);
  REQUIRE(run.trainer().exit_code == 0);
  const std::string ckpt = run.dir / "ckpt";
  std::filesystem::remove(ckpt + "/latest");
  test::expect_bad_input(run.trainer("--resume none"),
                         "--resume none but checkpoint.dir '" + ckpt +
                             "' already holds checkpoints (newest " + ckpt +
                             "/step_00000020); pass --resume auto to continue them, --force to "
                             "start over");
  CmdResult r = run.trainer("--resume none --force --set train.steps=10");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("note: starting over (--resume none --force): moved 2 entries of "
                      "checkpoint.dir aside (kept, not deleted)") != std::string::npos);
  const std::vector<std::string> aside = entries(ckpt, "abandoned-");
  REQUIRE(aside.size() == 1);
  CHECK(entries(ckpt + "/" + aside[0]) ==
        std::vector<std::string>{"step_00000010", "step_00000020"});
  CHECK(*ckpt::find_latest(ckpt) == ckpt + "/step_00000010");
  CHECK(steps_of(run).front()["step"] == 1);  // trained from scratch
}

// "Seen: after --resume step_20 with 22 and 24 on disk, latest keeps naming 24 until the first
// new save, so a crash in that window resumes the abandoned branch." Now `latest` names step 20
// before the first step, and 22 and 24 are moved aside.
TEST_CASE("reliability: --resume of an earlier step makes it latest at once", "[cli]") {
  RunDir run(24);
  REQUIRE(run.trainer("--set checkpoint.interval=2 --set checkpoint.keep_last=3").exit_code == 0);
  const std::string ckpt = run.dir / "ckpt";
  REQUIRE(entries(ckpt, "step_") ==
          std::vector<std::string>{"step_00000020", "step_00000022", "step_00000024"});
  // Killed while saving its first checkpoint (step 22 of the new branch).
  CmdResult r = run.trainer("--resume " + ckpt + "/step_00000020 --set checkpoint.interval=2",
                            "TR_TEST_CRASH_POINT=mid_tensors@22");
  INFO(r.output);
  CHECK(r.exit_code == 128 + 9);
  CHECK(r.output.find("note: resuming an earlier step than checkpoint.dir's newest: moved 2 "
                      "entries of checkpoint.dir aside") != std::string::npos);
  CHECK(*ckpt::find_latest(ckpt) == ckpt + "/step_00000020");
  const std::vector<std::string> aside = entries(ckpt, "abandoned-");
  REQUIRE(aside.size() == 1);
  CHECK(entries(ckpt + "/" + aside[0]) ==
        std::vector<std::string>{"step_00000022", "step_00000024"});
  CmdResult again = run.trainer("--set checkpoint.interval=2");
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  CHECK(again.output.find("resumed from " + ckpt + "/step_00000020: step 20") != std::string::npos);
}

// "Seen: a restarted job adopts the other run's weights with a one-line note." A checkpoint
// whose seeds or data differ from the config is refused unless --force.
TEST_CASE("reliability: a checkpoint of another run is refused unless --force", "[cli]") {
  RunDir run(10);
  REQUIRE(run.trainer().exit_code == 0);
  const std::string step = run.dir / "ckpt/step_00000010";
  test::expect_bad_input(run.trainer("--set train.steps=12 --set data.seed=99"),
                         "checkpoint " + step +
                             " was written by another run: data.seed: 1234 -> 99 (train.seed, "
                             "data.seed and data.train identify a run); resume it anyway with "
                             "--force, or choose another checkpoint.dir");
  CHECK(*ckpt::find_latest(run.dir / "ckpt") == step);
  CmdResult r = run.trainer("--set train.steps=12 --set data.seed=99 --force");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("note: config differs from the checkpoint's: data.seed: 1234 -> 99") !=
        std::string::npos);
}

// Sets a file's mtime `age_s` seconds into the past.
void set_age(const std::string& path, double age_s) {
  const auto t = std::filesystem::file_time_type::clock::now() -
                 std::chrono::milliseconds(static_cast<int64_t>(age_s * 1000));
  std::filesystem::last_write_time(path, t);
}

// Writes a lock file for a holder of our choosing, `age_s` seconds old; `extra` adds fields
// (pid_start, boot_id, heartbeat_s).
void fake_lock(const std::string& dir, const std::string& host, long long pid,
               const std::string& job, double age_s,
               nlohmann::json extra = nlohmann::json::object()) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + ckpt::kLockFile;
  nlohmann::json j = {
      {"host", host}, {"pid", pid}, {"slurm_job", job}, {"started", "2026-01-01T00:00:00Z"}};
  j.update(extra);
  test::write_file(path, j.dump());
  set_age(path, age_s);
}

std::string this_host() {
  char h[256] = {};
  gethostname(h, sizeof(h) - 1);
  return h;
}

// Field 22 of /proc/PID/stat: the process's start time.
long long start_time(pid_t pid) {
  const std::string stat = test::read_file("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream in(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) in >> field;
  return std::stoll(field);
}

// Options for tests: no waiting on a dying holder or on a file system's attribute cache.
ckpt::LockOptions quick(double heartbeat_s = 10) {
  ckpt::LockOptions o;
  o.stale_after_s = 900;
  o.heartbeat_s = heartbeat_s;
  o.wait_dying_s = 0;
  o.attr_cache_s = 0;
  return o;
}

TEST_CASE("reliability: the checkpoint.dir lock: live holders refuse, stale ones are taken",
          "[checkpoint]") {
  test::TempDir root;
  const std::string dir = root / "ckpt";
  std::string note;
  {
    absl::StatusOr<std::unique_ptr<ckpt::DirLock>> a = ckpt::DirLock::acquire(dir, quick(), &note);
    REQUIRE(a.ok());
    CHECK(note.empty());
    absl::StatusOr<ckpt::LockHolder> h = ckpt::read_lock(dir);
    REQUIRE(h.ok());
    CHECK(h->pid == getpid());
    CHECK(h->pid_start == start_time(getpid()));
    // A second taker in this process sees a live holder: this very pid on this host.
    absl::StatusOr<std::unique_ptr<ckpt::DirLock>> b = ckpt::DirLock::acquire(dir, quick(), &note);
    REQUIRE_FALSE(b.ok());
    CHECK(absl::IsUnavailable(b.status()));  // busy (exit 6), not bad input
    CHECK_THAT(std::string(b.status().message()),
               Catch::StartsWith("checkpoint.dir '" + dir + "' is in use by another trainer: pid " +
                                 std::to_string(getpid()) + " on host " + this_host()) &&
                   Catch::EndsWith("; wait for it, use another checkpoint.dir, or remove " + dir +
                                   "/trainer.lock if that run is gone"));
  }
  CHECK_FALSE(std::filesystem::exists(dir + "/trainer.lock"));  // released
  // Stale: a pid of this host that is gone.
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  fake_lock(dir, this_host(), gone, "", 1);
  REQUIRE(ckpt::DirLock::acquire(dir, quick(), &note).ok());
  CHECK_THAT(note, Catch::Contains("(its process is gone)"));
  // Live on another host with a fresh heartbeat: refused; with an old one: stale.
  fake_lock(dir, "elsewhere", 1, "77", 10);
  CHECK_FALSE(ckpt::DirLock::acquire(dir, quick(), &note).ok());
  fake_lock(dir, "elsewhere", 1, "77", 1000);
  REQUIRE(ckpt::DirLock::acquire(dir, quick(), &note).ok());
  CHECK_THAT(note, Catch::Contains("its heartbeat stopped 1000 s ago"));
  // An earlier run of this Slurm job (requeued): stale, wherever it ran.
  setenv("SLURM_JOB_ID", "4242", 1);
  fake_lock(dir, "elsewhere", 1, "4242", 10);
  REQUIRE(ckpt::DirLock::acquire(dir, quick(), &note).ok());
  CHECK_THAT(note, Catch::Contains("it was an earlier run of this Slurm job"));
  unsetenv("SLURM_JOB_ID");
}

// A live process of this host holds the lock whatever its heartbeat says (a slow load, a long
// evaluation, a hang or a clock step); a zombie (a killed rank not yet reaped: the restart 0.2 s
// after a killed job) or a pid now naming another process does not.
TEST_CASE("reliability: the lock of a live local holder is never stale, a zombie's is",
          "[checkpoint]") {
  test::TempDir root;
  const std::string dir = root / "ckpt";
  std::string note;
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  const nlohmann::json start = {{"pid_start", start_time(child)}};
  fake_lock(dir, this_host(), child, "", 1e6, start);  // a heartbeat 11 days old
  absl::StatusOr<std::unique_ptr<ckpt::DirLock>> held = ckpt::DirLock::acquire(dir, quick(), &note);
  REQUIRE_FALSE(held.ok());
  CHECK(absl::IsUnavailable(held.status()));
  // The same pid with another start time: the pid was reused, the holder is gone.
  fake_lock(dir, this_host(), child, "", 1, {{"pid_start", start_time(child) + 1}});
  REQUIRE(ckpt::DirLock::acquire(dir, quick(), &note).ok());
  CHECK_THAT(note, Catch::Contains("(its pid now belongs to another process)"));
  // Killed and not yet reaped: a zombie holds nothing.
  kill(child, SIGKILL);
  for (int i = 0;
       i < 200 && test::read_file("/proc/" + std::to_string(child) + "/stat").find(") Z ") ==
                      std::string::npos;
       ++i)
    usleep(10000);
  fake_lock(dir, this_host(), child, "", 1, start);
  REQUIRE(ckpt::DirLock::acquire(dir, quick(), &note).ok());
  CHECK_THAT(note, Catch::Contains("(its process has exited (a zombie))"));
  waitpid(child, nullptr, 0);
  // Another boot of this host: whatever has that pid now, the holder is gone.
  fake_lock(dir, this_host(), getpid(), "", 1, {{"boot_id", "not-this-boot"}});
  REQUIRE(ckpt::DirLock::acquire(dir, quick(), &note).ok());
  CHECK_THAT(note, Catch::Contains("(this host has rebooted since)"));
}

// The holder's heartbeat comes from a thread of its own, whatever the trainer is doing; another
// host's lock that looks old by this host's clock but is still being touched is not taken.
TEST_CASE("reliability: the lock's heartbeat is a thread, and a moving heartbeat is live",
          "[checkpoint]") {
  test::TempDir root;
  const std::string dir = root / "ckpt";
  std::string note;
  {
    absl::StatusOr<std::unique_ptr<ckpt::DirLock>> a =
        ckpt::DirLock::acquire(dir, quick(0.05), &note);
    REQUIRE(a.ok());
    set_age(dir + "/" + ckpt::kLockFile, 1000);
    usleep(300000);  // nothing else runs: only the heartbeat thread touches the file
    absl::StatusOr<ckpt::LockHolder> h = ckpt::read_lock(dir);
    REQUIRE(h.ok());
    CHECK(h->age_s < 100);
    CHECK(h->heartbeat_s == 0.05);
  }
  // Another host, heartbeat every 0.2 s, mtime 1000 s old by our clock yet moving: live.
  fake_lock(dir, "elsewhere", 1, "77", 1000, {{"heartbeat_s", 0.2}});
  std::atomic<bool> stop{false};
  std::thread toucher([&] {
    for (int i = 1; !stop; ++i) {
      set_age(dir + "/" + ckpt::kLockFile, 1000 - i);
      usleep(50000);
    }
  });
  absl::StatusOr<std::unique_ptr<ckpt::DirLock>> b = ckpt::DirLock::acquire(dir, quick(), &note);
  stop = true;
  toucher.join();
  CHECK_FALSE(b.ok());
  // The same lock, no longer touched: taken after the watch.
  REQUIRE(ckpt::DirLock::acquire(dir, quick(), &note).ok());
  CHECK_THAT(note, Catch::Contains("its heartbeat stopped"));
}

// "Seen: two trainers on one checkpoint.dir: no lock." The second exits 6 (busy) naming the first.
TEST_CASE("reliability: a second trainer on the same checkpoint.dir exits 6 (busy)", "[cli]") {
  RunDir run(100000);
  CmdResult r = run.second_trainer_while_training("");
  INFO(r.output);
  CHECK(r.output.find("error: checkpoint.dir '" + (run.dir / "ckpt") +
                      "' is in use by another trainer: pid ") != std::string::npos);
  CHECK(r.output.find("second=6") != std::string::npos);                // busy: kExitBusy
  CHECK_FALSE(std::filesystem::exists(run.dir / "ckpt/trainer.lock"));  // released at exit
}

TEST_CASE("reliability: a malformed TR_TEST_FAULT is one error line", "[cli]") {
  RunDir run(10);
  test::expect_bad_input(run.trainer("", "TR_TEST_FAULT=grad_nan"),
                         "TR_TEST_FAULT='grad_nan': expected KIND:STEP[:COUNT[:ARG]] with KIND "
                         "grad_nan, loss_nan, loss_spike, hang, slow or sigterm");
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// The step a trainer's output says it resumed from: a local checkpoint's, else a persistent
// one's, else 0 (a fresh start).
int64_t resumed_step(const std::string& out) {
  const char* local = "resumed from the local checkpoint of step ";
  if (const size_t at = out.find(local); at != std::string::npos)
    return std::stoll(out.substr(at + std::strlen(local)));
  if (const size_t at = out.find("resumed from "); at != std::string::npos)
    return std::stoll(out.substr(out.find(": step ", at) + 7));
  return 0;
}

// A lost node: every directory named `node` under the run's checkpoint.local_dir removed (its
// own parts and the replicas it held). Returns the files and directories removed.
size_t lose_node(const RunDir& run, const std::string& node) {
  std::vector<std::filesystem::path> dirs;
  for (const auto& e : std::filesystem::recursive_directory_iterator(run.dir / "local"))
    if (e.is_directory() && e.path().filename() == node) dirs.push_back(e.path());
  size_t removed = 0;
  for (const auto& d : dirs) removed += std::filesystem::remove_all(d);
  return removed;
}

// Node-local checkpoints: a run killed (kill -9 while step 17 hangs) resumes from its newest local
// checkpoint (step 15, or 12 when 15's background write had not been committed; every 3 steps)
// rather than the persistent one (step 10), and ends bit for bit where a run never killed ends;
// keep 2 leaves two parts on the node. A --resume none start removes them, so a later --resume auto
// cannot take a step of the abandoned run, and a run started after checkpoint.dir was deleted takes
// none (the run id it records there is gone).
TEST_CASE("reliability: a killed run resumes from its node-local checkpoint, bit-identical",
          "[cli]") {
  RunDir run(20, ""), ref(20, "");
  const std::string local = " --set checkpoint.local_interval=3 --set checkpoint.local_dir=";
  const std::string sets = local + (run.dir / "local");
  const CmdResult killed = run_cmd(
      "sh -c 'TR_TEST_FAULT=hang:17 " + tr::test::trainer_bin() + " --config " + run.config + sets +
      " >/dev/null 2>&1 & pid=$!; while [ \"$(ps -o stat= -p $pid | cut -c1)\" != T ]; "
      "do sleep 0.05; done; kill -9 $pid; wait $pid'");
  CHECK(killed.exit_code == 128 + SIGKILL);
  const CmdResult resumed = run.trainer(sets);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const int64_t from = resumed_step(resumed.output);
  CHECK((from == 12 || from == 15));
  CHECK(resumed.output.find(absl::StrCat("resumed from the local checkpoint of step ", from,
                                         " in ")) != std::string::npos);
  CHECK(resumed.output.find(absl::StrCat("(newer than persistent step 10): ", 8 * from,
                                         " samples consumed")) != std::string::npos);
  REQUIRE(ref.trainer(local + (ref.dir / "local")).exit_code == 0);
  test::check_same_checkpoint(run.config, run.dir / "ckpt/step_00000020", ref.config,
                              ref.dir / "ckpt/step_00000020");
  const std::vector<nlohmann::json> a = run.metrics(), b = ref.metrics();
  REQUIRE(a.size() == 20);
  REQUIRE(b.size() == 20);
  for (size_t i = 15; i < 20; ++i) CHECK(a[i]["loss"] == b[i]["loss"]);
  // Two parts kept (steps 15 and 18), in one directory for this checkpoint.dir.
  std::vector<std::string> parts;
  for (const auto& e : std::filesystem::recursive_directory_iterator(run.dir / "local"))
    if (e.is_regular_file())
      parts.push_back(e.path().filename().string() + "@" +
                      e.path().parent_path().filename().string());
  std::sort(parts.begin(), parts.end());
  CHECK(parts ==
        std::vector<std::string>{"rank_00000.bin@step_00000015", "rank_00000.bin@step_00000018"});
  // Starting over removes them: the only part left is the new run's step 3.
  const CmdResult fresh = run.trainer(sets + " --resume none --force --set train.steps=5");
  INFO(fresh.output);
  REQUIRE(fresh.exit_code == 0);
  parts.clear();
  for (const auto& e : std::filesystem::recursive_directory_iterator(run.dir / "local"))
    if (e.is_regular_file())
      parts.push_back(e.path().filename().string() + "@" +
                      e.path().parent_path().filename().string());
  CHECK(parts == std::vector<std::string>{"rank_00000.bin@step_00000003"});
  // A run started after checkpoint.dir was deleted is a fresh start: it takes no local part.
  std::filesystem::remove_all(run.dir / "ckpt");
  const CmdResult again = run.trainer(sets + " --set train.steps=5");
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  CHECK(again.output.find("resumed from") == std::string::npos);
  CHECK(again.output.find("step 1/5") != std::string::npos);
}

// The same on 4 ranks with ZeRO-1's sharded fp32 masters (the GPU's layout on CPU ranks), as
// tp 2 x dp 2 and as pp 2 x dp 2 (the tied embedding on both stages) under 1f1b, interleaved
// (v 2) and zero-bubble: a hung rank ends the job
// after parallel.timeout_s; the resume takes step 6 (or 4, when 6's background write was not yet
// committed), every rank's part of it, the compute weights are gathered again from the shards and
// the tied copies made equal, and the run ends bit for bit where one never stopped ends.
TEST_CASE("reliability: 4 ranks with sharded masters resume from their local parts", "[cli][mpi]") {
  const std::string interleaved =
      " --set parallel.pp=2 --set parallel.pipeline_schedule=interleaved"
      " --set parallel.virtual_stages=2 --set model.num_layers=4 --set train.micro_batch=2";
  for (const std::string& layout :
       {std::string(" --set parallel.tp=2"), std::string(" --set parallel.pp=2"), interleaved,
        std::string(" --set parallel.pp=2 --set parallel.pipeline_schedule=zero_bubble")}) {
    INFO(layout);
    const std::vector<std::string> shape = layout == interleaved
                                               ? std::vector<std::string>{"model.num_layers=4"}
                                               : std::vector<std::string>{};
    RunDir run(8, ""), ref(8, "");
    const std::string local = std::string(layout) +
                              " --set parallel.zero1=true --set checkpoint.interval=0"
                              " --set checkpoint.local_interval=2 --set checkpoint.local_dir=";
    const std::string env = "TR_TEST_COMPUTE_COPY=1";
    const CmdResult hung =
        run.mpirun(4, local + (run.dir / "local") + " --set parallel.timeout_s=3",
                   env + " TR_TEST_FAULT=hang:7:1:1");
    CHECK(hung.exit_code == kExitCommTimeout);
    const CmdResult resumed = run.mpirun(4, local + (run.dir / "local"), env);
    INFO(resumed.output);
    REQUIRE(resumed.exit_code == 0);
    const int64_t from = resumed_step(resumed.output);  // 6, or 4 before 6's commit
    CHECK((from == 4 || from == 6));
    CHECK(resumed.output.find("resumed from the local checkpoint of step ") != std::string::npos);
    REQUIRE(ref.mpirun(4, local + (ref.dir / "local"), env).exit_code == 0);
    test::check_same_checkpoint(run.config, run.dir / "ckpt/step_00000008", ref.config,
                                ref.dir / "ckpt/step_00000008", shape);
  }
  // A changed layout does not take them, and says why.
  RunDir other(8, "");
  const std::string local =
      " --set parallel.zero1=true --set checkpoint.interval=0 --set checkpoint.local_interval=2"
      " --set checkpoint.local_dir=" +
      (other.dir / "local");
  REQUIRE(other
              .mpirun(4, local + " --set parallel.tp=2 --set parallel.timeout_s=3",
                      "TR_TEST_FAULT=hang:7:1:1")
              .exit_code == kExitCommTimeout);
  const CmdResult changed =
      other.mpirun(4, local + " --set train.steps=5 --set train.micro_batch=2");
  INFO(changed.output);
  REQUIRE(changed.exit_code == 0);
  CHECK(changed.output.find(" was written by another layout (world, tp, pp, dp, virtual stages "
                            "or ZeRO-1); "
                            "resuming from the start") != std::string::npos);
}

// Replicas: 4 ranks as 2 "nodes" of 2 (TR_NODE_NAME), tp 2 x dp 2. Each rank's local part also
// goes to its holder on the other node. A hung rank ends the job; node n1's local directory is
// then deleted (the job comes back on a new node): its ranks fetch their parts from the replicas
// on n0, and the run ends bit for bit where one never stopped ends. Requeued with the node list
// changed (each rank on the other's node), the parts are found where they are. With both copies
// of n1's parts gone the resume falls back to the persistent checkpoint, and says why.
TEST_CASE("reliability: a lost node's ranks resume from their replicas on the next node",
          "[cli][mpi]") {
  RunDir run(8, ""), ref(8, ""), gone(8, ""), moved(8, "");
  // Each rank's node: n0 for ranks 0 and 1, n1 for ranks 2 and 3 (`first` 0); with `first` 1 the
  // job came back with its ranks on each other's nodes.
  auto launch = [](const RunDir& d, const std::string& args, const std::string& env,
                   int first = 0) {
    return run_cmd(env + " " + test::kOneThread + " " + tr::test::mpirun() +
                   " 4 sh -c 'TR_NODE_NAME=n$(((OMPI_COMM_WORLD_RANK / 2 + " +
                   std::to_string(first) + ") % 2)) exec " + tr::test::trainer_bin() +
                   " --config " + d.config + " " + args + "'");
  };
  const std::string sets =
      " --set parallel.tp=2 --set checkpoint.interval=0 --set checkpoint.local_interval=2"
      " --set checkpoint.local_dir=";
  for (const RunDir* d : {&run, &gone, &moved}) {
    const CmdResult hung = launch(*d, sets + (d->dir / "local") + " --set parallel.timeout_s=3",
                                  "TR_TEST_FAULT=hang:7:1:1");
    CHECK(hung.exit_code == kExitCommTimeout);
  }
  // Node n1's parts (and the replicas it held for n0) are gone.
  CHECK(lose_node(run, "n1") > 0);
  const CmdResult resumed = launch(run, sets + (run.dir / "local"), "");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK((resumed_step(resumed.output) == 4 || resumed_step(resumed.output) == 6));
  CHECK(resumed.output.find("resumed from the local checkpoint of step ") != std::string::npos);
  // (The reference asks for 3 replicas: the other node can hold one, and a note says so.)
  const CmdResult reference =
      launch(ref, sets + (ref.dir / "local") + " --set checkpoint.local_replicas=3", "");
  INFO(reference.output);
  REQUIRE(reference.exit_code == 0);
  CHECK(reference.output.find("note: checkpoint.local_replicas=3, but the other nodes of this job "
                              "are 1: keeping 1 copy of each part on them") != std::string::npos);
  test::check_same_checkpoint(run.config, run.dir / "ckpt/step_00000008", ref.config,
                              ref.dir / "ckpt/step_00000008");
  // Requeued with the node list changed (ranks 0 and 1 now on n1, 2 and 3 on n0): every part
  // is found where the old node names put it, and the run ends the same.
  const CmdResult requeued = launch(moved, sets + (moved.dir / "local"), "", 1);
  INFO(requeued.output);
  REQUIRE(requeued.exit_code == 0);
  CHECK((resumed_step(requeued.output) == 4 || resumed_step(requeued.output) == 6));
  CHECK(requeued.output.find("resumed from the local checkpoint of step ") != std::string::npos);
  test::check_same_checkpoint(moved.config, moved.dir / "ckpt/step_00000008", ref.config,
                              ref.dir / "ckpt/step_00000008");
  // Both copies of n1's parts gone (its directory, and n0's replicas of them): no local step is
  // whole; one line says why, and the run starts again from step 0 (no persistent checkpoint).
  CHECK(lose_node(gone, "n1") > 0);
  std::vector<std::filesystem::path> replicas;
  for (const auto& e : std::filesystem::recursive_directory_iterator(gone.dir / "local"))
    if (e.path().filename().string().starts_with("replica_")) replicas.push_back(e.path());
  CHECK(replicas.size() >= 4);  // n0 holds those of ranks 2 and 3, two steps (and unfinished)
  for (const auto& p : replicas) std::filesystem::remove(p);
  const CmdResult fresh = launch(gone, sets + (gone.dir / "local"), "");
  INFO(fresh.output);
  REQUIRE(fresh.exit_code == 0);
  CHECK(fresh.output.find(" has no copy left of the part of ranks 2, 3 (its node and its replica's "
                          "holder lost both); resuming from the start") != std::string::npos);
  CHECK(fresh.output.find("resumed from") == std::string::npos);
}

// checkpoint.local_replicas: 4 ranks as 4 nodes. With 2 replicas (on the next two nodes) two
// adjacent nodes lost together lose no part: the run resumes from the local step, bit-identical.
// With 0 no replica is written, and a lost node's part has no copy left: one line says so.
TEST_CASE("reliability: local_replicas 2 survives two adjacent lost nodes, 0 writes none",
          "[cli][mpi]") {
  RunDir two(8, ""), ref(8, ""), none(8, "");
  auto launch = [](const RunDir& d, const std::string& replicas, const std::string& env) {
    return run_cmd(env + " " + test::kOneThread + " " + tr::test::mpirun() +
                   " 4 sh -c 'TR_NODE_NAME=n$OMPI_COMM_WORLD_RANK exec " + tr::test::trainer_bin() +
                   " --config " + d.config +
                   " --set parallel.tp=2 --set checkpoint.interval=0 --set parallel.timeout_s=3"
                   " --set checkpoint.local_interval=2 --set checkpoint.local_replicas=" +
                   replicas + " --set checkpoint.local_dir=" + (d.dir / "local") + "'");
  };
  auto files_named = [](const RunDir& d, const std::string& prefix) {
    int n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(d.dir / "local"))
      n += e.path().filename().string().starts_with(prefix);
    return n;
  };
  for (const RunDir* d : {&two, &none})
    CHECK(launch(*d, d == &two ? "2" : "0", "TR_TEST_FAULT=hang:7:1:1").exit_code ==
          kExitCommTimeout);
  // Two replicas of each of 4 parts, for each kept step (steps 2 and 4 at least).
  CHECK(files_named(two, "replica_") >= 2 * 4 * 2);
  CHECK(files_named(none, "replica_") == 0);
  CHECK(files_named(none, "rank_") >= 4 * 2);
  CHECK(lose_node(two, "n1") > 0);
  CHECK(lose_node(two, "n2") > 0);
  const CmdResult resumed = launch(two, "2", "");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK((resumed_step(resumed.output) == 4 || resumed_step(resumed.output) == 6));
  CHECK(resumed.output.find("resumed from the local checkpoint of step ") != std::string::npos);
  REQUIRE(launch(ref, "2", "").exit_code == 0);
  test::check_same_checkpoint(two.config, two.dir / "ckpt/step_00000008", ref.config,
                              ref.dir / "ckpt/step_00000008");
  CHECK(lose_node(none, "n1") > 0);
  const CmdResult fresh = launch(none, "0", "");
  INFO(fresh.output);
  REQUIRE(fresh.exit_code == 0);
  CHECK(fresh.output.find(" has no copy left of the part of rank 1 (its node lost it; "
                          "checkpoint.local_replicas=0 keeps no other copy)") != std::string::npos);
  CHECK(fresh.output.find("resumed from") == std::string::npos);
}

// The chaos run: tp 2 x pp 2 x dp 2 on 8 ranks as 4 "nodes" of 2, a local checkpoint
// every 2 steps and a persistent one every 10. Ten faults at seeded random steps, in turn: a
// rank hangs (the job ends after parallel.timeout_s, no rank saves); a rank is killed (kill -9,
// and its node's local directory goes with it); the launcher is killed (kill -9 of mpirun once
// the step is logged, then the ranks, as a scheduler ends the job's processes). One kill takes
// two adjacent nodes' directories. Each restart with --resume auto (the next fault's launch, or
// the last) resumes no earlier than the newest checkpoint committed before the fault, as the
// run's own log says (the faulted launch's "local_checkpoint" events and the local step it
// resumed from; a persistent "checkpoint" event of any launch), whatever the load on
// the machine, or, with two adjacent nodes gone, from the persistent checkpoint with a line
// saying why a newer local one was not taken; the final weights and Adam states are bit for bit
// those of a run never interrupted.
TEST_CASE("reliability: a chaos run of ten faults ends bit-identical to an uninterrupted one",
          "[cli][mpi]") {
  RunDir run(40, ""), ref(40, "");
  auto command = [](const RunDir& d, const std::string& env) {
    return env + " " + test::kOneThread + " " + tr::test::mpirun() +
           " 8 sh -c 'TR_NODE_NAME=n$((OMPI_COMM_WORLD_RANK / 2)) exec " + tr::test::trainer_bin() +
           " --config " + d.config +
           " --set parallel.tp=2 --set parallel.pp=2 --set parallel.timeout_s=2"
           " --set checkpoint.interval=10 --set checkpoint.local_interval=2 --set log.interval=1"
           " --set checkpoint.local_dir=" +
           (d.dir / "local") + "'";
  };
  auto launch = [&](const RunDir& d, const std::string& env) { return run_cmd(command(d, env)); };
  // mpirun started in the background and killed (kill -9) once step `at` is logged; then every
  // rank of the run, as the scheduler would (the ranks outlive their launcher for a while).
  auto kill_launcher = [&](const RunDir& d, int64_t at) {
    test::write_file(d.dir / "launch.sh", "exec env " + command(d, "") + "\n");
    test::write_file(
        d.dir / "kill.sh",
        "sh " + (d.dir / "launch.sh") + " & pid=$!\n" +
            "while kill -0 $pid 2>/dev/null && ! grep -qs '\"step\":" + std::to_string(at) + ",' " +
            (d.dir / "log/metrics.jsonl") + "; do sleep 0.02; done\n" +
            "kill -9 $pid; pkill -9 -f " + d.config + "; wait $pid\n");
    return run_cmd("sh " + (d.dir / "kill.sh"));
  };
  // The local directory of node n<k> lost.
  auto lose = [&](int k) {
    std::string name = "n";
    name += std::to_string(k);
    lose_node(run, name);
  };
  std::mt19937 rng(29);
  int64_t last = 0;  // the last step the run logged before the fault
  // The newest steps the faulted launch logged as committed: a local checkpoint of that launch,
  // a persistent one of any launch (metrics.jsonl's checkpoint events, from line `from` on).
  int64_t committed_local = 0, committed_persistent = 0;
  auto newest_event = [&](const std::string& event, size_t from) {
    int64_t newest = 0;
    const std::vector<std::string> lines = test::read_lines(run.dir / "log/metrics.jsonl");
    for (size_t i = from; i < lines.size(); ++i) {
      const nlohmann::json j = nlohmann::json::parse(lines[i], nullptr, false);
      if (j.is_object() && j.value("event", "") == event)
        newest = std::max(newest, j["step"].get<int64_t>());
    }
    return newest;
  };
  int from_local = 0, from_persistent = 0;
  bool two_nodes = false;
  // What the launch after a fault says of its resume.
  auto check_resume = [&](const CmdResult& r) {
    if (last == 0) return;
    const int64_t resumed = resumed_step(r.output);
    INFO("after the fault past step " << last << ": resumed at " << resumed << "; committed before "
                                      << "it: local " << committed_local << ", persistent "
                                      << committed_persistent);
    CHECK(resumed >= committed_persistent);
    if (two_nodes) {  // a persistent checkpoint (or the start), with a line when a local step
                      // was newer
      CHECK(resumed % 10 == 0);
      CHECK((r.output.find("has no copy left of the part of rank") != std::string::npos ||
             resumed >= committed_local));
      CHECK(r.output.find("resumed from the local checkpoint") == std::string::npos);
    } else {  // the local checkpoint, or a persistent one as new
      CHECK(resumed >= committed_local);
      ++(r.output.find("resumed from the local checkpoint of step ") != std::string::npos
             ? from_local
             : from_persistent);
    }
    CHECK(resumed <= last);
  };
  for (int fault = 0; fault < 10; ++fault) {
    const int64_t at = last + 2 + static_cast<int64_t>(rng() % 3);  // past the resume point
    const int rank = static_cast<int>(rng() % 8);
    const char* kinds[] = {"hang", "kill", "launcher"};
    const std::string kind = kinds[fault % 3];
    const size_t lines_before = test::read_lines(run.dir / "log/metrics.jsonl").size();
    const CmdResult r = kind == "launcher"
                            ? kill_launcher(run, at)
                            : launch(run, "TR_TEST_FAULT=" + kind + ":" + std::to_string(at) +
                                              ":1:" + std::to_string(rank));
    INFO("fault " << fault << ": " << kind << " of rank " << rank << " at step " << at << "\n"
                  << r.output);
    if (kind == "hang")
      REQUIRE(r.exit_code == kExitCommTimeout);
    else
      REQUIRE(r.exit_code != 0);
    check_resume(r);
    last = run.metrics().back()["step"].get<int64_t>();
    committed_local = newest_event("local_checkpoint", lines_before);
    if (r.output.find("resumed from the local checkpoint of step ") != std::string::npos)
      committed_local = std::max(committed_local, resumed_step(r.output));  // committed before
    committed_persistent = newest_event("checkpoint", 0);
    if (kind == "launcher")
      CHECK(last >= at);
    else  // the faulty step never ends (and the one before may end unlogged on rank 0)
      CHECK((last == at - 1 || last == at - 2));
    two_nodes = fault == 7;
    if (two_nodes) {
      lose(rank / 2);
      lose((rank / 2 + 1) % 4);
    } else if (kind == "kill") {
      lose(rank / 2);
    }
  }
  const CmdResult end = launch(run, "");
  INFO(end.output);
  REQUIRE(end.exit_code == 0);
  check_resume(end);
  // Most restarts took a local checkpoint (the others found a persistent one as new, or a local
  // write not yet committed left it older).
  CHECK(from_local + from_persistent == 9);
  CHECK(from_local >= 3);
  REQUIRE(launch(ref, "").exit_code == 0);
  test::check_same_checkpoint(run.config, run.dir / "ckpt/step_00000040", ref.config,
                              ref.dir / "ckpt/step_00000040");
}

// tools/goodput over a run killed twice (kill -9 while a step hangs) and resumed twice: the
// steps it reports recomputed are exactly those logged past the checkpoint each restart resumed
// from, the productive time is the step time of the steps that count, and the parts add up to
// the wall time.
TEST_CASE("reliability: tools/goodput counts the steps two kill -9s cost", "[cli]") {
  RunDir run(20, "");
  const std::string every5 = " --set checkpoint.interval=5";
  // Kills the trainer once it has stopped itself at the start of step `hang` (steps before it
  // logged, the checkpoint of the last multiple of 5 committed).
  auto killed_at = [&](int hang) {
    return run_cmd(
        "sh -c 'TR_TEST_FAULT=hang:" + std::to_string(hang) + " " + tr::test::trainer_bin() +
        " --config " + run.config + every5 +
        " >/dev/null 2>&1 & pid=$!; while [ \"$(ps -o stat= -p $pid | cut -c1)\" != T ]; "
        "do sleep 0.05; done; kill -9 $pid; wait $pid'");
  };
  CHECK(killed_at(14).exit_code == 128 + SIGKILL);  // steps 1-13 logged, 11-13 lost
  CHECK(killed_at(18).exit_code == 128 + SIGKILL);  // resumed at 10: 11-17 logged, 16-17 lost
  const CmdResult last = run.trainer(every5);       // resumed at 15: 16-20
  INFO(last.output);
  REQUIRE(last.exit_code == 0);
  const std::string tool = tr::test::source_dir() + "/tools/goodput";
  const std::string python = tr::test::python_bin();
  const CmdResult r = run_cmd(python + " " + tool + " --json " + (run.dir / "log"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json g = nlohmann::json::parse(r.output);
  const nlohmann::json& total = g["total"];
  CHECK(total["processes"] == 3);
  CHECK(total["restarts"] == 2);
  CHECK(total["steps"] == 20);
  CHECK(total["recomputed_steps"] == 5);
  const nlohmann::json& p = g["processes"];
  REQUIRE(p.size() == 3);
  CHECK(p[0]["start_step"] == 0);
  CHECK(p[1]["start_step"] == 10);
  CHECK(p[2]["start_step"] == 15);
  CHECK(p[0]["recomputed_steps"] == 3);
  CHECK(p[1]["recomputed_steps"] == 2);
  CHECK(p[2]["recomputed_steps"] == 0);
  CHECK(p[0]["exit_code"].is_null());  // killed: no exit event
  CHECK(p[2]["exit_code"] == 0);
  // Productive: the step time of the 20 steps as the run's history keeps them.
  double kept = 0;
  for (const nlohmann::json& s : run.metrics()) kept += s["step_time_s"].get<double>();
  CHECK(total["productive_s"].get<double>() == Approx(kept).epsilon(1e-9));
  const double parts = total["productive_s"].get<double>() + total["recomputed_s"].get<double>() +
                       total["restart_s"].get<double>() +
                       total["checkpoint_stall_s"].get<double>() + total["eval_s"].get<double>() +
                       total["other_s"].get<double>();
  CHECK(std::abs(parts - total["wall_s"].get<double>()) < 1e-3);
  CHECK(total["goodput"].get<double>() > 0);
  CHECK(total["goodput"].get<double>() < 1);
  // The table and the plot.
  const CmdResult t = run_cmd(python + " " + tool + " --plot " + (run.dir / "goodput.png") + " " +
                              (run.dir / "log"));
  INFO(t.output);
  CHECK(t.exit_code == 0);
  CHECK(t.output.find("| all | | | ") != std::string::npos);
  CHECK(t.output.find("(2 restart(s), 5 step(s) recomputed, 0 skipped)") != std::string::npos);
  CHECK(std::filesystem::file_size(run.dir / "goodput.png") > 1000);
}

}  // namespace
}  // namespace tr
