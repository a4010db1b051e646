// End-to-end tests of the trainer on a GPU (label gpu): bf16 training against the CPU run,
// GPU <-> CPU resume, determinism, and several ranks sharing one GPU. Without a CUDA device, or
// in a build without CUDA, the binary prints why and exits 77, which ctest reports as skipped.
// (The error a train.backend=cuda run gives without a GPU is tested in test_cli.cpp.)
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/core/exit_codes.h"
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

// The tiny model trains in bf16 on the GPU and its loss follows the CPU run's within bf16
// tolerance; checkpoints move between the GPU and the CPU; two GPU runs are bit-identical.
TEST_CASE("cli gpu: train.backend=cuda trains on a GPU like the CPU", "[gpu]") {
  RunDir run(20), cpu(20);
  CmdResult r = run.trainer("--set train.backend=cuda --set train.deterministic=true");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(cpu.trainer().exit_code == 0);
  const std::vector<nlohmann::json> g = run.metrics(), c = cpu.metrics();
  REQUIRE(g.size() == 20);
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("step " << i + 1 << ": gpu " << g[i]["loss"] << ", cpu " << c[i]["loss"]);
    CHECK(std::abs(g[i]["loss"].get<double>() / c[i]["loss"].get<double>() - 1) < 2e-2);
  }
  CHECK(g.back()["loss"].get<double>() < g.front()["loss"].get<double>() - 0.5);
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
  // train.deterministic: a second GPU run of the same 20 steps gives the same losses, bit for
  // bit.
  RunDir again(20);
  REQUIRE(again.trainer("--set train.backend=cuda --set train.deterministic=true").exit_code == 0);
  const std::vector<nlohmann::json> g2 = again.metrics();
  REQUIRE(g2.size() == g.size());
  for (size_t i = 0; i < g.size(); ++i)
    CHECK(g2[i]["loss"].get<double>() == g[i]["loss"].get<double>());
}

// GPU ranks: tp 2 x pp 2 x dp 2 as 8 ranks sharing this machine's GPU(s) through
// parallel.comm=mpi (device tensors staged through host memory) match one GPU rank within bf16
// tolerance; NCCL refuses more ranks than GPUs with a clear error.
TEST_CASE("cli gpu: 8 GPU ranks sharing one GPU (parallel.comm=mpi) match one GPU rank",
          "[gpu][mpi]") {
  RunDir one(10), eight(10);
  const std::string layout =
      " --set train.backend=cuda --set train.micro_batch=2 --set model.num_layers=4";
  CmdResult r = one.trainer(layout);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string par = layout + " --set parallel.tp=2 --set parallel.pp=2";
  if (gpu_count() < 8) {
    CmdResult nccl = eight.mpirun(8, par);
    CHECK(nccl.exit_code == 2);
    CHECK(nccl.output.find("parallel.comm=nccl needs one GPU per rank") != std::string::npos);
  }
  CmdResult m = eight.mpirun(8, par + " --set parallel.comm=mpi");
  INFO(m.output);
  REQUIRE(m.exit_code == 0);
  CHECK(m.output.find("world 8 = tp 2 x dp 2 x pp 2") != std::string::npos);
  const std::vector<nlohmann::json> a = one.metrics(), b = eight.metrics();
  REQUIRE(a.size() == 10);
  REQUIRE(b.size() == 10);
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i + 1 << ": one rank " << a[i]["loss"] << ", 8 ranks " << b[i]["loss"]);
    CHECK(std::abs(b[i]["loss"].get<double>() / a[i]["loss"].get<double>() - 1) < 1e-2);
  }
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {}  // namespace
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
