// The end-to-end tests' run directory (data, config, checkpoint and log dirs) and the trainer's
// one-line error check, shared by test_cli.cpp and test_cli_gpu.cpp.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "data/writer.h"
#include "tests/test_util.h"
#include "trainer/config/config.h"
#include "trainer/model/model.h"

namespace tr::test {

// Byte-level documents of a few repeated sentences: easy to learn, so the loss falls fast.
inline void write_dataset(const std::string& prefix, int docs) {
  const char* sentences[] = {"the quick brown fox jumps over the lazy dog. ",
                             "pack my box with five dozen liquor jugs! ",
                             "how vexingly quick daft zebras jump? "};
  auto w = data::IndexedDatasetWriter::create(prefix, 257);
  REQUIRE(w.ok());
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> toks;
    for (int r = 0; r < 6; ++r)
      for (const char* c = sentences[(d + r) % 3]; *c; ++c)
        toks.push_back(static_cast<unsigned char>(*c));
    toks.push_back(256);
    REQUIRE((*w)->add_document(toks).ok());
  }
  REQUIRE((*w)->finish().ok());
}

// The licence texts every Debian machine has (the demo's data), a byte per token and 256 after
// each: text a model of this size cannot memorise in a few hundred steps.
inline void write_licence_texts(const std::string& prefix) {
  auto w = data::IndexedDatasetWriter::create(prefix, 257);
  REQUIRE(w.ok());
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses"))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 5);
  for (const std::filesystem::path& f : files) {
    std::vector<int32_t> toks;
    for (const char c : read_file(f.string())) toks.push_back(static_cast<unsigned char>(c));
    toks.push_back(256);
    REQUIRE((*w)->add_document(toks).ok());
  }
  REQUIRE((*w)->finish().ok());
}

// Many ranks share 2 cores in CI: one BLAS/OpenMP thread each.
inline constexpr const char* kOneThread =
    "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1";

// A run directory: data, config.yaml and the checkpoint/log dirs inside one temp dir.
struct RunDir {
  TempDir dir;
  std::string config = dir / "config.yaml";
  explicit RunDir(int steps = 20, const std::string& extra = "") {
    write_dataset(dir / "train", 40);
    write_dataset(dir / "valid", 4);
    test::write_file(config, R"(
model: {hidden_size: 64, intermediate_size: 128, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        head_dim: 16, vocab_size: 257, max_seq_len: 64, rope_theta: 10000, tie_embeddings: true}
data: {train: [{path: )" + (dir / "train") +
                                 R"(}], valid: [{path: )" + (dir / "valid") + R"(}], seq_len: 32}
train: {steps: )" + std::to_string(steps) +
                                 R"(, global_batch: 8, micro_batch: 4, eval_interval: 0}
optim: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 5}
checkpoint: {dir: )" + (dir / "ckpt") +
                                 R"(, interval: 10, keep_last: 2}
log: {dir: )" + (dir / "log") + R"(, interval: 5}
)" + extra);
  }
  CmdResult trainer(const std::string& args = "", const std::string& env = "") const {
    return run_cmd(env + " " + tr::test::trainer_bin() + " --config " + config + " " + args);
  }
  // The trainer on `ranks` ranks of the test suite's own Slurm (tests/slurm/local_slurm.sh).
  CmdResult srun(int ranks, const std::string& args = "", const std::string& env = "") const {
    return run_cmd(env + " " + kOneThread + " srun --overcommit --mpi=pmix -n " +
                   std::to_string(ranks) + " " + tr::test::trainer_bin() + " --config " + config +
                   " " + args);
  }
  // The trainer on `ranks` MPI ranks of this machine.
  CmdResult mpirun(int ranks, const std::string& args = "", const std::string& env = "") const {
    return run_cmd(env + " " + kOneThread + " " + tr::test::mpirun() + " " + std::to_string(ranks) +
                   " " + tr::test::trainer_bin() + " --config " + config + " " + args);
  }
  // Shell: waits until metrics.jsonl has a step line (its start event comes before any step).
  std::string wait_for_a_step() const {
    return "until grep -qs loss " + (dir / "log/metrics.jsonl") + "; do sleep 0.05; done;";
  }
  // `launch` (e.g. mpirun and its arguments; "" for one process) and the trainer started in the
  // background; once it logs a step it gets SIGsig (`sig` as kill names it: TERM, USR1) and is
  // waited for, as a job that Slurm or a user stops.
  CmdResult signal_when_training(const std::string& launch, const std::string& sig) const {
    return run_cmd("sh -c '" + launch + " " + tr::test::trainer_bin() + " --config " + config +
                   " & pid=$!; " + wait_for_a_step() + " kill -" + sig + " $pid; wait $pid'");
  }
  // While a trainer of this run is training (it has logged a step), a second one with `args`:
  // its output, then "second=<its exit code>"; the first is stopped with SIGTERM after.
  CmdResult second_trainer_while_training(const std::string& args) const {
    return run_cmd("sh -c '" + tr::test::trainer_bin() + " --config " + config +
                   " >/dev/null 2>&1 & pid=$!; " + wait_for_a_step() + " " +
                   tr::test::trainer_bin() + " --config " + config + " " + args +
                   "; echo second=$?; kill -TERM $pid; wait $pid'");
  }
  // The lines of log/metrics.jsonl that have `key` ("loss": steps, "val_loss": evaluations), by
  // step, read as tools/plot_metrics reads them: the last line of each step; a resume line drops
  // the later steps logged before it; a line a crash cut short (not JSON) is skipped.
  std::vector<nlohmann::json> metrics(const char* key = "loss") const {
    std::map<int64_t, nlohmann::json> by_step;
    for (const std::string& l : test::read_lines(dir / "log/metrics.jsonl")) {
      const nlohmann::json j = nlohmann::json::parse(l, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object() || !j.contains("step")) continue;
      if (j.value("event", "") == "resume")
        by_step.erase(by_step.upper_bound(j["step"].get<int64_t>()), by_step.end());
      else if (j.contains(key))
        by_step[j["step"].get<int64_t>()] = j;
    }
    std::vector<nlohmann::json> lines;
    for (auto& [step, j] : by_step) lines.push_back(std::move(j));
    return lines;
  }
};

// Runs the trainer expecting exit code 2 and one error line containing `message`.
inline void expect_bad_input(const CmdResult& r, const std::string& message) {
  INFO(r.output);
  CHECK(r.exit_code == 2);
  const size_t at = r.output.find("error: ");
  REQUIRE(at != std::string::npos);
  const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
  CHECK(line.find(message) != std::string::npos);
  CHECK(r.output.find('\n', at) == r.output.size() - 1);  // one line, and the last
}

// Every tensor of a checkpoint (params, Adam m and v) as one flat vector per kind.
struct CkptTensors {
  std::vector<float> p, m, v;
  ckpt::TrainState state;
};
inline CkptTensors read_checkpoint(const std::string& config, const std::string& path,
                                   const std::vector<std::string>& sets = {}) {
  absl::StatusOr<Config> cfg = load_config(config, sets);
  REQUIRE(cfg.ok());
  ParamLayout layout = ParamLayout::make(ModelDims::from(cfg->model, Topology{}));
  CkptTensors t;
  t.p.resize(layout.total), t.m.resize(layout.total), t.v.resize(layout.total);
  auto refs = [&](std::vector<float>& buf) {
    std::vector<ckpt::TensorRef> r;
    for (const ParamInfo& p : layout.tensors)
      r.push_back({p.name, p.global_shape, buf.data() + p.offset});
    return r;
  };
  auto p = refs(t.p), m = refs(t.m), v = refs(t.v);
  absl::Status st = ckpt::load(path, ckpt::LoadTarget{p, m, v}, &t.state, nullptr);
  INFO(st.message());
  REQUIRE(st.ok());
  return t;
}

// Two checkpoints hold the same weights and Adam moments, bit for bit. `sets`: the model's
// --set flags both ran with.
inline void check_same_checkpoint(const std::string& config_a, const std::string& path_a,
                                  const std::string& config_b, const std::string& path_b,
                                  const std::vector<std::string>& sets = {}) {
  INFO(path_a << " against " << path_b);
  const CkptTensors a = read_checkpoint(config_a, path_a, sets);
  const CkptTensors b = read_checkpoint(config_b, path_b, sets);
  CHECK(a.p == b.p);
  CHECK(a.m == b.m);
  CHECK(a.v == b.v);
}

// After a stop: every logged step was applied and the newest of them is `latest`.
inline void check_latest_is_last_logged_step(const RunDir& run) {
  const int64_t steps = static_cast<int64_t>(run.metrics().size());
  REQUIRE(steps >= 1);
  absl::StatusOr<std::string> latest = ckpt::find_latest(run.dir / "ckpt");
  REQUIRE(latest.ok());
  CHECK(read_checkpoint(run.config, *latest).state.step == steps);
}

// The layout tests' model: 8 heads and 4 KV heads (so tp 4 divides them) of dim 8, and 4 layers
// (so pp 4 divides them).
inline const std::vector<std::string> kLayoutShape = {"model.num_heads=8", "model.num_kv_heads=4",
                                                      "model.head_dim=8", "model.num_layers=4"};

// `base` with kLayoutShape's --set flags.
inline std::string with_layout_shape(std::string base) {
  for (const std::string& kv : kLayoutShape) base += " --set " + kv;
  return base;
}

// Two runs' metrics.jsonl: `steps` steps each, with the same loss and gradient norm, bit for bit,
// at every step.
inline void expect_same_bits(const std::vector<nlohmann::json>& a,
                             const std::vector<nlohmann::json>& b, size_t steps) {
  REQUIRE(a.size() == steps);
  REQUIRE(b.size() == steps);
  for (size_t i = 0; i < steps; ++i) {
    INFO("step " << i + 1);
    CHECK(b[i]["loss"].get<double>() == a[i]["loss"].get<double>());
    CHECK(b[i]["grad_norm"].get<double>() == a[i]["grad_norm"].get<double>());
  }
}

// `run` trained as `one` did, under another layout: every step's loss and gradient norm, the
// last validation loss and the final checkpoint's weights and Adam states within relative 1e-5,
// and the samples consumed. `shape`: the model's --set flags both ran with.
inline void expect_same_training(const RunDir& one, const RunDir& run, int steps, int64_t samples,
                                 const std::string& what,
                                 const std::vector<std::string>& shape = kLayoutShape) {
  std::vector<nlohmann::json> a = one.metrics(), b = run.metrics();
  REQUIRE(a.size() == static_cast<size_t>(steps));
  REQUIRE(b.size() == static_cast<size_t>(steps));
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(what << ": step " << i + 1);
    CHECK(std::abs(b[i]["loss"].get<double>() / a[i]["loss"].get<double>() - 1) < 1e-5);
    CHECK(std::abs(b[i]["grad_norm"].get<double>() / a[i]["grad_norm"].get<double>() - 1) < 1e-5);
    CHECK(b[i]["tokens"] == a[i]["tokens"]);
  }
  std::vector<nlohmann::json> ea = one.metrics("val_loss"), eb = run.metrics("val_loss");
  REQUIRE(eb.size() == 2);
  CHECK(std::abs(eb[1]["val_loss"].get<double>() / ea[1]["val_loss"].get<double>() - 1) < 1e-5);
  char last[32];
  std::snprintf(last, sizeof last, "ckpt/step_%08d", steps);
  CkptTensors x = read_checkpoint(one.config, one.dir / std::string(last), shape);
  CkptTensors y = read_checkpoint(run.config, run.dir / std::string(last), shape);
  CHECK(rel_err(y.p, x.p) < 1e-5);
  CHECK(rel_err(y.m, x.m) < 1e-5);
  CHECK(rel_err(y.v, x.v) < 1e-5);
  CHECK(y.state.consumed_samples == samples);
}

}  // namespace tr::test
