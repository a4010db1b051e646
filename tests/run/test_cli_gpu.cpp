// End-to-end tests of the trainer on a GPU (label gpu): bf16 training against the CPU run,
// GPU <-> CPU resume, determinism, and several ranks sharing one GPU. Without a CUDA device, or
// in a build without CUDA, the binary prints why and exits 77, which ctest reports as skipped.
// (The error a train.backend=cuda run gives without a GPU is tested in test_cli.cpp.)
#define CATCH_CONFIG_RUNNER
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/exit_codes.h"
#include "tests/cli_util.h"
#ifdef TRAINER_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace tr {
namespace {

using test::CmdResult;
using test::RunDir;

// CUDA devices this process sees; 0 in a build without CUDA.
int gpu_count() {
#ifdef TRAINER_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

// Each step's loss of `run` within `tol` (relative) of the same step's in `ref`.
void check_losses_near(const std::vector<nlohmann::json>& run,
                       const std::vector<nlohmann::json>& ref, double tol) {
  REQUIRE(run.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    INFO("step " << i + 1 << ": " << run[i]["loss"] << " against " << ref[i]["loss"]);
    CHECK(std::abs(run[i]["loss"].get<double>() / ref[i]["loss"].get<double>() - 1) < tol);
  }
}

// `split` with `args` stopped at step 10 and resumed to 20 gives the losses of `straight`, the
// same run without the stop, bit for bit.
void check_resumes_exactly(const RunDir& split, const std::string& args,
                           const std::vector<nlohmann::json>& straight) {
  REQUIRE(split.trainer(args + " --set train.exit_interval=10").exit_code == kExitStopped);
  CmdResult resumed = split.trainer(args);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const std::vector<nlohmann::json> s = split.metrics();
  REQUIRE(s.size() == straight.size());
  for (size_t i = 0; i < s.size(); ++i) {
    INFO("step " << i + 1 << ": straight " << straight[i]["loss"] << ", resumed " << s[i]["loss"]);
    CHECK(s[i]["loss"].get<double>() == straight[i]["loss"].get<double>());
  }
}

// The tiny model trains in bf16 on the GPU and its loss follows the CPU run's within bf16
// tolerance; checkpoints move between the GPU and the CPU.
TEST_CASE("cli gpu: train.backend=cuda trains on a GPU like the CPU", "[gpu]") {
  RunDir run(20), cpu(20);
  CmdResult r = run.trainer("--set train.backend=cuda --set train.deterministic=true");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(cpu.trainer().exit_code == 0);
  const std::vector<nlohmann::json> g = run.metrics(), c = cpu.metrics();
  REQUIRE(g.size() == 20);
  check_losses_near(g, c, 2e-2);
  CHECK(g.back()["loss"].get<double>() < g.front()["loss"].get<double>() - 0.5);
  // The breakdown is the device's (CUDA events read at the step's one host sync): from the
  // second step on (the first has no update of its own before it) the parts add up to the step
  // time, the device spent time in the forward, the backward and the update, and the step still
  // syncs once.
  for (size_t i = 1; i < g.size(); ++i) {
    const nlohmann::json& l = g[i];
    INFO("step " << i + 1 << ": " << l.dump());
    double parts = l["data_wait_s"].get<double>();
    for (const char* k :
         {"time_forward_s", "time_backward_s", "time_pipeline_wait_s", "time_tp_comm_s",
          "time_cp_comm_s", "time_dp_wait_s", "time_optimizer_s", "time_other_s"})
      parts += l[k].get<double>();
    CHECK(std::abs(parts / l["step_time_s"].get<double>() - 1) < 0.05);
    CHECK(l["time_forward_s"].get<double>() > 0);
    CHECK(l["time_backward_s"].get<double>() > 0);
    CHECK(l["time_optimizer_s"].get<double>() > 0);
    CHECK(l["host_syncs"].get<int>() == 1);
  }
  // A GPU checkpoint resumes on the CPU: 5 more steps there follow the CPU run.
  RunDir both(25);
  REQUIRE(both.trainer("--set train.backend=cuda --set train.exit_interval=20").exit_code ==
          kExitStopped);
  REQUIRE(both.trainer("--set train.backend=cpu").exit_code == 0);
  RunDir cpu25(25);
  REQUIRE(cpu25.trainer().exit_code == 0);
  const std::vector<nlohmann::json> b = both.metrics(), c25 = cpu25.metrics();
  REQUIRE(b.size() == 25);
  CHECK(std::abs(b[24]["loss"].get<double>() / c25[24]["loss"].get<double>() - 1) < 2e-2);
  // And a CPU checkpoint resumes on the GPU.
  RunDir back(25);
  REQUIRE(back.trainer("--set train.backend=cpu --set train.exit_interval=20").exit_code ==
          kExitStopped);
  REQUIRE(back.trainer("--set train.backend=cuda").exit_code == 0);
  const std::vector<nlohmann::json> k = back.metrics();
  REQUIRE(k.size() == 25);
  CHECK(std::abs(k[24]["loss"].get<double>() / c25[24]["loss"].get<double>() - 1) < 2e-2);
}

// "cuDNN 9.14.0" from the trainer's start-up line "gpu libraries: ..., cuDNN 9.14.0 (CUDA ...".
std::string cudnn_of(const std::string& output) {
  const size_t at = output.find("cuDNN ");
  return at == std::string::npos ? "cuDNN ?" : output.substr(at, output.find(' ', at + 6) - at);
}

// train.deterministic: two GPU runs of the same 20 steps give the same losses, bit for bit. Where
// cuDNN cannot build the deterministic attention backward (the run falls back to the fast one
// and logs attention_bwd: fast) the case reports skipped, naming the cuDNN version.
TEST_CASE("cli gpu: two deterministic GPU runs are bit-identical", "[gpu]") {
  RunDir first(20), again(20);
  const std::string det = "--set train.backend=cuda --set train.deterministic=true";
  CmdResult r = first.trainer(det);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<nlohmann::json> g = first.metrics();
  REQUIRE(g.size() == 20);
  if (g[0].value("attention_bwd", "") != "deterministic") {
    std::printf("skipped: deterministic attention unavailable (%s)\n", cudnn_of(r.output).c_str());
    std::exit(77);
  }
  REQUIRE(again.trainer(det).exit_code == 0);
  const std::vector<nlohmann::json> g2 = again.metrics();
  REQUIRE(g2.size() == g.size());
  for (size_t i = 0; i < g.size(); ++i)
    CHECK(g2[i]["loss"].get<double>() == g[i]["loss"].get<double>());
}

// Ranks sharing a GPU wait for each other at most this long: a hang ends the job with exit 5 and
// the watchdog's line naming the group and the call, instead of running into the test's limit.
const std::string kSharedGpuTimeout = " --set parallel.timeout_s=60";

// NCCL refuses two ranks on one GPU before it starts, naming the ranks and the fix (one GPU
// visible, so that the ranks share it on any machine).
TEST_CASE("cli gpu: NCCL ranks sharing one GPU are refused, naming the fix", "[gpu][mpi]") {
  RunDir two(10);
  CmdResult nccl =
      two.mpirun(2, " --set train.backend=cuda --set parallel.tp=2" + kSharedGpuTimeout,
                 "CUDA_VISIBLE_DEVICES=0");
  INFO(nccl.output);
  CHECK(nccl.exit_code == 2);
  CHECK(nccl.output.find("parallel.comm=nccl needs one GPU per rank, but ranks 0 and 1") !=
        std::string::npos);
}

// GPU ranks: tp 2 x pp 2 x dp 2 as 8 ranks sharing this machine's GPU(s) through
// parallel.comm=mpi (device tensors staged through host memory) match one GPU rank within bf16
// tolerance.
TEST_CASE("cli gpu: 8 GPU ranks sharing one GPU (parallel.comm=mpi) match one GPU rank",
          "[gpu][mpi]") {
  RunDir one(10), eight(10);
  const std::string layout =
      " --set train.backend=cuda --set train.micro_batch=2 --set model.num_layers=4";
  CmdResult r = one.trainer(layout);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string par = layout + " --set parallel.tp=2 --set parallel.pp=2" + kSharedGpuTimeout;
  CmdResult m = eight.mpirun(8, par + " --set parallel.comm=mpi");
  INFO(m.output);
  REQUIRE(m.exit_code == 0);
  CHECK(m.output.find("world 8 = tp 2 x dp 2 x pp 2") != std::string::npos);
  const std::vector<nlohmann::json> a = one.metrics(), b = eight.metrics();
  REQUIRE(a.size() == 10);
  REQUIRE(b.size() == 10);
  check_losses_near(b, a, 1e-2);
}

// FP8 projections on the GPU (the device casts, cuBLASLt's FP8 products) follow the CPU's exact
// emulation of the same recipe within bf16's tolerance (the GPU casts bf16 activations, the CPU
// f32 ones), are not the GPU's bf16 run, and, stopped at step 10 and resumed, repeat themselves
// bit for bit.
TEST_CASE("cli gpu: FP8 projections on a GPU follow the CPU emulation and resume exactly",
          "[gpu]") {
  const std::string fp8 = "--set train.precision=fp8";
  const std::string gpu_det = " --set train.backend=cuda --set train.deterministic=true";
  RunDir gpu(20), cpu(20), bf16(20), split(20);
  CmdResult r = gpu.trainer(fp8 + gpu_det);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(cpu.trainer(fp8).exit_code == 0);
  REQUIRE(bf16.trainer(gpu_det).exit_code == 0);
  const std::vector<nlohmann::json> g = gpu.metrics(), c = cpu.metrics(), b = bf16.metrics();
  REQUIRE(g.size() == 20);
  REQUIRE(b.size() == 20);
  check_losses_near(g, c, 2e-2);
  bool differs = false;
  for (size_t i = 0; i < g.size(); ++i)
    differs |= g[i]["loss"].get<double>() != b[i]["loss"].get<double>();
  CHECK(differs);
  check_resumes_exactly(split, fp8 + gpu_det, g);
}

// A mixture of experts on the GPU (the router's softmax and top-k, the dispatch, the permutations
// and the experts' grouped projections in bf16, the load-balancing loss): the tiny qwen3_moe
// model follows the CPU run within bf16's tolerance, logs its router metrics, and, stopped at
// step 10 and resumed, repeats itself bit for bit.
TEST_CASE("cli gpu: a qwen3_moe model on a GPU follows the CPU and resumes exactly", "[gpu]") {
  const std::string moe =
      "--set model.family=qwen3_moe --set model.num_experts=8 --set model.experts_per_token=2 "
      "--set model.moe_intermediate_size=32 --set model.router_aux_loss_coef=0.01";
  const std::string gpu_det = " --set train.backend=cuda --set train.deterministic=true";
  RunDir gpu(20), cpu(20), split(20);
  CmdResult r = gpu.trainer(moe + gpu_det);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(cpu.trainer(moe).exit_code == 0);
  const std::vector<nlohmann::json> g = gpu.metrics(), c = cpu.metrics();
  REQUIRE(g.size() == 20);
  check_losses_near(g, c, 2e-2);
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("step " << i + 1 << ": " << g[i].dump());
    CHECK(std::abs(g[i]["moe_aux_loss"].get<double>() / c[i]["moe_aux_loss"].get<double>() - 1) <
          5e-2);
    CHECK(g[i]["moe_imbalance"].get<double>() >= 1);
  }
  check_resumes_exactly(split, moe + gpu_det, g);
}

// Context parallelism on GPU ranks (cuDNN on chunk blocks, the merge kernel), both exchanges, over
// 2 and 4 ranks sharing one GPU (parallel.comm=mpi), with tensor parallelism too: the losses of
// one GPU rank within bf16 tolerance.
TEST_CASE("cli gpu: cp 2 and 4 on ranks sharing one GPU match one GPU rank", "[gpu][mpi]") {
  RunDir one(10);
  const std::string base = " --set train.backend=cuda --set train.micro_batch=2";
  CmdResult r = one.trainer(base);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<nlohmann::json> a = one.metrics();
  REQUIRE(a.size() == 10);
  struct Case {
    int ranks;
    std::string sets;
  };
  for (const Case& c : {Case{2, " --set parallel.cp=2 --set parallel.cp_comm=allgather"},
                        Case{2, " --set parallel.cp=2 --set parallel.cp_comm=ring"},
                        Case{4, " --set parallel.cp=4 --set parallel.cp_comm=ring"},
                        Case{4, " --set parallel.cp=2 --set parallel.tp=2"}}) {
    RunDir run(10);
    CmdResult m =
        run.mpirun(c.ranks, base + c.sets + " --set parallel.comm=mpi" + kSharedGpuTimeout);
    INFO(c.sets << "\n" << m.output);
    REQUIRE(m.exit_code == 0);
    const std::vector<nlohmann::json> b = run.metrics();
    REQUIRE(b.size() == 10);
    check_losses_near(b, a, 1e-2);
  }
}

// Packed documents on the GPU (the options below): block-causal attention through cuDNN's ragged
// batches, with positions restarting in each document and the end-of-document targets left out.
// Documents end at every space (token 32), so samples hold several.
const std::string kDocs =
    " --set data.eod_id=32 --set data.document_mask=block_causal"
    " --set data.reset_position_ids=true --set data.eod_mask_loss=true --set train.micro_batch=2";

// One GPU follows the CPU run and, stopped at step 10 and resumed, repeats itself bit for bit
// (where every step's attention backward was the deterministic one).
TEST_CASE("cli gpu: block-causal attention on a GPU follows the CPU and resumes exactly", "[gpu]") {
  const std::string det = "--set train.backend=cuda --set train.deterministic=true" + kDocs;
  RunDir gpu(20), cpu(20);
  CmdResult r = gpu.trainer(det);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(cpu.trainer(kDocs).exit_code == 0);
  const std::vector<nlohmann::json> g = gpu.metrics(), c = cpu.metrics();
  REQUIRE(g.size() == 20);
  check_losses_near(g, c, 2e-2);
  // The ragged path ran every step, and its graphs' workspace was ready before the first: from
  // the second step on (the first builds graphs) the step still syncs once.
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("step " << i + 1 << ": " << g[i].dump());
    CHECK(g[i].value("attention_ragged", 0) > 0);
    if (i > 0) CHECK(g[i]["host_syncs"].get<int>() == 1);
  }
  RunDir split(20);
  REQUIRE(split.trainer(det + " --set train.exit_interval=10").exit_code == kExitStopped);
  CmdResult resumed = split.trainer(det);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const std::vector<nlohmann::json> s = split.metrics();
  REQUIRE(s.size() == 20);
  const bool deterministic = std::all_of(g.begin(), g.end(), [](const nlohmann::json& l) {
    return l.value("attention_bwd", "") == "deterministic";
  });
  if (deterministic) {
    for (size_t i = 0; i < g.size(); ++i) {
      INFO("step " << i + 1 << ": straight " << g[i]["loss"] << ", resumed " << s[i]["loss"]);
      CHECK(s[i]["loss"].get<double>() == g[i]["loss"].get<double>());
    }
  } else {
    WARN("a step ran the fast attention backward: resume checked to 1e-2");
    check_losses_near(s, g, 1e-2);
  }
}

// Under cp 2 (chunk blocks over ragged documents, both exchanges) on ranks sharing the GPU: the
// losses of one GPU rank.
TEST_CASE("cli gpu: block-causal attention under cp 2 on ranks sharing the GPU matches one rank",
          "[gpu][mpi]") {
  RunDir one(20);
  CmdResult r = one.trainer("--set train.backend=cuda" + kDocs);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<nlohmann::json> g = one.metrics();
  REQUIRE(g.size() == 20);
  for (const std::string& cp :
       {std::string(" --set parallel.cp=2 --set parallel.cp_comm=allgather"),
        std::string(" --set parallel.cp=2 --set parallel.cp_comm=ring")}) {
    RunDir run(20);
    CmdResult m = run.mpirun(2, "--set train.backend=cuda" + kDocs + cp +
                                    " --set parallel.comm=mpi" + kSharedGpuTimeout);
    INFO(cp << "\n" << m.output);
    REQUIRE(m.exit_code == 0);
    const std::vector<nlohmann::json> b = run.metrics();
    REQUIRE(b.size() == 20);
    check_losses_near(b, g, 1e-2);
    for (const nlohmann::json& l : b) CHECK(l.value("attention_ragged", 0) > 0);
  }
}

// Ends this case as skipped (exit 77, which ctest reports) on a machine with fewer than `n` GPUs.
void need_gpus(int n) {
  if (gpu_count() >= n) return;
  std::printf("skipped: needs %d GPUs, this machine has %d\n", n, gpu_count());
  std::exit(77);
}

// One GPU rank's 10 steps of `shape`, then each of `layouts` on two GPUs over NCCL (one rank
// per GPU): every step's loss within bf16's tolerance of the one rank's.
void expect_two_gpus_near_one(const std::string& shape, const std::vector<std::string>& layouts) {
  RunDir one(10);
  CmdResult r = one.trainer(shape);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<nlohmann::json> a = one.metrics();
  REQUIRE(a.size() == 10);
  for (const std::string& layout : layouts) {
    RunDir two(10);
    CmdResult m = two.mpirun(2, shape + layout);
    INFO(layout << "\n" << m.output);
    REQUIRE(m.exit_code == 0);
    const std::vector<nlohmann::json> b = two.metrics();
    REQUIRE(b.size() == 10);
    check_losses_near(b, a, 1e-2);
  }
}

// NCCL between GPUs (one rank per GPU): tensor parallel with sequence parallelism, data
// parallel with ZeRO-1 (weight all-gather overlapping the forward) and bf16 gradient reduction,
// and context parallel by both exchanges, each against one GPU rank within bf16 tolerance.
TEST_CASE("cli gpu: tp 2, dp 2 and cp 2 over NCCL between two GPUs match one GPU rank",
          "[gpu][mpi]") {
  need_gpus(2);
  expect_two_gpus_near_one(
      " --set train.backend=cuda --set model.num_layers=4",
      {" --set parallel.tp=2 --set parallel.sequence_parallel=true",
       " --set parallel.zero1=true --set parallel.overlap_param_gather=true"
       " --set parallel.grad_reduce_dtype=bf16",
       // The ring's K/V passes on NCCL's side stream beside the attention, dK/dV in order.
       " --set parallel.cp=2 --set parallel.cp_comm=ring",
       " --set parallel.cp=2 --set parallel.cp_comm=allgather"});
}

// Expert parallelism over NCCL: the routed rows' exchanges (grouped sends and receives on the ep
// group, each rank's own rows copied) and the experts' gradients reduced over their replicas
// (one rank each at ep 2 of dp 2: ZeRO-1's expert shard is a copy), against one GPU rank.
TEST_CASE("cli gpu: a qwen3_moe model at ep 2 over NCCL between two GPUs matches one GPU rank",
          "[gpu][mpi]") {
  need_gpus(2);
  expect_two_gpus_near_one(
      " --set train.backend=cuda --set model.num_layers=4 --set model.family=qwen3_moe"
      " --set model.num_experts=8 --set model.experts_per_token=2"
      " --set model.moe_intermediate_size=32 --set model.router_aux_loss_coef=0.01",
      {" --set parallel.ep=2", " --set parallel.ep=2 --set parallel.zero1=true"});
}

// A rank stopped with SIGSTOP leaves the other waiting: a watchdog ends the job after
// parallel.timeout_s with an error line, exit code 5 (the NCCL watchdog aborting the
// communicators, or MPI's over the step's agreement).
TEST_CASE("cli gpu: a stopped rank ends an NCCL job after parallel.timeout_s, exit 5",
          "[gpu][mpi]") {
  need_gpus(2);
  RunDir run(1000);
  const auto t0 = std::chrono::steady_clock::now();
  CmdResult r = run.mpirun(2, "--set train.backend=cuda --set parallel.timeout_s=20",
                           "TR_TEST_FAULT=hang:3:1:1");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output);
  CHECK(r.exit_code == kExitCommTimeout);
  CHECK(took > 20);
  CHECK(took < 90);
  // The NCCL watchdog or the MPI one (the step's agreement), whichever waits first, names it.
  CHECK(r.output.find("parallel.timeout_s") != std::string::npos);
  CHECK(r.output.find("error: ") != std::string::npos);
}

// preflight's collectives over NCCL at two ranks (one per GPU): every op correct.
TEST_CASE("cli gpu: preflight's NCCL collectives on two GPUs are all correct", "[gpu][mpi]") {
  need_gpus(2);
  CmdResult r = test::run_cmd(std::string(test::kOneThread) + " " + tr::test::mpirun() + " 2 " +
                              tr::test::preflight_bin() +
                              " --backend cuda --min-bytes 1K --max-bytes 1M --iters 3 --warmup 1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("preflight: passed") != std::string::npos);
}

}  // namespace
}  // namespace tr

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::string(argv[i]).rfind("--list", 0) == 0;
  if (!listing) {
#ifdef TRAINER_HAVE_CUDA
    if (!tr::cuda::device_available()) {
      std::printf("skipped: no CUDA device\n");
      return 77;
    }
    std::printf("device: %s\n", tr::cuda::device_name(0).c_str());
#else
    std::printf("skipped: this build has no CUDA backend (-DTRAINER_CUDA=OFF)\n");
    return 77;
#endif
  }
  return Catch::Session().run(argc, argv);
}
