// End-to-end tests of the trainer binary: training, bit-exact resume, crash safety and the
// one-line errors (exit code 2) for every kind of bad input.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/exit_codes.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"
#include "trainer/config/config.h"
#include "trainer/model/model.h"
#include "trainer/step/agree.h"

namespace tr {
namespace {

namespace fs = std::filesystem;
using test::CkptTensors;
using test::CmdResult;
using test::expect_bad_input;
using test::expect_same_bits;
using test::kLayoutShape;
using test::kOneThread;
using test::read_checkpoint;
using test::run_cmd;
using test::RunDir;
using test::TempDir;
using test::with_layout_shape;

TEST_CASE("cli: the tiny model's loss falls below a bound", "[cli]") {
  RunDir run(150);
  CmdResult r = run.trainer();
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::vector<nlohmann::json> m = run.metrics();
  REQUIRE(m.size() == 150);
  const double first = m.front()["loss"], last = m.back()["loss"];
  CHECK(std::abs(first - std::log(257.0)) < 0.3);  // uniform prediction at the start
  CHECK(last < 1.0);
  CHECK(m.back()["step"] == 150);
  CHECK(m.back()["tokens"] == 8 * 32);
  for (const char* k : {"lr", "grad_norm", "tokens_per_s", "step_time_s"})
    CHECK(m.back().contains(k));
  CHECK(fs::exists(run.dir / "ckpt/step_00000150/model.h5"));
  CHECK(fs::exists(run.dir / "log/config.yaml"));
  CHECK(r.output.find("resolved config:") != std::string::npos);
}

// Also with packed documents: block-causal attention, positions restarting in each document and
// the targets after each end-of-document token left out of the loss.
TEST_CASE("cli: 10 steps + resume + 10 steps is bit-identical to 20 steps (also block-causal)",
          "[cli][cpu-build]") {
  for (const std::string& mode :
       {std::string(), std::string("--set data.document_mask=block_causal --set data.eod_id=32 "
                                   "--set data.reset_position_ids=true "
                                   "--set data.eod_mask_loss=true ")}) {
    INFO(mode);
    RunDir straight(20), split(20);
    const std::string eval = mode + "--set train.eval_interval=5 --set train.eval_steps=2 ";
    REQUIRE(straight.trainer(eval).exit_code == 0);
    CmdResult first = split.trainer(eval + "--set train.exit_interval=10");
    INFO(first.output);
    REQUIRE(first.exit_code == kExitStopped);
    REQUIRE(split.metrics().size() == 10);
    CmdResult second = split.trainer(eval + "--resume auto");
    INFO(second.output);
    REQUIRE(second.exit_code == 0);
    CHECK(second.output.find("resumed from") != std::string::npos);
    std::vector<nlohmann::json> a = straight.metrics(), b = split.metrics();
    REQUIRE(a.size() == 20);
    REQUIRE(b.size() == 20);
    for (size_t i = 0; i < a.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(a[i]["step"] == b[i]["step"]);
      CHECK(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());  // bit for bit
      CHECK(a[i]["grad_norm"].get<double>() == b[i]["grad_norm"].get<double>());
    }
    std::vector<nlohmann::json> ea = straight.metrics("val_loss"), eb = split.metrics("val_loss");
    REQUIRE(ea.size() == 4);  // steps 5, 10, 15, 20
    REQUIRE(eb.size() == 4);
    for (size_t i = 0; i < ea.size(); ++i) {
      CHECK(ea[i]["step"] == 5 * (i + 1));
      CHECK(ea[i]["val_loss"].get<double>() == eb[i]["val_loss"].get<double>());
    }
    CHECK(ea[3]["val_loss"].get<double>() < ea[0]["val_loss"].get<double>());
    CkptTensors x = read_checkpoint(straight.config, straight.dir / "ckpt/step_00000020");
    CkptTensors y = read_checkpoint(split.config, split.dir / "ckpt/step_00000020");
    CHECK(std::memcmp(x.p.data(), y.p.data(), x.p.size() * 4) == 0);
    CHECK(std::memcmp(x.m.data(), y.m.data(), x.m.size() * 4) == 0);
    CHECK(std::memcmp(x.v.data(), y.v.data(), x.v.size() * 4) == 0);
    CHECK(x.state.consumed_samples == 160);
    CHECK(y.state.consumed_samples == 160);
  }
}

TEST_CASE("cli: SIGKILL during a save leaves the previous checkpoint as latest", "[cli]") {
  RunDir run(20);
  CmdResult r = run.trainer("", "TR_TEST_CRASH_POINT=mid_tensors@20");
  INFO(r.output);
  CHECK(r.exit_code == 128 + 9);  // the shell reports the trainer's SIGKILL
  absl::StatusOr<std::string> latest = ckpt::find_latest(run.dir / "ckpt");
  REQUIRE(latest.ok());
  CHECK(*latest == run.dir / "ckpt/step_00000010");
  CHECK(ckpt::verify(*latest).ok());
  CHECK(read_checkpoint(run.config, *latest).state.step == 10);
  CmdResult again = run.trainer("--resume auto");
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  CHECK(again.output.find("resumed from " + run.dir.path() + "/ckpt/step_00000010: step 10") !=
        std::string::npos);
  CHECK(*ckpt::find_latest(run.dir / "ckpt") == run.dir / "ckpt/step_00000020");
}

TEST_CASE("cli: SIGTERM saves the last applied step and exits 3", "[cli]") {
  RunDir run(100000);
  // Signalled as Slurm does before a time limit, once steps are being logged.
  CmdResult r = run.signal_when_training("", "TERM");
  INFO(r.output);
  REQUIRE(r.exit_code == kExitStopped);
  CHECK(r.output.find("stopped by signal 15 (Terminated) ") != std::string::npos);
  test::check_latest_is_last_logged_step(run);
}

// Ctrl-C: the first says at once what will happen and saves as SIGTERM does; a second, while the
// stop is under way, ends the process at once without saving (here the handler is called twice
// in a child process, so that the second lands inside the first's stop every time).
TEST_CASE("cli: Ctrl-C says what it will do, and a second one stops without saving", "[cli]") {
  RunDir run(100000);
  const CmdResult r = run.signal_when_training("", "INT");
  INFO(r.output);
  REQUIRE(r.exit_code == kExitStopped);
  CHECK(r.output.find("trainer: stop requested: finishing the current micro-batch, then saving the "
                      "last applied step and exiting with code 3 (Ctrl-C again: stop now, "
                      "without saving)\n") != std::string::npos);
  test::check_latest_is_last_logged_step(run);
  const pid_t child = fork();
  if (child == 0) {
    on_stop_signal(SIGINT);
    if (g_stop_signal != SIGINT) _exit(1);
    on_stop_signal(SIGINT);
    _exit(2);  // not reached: the second exits
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGINT);
}

// log.profile_steps: the capture starts before the window's first step and stops after its last,
// once; a window past the run's last step stops with the run. A profile or trace window cut at
// train.steps, or lying past it, is one warning at start-up.
TEST_CASE("cli: log.profile_steps brackets those steps with the profiler's capture", "[cli]") {
  RunDir run(5);
  CmdResult r = run.trainer("--set log.interval=1 --set 'log.profile_steps=[2, 3]'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto at = [&](const std::string& text) {
    const size_t i = r.output.find(text);
    CHECK(i != std::string::npos);
    CHECK(r.output.find(text, i + 1) == std::string::npos);  // once
    return i;
  };
  const size_t start = at("profiler: capturing steps 2 to 3 (cudaProfilerStart)\n");
  const size_t stop = at("profiler: capture stopped after step 3 (cudaProfilerStop)\n");
  CHECK(at("step 1/5") < start);
  CHECK(start < at("step 2/5"));
  CHECK(at("step 3/5") < stop);
  CHECK(stop < at("step 4/5"));
  r = run.trainer(
      "--resume none --force --set 'log.profile_steps=[4, 9]' --set 'log.trace_steps=[5, 50]'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("profiler: capturing steps 4 to 5 (cudaProfilerStart)") != std::string::npos);
  CHECK(r.output.find("profiler: capture stopped after step 5") != std::string::npos);
  CHECK(r.output.find("warning: profiler: log.profile_steps ends at step 9, after train.steps 5: "
                      "only steps 4 to 5 are captured\n") != std::string::npos);
  CHECK(r.output.find("warning: trace: log.trace_steps ends at step 50, after train.steps 5: "
                      "only steps 5 to 5 are traced\n") != std::string::npos);
  CHECK(r.output.find("trace: steps 5-5 of 1 of 1 ranks") != std::string::npos);
  r = run.trainer(
      "--resume none --force --set 'log.profile_steps=[7, 9]' --set 'log.trace_steps=[50, 60]'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("warning: profiler: log.profile_steps starts at step 7, after train.steps "
                      "5: nothing is captured\n") != std::string::npos);
  CHECK(r.output.find("profiler: capturing") == std::string::npos);
  CHECK(r.output.find("warning: trace: log.trace_steps starts at step 50, after train.steps 5: "
                      "nothing is traced\n") != std::string::npos);
}

// log.trace_steps: a Chrome trace of steps 2 and 3 on 4 ranks (tp 2 x pp 2): every rank a
// process named by its coordinates, every traced step a span, and its phases (forward, backward,
// pipeline wait, TP collectives, ...) adding up to the step time rank 0 logged.
TEST_CASE("cli: log.trace_steps writes every rank's phases as one Chrome trace", "[cli][mpi]") {
  RunDir run(6);
  const CmdResult r = run.mpirun(4,
                                 " --set parallel.tp=2 --set parallel.pp=2 --set log.interval=1"
                                 " --set 'log.trace_steps=[2, 3]'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("trace: steps 2-3 of 4 of 4 ranks in " + (run.dir / "log/trace.json")) !=
        std::string::npos);
  const nlohmann::json trace = nlohmann::json::parse(test::read_file(run.dir / "log/trace.json"));
  const std::set<std::string> phases = {"other",         "data wait",     "forward",
                                        "backward",      "pipeline wait", "tp collective",
                                        "cp collective", "dp wait",       "optimizer"};
  std::map<int, std::string> names;
  std::map<std::pair<int, int>, double> phase_us, span_us;  // (rank, step)
  std::map<int, std::set<std::string>> seen;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    const int pid = e["pid"];
    if (e["ph"] == "M") {
      if (e["name"] == "process_name") names[pid] = e["args"]["name"];
      continue;
    }
    REQUIRE(e["ph"] == "X");
    const int step = e["args"]["step"];
    CHECK((step == 2 || step == 3));
    CHECK(e["dur"].get<double>() >= 0);
    if (e["tid"] == 1) {
      span_us[{pid, step}] += e["dur"].get<double>();
    } else {
      CHECK(phases.count(e["name"].get<std::string>()) == 1);
      phase_us[{pid, step}] += e["dur"].get<double>();
      seen[pid].insert(e["name"].get<std::string>());
    }
  }
  REQUIRE(names.size() == 4);
  CHECK(names[3] == "rank 3 (tp 1, cp 0, dp 0, pp 1)");
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    for (const char* p : {"forward", "backward", "pipeline wait", "tp collective", "optimizer"})
      CHECK(seen[rank].count(p) == 1);
    for (int step : {2, 3}) {  // the phases tile the step's span
      CHECK(phase_us[{rank, step}] > 0);
      CHECK(std::abs(phase_us[{rank, step}] - span_us[{rank, step}]) <
            1e-3 * span_us[{rank, step}] + 1.0);
    }
  }
  // ...and on rank 0 the step time it logged (the clock's last charge to the step's end).
  for (const nlohmann::json& m : run.metrics())
    if (m["step"] == 2 || m["step"] == 3) {
      const double logged_us = m["step_time_s"].get<double>() * 1e6;
      CHECK(std::abs(phase_us[{0, m["step"].get<int>()}] - logged_us) < 0.02 * logged_us + 200);
    }
  CHECK(std::filesystem::exists(run.dir / "log/trace/rank_00003.json"));
}

// A step waits for the device once: the step's loss sum and squared gradient norm are summed on
// the device and read together, the micro-batches' tokens uploaded ahead of them. The CPU backend
// counts the operations that would wait on a GPU (metrics host_syncs), so this holds the GPU's
// step to it under every layout and option; evaluations and saves (between steps) do not count.
TEST_CASE("cli: every step waits for the device once, under every layout", "[cli][mpi]") {
  const std::string shape =
      " --set model.num_heads=8 --set model.num_kv_heads=4 --set model.head_dim=8"
      " --set model.num_layers=4 --set train.micro_batch=1 --set train.eval_interval=2"
      " --set checkpoint.interval=3";
  for (const std::string& layout :
       {std::string(""),
        std::string(" --set parallel.tp=2 --set parallel.pp=2"
                    " --set parallel.sequence_parallel=true"
                    " --set train.recompute=selective"),
        std::string(
            " --set parallel.pp=2 --set parallel.zero1=true"
            " --set parallel.dp_bucket_elems=3000 --set parallel.grad_reduce_dtype=bf16")}) {
    RunDir run(6);
    CmdResult r = layout.empty() ? run.trainer(shape) : run.mpirun(4, shape + layout);
    INFO(layout << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    const std::vector<nlohmann::json> steps = run.metrics();
    REQUIRE(steps.size() == 6);
    for (const nlohmann::json& j : steps) CHECK(j["host_syncs"].get<int64_t>() == 1);
  }
}

// Where the step's time goes (trainer/obs/step_timing.h): rank 0's phases add up to its step time,
// and under tp 2 x cp 2 x pp 2 every one of forward, backward, the pipeline's exchanges, the TP
// collectives, the CP exchange, the gradient reduction (over the CP group's replicas) and the
// optimizer takes some of it.
TEST_CASE("cli: the step-time breakdown adds up to the step time under tp2 x cp2 x pp2",
          "[cli][mpi]") {
  RunDir run(6);
  const CmdResult r =
      run.mpirun(8,
                 " --set model.num_heads=8 --set model.num_kv_heads=4 --set model.head_dim=8"
                 " --set model.num_layers=4 --set train.micro_batch=1"
                 " --set parallel.tp=2 --set parallel.cp=2 --set parallel.pp=2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<nlohmann::json> steps = run.metrics();
  REQUIRE(steps.size() == 6);
  const char* phases[] = {"time_forward_s",   "time_backward_s", "time_pipeline_wait_s",
                          "time_tp_comm_s",   "time_cp_comm_s",  "time_dp_wait_s",
                          "time_optimizer_s", "time_other_s",    "data_wait_s"};
  std::map<std::string, double> total;
  for (const nlohmann::json& j : steps) {
    double sum = 0;
    for (const char* p : phases) {
      sum += j[p].get<double>();
      total[p] += j[p].get<double>();
    }
    INFO("step " << j["step"] << ": " << j.dump());
    CHECK(std::abs(sum / j["step_time_s"].get<double>() - 1) < 0.05);
  }
  for (const char* p : phases) {
    INFO(p);
    if (std::string(p) != "data_wait_s" && std::string(p) != "time_other_s") CHECK(total[p] > 0);
  }
}

// TensorBoard event files (their contents against the tensorboard package: test_tensorboard.py):
// rank 0's in log.dir/tb, and with log.tensorboard_all_ranks every other rank's own in
// tb/rank_<r>; log.tensorboard=false writes none.
TEST_CASE("cli: TensorBoard event files of rank 0, of every rank, or none", "[cli][mpi]") {
  namespace fs = std::filesystem;
  auto event_files = [](const fs::path& dir) {
    std::vector<fs::path> files;
    if (fs::is_directory(dir))
      for (const fs::directory_entry& e : fs::directory_iterator(dir))
        if (e.is_regular_file() &&
            e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
          files.push_back(e.path());
    return files;
  };
  RunDir all(6), off(6);
  CmdResult r = all.mpirun(2, "--set log.tensorboard_all_ranks=true");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const fs::path tb = fs::path(all.dir.path()) / "log/tb";
  REQUIRE(event_files(tb).size() == 1);
  REQUIRE(event_files(tb / "rank_1").size() == 1);
  CHECK(fs::file_size(event_files(tb)[0]) > 2000);  // 6 steps of some 20 scalars, the config
  CHECK(fs::file_size(event_files(tb / "rank_1")[0]) > 1500);
  CHECK_FALSE(fs::exists(tb / "rank_0"));
  r = off.mpirun(2, "--set log.tensorboard=false --set log.tensorboard_all_ranks=true");
  REQUIRE(r.exit_code == 0);
  CHECK_FALSE(fs::exists(fs::path(off.dir.path()) / "log/tb"));
}

// The multi-tensor AdamW (one launch over the rank's range, the clipping folded in) updates as
// the per-tensor kernels with clipping as a pass of its own (TR_ADAMW_PER_TENSOR=1) do,
// bit for bit: one rank, and (2,2,2) with ZeRO-1's sharded masters; the gradient norm of these
// steps is over optim.grad_clip, so the clipping is exercised.
TEST_CASE("cli: the multi-tensor AdamW updates as the per-tensor one, bit for bit", "[cli][mpi]") {
  const std::string shape =
      " --set model.num_heads=8 --set model.num_kv_heads=4 --set model.head_dim=8"
      " --set model.num_layers=4 --set train.micro_batch=1 --set optim.grad_clip=0.5";
  for (const std::string& layout :
       {std::string(""), std::string(" --set parallel.tp=2 --set parallel.pp=2"
                                     " --set parallel.zero1=true")}) {
    RunDir fused(6), per_tensor(6);
    const bool one = layout.empty();
    CmdResult a =
        one ? fused.trainer(shape) : fused.mpirun(8, shape + layout, "TR_TEST_COMPUTE_COPY=1");
    INFO(a.output);
    REQUIRE(a.exit_code == 0);
    CmdResult b =
        one ? per_tensor.trainer(shape, "TR_ADAMW_PER_TENSOR=1")
            : per_tensor.mpirun(8, shape + layout, "TR_TEST_COMPUTE_COPY=1 TR_ADAMW_PER_TENSOR=1");
    INFO(b.output);
    REQUIRE(b.exit_code == 0);
    CHECK(a.output.find("TR_ADAMW_PER_TENSOR (") == std::string::npos);
    CHECK(b.output.find("TR_ADAMW_PER_TENSOR (") != std::string::npos);
    const std::vector<nlohmann::json> x = fused.metrics();
    expect_same_bits(x, per_tensor.metrics(), 6);
    for (const nlohmann::json& step : x) CHECK(step["grad_norm"].get<double>() > 0.5);
    const std::vector<std::string>& sets = kLayoutShape;
    const CkptTensors p = read_checkpoint(fused.config, fused.dir / "ckpt/step_00000006", sets);
    const CkptTensors q =
        read_checkpoint(per_tensor.config, per_tensor.dir / "ckpt/step_00000006", sets);
    CHECK(p.p == q.p);
    CHECK(p.m == q.m);
    CHECK(p.v == q.v);
    // The squared norm in one pass over pieces against one reduction per tensor
    // (TR_NORM_PER_TENSOR=1): the same norm but for the summation order.
    RunDir norm(6);
    CmdResult c =
        one ? norm.trainer(shape, "TR_NORM_PER_TENSOR=1")
            : norm.mpirun(8, shape + layout, "TR_TEST_COMPUTE_COPY=1 TR_NORM_PER_TENSOR=1");
    INFO(c.output);
    REQUIRE(c.exit_code == 0);
    CHECK(c.output.find("TR_NORM_PER_TENSOR (") != std::string::npos);
    const std::vector<nlohmann::json> z = norm.metrics();
    REQUIRE(z.size() == 6);
    CHECK(z[0]["loss"].get<double>() == x[0]["loss"].get<double>());
    for (size_t i = 0; i < z.size(); ++i)
      CHECK(std::abs(z[i]["grad_norm"].get<double>() / x[i]["grad_norm"].get<double>() - 1) < 1e-9);
  }
}

// Each gradient's first write of a step assigns (no zeroing pass over the gradient buffer): with
// every gradient NaN before each step (TR_TEST_POISON_GRADS=1), runs match the old zero-then-add
// path (TR_GRAD_ZERO=1) bit for bit: losses, norms, weights and Adam states. One rank (tied: the
// LM head assigns the embedding's gradient before the embedding adds to it; four micro-batches
// per step), and tp 2 · pp 2 · dp 2 with sequence parallelism and the DP overlap (two
// micro-batches per rank), tied (the first stage zeroes its embedding gradient, the last stage's
// head assigns its copy) and untied with ZeRO-1.
TEST_CASE("cli: the first micro-batch assigns the gradients, as zeroing them first did",
          "[cli][mpi]") {
  const std::string shape =
      " --set model.num_heads=8 --set model.num_kv_heads=4 --set model.head_dim=8"
      " --set model.num_layers=4 --set train.micro_batch=2";
  const std::string split =
      " --set parallel.tp=2 --set parallel.pp=2"
      " --set parallel.sequence_parallel=true";
  for (const std::string& layout :
       {std::string(""), split,
        split + " --set model.tie_embeddings=false --set parallel.zero1=true"}) {
    RunDir assigned(6), zeroed(6);
    const bool one = layout.empty();
    CmdResult a = one ? assigned.trainer(shape, "TR_TEST_POISON_GRADS=1")
                      : assigned.mpirun(8, shape + layout, "TR_TEST_POISON_GRADS=1");
    INFO(layout << "\n" << a.output);
    REQUIRE(a.exit_code == 0);
    CHECK(a.output.find("warning: step") == std::string::npos);
    CHECK(a.output.find("debug switches taken: TR_TEST_POISON_GRADS (") != std::string::npos);
    CmdResult b = one ? zeroed.trainer(shape, "TR_GRAD_ZERO=1")
                      : zeroed.mpirun(8, shape + layout, "TR_GRAD_ZERO=1");
    INFO(b.output);
    REQUIRE(b.exit_code == 0);
    CHECK(b.output.find("debug switches taken: TR_GRAD_ZERO (") != std::string::npos);
    const std::vector<nlohmann::json> x = assigned.metrics(), y = zeroed.metrics();
    expect_same_bits(x, y, 6);
    for (const nlohmann::json& step : x) CHECK(std::isfinite(step["loss"].get<double>()));
    std::vector<std::string> sets = kLayoutShape;
    if (layout.find("tie_embeddings=false") != std::string::npos)
      sets.push_back("model.tie_embeddings=false");
    const CkptTensors p =
        read_checkpoint(assigned.config, assigned.dir / "ckpt/step_00000006", sets);
    const CkptTensors q = read_checkpoint(zeroed.config, zeroed.dir / "ckpt/step_00000006", sets);
    CHECK(p.p == q.p);
    CHECK(p.m == q.m);
    CHECK(p.v == q.v);
  }
}

// A bad token that only data-parallel rank 1 reads (validation samples 4..7 of 8) must end
// every rank with exit 2, not leave rank 0 waiting in a collective.
// Validation data with an id outside the vocabulary (in sample 6, which only rank 1's evaluation
// would read) is found by rank 0's start-up scan; every rank ends with exit 2 before any step.
TEST_CASE("cli: bad validation data on one rank ends every rank", "[cli][mpi]") {
  RunDir run(6);
  {
    auto w = data::IndexedDatasetWriter::create(run.dir / "badvalid", 400);
    REQUIRE(w.ok());
    std::vector<int32_t> toks(300, 'a');
    toks[200] = 300;  // past model.vocab_size 257; in sample 6 (tokens 192..224)
    REQUIRE((*w)->add_document(toks).ok());
    REQUIRE((*w)->finish().ok());
  }
  CmdResult r = run_cmd(std::string(kOneThread) + " timeout 120 " + tr::test::mpirun() + " 2 " +
                        tr::test::trainer_bin() + " --config " + run.config +
                        " --set 'data.valid=[{path: " + (run.dir / "badvalid") +
                        "}]' --set train.eval_interval=1 --set train.eval_steps=1");
  INFO(r.output);
  CHECK(r.exit_code == 2);  // 124 would be the timeout: a hang
  CHECK(r.output.find("error: rank 0: token 200 of " + (run.dir / "badvalid.bin") +
                      " (u16) has value 300") != std::string::npos);
  CHECK(run.metrics().empty());
}

TEST_CASE("cli: bad input on MPI ranks is one error line and exit 2", "[cli][mpi]") {
  RunDir run;
  CmdResult r = run.mpirun(2, "--set optim.lr=-1");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("error: rank 0: optim.lr must be in [0, 10] (got -1)") != std::string::npos);
  CHECK(r.output.find("error:") == r.output.rfind("error:"));  // printed once, not per rank
  r = run.mpirun(
      2,
      "--set parallel.tp=2 --set parallel.sequence_parallel=true --set train.micro_batch=1 "
      "--set data.seq_len=31");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find(
            "parallel.sequence_parallel: train.micro_batch x data.seq_len = 31 tokens do not "
            "split over parallel.tp 2") != std::string::npos);
  r = run.mpirun(3);  // global_batch 8 does not split over 3 data-parallel ranks
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("not divisible") != std::string::npos);
  CHECK_FALSE(fs::exists(run.dir / "ckpt"));
  // A checkpoint of 4 layers resumed as 2 layers over 2 pipeline stages: each stage reads only
  // its own layer, yet the extra layers are found.
  REQUIRE(run.trainer("--set model.num_layers=4 --set train.steps=6").exit_code == 0);
  r = run.mpirun(2, "--set parallel.pp=2 --set train.steps=8");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("has tensor 'layers/2/input_layernorm/weight' (/model/layers/2/"
                      "input_layernorm/weight) that the model does not have") != std::string::npos);
  CHECK(r.output.find("error:") == r.output.rfind("error:"));
}

TEST_CASE("cli: bad config values exit 2 naming the key", "[cli]") {
  RunDir run;
  expect_bad_input(run.trainer("--set optim.lrr=0.1"),
                   "unknown key 'optim.lrr' in --set 'optim.lrr=0.1'; did you mean 'lr'?");
  expect_bad_input(run.trainer("--set parallel.timeout_s=1e308"),
                   "parallel.timeout_s must be at most 1e+300 (got 1e+308)");
  expect_bad_input(run.trainer("--set train.eval_steps=1000001"),
                   "train.eval_steps must be in [1, 1000000] (got 1000001)");
  test::write_file(run.dir / "ckptfile", "x");
  expect_bad_input(run.trainer("--set checkpoint.dir=" + (run.dir / "ckptfile")),
                   "checkpoint.dir '" + (run.dir / "ckptfile") +
                       "' is a file, not a directory; choose another checkpoint.dir");
  expect_bad_input(run.trainer("--set train.steps=many"),
                   "train.steps: expected an integer, got 'many'");
  expect_bad_input(run.trainer("--set optim.lr=-0.5"), "optim.lr must be in [0, 10] (got -0.5)");
  expect_bad_input(run_cmd(tr::test::trainer_bin() + " --config " + (run.dir / "nope.yaml")),
                   "config file '" + (run.dir / "nope.yaml") + "' cannot be read; check --config");
  expect_bad_input(run.trainer("--bogus"), "unknown argument '--bogus'; see --help");
  expect_bad_input(run_cmd(tr::test::trainer_bin()), "--config FILE is required; see --help");
  // A log.dir that cannot be one (a file is there) is found before checkpoint.dir is created.
  test::write_file(run.dir / "afile", "x");
  expect_bad_input(run.trainer("--set log.dir=" + (run.dir / "afile")),
                   "log.dir '" + (run.dir / "afile") + "' cannot be created: ");
  CHECK_FALSE(fs::exists(run.dir / "ckpt"));
  // Debug switches take 1 or 0: a value that looks like "on" is refused, not guessed.
  expect_bad_input(run.trainer("", "TR_GRAD_ZERO=yes"),
                   "debug switch TR_GRAD_ZERO='yes': set it to 1 (on) or 0 (off), or unset it");
  expect_bad_input(run.trainer("", "TR_LOSS_CHUNK_TOKENS=lots"),
                   "debug setting TR_LOSS_CHUNK_TOKENS='lots': expected an integer >= 0, or unset "
                   "it");
  CHECK_FALSE(fs::exists(run.dir / "ckpt"));  // nothing written by a refused run
}

// TR_LOSS_CHUNK_TOKENS (docs/debug.md) changes the loss chunk the model is built with, and the
// start-up output says that it is set.
TEST_CASE("cli: TR_LOSS_CHUNK_TOKENS sets the loss chunk", "[cli]") {
  RunDir run(10);
  CmdResult a = run.trainer("--dry-run");
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  CmdResult b = run.trainer("--dry-run", "TR_LOSS_CHUNK_TOKENS=8");
  INFO(b.output);
  REQUIRE(b.exit_code == 0);
  CHECK(a.output.find("(loss chunks of 128 tokens)") != std::string::npos);  // 4 x 32, whole
  CHECK(a.output.find("debug switches:") == std::string::npos);
  CHECK(b.output.find("(loss chunks of 8 tokens)") != std::string::npos);
  CHECK(b.output.find("debug switches: TR_LOSS_CHUNK_TOKENS=8 (docs/debug.md)") !=
        std::string::npos);
}

TEST_CASE("cli: bad data files exit 2 naming the file", "[cli]") {
  RunDir run;
  expect_bad_input(run.trainer("--set 'data.train=[{path: " + (run.dir / "missing") + "}]'"),
                   "data path '" + (run.dir / "missing") + "' not found");
  SECTION("bad .idx magic") {
    std::string idx = test::read_file(run.dir / "train.idx");
    idx[0] = 'X';
    test::write_file(run.dir / "train.idx", idx);
    expect_bad_input(run.trainer(), "index file " + (run.dir / "train.idx") + " has a bad magic");
  }
  SECTION(".bin shorter than the index says") {
    const uintmax_t size = fs::file_size(run.dir / "train.bin");
    fs::resize_file(run.dir / "train.bin", size - 10);
    expect_bad_input(run.trainer(), "data file " + (run.dir / "train.bin") + " is " +
                                        std::to_string(size - 10) + " bytes but " +
                                        (run.dir / "train.idx") + " says " + std::to_string(size) +
                                        "; the .bin is truncated");
  }
}

// An id outside the vocabulary deep in a dataset (here the last token of a file of int32 ids) is
// bad input found at start-up, before any step or log line, not when a step first reads it. A
// file checked once is not read again by the next start (data-ids-checked.json in
// checkpoint.dir); a changed file is.
TEST_CASE("cli: every token id is checked at start-up, once per file version", "[cli]") {
  RunDir run(6);
  CmdResult first = run.trainer();
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(first.output.find("data: every token id of 1 file(s) is below vocab_size 257") !=
        std::string::npos);
  CHECK(fs::exists(run.dir / "ckpt/data-ids-checked.json"));
  CmdResult again = run.trainer("--set train.steps=7");
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  CHECK(again.output.find("data: every token id") == std::string::npos);         // remembered
  fs::last_write_time(run.dir / "train.bin", fs::file_time_type::clock::now());  // a new version
  CmdResult changed = run.trainer("--set train.steps=8");
  INFO(changed.output);
  REQUIRE(changed.exit_code == 0);
  CHECK(changed.output.find("data: every token id of 1 file(s)") != std::string::npos);
  // A dataset of int32 ids (written for a vocabulary of 100000) whose very last id is 5000.
  {
    auto w = data::IndexedDatasetWriter::create(run.dir / "wide", 100000);
    REQUIRE(w.ok());
    std::vector<int32_t> doc(5000, 7);
    doc.back() = 5000;
    REQUIRE((*w)->add_document(doc).ok());
    REQUIRE((*w)->finish().ok());
  }
  RunDir fresh(6);
  CmdResult bad = fresh.trainer("--set 'data.train=[{path: " + (run.dir / "wide") + "}]'");
  expect_bad_input(bad, "token 4999 of " + (run.dir / "wide.bin") +
                            " (i32) has value 5000, not a token id in [0, 257)");
  CHECK(fresh.metrics().empty());
  CHECK_FALSE(fs::exists(fresh.dir / "ckpt"));
}

TEST_CASE("cli: bad checkpoints exit 2 and are left as they were", "[cli]") {
  RunDir run(10);
  REQUIRE(run.trainer().exit_code == 0);
  const std::string step = run.dir / "ckpt/step_00000010";
  SECTION("checkpoint from a different model shape") {
    const CmdResult r = run.trainer("--set model.hidden_size=32 --set train.steps=20");
    expect_bad_input(r, "checkpoint file " + step +
                            "/model.h5: tensor 'embed_tokens/weight' (/model/embed_tokens/weight) "
                            "has shape [257,64] in the checkpoint but the model expects [257,32]: "
                            "the checkpoint is from a different model shape");
    // ...and which field changed, with the fix.
    expect_bad_input(r,
                     "; this run's model differs from the checkpoint's (model.hidden_size: 64 "
                     "-> 32): set those fields back to the checkpoint's, or give this model a "
                     "new checkpoint.dir");
  }
  SECTION("truncated checkpoint file") {
    fs::resize_file(step + "/model.h5", fs::file_size(step + "/model.h5") / 2);
    CmdResult r = run.trainer("--set train.steps=20");
    expect_bad_input(r, "checkpoint file " + step + "/model.h5 is corrupt");
    CHECK(fs::file_size(step + "/model.h5") > 0);
  }
  SECTION("--resume PATH that is not a checkpoint") {
    expect_bad_input(run.trainer("--resume " + (run.dir / "log") + " --set train.steps=20"),
                     "--resume " + (run.dir / "log") + ": not a committed checkpoint directory");
    expect_bad_input(run.trainer("--resume " + (run.dir / "nowhere")),
                     "--resume " + (run.dir / "nowhere") + ": no such checkpoint directory");
  }
  SECTION("--resume none over existing checkpoints") {
    expect_bad_input(
        run.trainer("--resume none --set train.steps=20"),
        "--resume none but checkpoint.dir '" + (run.dir / "ckpt") + "' already holds checkpoints");
  }
  CHECK(*ckpt::find_latest(run.dir / "ckpt") == step);  // latest untouched by the refused run
}

// trainer --version: the source's git describe (as built), the build type, the backend, and on
// a CUDA build the GPU libraries it was built with and finds.
TEST_CASE("cli: trainer --version names the commit, the build and the GPU libraries",
          "[cli][cpu-build]") {
  const CmdResult r = run_cmd(tr::test::trainer_bin() + " --version 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  const CmdResult git =
      run_cmd("git -C " + tr::test::source_dir() + " describe --always --tags 2>/dev/null");
  const std::string commit =
      git.exit_code == 0 ? git.output.substr(0, git.output.find('\n')) : "unknown";
  CHECK(r.output.rfind("trainer " + commit, 0) == 0);  // "-dirty" may follow
#ifdef TRAINER_HAVE_CUDA
  CHECK(r.output.find("backend cuda") != std::string::npos);
  CHECK(r.output.find("\nbuilt with: CUDA ") != std::string::npos);
  CHECK(r.output.find("\nfound at run time: CUDA runtime ") != std::string::npos);
#else
  CHECK(r.output.find("backend cpu; built without CUDA") != std::string::npos);
#endif
  // Like --help, it needs no config.
  CHECK(run_cmd(tr::test::trainer_bin() + " --version --config /nonexistent").exit_code == 0);
}

// train.backend=cuda where no GPU can be used is one clear line and exit 2: in a build without
// CUDA, and in a CUDA build with every device hidden (so this runs on GPU machines too). The
// GPU runs themselves are in test_cli_gpu.cpp (label gpu).
TEST_CASE("cli: train.backend=cuda without a usable GPU is one error line and exit 2",
          "[cli][cpu-build]") {
  RunDir run(5);
#ifdef TRAINER_HAVE_CUDA
  const std::string message = "train.backend=cuda but no CUDA device is visible";
#else
  const std::string message = "train.backend=cuda but this trainer was built without CUDA";
#endif
  expect_bad_input(run.trainer("--set train.backend=cuda", "CUDA_VISIBLE_DEVICES="), message);
  const CmdResult r = run.mpirun(2, "--set train.backend=cuda", "CUDA_VISIBLE_DEVICES=");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("error: rank 0: " + message) != std::string::npos);
  CHECK(r.output.find("error:") == r.output.rfind("error:"));  // printed once, not per rank
  CHECK_FALSE(fs::exists(run.dir / "ckpt"));
}

// `trainer plan` and the trainer refuse the same layouts with the same line: the planner's
// --nodes N --gpus-per-node 1 against N MPI ranks of `trainer --dry-run` (the grid of layouts
// in process: "layout rules: ..." in tests/plan/test_plan.cpp).
TEST_CASE("cli: trainer plan and trainer --dry-run reject the same layouts", "[cli][mpi]") {
  RunDir run(10);
  struct Case {
    int world;
    std::string sets, error;  // error: "" = accepted
  };
  const Case cases[] = {
      {4, "--set parallel.tp=2 --set parallel.pp=2", ""},
      {3, "--set parallel.tp=2", "parallel layout: world size 3 is not divisible by tp 2"},
      {4, "--set train.micro_batch=4",
       "train.global_batch 8 is not divisible by train.micro_batch 4 x dp 4 = 16"},
      {2,
       "--set parallel.tp=2 --set parallel.sequence_parallel=true --set train.micro_batch=1 "
       "--set data.seq_len=31",
       "parallel.sequence_parallel: train.micro_batch x data.seq_len = 31 tokens do not split"},
      {4, "--set parallel.tp=2 --set parallel.cp=2", ""},
      {2,
       "--set parallel.pp=2 --set parallel.pipeline_schedule=interleaved "
       "--set parallel.virtual_stages=2 --set model.num_layers=4 --set train.micro_batch=1 "
       "--set train.global_batch=3",
       "parallel.pipeline_schedule interleaved: micro-batches run in groups of pp: 3 per step "
       "(train.global_batch / (micro_batch x dp)) are not a multiple of pp 2; change the batch "
       "sizes or pp"},
      {2, "--set parallel.pp=2 --set parallel.pipeline_schedule=zero_bubble", ""},
      {6, "--set parallel.tp=2 --set parallel.cp=2",
       "parallel layout: world size 6 is not divisible by tp 2 x cp 2 x pp 1 = 4"},
      {8,
       "--set parallel.tp=4 --set parallel.cp=2 --set model.num_kv_heads=4 "
       "--set parallel.sequence_parallel=true --set train.micro_batch=1 --set data.seq_len=36",
       "parallel.sequence_parallel: train.micro_batch x data.seq_len / cp = 18 tokens do not "
       "split over parallel.tp 4"}};
  for (const Case& c : cases) {
    INFO(c.world << " ranks, " << c.sets);
    const CmdResult plan =
        run_cmd(tr::test::trainer_bin() + " plan --config " + run.config + " " + c.sets +
                " --nodes " + std::to_string(c.world) + " --gpus-per-node 1 2>&1");
    const CmdResult dry = run.mpirun(c.world, "--dry-run " + c.sets);
    if (c.error.empty()) {
      INFO(plan.output << dry.output);
      CHECK(plan.exit_code == 0);
      CHECK(dry.exit_code == 0);
      continue;
    }
    expect_bad_input(plan, "error: " + c.error);
    CHECK(dry.exit_code == 2);
    CHECK(dry.output.find("error: rank 0: " + c.error) != std::string::npos);
    // The same line, word for word, after the rank prefix.
    const std::string line = plan.output.substr(7, plan.output.size() - 8);
    CHECK(dry.output.find("error: rank 0: " + line + "\n") != std::string::npos);
  }
}

// The 72B job checked on a login node: config, layout, data and each stage's memory for 128 ranks
// of H100, in one process without a GPU; missing data, a world that does not fit the layout and
// one too small for the memory are one line each.
TEST_CASE("cli: trainer --dry-run --world 128 --gpu h100 checks the 72B job without a GPU",
          "[cli]") {
  test::TempDir dir;
  const std::string cfg = tr::test::source_dir() + "/configs/qwen2.5-72b.yaml";
  auto dry = [&](const std::string& args) {
    return run_cmd("cd " + dir.path() + " && " + tr::test::trainer_bin() + " --config " + cfg +
                   " --dry-run " + args);
  };
  // The preset's data, datasets/qwen/..., from the working directory: not there yet.
  expect_bad_input(dry("--world 128 --gpu h100"),
                   "data path 'datasets/qwen/train_text_document' not found (a relative path: "
                   "from the working directory ");
  std::filesystem::create_directories(dir / "datasets/qwen");
  for (const char* part : {"train", "valid"}) {
    const CmdResult made =
        run_cmd(tr::test::prepare_data_bin() + " --output " + (dir / "datasets/qwen/") + part +
                "_text_document --synthetic 300000 --vocab 151643");
    REQUIRE(made.exit_code == 0);
  }
  const CmdResult ok = dry("--world 128 --gpu H100");
  INFO(ok.output);
  REQUIRE(ok.exit_code == 0);
  CHECK(ok.output.find("plan: 16 nodes x 8 h100 = 128 GPUs; tp 8 x pp 2 x dp 8, zero1") !=
        std::string::npos);
  CHECK(ok.output.find("verdict: fits: stage ") != std::string::npos);
  CHECK(ok.output.find("data: every token id of 2 file(s) is below vocab_size 152064") !=
        std::string::npos);
  CHECK(ok.output.find("dry run for 128 ranks of h100: config, layout, data and memory check "
                       "out") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "runs"));  // nothing written
  CHECK_FALSE(std::filesystem::exists(dir / "checkpoints"));
  expect_bad_input(dry("--world 100"),
                   "--world 100 is not a whole number of nodes of "
                   "--gpus-per-node 8");
  expect_bad_input(dry("--world 120"), "parallel layout");
  expect_bad_input(dry("--world 16 --gpu h100"), "16 ranks of h100: the run does not fit: stage ");
  // The flags belong together.
  expect_bad_input(run_cmd(tr::test::trainer_bin() + " --config " + cfg + " --world 8"),
                   "--world N checks a job of N ranks without launching them; give it with "
                   "--dry-run");
  expect_bad_input(run_cmd(tr::test::trainer_bin() + " --config " + cfg + " --dry-run --gpu b300"),
                   "--gpu and --gpus-per-node go with --dry-run --world N (or with trainer plan)");
}

TEST_CASE("cli: trainer plan prints the 72B plan, and a bad --gpu is one error line and exit 2",
          "[cli]") {
  const std::string cfg = tr::test::source_dir() + "/configs/qwen2.5-72b.yaml";
  CmdResult r =
      run_cmd(tr::test::trainer_bin() + " plan --config " + cfg + " --gpu b300 --nodes 16 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("plan: 16 nodes x 8 b300 = 128 GPUs; tp 8 x pp 2 x dp 8, zero1") !=
        std::string::npos);
  CHECK(r.output.find("verdict: fits") != std::string::npos);
  CHECK(r.output.find("tokens/s/GPU, MFU") != std::string::npos);
  CHECK(r.output.find("\nbottleneck: ") != std::string::npos);
  // --suggest: the layouts of 16 nodes of H100 that fit, ranked (plan: --suggest's own test).
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg +
              " --gpu h100 --nodes 16 --suggest 2>&1");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("layouts of 16 x 8 h100 that fit, by predicted tokens/s/GPU") !=
        std::string::npos);
  CHECK(r.output.find("| 1 | ") != std::string::npos);
  CHECK(r.output.find("<- this config's tp and pp") != std::string::npos);
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg + " --gpu v100 2>&1");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "error: --gpu v100 is unknown; known: h100, h200, b200, b300, a100\n");
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg + " --nodes 3 2>&1");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("error: parallel layout") != std::string::npos);
  // The hardware table overridden from YAML (name and GEMM ceiling here).
  test::TempDir dir;
  test::write_file(dir / "hw.yaml", "name: slow-h100\ngemm_tflops: 400\n");
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg + " --nodes 16 --hardware " +
              (dir / "hw.yaml") + " 2>&1");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("x 8 slow-h100 = 128 GPUs") != std::string::npos);
  test::write_file(dir / "bad.yaml", "netwrk: 3\n");
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg + " --hardware " +
              (dir / "bad.yaml") + " 2>&1");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("unknown key 'netwrk'; known: name, measured_by, peak_bf16_tflops") !=
        std::string::npos);
  // A directory (it aborted, exit 134) and a name that is not UTF-8 (it aborted --json).
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg + " --hardware " + dir.path() +
              " 2>&1");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "error: --hardware " + dir.path() + ": not a regular file\n");
  test::write_file(dir / "name.yaml",
                   "name: h\xff\xfe"
                   "100\n");
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg + " --json --hardware " +
              (dir / "name.yaml") + " 2>&1");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "error: --hardware " + (dir / "name.yaml") +
                        ": name must be UTF-8 text without control characters\n");
  // What preflight --json measured, through --explain's rows: GEMMs at half the table's H100
  // ceiling (798 TFLOP/s) double the GEMMs' time, a copy at 1.5 TB/s instead of 3.0 doubles the
  // memory-bound passes', and NVLink's all-reduce at half the table's 450 GB/s with twice its
  // 10 us latency doubles the tensor-parallel time; attention (the dense peak's) and the
  // network's are the table's.
  auto seconds = [](const std::string& out, const std::string& part) {
    std::smatch m;
    REQUIRE(std::regex_search(out, m, std::regex("\\| " + part + " \\| ([0-9.]+) \\|")));
    return std::stod(m[1]);
  };
  const char* parts[] = {"GEMMs", "memory-bound passes", "tp communication", "attention"};
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg + " --nodes 16 --explain 2>&1");
  std::vector<double> table;
  for (const char* part : parts) table.push_back(seconds(r.output, part));
  test::write_file(dir / "preflight.json",
                   R"({"name": "h100", "measured_by": "preflight", "gemm_tflops": 399,)"
                   R"( "node_busbw_gbps": 225, "network_busbw_gbps": 50, "memory_gbps": 1500,)"
                   R"( "node_latency_us": 20, "network_latency_us": 20})");
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg +
              " --nodes 16 --explain --hardware " + (dir / "preflight.json") + " 2>&1");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (size_t i = 0; i < 4; ++i) {
    INFO(parts[i]);
    CHECK(seconds(r.output, parts[i]) == Approx((i < 3 ? 2 : 1) * table[i]).epsilon(0.002));
  }
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg + " --explain --json 2>&1");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("--explain prints a table; give it without --json") != std::string::npos);
  // Measured on another GPU type, or with another GEMM size: one line naming the fix.
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg + " --nodes 16 --gpu a100" +
              " --hardware " + (dir / "preflight.json") + " 2>&1");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("measured on h100, but the plan is for a100; pass --gpu h100") !=
        std::string::npos);
  test::write_file(dir / "small.json", R"({"measured_by": "preflight", "name": "h100", )"
                                       R"("gemm_tflops": 300, "gemm_n": 64})");
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg + " --hardware " +
              (dir / "small.json") + " 2>&1");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("gemm_tflops was measured at 64^3") != std::string::npos);
  // --mtbf-hours: what failures cost, with the cluster's storage from the same file.
  test::write_file(dir / "storage.yaml", "storage_gbps: 40\nrestart_s: 600\n");
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg +
              " --nodes 16 --mtbf-hours 2400 --hardware " + (dir / "storage.yaml") + " 2>&1");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("storage_gbps 40, restart_s 600)") != std::string::npos);
  CHECK(r.output.find("local, Young/Daly, beside the persistent saves: every") !=
        std::string::npos);
  r = run_cmd(tr::test::trainer_bin() + " plan --config " + cfg + " --mtbf-hours 0 2>&1");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("error: --mtbf-hours '0' is not a positive number of hours") !=
        std::string::npos);
}

TEST_CASE("cli: trainer plan --json agrees with the text plan", "[cli]") {
  const std::string cmd = tr::test::trainer_bin() + " plan --config " + tr::test::source_dir() +
                          "/configs/qwen2.5-72b.yaml --gpu b300 --nodes 16";
  CmdResult text = run_cmd(cmd + " 2>&1");
  CmdResult js = run_cmd(cmd + " --json 2>&1");
  REQUIRE(text.exit_code == 0);
  REQUIRE(js.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(js.output);
  CHECK(j["world"] == 128);
  CHECK(j["tp"] == 8);
  CHECK(j["pp"] == 2);
  CHECK(j["dp"] == 8);
  CHECK(j["fits"] == true);
  CHECK(j["stages"].size() == 2);
  CHECK(j["params"].get<double>() == 72706203648.0);
  // The same numbers as the text report, rounded as it prints them.
  char want[160];
  std::snprintf(want, sizeof want, "%.0f tokens/s/GPU, MFU %.1f%%",
                j["tokens_per_s_per_gpu"].get<double>(), 100 * j["mfu"].get<double>());
  CHECK(text.output.find(want) != std::string::npos);
  std::snprintf(want, sizeof want, "needs %.1f GiB of 288 GiB", j["memory_gib"].get<double>());
  CHECK(text.output.find(want) != std::string::npos);
}

}  // namespace
}  // namespace tr
