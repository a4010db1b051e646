// Layouts end to end: whole trainer runs under mpirun (and srun) against one rank, and what
// overlapping, sharding and recomputation must leave bit for bit.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/exit_codes.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"

namespace tr {
namespace {

using test::CkptTensors;
using test::CmdResult;
using test::expect_same_bits;
using test::expect_same_training;
using test::kLayoutShape;
using test::kOneThread;
using test::read_checkpoint;
using test::run_cmd;
using test::RunDir;
using test::TempDir;
using test::with_layout_shape;

// With buckets small enough, the DP all-reduce of the layers' buckets starts during the last
// micro-batch's backward (MPI_Iallreduce here, NCCL on a side stream on GPUs). With 2 DP ranks
// every sum is a + b in either order, so the run is bit-identical to the one that reduces after
// backward; the trace shows how many buckets started early.
TEST_CASE("cli: data-parallel buckets overlap backward and change no bit", "[cli][mpi]") {
  RunDir run(6);
  const std::string args = " --set parallel.pp=2 --set parallel.dp_bucket_elems=4000";
  CmdResult off = run.mpirun(4, args + " --set parallel.overlap_dp=false");
  INFO(off.output);
  REQUIRE(off.exit_code == 0);
  const std::vector<nlohmann::json> want = run.metrics();
  std::filesystem::remove_all(run.dir / "ckpt");
  std::filesystem::remove_all(run.dir / "log");
  CmdResult on = run_cmd(std::string(kOneThread) + " TR_TRACE_DP=1 " + tr::test::mpirun() + " 4 " +
                         tr::test::trainer_bin() + " --config " + run.config + args);
  INFO(on.output);
  REQUIRE(on.exit_code == 0);
  expect_same_bits(want, run.metrics(), 6);
  // Stage 0 of 2 (world rank 0) holds layer 0 (37120 gradients, first in the flat buffer) and
  // the embedding (384 padded rows x 64): 61696 elements, 16 buckets of 4000, of which 0-8 lie
  // wholly inside the layer and start early; the rest wait for the end of backward.
  for (int step = 1; step <= 6; ++step)
    CHECK(on.output.find("step " + std::to_string(step) +
                         ": 9 of 16 dp buckets started during backward") != std::string::npos);
  CHECK(off.output.find("dp buckets started") == std::string::npos);
  // ZeRO-1: the same buckets, each reduced into the shard owners' gradient shards, started early
  // or after backward: the same losses and norms bit for bit, and the same early starts. (The
  // loss also equals the plain DP run's; the norm sums its squares by shard, so its last bits
  // may differ from that.)
  const auto zero1 = [&](const std::string& overlap) {
    std::filesystem::remove_all(run.dir / "ckpt");
    std::filesystem::remove_all(run.dir / "log");
    CmdResult z = run_cmd(std::string(kOneThread) + " TR_TRACE_DP=1 " + tr::test::mpirun() + " 4 " +
                          tr::test::trainer_bin() + " --config " + run.config + args +
                          " --set parallel.zero1=true --set parallel.overlap_dp=" + overlap);
    INFO(z.output);
    REQUIRE(z.exit_code == 0);
    return std::make_pair(z, run.metrics());
  };
  const auto [z_off, zw] = zero1("false");
  const auto [z, zg] = zero1("true");
  REQUIRE(zg.size() == 6);
  REQUIRE(zw.size() == 6);
  for (size_t i = 0; i < zg.size(); ++i) {
    CHECK(zg[i]["loss"].get<double>() == zw[i]["loss"].get<double>());
    CHECK(zg[i]["loss"].get<double>() == want[i]["loss"].get<double>());
    CHECK(zg[i]["grad_norm"].get<double>() == zw[i]["grad_norm"].get<double>());
  }
  CHECK(z_off.output.find("step 6: 0 of 16 dp buckets") != std::string::npos);
  CHECK(z.output.find("step 6: 9 of 16 dp buckets started during backward") != std::string::npos);
}

// parallel.overlap_tp: each column-parallel layer's input-gradient reduction over TP runs beside
// the layer's weight-gradient GEMM (MPI's non-blocking collective here, the TP communicator's
// side stream on GPUs), with and without sequence parallelism. With 2 TP ranks every sum is
// a + b in either order, so the runs are bit-identical to the in-order ones; the trace counts
// 2 layers x 2 column-parallel layers x 2 micro-batches per step. A zero-bubble schedule's
// input-only pass has no weight GEMM to overlap: none there.
TEST_CASE("cli: TP input-gradient reductions overlap the weight gradients and change no bit",
          "[cli][mpi]") {
  for (const std::string sp : {"true", "false"}) {
    INFO("sequence_parallel " << sp);
    const std::string args = " --set parallel.tp=2 --set parallel.sequence_parallel=" + sp;
    RunDir off(6), on(6);
    CmdResult a = off.mpirun(2, args + " --set parallel.overlap_tp=false", "TR_TRACE_TP=1");
    INFO(a.output);
    REQUIRE(a.exit_code == 0);
    CmdResult b = on.mpirun(2, args, "TR_TRACE_TP=1");
    INFO(b.output);
    REQUIRE(b.exit_code == 0);
    expect_same_bits(off.metrics(), on.metrics(), 6);
    test::check_same_checkpoint(off.config, off.dir / "ckpt/step_00000006", on.config,
                                on.dir / "ckpt/step_00000006");
    for (int step = 1; step <= 6; ++step) {
      const std::string s = "step " + std::to_string(step) + ": ";
      CHECK(b.output.find(s + "8 tp input-gradient reductions ran beside the weight gradients") !=
            std::string::npos);
      CHECK(a.output.find(s + "0 tp input-gradient reductions ran beside") != std::string::npos);
    }
  }
  RunDir zb(6);
  CmdResult z = zb.mpirun(4,
                          " --set parallel.tp=2 --set parallel.pp=2 --set "
                          "parallel.pipeline_schedule=zero_bubble",
                          "TR_TRACE_TP=1");
  INFO(z.output);
  REQUIRE(z.exit_code == 0);
  CHECK(z.output.find("step 6: 0 tp input-gradient reductions ran beside") != std::string::npos);
}

// ZeRO-1's weight all-gather, bucket by bucket in the shards' layout: with overlap_param_gather
// the next forward completes each bucket as it reaches the layer that reads it, instead of the
// update waiting for all of them; the run is the same bit for bit (losses, norms, checkpoints),
// with the fp32 weights as the compute copy (CPU ranks) and with a separate compute copy and
// sharded masters (TR_TEST_COMPUTE_COPY=1, the GPU's layout).
TEST_CASE("cli: ZeRO-1's weight all-gather overlaps the next forward and changes no bit",
          "[cli][mpi]") {
  const std::string args =
      " --set parallel.pp=2 --set parallel.zero1=true --set parallel.dp_bucket_elems=4000";
  for (const std::string env : {"", "TR_TEST_COMPUTE_COPY=1"}) {
    RunDir off(6), on(6);
    CmdResult a =
        off.mpirun(4, args + " --set parallel.overlap_param_gather=false", env + " TR_TRACE_DP=1");
    INFO(env << "\n" << a.output);
    REQUIRE(a.exit_code == 0);
    CmdResult b = on.mpirun(4, args, env + " TR_TRACE_DP=1");
    INFO(b.output);
    REQUIRE(b.exit_code == 0);
    expect_same_bits(off.metrics(), on.metrics(), 6);
    test::check_same_checkpoint(off.config, off.dir / "ckpt/step_00000006", on.config,
                                on.dir / "ckpt/step_00000006");
    // Stage 0 (world rank 0): the embedding and layer 0, 61696 elements in 16 buckets of 4000,
    // all read by the forward. Step 1's forward follows no update.
    CHECK(b.output.find("step 1: 9 of 16 dp buckets started during backward; 0 of 0 weight") !=
          std::string::npos);
    for (int step = 2; step <= 6; ++step) {
      const std::string s = "step " + std::to_string(step) + ": ";
      CHECK(b.output.find(s + "9 of 16 dp buckets started during backward; 16 of 16 weight "
                              "buckets completed by the forward") != std::string::npos);
      CHECK(a.output.find(s + "9 of 16 dp buckets started during backward; 0 of 16 weight") !=
            std::string::npos);
    }
  }
}

// Sequence parallelism: each layer's norm gradients are summed over TP as the last backward
// finishes the layer (one all-reduce per tensor, as after backward), so DP buckets start early
// here too; the run is the non-overlapped one bit for bit. A bucket started before its norms
// were summed would carry one TP rank's share of them and change the weights.
TEST_CASE("cli: under sequence parallelism DP buckets start during backward and change no bit",
          "[cli][mpi]") {
  RunDir run(6);
  const std::string args =
      " --set parallel.tp=2 --set parallel.sequence_parallel=true --set "
      "parallel.dp_bucket_elems=3000";
  CmdResult off = run.mpirun(4, args + " --set parallel.overlap_dp=false");
  INFO(off.output);
  REQUIRE(off.exit_code == 0);
  const std::vector<nlohmann::json> want = run.metrics();
  RunDir again(6);
  CmdResult on = run_cmd(std::string(kOneThread) + " TR_TRACE_DP=1 " + tr::test::mpirun() + " 4 " +
                         tr::test::trainer_bin() + " --config " + again.config + args);
  INFO(on.output);
  REQUIRE(on.exit_code == 0);
  expect_same_bits(want, again.metrics(), 6);
  test::check_same_checkpoint(run.config, run.dir / "ckpt/step_00000006", again.config,
                              again.dir / "ckpt/step_00000006");
  // Each TP rank's flat buffer: 2 layers of 18560 gradients, then the embedding and the final
  // norm; the buckets wholly inside the layers start early.
  const std::regex early("step 6: ([0-9]+) of ([0-9]+) dp buckets started during backward");
  std::smatch m;
  REQUIRE(std::regex_search(on.output, m, early));
  CHECK(std::stoi(m[1]) >= 10);
  CHECK(std::stoi(m[1]) < std::stoi(m[2]));
}

// Activation recomputation at tp 2 x pp 2 with sequence parallelism (so that the recomputed norm
// outputs are all-gathered again, and two micro-batches are in flight on stage 0): selective,
// full, and full on the first layer of each stage only train the run without recomputation bit
// for bit.
TEST_CASE(
    "cli: activation recomputation is bit-identical to none under tp, pp and sequence parallel",
    "[cli][mpi]") {
  const std::string args =
      " --set model.num_heads=8 --set model.num_kv_heads=4 --set model.head_dim=8"
      " --set model.num_layers=4 --set train.micro_batch=1 --set train.steps=3 --set "
      "optim.warmup_steps=1"
      " --set parallel.tp=2 --set parallel.pp=2 --set parallel.sequence_parallel=true";
  RunDir none(6);  // 6 in the file (the warm-up's 5 fit), 3 run
  CmdResult r = none.mpirun(4, args);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (const std::string rc : {" --set train.recompute=selective", " --set train.recompute=full",
                               " --set train.recompute=full --set train.recompute_layers=[1]"}) {
    RunDir run(6);
    CmdResult o = run.mpirun(4, args + rc);
    INFO(rc << "\n" << o.output);
    REQUIRE(o.exit_code == 0);
    expect_same_bits(none.metrics(), run.metrics(), 3);
    const CkptTensors x =
        read_checkpoint(none.config, none.dir / "ckpt/step_00000003", kLayoutShape);
    const CkptTensors y = read_checkpoint(run.config, run.dir / "ckpt/step_00000003", kLayoutShape);
    CHECK(x.p == y.p);
    CHECK(x.m == y.m);
    CHECK(x.v == y.v);
  }
}

// Megatron's distributed optimizer: with a separate compute copy (bf16 on GPUs; fp32 on CPU ranks
// with TR_TEST_COMPUTE_COPY=1) ZeRO-1 keeps the fp32 masters of the rank's shard only, updates
// them, and all-gathers the updated compute copy. On the CPU the compute copy is exact, so the
// run is the one with whole masters bit for bit, at (2,2,2) (tied embedding over two stages:
// its compute copies are broadcast) and at (1,1,4); each rank says it holds a shard.
TEST_CASE("cli: ZeRO-1 with sharded fp32 masters trains the whole-master run bit for bit",
          "[cli][mpi]") {
  const std::string shape =
      " --set model.num_heads=8 --set model.num_kv_heads=4 --set model.head_dim=8"
      " --set model.num_layers=4 --set train.micro_batch=1 --set parallel.zero1=true";
  for (const std::string layout :
       {" --set parallel.tp=2 --set parallel.pp=2", " --set parallel.tp=1 --set parallel.pp=1"}) {
    RunDir whole(6), sharded(6);
    CmdResult a = whole.mpirun(layout.find("tp=2") != std::string::npos ? 8 : 4, shape + layout);
    INFO(a.output);
    REQUIRE(a.exit_code == 0);
    CHECK(a.output.find("this rank's zero1 shard") == std::string::npos);
    CmdResult b = sharded.mpirun(layout.find("tp=2") != std::string::npos ? 8 : 4, shape + layout,
                                 "TR_TEST_COMPUTE_COPY=1");
    INFO(b.output);
    REQUIRE(b.exit_code == 0);
    CHECK(b.output.find("(this rank's zero1 shard), compute copy") != std::string::npos);
    expect_same_bits(whole.metrics(), sharded.metrics(), 6);
    const CkptTensors p =
        read_checkpoint(whole.config, whole.dir / "ckpt/step_00000006", kLayoutShape);
    const CkptTensors q =
        read_checkpoint(sharded.config, sharded.dir / "ckpt/step_00000006", kLayoutShape);
    CHECK(p.p == q.p);
    CHECK(p.m == q.m);
    CHECK(p.v == q.v);
  }
}

// parallel.grad_reduce_dtype: bf16 rounds each DP bucket to bf16 and sums it in bf16 (our own
// MPI operation here, NCCL's on GPUs). At (2,2,2) and at (1,1,4) with ZeRO-1 the losses stay
// within 1e-2 of the fp32 reduction's, differ from them (the rounding is real), and a second
// run repeats the first bit for bit.
TEST_CASE("cli: bf16 gradient reduction is within 1e-2 of fp32 and repeats bit for bit",
          "[cli][mpi]") {
  const std::string shape =
      " --set model.num_heads=8 --set model.num_kv_heads=4 --set model.head_dim=8"
      " --set model.num_layers=4 --set train.micro_batch=1";
  for (const std::string layout :
       {" --set parallel.tp=2 --set parallel.pp=2",
        " --set parallel.tp=1 --set parallel.pp=1 --set parallel.zero1=true"}) {
    const int ranks = 8;
    RunDir fp32(6), bf16(6), again(6);
    const std::string bf = shape + layout + " --set parallel.grad_reduce_dtype=bf16";
    for (auto [run, args] : {std::pair{&fp32, shape + layout}, {&bf16, bf}, {&again, bf}}) {
      CmdResult r = run->mpirun(layout.find("tp=2") != std::string::npos ? ranks : 4, args);
      INFO(args << "\n" << r.output);
      REQUIRE(r.exit_code == 0);
    }
    const std::vector<nlohmann::json> x = fp32.metrics(), y = bf16.metrics(), z = again.metrics();
    REQUIRE(x.size() == 6);
    REQUIRE(y.size() == 6);
    REQUIRE(z.size() == 6);
    bool differs = false;
    for (size_t i = 0; i < x.size(); ++i) {
      INFO(layout << ": step " << i + 1);
      const double a = x[i]["loss"].get<double>(), b = y[i]["loss"].get<double>();
      CHECK(std::abs(b / a - 1) < 1e-2);
      differs = differs || a != b;
      CHECK(z[i]["loss"].get<double>() == b);
      CHECK(z[i]["grad_norm"].get<double>() == y[i]["grad_norm"].get<double>());
    }
    CHECK(differs);
  }
}

// The vocab-parallel loss from gathered shard statistics (two passes over the logits) against
// the three steps with their two all-reduces (TR_XENT_3PASS=1): the same losses but for rounding,
// at tp 2 and tp 4 (the vocabulary of 257 padded: the last rank's shard is partly padding).
TEST_CASE("cli: the two-pass vocab-parallel loss matches the three-pass one", "[cli][mpi]") {
  const std::string shape =
      " --set model.num_heads=8 --set model.num_kv_heads=4 --set model.head_dim=8";
  for (int tp : {2, 4}) {
    const std::string layout = " --set parallel.tp=" + std::to_string(tp);
    RunDir two(6), three(6);
    CmdResult a = two.mpirun(tp, shape + layout);
    INFO(a.output);
    REQUIRE(a.exit_code == 0);
    CmdResult b = three.mpirun(tp, shape + layout, "TR_XENT_3PASS=1");
    INFO(b.output);
    REQUIRE(b.exit_code == 0);
    // Every TP rank ran the three steps; the default run took no switched path.
    for (int r = 0; r < tp; ++r)
      CHECK(b.output.find("rank " + std::to_string(r) +
                          ": debug switches taken: TR_XENT_3PASS (") != std::string::npos);
    CHECK(a.output.find("debug switches taken") == std::string::npos);
    const std::vector<nlohmann::json> x = two.metrics(), y = three.metrics();
    REQUIRE(x.size() == 6);
    REQUIRE(y.size() == 6);
    for (size_t i = 0; i < x.size(); ++i)
      CHECK(std::abs(x[i]["loss"].get<double>() / y[i]["loss"].get<double>() - 1) < 1e-6);
  }
}

// Every layout (tp, pp, dp) of 8 ranks and fewer, at the same global batch: losses, validation
// loss, final weights and Adam states match the single-rank run to relative 1e-5. Prints the table.
TEST_CASE("cli: tensor, pipeline and data parallel layouts over MPI ranks match one rank",
          "[cli][mpi]") {
  const std::string args = with_layout_shape(
      "--set train.micro_batch=2 --set train.eval_interval=5 --set train.eval_steps=2");
  RunDir one(10);
  REQUIRE(one.trainer(args).exit_code == 0);
  struct Case {
    int tp, pp, dp;
    bool zero1, sp;
    std::string more = "";
    std::string env = "";  // TR_TEST_COMPUTE_COPY=1: ZeRO-1 with sharded masters, as on GPUs
  };
  const Case cases[] = {
      {2, 1, 1, false, false},
      {1, 2, 1, false, false},
      {1, 1, 2, false, false},
      {2, 2, 2, false, false},
      {4, 1, 2, false, false},
      {2, 2, 2, true, false},
      {2, 2, 2, false, true},
      {1, 1, 4, true, false},
      {1, 4, 1, false, false},
      {1, 4, 1, false, false, " --set train.micro_batch=4"},  // 2 < 4 stages
      {1, 2, 1, false, false, " --set 'parallel.pipeline_layers=[1, 3]'"},
      // DP buckets small enough to start during backward (overlap).
      {2, 2, 2, false, false, " --set parallel.dp_bucket_elems=3000"},
      {1, 1, 4, true, false, " --set parallel.dp_bucket_elems=3000"},
      // Recomputation (bit-identical to none at the same layout, tested
      // above; here against one rank).
      {2, 2, 2, false, true, " --set train.recompute=selective"},
      {2, 2, 2, true, false, " --set train.recompute=full"},
      // ZeRO-1 as Megatron's distributed optimizer: sharded fp32 masters.
      {2, 2, 2, true, false, "", "TR_TEST_COMPUTE_COPY=1"},
      {1, 1, 4, true, false, "", "TR_TEST_COMPUTE_COPY=1"},
      // ... with many buckets per shard (each rank a piece of every bucket),
      // the weight all-gather overlapping the next forward.
      {1, 1, 4, true, false, " --set parallel.dp_bucket_elems=3000", "TR_TEST_COMPUTE_COPY=1"}};
  std::printf("layout (tp,pp,dp)                    loss at step 10     relative difference\n");
  std::printf("(1,1,1)                              %.9f\n",
              one.metrics().back()["loss"].get<double>());
  for (const Case& c : cases) {
    RunDir owned(10);
    RunDir* run = &owned;
    const int ranks = c.tp * c.pp * c.dp;
    const std::string extra = " --set parallel.tp=" + std::to_string(c.tp) +
                              " --set parallel.pp=" + std::to_string(c.pp) +
                              (c.zero1 ? " --set parallel.zero1=true" : "") +
                              (c.sp ? " --set parallel.sequence_parallel=true" : "") + c.more;
    const std::string layout = "tp " + std::to_string(c.tp) + " x dp " + std::to_string(c.dp) +
                               " x pp " + std::to_string(c.pp);
    CmdResult r = run->mpirun(ranks, args + extra, c.env);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("world " + std::to_string(ranks) + " = " + layout) != std::string::npos);
    expect_same_training(one, *run, 10, 80, layout + extra);
    std::vector<nlohmann::json> a = one.metrics(), b = run->metrics();
    const double la = a.back()["loss"].get<double>(), lb = b.back()["loss"].get<double>();
    std::string label = std::string(c.zero1 ? "+zero1" : "") + (c.sp ? "+seq-par" : "");
    if (c.more.find("micro_batch") != std::string::npos) label += "+mb4";
    if (c.more.find("pipeline_layers") != std::string::npos) label += "+[1,3]";
    if (c.more.find("bucket") != std::string::npos) label += "+overlap";
    if (c.more.find("selective") != std::string::npos) label += "+rc-sel";
    if (c.more.find("recompute=full") != std::string::npos) label += "+rc-full";
    if (!c.env.empty()) label += "+sharded-masters";
    std::printf("(%d,%d,%d)%-30s%.9f  %.2e\n", c.tp, c.pp, c.dp, label.c_str(), lb,
                std::abs(lb / la - 1));
  }
}

// The llama and qwen3 families (no q, k, v biases; Llama 3's RoPE rule; QK-norm) over 20 steps:
// tp 2 x pp 2 x dp 2 with ZeRO-1 and cp 2 (ring) x tp 2 against one rank, every step's loss and
// gradient norm, the validation loss and the final weights and Adam states to 1e-5.
TEST_CASE(
    "cli: the llama and qwen3 families over ZeRO-1 and context-parallel layouts match one "
    "rank",
    "[cli][mpi]") {
  const std::vector<std::vector<std::string>> families = {
      {"model.family=llama",
       "model.rope_scaling={type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, "
       "original_max_position_embeddings: 64}"},
      // QK-norm's weights start at one, as Hugging Face's: attention is sharp from the first
      // step, and at the suite's learning rate of 3e-3 a spike (gradient norm ~45 at step 15)
      // amplifies the layouts' rounding past 1e-5 of the gradient norm; 1e-3 trains smoothly.
      {"model.family=qwen3", "optim.lr=1.0e-3"}};
  for (const std::vector<std::string>& family : families) {
    std::vector<std::string> shape = test::kLayoutShape;
    std::string args = with_layout_shape(
        "--set train.micro_batch=2 --set train.eval_interval=10 --set train.eval_steps=2");
    for (const std::string& kv : family) {
      args += " --set '" + kv + "'";  // (the shell's word)
      shape.push_back(kv);
    }
    RunDir one(20);
    REQUIRE(one.trainer(args).exit_code == 0);
    for (const auto& [ranks, layout] :
         {std::pair{8, std::string(" --set parallel.tp=2 --set parallel.pp=2 "
                                   "--set parallel.zero1=true")},
          std::pair{4, std::string(" --set parallel.cp=2 --set parallel.cp_comm=ring "
                                   "--set parallel.tp=2 --set parallel.sequence_parallel=true")}}) {
      RunDir run(20);
      CmdResult r = run.mpirun(ranks, args + layout);
      INFO(family[0] << layout << "\n" << r.output);
      REQUIRE(r.exit_code == 0);
      expect_same_training(one, run, 20, 160, family[0] + layout, shape);
    }
  }
}

// Context parallelism (parallel.cp) over MPI ranks, both exchanges, alone and with tensor and
// pipeline parallelism, sequence parallelism and ZeRO-1: every step's loss and gradient norm,
// the validation loss and the final weights and Adam states after 20 steps match one rank to
// relative 1e-5. Prints the table's rows.
TEST_CASE("cli: context-parallel layouts over MPI ranks match one rank", "[cli][mpi]") {
  const std::string args = with_layout_shape(
      "--set train.micro_batch=2 --set train.eval_interval=10 --set train.eval_steps=2");
  RunDir one(20);
  REQUIRE(one.trainer(args).exit_code == 0);
  struct Case {
    int tp, cp, pp, dp;
    std::string how;
    std::string label = "";  // the table's name for `more` and `env`
    std::string more = "";
    std::string env = "";
  };
  const std::string sp_zero1 = " --set parallel.sequence_parallel=true --set parallel.zero1=true";
  const Case cases[] = {
      {1, 2, 1, 1, "allgather"},
      {1, 2, 1, 1, "ring"},
      {1, 4, 1, 1, "allgather"},
      {1, 4, 1, 1, "ring"},
      // With recomputation, whose forward again exchanges K and V.
      {2, 2, 2, 1, "allgather", "+seq-par+zero1+rc-full", sp_zero1 + " --set train.recompute=full"},
      {2, 2, 2, 1, "ring", "+seq-par+zero1+rc-sel", sp_zero1 + " --set train.recompute=selective"},
      // ZeRO-1's shards over dp x cp with sharded fp32 masters, as on GPUs.
      {1, 2, 1, 2, "ring", "+zero1+sharded-masters", " --set parallel.zero1=true",
       "TR_TEST_COMPUTE_COPY=1"}};
  std::printf(
      "layout (tp,cp,pp,dp)                       loss at step 20     relative difference\n");
  for (const Case& c : cases) {
    RunDir run(20);
    const int ranks = c.tp * c.cp * c.pp * c.dp;
    const std::string extra = " --set parallel.tp=" + std::to_string(c.tp) +
                              " --set parallel.cp=" + std::to_string(c.cp) +
                              " --set parallel.pp=" + std::to_string(c.pp) +
                              " --set parallel.cp_comm=" + c.how + c.more;
    const std::string layout = "tp " + std::to_string(c.tp) + " x cp " + std::to_string(c.cp) +
                               " x dp " + std::to_string(c.dp) + " x pp " + std::to_string(c.pp);
    CmdResult r = run.mpirun(ranks, args + extra, c.env);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("world " + std::to_string(ranks) + " = " + layout) != std::string::npos);
    expect_same_training(one, run, 20, 160, layout + extra);
    std::vector<nlohmann::json> a = one.metrics(), b = run.metrics();
    const double la = a.back()["loss"].get<double>(), lb = b.back()["loss"].get<double>();
    std::printf("(%d,%d,%d,%d)%-34s%.9f  %.2e\n", c.tp, c.cp, c.pp, c.dp,
                ("+" + c.how + c.label).c_str(), lb, std::abs(lb / la - 1));
  }
}

// An uninterrupted 10-step run of `args` on one rank: its metrics and final checkpoint (read as
// `shape`), what a run stopped after 5 steps and resumed must match.
struct Straight {
  std::vector<nlohmann::json> metrics;
  CkptTensors final_state;
  std::vector<std::string> shape;
};
Straight run_straight(const std::string& args, const std::vector<std::string>& shape) {
  RunDir straight(10);
  REQUIRE(straight.trainer(args).exit_code == 0);
  Straight s{straight.metrics(),
             read_checkpoint(straight.config, straight.dir / "ckpt/step_00000010", shape), shape};
  REQUIRE(s.metrics.size() == 10);
  return s;
}

// A run stopped after 5 of 10 steps and resumed by `r`: it resumed, and its last 5 losses and its
// final weights and first moments match the uninterrupted run's to 1e-5.
void expect_resumed_like(const RunDir& run, const CmdResult& r, const Straight& want) {
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("resumed from") != std::string::npos);
  const std::vector<nlohmann::json> got = run.metrics();
  REQUIRE(got.size() == 10);
  for (size_t i = 5; i < 10; ++i) {
    INFO("step " << i + 1);
    CHECK(std::abs(got[i]["loss"].get<double>() / want.metrics[i]["loss"].get<double>() - 1) <
          1e-5);
  }
  const CkptTensors w = read_checkpoint(run.config, run.dir / "ckpt/step_00000010", want.shape);
  CHECK(test::rel_err(w.p, want.final_state.p) < 1e-5);
  CHECK(test::rel_err(w.m, want.final_state.m) < 1e-5);
}

// Save under one data-parallel layout, resume under another: the next losses match an
// uninterrupted single-rank run (checkpoints hold global tensors; the sample order is global).
// Resharding: save at (tp, pp, dp) = (2, 2, 2) with ZeRO-1 after 5 steps, resume
// at (4, 1, 2), at (1, 2, 4) without ZeRO-1 and at (1, 1, 1), and between context-parallel
// sizes (saved at cp 2, resumed at cp 1 and cp 4): the next 5 losses and the final weights match
// an uninterrupted single-rank run.
TEST_CASE("cli: checkpoints move between tensor, pipeline and data-parallel layouts",
          "[cli][mpi]") {
  const std::vector<std::string>& shape = kLayoutShape;
  const std::string args =
      with_layout_shape("--set train.micro_batch=1 --set checkpoint.interval=5");
  const Straight want = run_straight(args, shape);
  struct Case {
    int ranks;
    std::string layout;
    // ZeRO-1 with sharded fp32 masters (TR_TEST_COMPUTE_COPY=1) when saving and when resuming;
    // the save's layout (default (2,2,2) with ZeRO-1).
    std::string save_env = "", resume_env = "";
    std::string saved = " --set parallel.tp=2 --set parallel.pp=2 --set parallel.zero1=true";
  };
  const std::string copy = "TR_TEST_COMPUTE_COPY=1";
  for (const Case& c :
       {Case{8, " --set parallel.tp=4 --set parallel.pp=1"},
        Case{8, " --set parallel.tp=1 --set parallel.pp=2"}, Case{1, ""},
        // Saved with sharded masters, resumed without ZeRO-1; saved without, resumed with.
        Case{8, " --set parallel.tp=4 --set parallel.pp=1", copy, ""},
        Case{4, " --set parallel.zero1=true", "", copy, " --set parallel.pp=2"},
        // Sharded masters in pieces of many buckets, resumed at another dp and bucket size.
        Case{4, " --set parallel.zero1=true --set parallel.dp_bucket_elems=5000", copy, copy,
             " --set parallel.tp=2 --set parallel.pp=2 --set parallel.zero1=true"
             " --set parallel.dp_bucket_elems=3000"},
        // Context parallelism: saved at cp 2 (ZeRO-1 over dp x cp), resumed at cp 1 and cp 4.
        Case{1, "", "", "", " --set parallel.tp=2 --set parallel.cp=2 --set parallel.zero1=true"},
        Case{8, " --set parallel.tp=2 --set parallel.cp=4", "", "",
             " --set parallel.tp=2 --set parallel.cp=2 --set parallel.zero1=true"},
        Case{8, " --set parallel.cp=4 --set parallel.zero1=true", copy, copy,
             " --set parallel.cp=2 --set parallel.pp=2 --set parallel.zero1=true"}}) {
    RunDir run(10);
    INFO("saved with" << c.saved << " " << c.save_env << ", resumed with" << c.layout << " "
                      << c.resume_env);
    REQUIRE(run.mpirun(8, args + c.saved + " --set train.exit_interval=5", c.save_env).exit_code ==
            kExitStopped);
    CmdResult r =
        c.ranks == 1 ? run.trainer(args) : run.mpirun(c.ranks, args + c.layout, c.resume_env);
    expect_resumed_like(run, r, want);
    if (c.ranks == 1)
      CHECK(r.output.find(
                "note: config differs from the checkpoint's: parallel.zero1: true -> false") !=
            std::string::npos);
  }
}

// A mixture of experts saved under expert parallelism resumes under another ep (and on one rank):
// checkpoints hold each expert once under its global name, written by its replicas. Saved at tp 2
// x pp 2 x dp 2 with ep 2 and ZeRO-1 after 5 steps (each expert's replicas: one rank), resumed
// at ep 4 of dp 8 and at ep 2 of dp 4 x pp 2 with ZeRO-1 (two replicas each); the next 5 losses
// and the final weights and moments match an uninterrupted single-rank run.
TEST_CASE("cli: a mixture of experts' checkpoint moves between expert-parallel layouts",
          "[cli][mpi]") {
  std::vector<std::string> shape = kLayoutShape;
  for (const char* kv :
       {"model.family=qwen3_moe", "model.num_experts=4", "model.experts_per_token=2",
        "model.moe_intermediate_size=32", "model.router_aux_loss_coef=0.02"})
    shape.push_back(kv);
  std::string args = "--set train.micro_batch=1 --set checkpoint.interval=5";
  for (const std::string& kv : shape) args += " --set " + kv;
  const Straight want = run_straight(args, shape);
  const std::string saved =
      " --set parallel.tp=2 --set parallel.pp=2 --set parallel.ep=2 --set parallel.zero1=true";
  for (const std::string& layout :
       {std::string(" --set parallel.ep=4"),
        std::string(" --set parallel.pp=2 --set parallel.ep=2 --set parallel.zero1=true")}) {
    RunDir run(10);
    INFO("resumed with" << layout);
    const CmdResult first = run.mpirun(8, args + saved + " --set train.exit_interval=5");
    INFO(first.output);
    REQUIRE(first.exit_code == kExitStopped);
    expect_resumed_like(run, run.mpirun(8, args + layout), want);
  }
}

// The pipeline schedules (parallel.pipeline_schedule): interleaved (v 2) and zero-bubble at pp 2
// and pp 4, with ZeRO-1, context parallelism and recomputation, over 20 steps: every step's
// loss and gradient norm, the validation loss and the final weights and Adam states match one
// rank to relative 1e-5. Prints the table's rows. Each schedule under tp 2 with sequence
// parallelism and dp 2 with ZeRO-1 at pp 2 is compared tensor by tensor in process
// (tests/parallel/test_layouts.cpp); ZeRO-1 over many steps is the pp 4 rows'.
TEST_CASE("cli: interleaved and zero-bubble pipelines over MPI ranks match one rank",
          "[cli][mpi]") {
  const std::string base =
      "--set train.micro_batch=1 --set train.eval_interval=10 --set train.eval_steps=2";
  // 4 layers: interleaved v 2 fits pp 2; an 8-layer model takes pp 4, at a lower learning rate
  // (at the default one its training amplifies rounding past 1e-5 by step 14 under any layout,
  // 1f1b at pp 2 included).
  std::vector<std::string> eight = kLayoutShape;
  std::erase(eight, std::string("model.num_layers=4"));
  eight.push_back("model.num_layers=8");
  eight.push_back("optim.lr=5e-4");
  std::string args8 = base;
  for (const std::string& kv : eight) args8 += " --set " + kv;
  const std::string args4 = with_layout_shape(base);
  RunDir one4(20), one8(20);
  REQUIRE(one4.trainer(args4).exit_code == 0);
  REQUIRE(one8.trainer(args8).exit_code == 0);
  struct Case {
    std::string schedule;
    int ranks, pp;
    std::string label;  // the table's name for `more`
    std::string more = "";
    bool eight_layers = false;
  };
  const std::string il = "interleaved --set parallel.virtual_stages=2";
  const Case cases[] = {
      {il, 2, 2, ""},
      {il, 4, 2, "+cp2", " --set parallel.cp=2"},
      {il, 2, 2, "+rc-full", " --set train.recompute=full"},
      {il, 4, 4, "", "", true},
      {il, 8, 4, "+dp2+zero1+rc-sel", " --set parallel.zero1=true --set train.recompute=selective",
       true},
      {"zero_bubble", 2, 2, ""},
      {"zero_bubble", 4, 4, ""},
      {"zero_bubble", 4, 2, "+cp2", " --set parallel.cp=2 --set parallel.cp_comm=ring"},
      {"zero_bubble", 2, 2, "+rc-full", " --set train.recompute=full"},
      {"zero_bubble", 8, 4, "+dp2+zero1+rc-sel",
       " --set parallel.zero1=true --set train.recompute=selective"}};
  std::printf(
      "schedule (pp, ranks)                         loss at step 20     relative "
      "difference\n");
  for (const Case& c : cases) {
    const RunDir& one = c.eight_layers ? one8 : one4;
    RunDir run(20);
    const std::string extra = " --set parallel.pipeline_schedule=" + c.schedule +
                              " --set parallel.pp=" + std::to_string(c.pp) + c.more;
    CmdResult r = run.mpirun(c.ranks, (c.eight_layers ? args8 : args4) + extra);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    expect_same_training(one, run, 20, 160, extra, c.eight_layers ? eight : kLayoutShape);
    const double la = one.metrics().back()["loss"].get<double>(),
                 lb = run.metrics().back()["loss"].get<double>();
    const std::string name = c.schedule.substr(0, c.schedule.find(' ')) + " (" +
                             std::to_string(c.pp) + ", " + std::to_string(c.ranks) + ")" + c.label;
    std::printf("%-45s%.9f  %.2e\n", name.c_str(), lb, std::abs(lb / la - 1));
  }
}

// Packed documents through the trainer: block-causal attention (data.document_mask), positions
// restarting in each document (data.reset_position_ids) and the loss leaving out the target
// after each end-of-document token (data.eod_mask_loss). Each changes the training (the
// documents no longer see each other; the loss is another mean), and tp 2 with sequence
// parallelism, pp 2 (interleaved), dp 2 with ZeRO-1, pp 2 under zero-bubble and cp 2 (both
// exchanges; documents crossing the chunks and ranks) match one rank over 20 steps. Documents
// end at every space (token 32) so that each sample holds several.
TEST_CASE("cli: block-causal attention over MPI ranks matches one rank", "[cli][mpi]") {
  const std::string base = with_layout_shape(
      "--set train.micro_batch=1 --set train.eval_interval=10 --set train.eval_steps=2 "
      "--set data.eod_id=32");
  const std::string block = " --set data.document_mask=block_causal";
  const std::string args =
      base + block + " --set data.reset_position_ids=true --set data.eod_mask_loss=true";
  RunDir one(20);
  REQUIRE(one.trainer(args).exit_code == 0);
  auto last_loss = [&](const std::string& options) {
    RunDir run(20);
    REQUIRE(run.trainer(base + options).exit_code == 0);
    return run.metrics().back()["loss"].get<double>();
  };
  const double all = one.metrics().back()["loss"].get<double>(), none = last_loss("");
  CHECK(std::abs(none / all - 1) > 1e-4);
  CHECK(std::abs(last_loss(block) / all - 1) > 1e-4);  // eod_mask_loss acts
  CHECK(std::abs(last_loss(" --set data.reset_position_ids=true --set data.eod_mask_loss=true") /
                     all -
                 1) > 1e-4);  // block_causal acts
  // Under block-causal attention restarting the positions changes only rounding (RoPE is
  // relative); across documents it changes the training.
  CHECK(std::abs(last_loss(" --set data.reset_position_ids=true") / none - 1) > 1e-4);
  // Data without prepare_data's metadata names no end-of-document id: one line, exit 2.
  RunDir bare(10);
  test::expect_bad_input(bare.trainer("--set data.eod_mask_loss=true"),
                         "error: data.document_mask, reset_position_ids and eod_mask_loss need "
                         "the end-of-document token id, and the training data records none");
  for (const auto& [ranks, layout] : std::vector<std::pair<int, std::string>>{
           {2, " --set parallel.tp=2 --set parallel.sequence_parallel=true"},
           {2,
            " --set parallel.pp=2 --set parallel.pipeline_schedule=interleaved"
            " --set parallel.virtual_stages=2"},
           {2, " --set parallel.zero1=true"},
           {4, " --set parallel.pp=2 --set parallel.pipeline_schedule=zero_bubble"},
           {2, " --set parallel.cp=2"},
           {4, " --set parallel.cp=2 --set parallel.cp_comm=ring --set parallel.tp=2"}}) {
    RunDir run(20);
    CmdResult r = run.mpirun(ranks, args + layout);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    expect_same_training(one, run, 20, 160, "packed documents" + layout);
  }
}

// Checkpoints move between schedules: saved after 5 steps under one of 1f1b, interleaved (v 2)
// and zero-bubble, resumed under another, the next 5 losses and the final weights match an
// uninterrupted single-rank run.
TEST_CASE("cli: checkpoints move between 1f1b, interleaved and zero-bubble", "[cli][mpi]") {
  const std::string args =
      with_layout_shape("--set train.micro_batch=1 --set checkpoint.interval=5");
  const Straight want = run_straight(args, kLayoutShape);
  const std::string one_f = " --set parallel.pp=2";
  const std::string inter =
      " --set parallel.pp=2 --set parallel.pipeline_schedule=interleaved"
      " --set parallel.virtual_stages=2";
  const std::string zb = " --set parallel.pp=4 --set parallel.pipeline_schedule=zero_bubble";
  const std::pair<std::string, std::string> moves[] = {{one_f, inter}, {inter, zb}, {zb, one_f}};
  for (const auto& [saved, resumed] : moves) {
    RunDir run(10);
    INFO("saved with" << saved << ", resumed with" << resumed);
    REQUIRE(run.mpirun(4, args + saved + " --set train.exit_interval=5").exit_code == kExitStopped);
    expect_resumed_like(run, run.mpirun(4, args + resumed), want);
  }
}

// What the executor ran on each stage equals the textbook 1F1B order (warm-up forwards,
// one-forward-one-backward, cool-down backwards), written out here by hand.
TEST_CASE("cli: each pipeline stage executes the textbook 1F1B order", "[cli][mpi]") {
  RunDir run(1);
  auto executed = [&](int pp, int micro_batch) {
    CmdResult r =
        run_cmd(std::string(kOneThread) + " TR_TRACE_PIPELINE=1 " + tr::test::mpirun() + " " +
                std::to_string(pp) + " " + tr::test::trainer_bin() + " --config " + run.config +
                " --resume none --set checkpoint.dir=" +
                (run.dir / ("ck" + std::to_string(pp * 10 + micro_batch))) +
                " --set optim.warmup_steps=0 --set model.num_layers=4 --set parallel.pp=" +
                std::to_string(pp) + " --set train.micro_batch=" + std::to_string(micro_batch));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    std::vector<std::string> order(pp);
    for (int s = 0; s < pp; ++s) {
      const std::string tag = "pipeline stage " + std::to_string(s) + " executed: ";
      const size_t at = r.output.find(tag);
      REQUIRE(at != std::string::npos);
      order[s] = r.output.substr(at + tag.size(), r.output.find('\n', at) - at - tag.size());
    }
    return order;
  };
  // pp 4, 4 micro-batches of 2 samples.
  CHECK(executed(4, 2) ==
        std::vector<std::string>{"F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 F2 B0 F3 B1 B2 B3",
                                 "F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"});
  // pp 4, 2 micro-batches: fewer than stages.
  CHECK(executed(4, 4) ==
        std::vector<std::string>{"F0 F1 B0 B1", "F0 F1 B0 B1", "F0 F1 B0 B1", "F0 B0 F1 B1"});
  // pp 2, 8 micro-batches of 1.
  CHECK(executed(2, 1) ==
        std::vector<std::string>{"F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
                                 "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"});
}

// Launched by srun (PMIx) on the local Slurm, as on a cluster: tp 2 x dp 2 with ZeRO-1 matches
// one rank, and a bad layout is one error line. Run by ctest with the slurm fixture.
TEST_CASE("cli: srun -n 4 with tp 2 x dp 2 matches one rank", "[.slurm]") {
  REQUIRE(std::getenv("SLURM_CONF") != nullptr);  // started by tests/slurm/local_slurm.sh
  const std::string args = "--set train.micro_batch=2";
  RunDir one(10), four(10);
  REQUIRE(one.trainer(args).exit_code == 0);
  CmdResult r = four.srun(4, args + " --set parallel.tp=2 --set parallel.zero1=true");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("world 4 = tp 2 x dp 2 x pp 1") != std::string::npos);
  std::vector<nlohmann::json> a = one.metrics(), b = four.metrics();
  REQUIRE(b.size() == 10);
  for (size_t i = 0; i < a.size(); ++i)
    CHECK(std::abs(b[i]["loss"].get<double>() / a[i]["loss"].get<double>() - 1) < 1e-5);
  r = run_cmd("srun --overcommit -n 2 " + tr::test::trainer_bin() + " --config " +
              four.config);  // no PMI
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("error: started by srun with 2 tasks but without PMI") != std::string::npos);
  r = four.srun(4, "--set parallel.dp=2");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find(
            "error: rank 0: parallel layout: tp 1 x pp 1 x dp 2 = 2 ranks but this run has 4 "
            "processes; launch 2 ranks (srun -n 2) or change parallel.tp/pp/dp") !=
        std::string::npos);
}

// The production job's layout (configs/qwen2.5-72b.yaml: tp 8, pp 2) on 16 ranks under srun,
// with the model scaled down by --set but the head ratios kept (64 heads, 8 KV heads): its
// losses match a single rank's.
TEST_CASE("cli: the 72B layout, tp 8 x pp 2 on 16 srun ranks, matches one rank", "[.slurm]") {
  REQUIRE(std::getenv("SLURM_CONF") != nullptr);
  RunDir one(5), prod(5);
  const std::string shape =
      "--set model.num_heads=64 --set model.num_kv_heads=8 --set model.hidden_size=64 --set "
      "model.head_dim=8 "
      "--set model.num_layers=4 --set model.intermediate_size=128 --set model.vocab_size=257 "
      "--set model.max_seq_len=64 --set model.rope_theta=10000 --set train.micro_batch=2 "
      "--set checkpoint.interval=0";
  REQUIRE(one.trainer(shape).exit_code == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CmdResult r = prod.srun(16, shape + " --set parallel.tp=8 --set parallel.pp=2");
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("world 16 = tp 8 x dp 1 x pp 2") != std::string::npos);
  std::vector<nlohmann::json> a = one.metrics(), b = prod.metrics();
  REQUIRE(b.size() == 5);
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i + 1 << " one rank " << a[i]["loss"] << ", 16 ranks " << b[i]["loss"]);
    CHECK(std::abs(b[i]["loss"].get<double>() / a[i]["loss"].get<double>() - 1) < 1e-5);
  }
  std::printf(
      "16-rank srun run of the 72B layout: %.1f s wall, loss at step 5 %.6f (one rank %.6f)\n",
      wall, b[4]["loss"].get<double>(), a[4]["loss"].get<double>());
}

}  // namespace
}  // namespace tr
