// Multi-rank correctness in process: a layout's training step on 8 MPI ranks against one
// process's step of the same batch, tensor by tensor. Each rank builds its session as the
// trainer does (run/run.h open_session), takes one step, and sends the blocks of every tensor it
// owns (trainer/checkpoint/ownership.h: the fp32 weights after the update and both Adam moments)
// to rank 0, which assembles the global tensors and compares them with one rank's, naming the
// first tensor (in model order) whose gradient, update or second moment differs. After one
// step Adam's first moment is (1 - beta1) times the clipped gradient, so a wrong gradient is
// named by its tensor, not only seen as a different loss.
//
// Run by ctest under `mpirun -n 8`; with another number of ranks it exits 77 (skipped).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/exit_codes.h"
#include "parallel/mpi_comm.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"
#include "trainer/checkpoint/ownership.h"
#include "trainer/model/op_list.h"
#include "trainer/run/run.h"
#include "trainer/step/step.h"

namespace tr {
namespace {

constexpr int kRanks = 8;

// The global tensors of a run after its step: weights, Adam m and v by name, in model order.
struct GlobalState {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int64_t>> shape;
  std::map<std::string, std::array<std::vector<float>, 3>> sets;  // params, exp_avg, exp_avg_sq
  double loss = 0, grad_norm = 0;
};

// Copies a block (whole, a run of a vector, or rows x columns of a matrix) into its tensor.
void place(const ckpt::TensorRef& block, const float* data, const std::vector<int64_t>& shape,
           std::vector<float>& into) {
  if (block.whole()) {
    std::copy(data, data + block.block_numel(), into.begin());
    return;
  }
  TR_ASSERT(shape.size() <= 2, "blocks of vectors and matrices only");
  if (shape.size() == 1) {
    std::copy(data, data + block.extent[0], into.begin() + block.start[0]);
    return;
  }
  const int64_t cols = shape[1];
  for (int64_t r = 0; r < block.extent[0]; ++r)
    std::copy(data + r * block.extent[1], data + (r + 1) * block.extent[1],
              into.begin() + (block.start[0] + r) * cols + block.start[1]);
}

// A session of `dir`'s config with `sets`, over the MPI world or one process, after one step.
struct Stepped {
  std::unique_ptr<Session> s;
  StepMetrics m;
};

Stepped step_once(const test::RunDir& dir, const std::vector<std::string>& sets, bool mpi) {
  Stepped out;
  out.s = std::make_unique<Session>();
  Session& s = *out.s;
  s.opts.config = dir.config;
  s.opts.sets = sets;
  s.groups.world = mpi ? make_mpi_world() : make_self_comm("world");
  // A failure before the comparison ends every rank (fatal_error's MPI_Abort): a Catch2 failure
  // on one rank would leave the others waiting in a collective.
  TR_ASSERT(open_session(s) == kExitOk, "the session did not open (its error is above)");
  StepGuard guard(s.cfg.train);
  absl::StatusOr<FaultInjector> fault = FaultInjector::from_switches();
  TR_ASSERT(fault.ok(), fault.status().ToString());
  OpLog log;
  s.model->set_op_log(&log);
  const StepOutcome step = train_step(s, out.m, guard, *fault);
  s.model->set_op_log(nullptr);
  TR_ASSERT(step.code == kExitOk && step.ran, "the step failed: " + step.status.ToString());
  // The kernels this rank's model ran are those its op list (the planner's and bench_ops') says.
  const std::string differs = op_count_difference(
      log.counts(),
      op_counts(model_ops(s.model->dims(), s.model->options(), s.layout.micro_batches)));
  INFO("rank " << s.topo().rank << ", kernels run against the model's op list:\n" << differs);
  CHECK(!log.counts().empty());
  CHECK(differs.empty());
  return out;
}

// Every rank's owned blocks on rank 0, as global tensors (empty on the other ranks).
GlobalState gather(Session& s, const StepMetrics& m) {
  Comm& world = *s.groups.world;
  const bool sharded = s.opt->masters_sharded();
  const RankBuffers mine{s.opt->masters().ptr<float>(), sharded, s.opt->exp_avg().ptr<float>(),
                         s.opt->exp_avg_sq().ptr<float>()};
  const std::vector<ckpt::ShardPiece> own = owned_pieces(s.cfg, s.topo(), mine);
  GlobalState g;
  if (world.rank() != 0) {
    for (const ckpt::ShardPiece& p : own)
      if (const int64_t n = p.ref.block_numel(); n > 0)
        world.send(Tensor(const_cast<float*>(p.ref.data), DType::f32, Device::cpu, {n}), 0);
    return g;
  }
  g.loss = m.loss;
  g.grad_norm = m.grad_norm;
  for (const ckpt::TensorRef& t : model_tensors(s.cfg, s.topo())) {
    g.order.push_back(t.name);
    g.shape[t.name] = t.shape;
    for (std::vector<float>& v : g.sets[t.name]) v.assign(static_cast<size_t>(t.block_numel()), 0);
  }
  std::vector<float> buf;
  for (int k = 0; k < world.size(); ++k) {
    const std::vector<ckpt::ShardPiece> pieces =
        k == 0 ? own : owned_pieces(s.cfg, s.topo().of_rank(k), RankBuffers{nullptr, sharded});
    for (const ckpt::ShardPiece& p : pieces) {
      const int64_t n = p.ref.block_numel();
      if (n == 0) continue;
      const float* data = p.ref.data;
      if (k != 0) {
        buf.resize(static_cast<size_t>(n));
        world.recv(Tensor(buf.data(), DType::f32, Device::cpu, {n}), k);
        data = buf.data();
      }
      place(p.ref, data, g.shape.at(p.ref.name), g.sets.at(p.ref.name)[static_cast<int>(p.set)]);
    }
  }
  return g;
}

// max |a - b| / max |b| over one tensor (0 when b is all zero and a equals it).
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// The first tensor of `got` (model order) that differs from `want` by more than its set's
// tolerance, as "name: what (relative difference)"; "" when none does. Prints every tensor's
// differences. The gradient and Adam v differ by rounding only (a few 1e-7 here). The update
// is looser: Adam's first step moves each weight by lr g / (|g| + eps), so an element whose
// gradient is near zero turns a rounding difference into up to about 2e-4 of the tensor's
// largest weight; a wrong learning rate or a skipped shard moves it by lr, over 1e-2.
std::string first_difference(const GlobalState& got, const GlobalState& want) {
  static const char* kWhat[3] = {"weights after the update", "gradient (Adam m)", "Adam v"};
  std::string first;
  std::printf("%-44s %10s %10s %10s\n", "tensor", "update", "gradient", "adam v");
  for (const std::string& name : want.order) {
    const auto& a = got.sets.at(name);
    const auto& b = want.sets.at(name);
    const double d[3] = {rel_diff(a[0], b[0]), rel_diff(a[1], b[1]), rel_diff(a[2], b[2])};
    std::printf("%-44s %10.2e %10.2e %10.2e\n", name.c_str(), d[0], d[1], d[2]);
    // The gradient first: a wrong gradient makes a wrong update and v too.
    constexpr double kTol[3] = {1e-3, 1e-5, 1e-5};
    for (int set : {1, 0, 2})
      if (first.empty() && !(d[set] <= kTol[set]))
        first = name + ": " + kWhat[set] + " (relative difference " + std::to_string(d[set]) + ")";
  }
  return first;
}

// One rank's step of `sets`, once per process and sets.
const GlobalState& one_rank_reference(const std::vector<std::string>& sets) {
  static std::map<std::string, GlobalState> refs;
  const std::string key = absl::StrJoin(sets, " ");
  if (!refs.contains(key)) {
    test::RunDir dir(1);
    Stepped one = step_once(dir, sets, /*mpi=*/false);
    refs[key] = gather(*one.s, one.m);
  }
  return refs.at(key);
}

// The tiny model in a shape every layout below divides: 8 query and 4 KV heads, 4 layers.
const std::vector<std::string> kShape = {
    "model.num_heads=8",     "model.num_kv_heads=4", "model.head_dim=8", "model.num_layers=4",
    "train.micro_batch=2",   "train.global_batch=8", "train.steps=1",    "train.eval_interval=0",
    "checkpoint.interval=0", "optim.warmup_steps=1"};

// `layout` (with `shape`'s changes to kShape, which the one rank takes too) on 8 ranks against one
// rank.
void expect_layout_matches_one_rank(const std::vector<std::string>& layout,
                                    const std::vector<std::string>& shape = {}) {
  // Every rank its own run directory (the same data); rank 0 computes the reference first.
  test::RunDir dir(1);
  int rank = 0;
  {
    std::unique_ptr<Comm> world = make_mpi_world();
    rank = world->rank();
  }
  std::vector<std::string> sets = kShape;
  sets.insert(sets.end(), shape.begin(), shape.end());
  const GlobalState* want = rank == 0 ? &one_rank_reference(sets) : nullptr;
  sets.insert(sets.end(), layout.begin(), layout.end());
  Stepped run = step_once(dir, sets, /*mpi=*/true);
  const GlobalState got = gather(*run.s, run.m);
  if (rank != 0) return;
  INFO("layout: " << absl::StrJoin(layout, " "));
  CHECK(std::abs(got.loss / want->loss - 1) < 1e-6);
  CHECK(std::abs(got.grad_norm / want->grad_norm - 1) < 1e-5);
  const std::string first = first_difference(got, *want);
  INFO("the first tensor that differs from one rank's: " << first);
  CHECK(first.empty());
}

TEST_CASE(
    "layouts: tp 2 x pp 2 x dp 2 with ZeRO-1 and sequence parallelism match one rank tensor by "
    "tensor",
    "[mpi]") {
  expect_layout_matches_one_rank(
      {"parallel.tp=2", "parallel.pp=2", "parallel.zero1=true", "parallel.sequence_parallel=true"});
}

TEST_CASE("layouts: cp 2 (ring) x tp 2 x pp 2 match one rank tensor by tensor", "[mpi]") {
  expect_layout_matches_one_rank({"parallel.cp=2", "parallel.cp_comm=ring", "parallel.tp=2",
                                  "parallel.pp=2", "parallel.sequence_parallel=true"});
}

// The llama family (no q, k, v biases; Llama 3's RoPE rule over the tiny model's context) under
// the same layouts.
const std::vector<std::string> kLlama = {
    "model.family=llama",
    "model.rope_scaling={type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, "
    "original_max_position_embeddings: 64}"};

TEST_CASE(
    "layouts: the llama family under tp 2 x pp 2 x dp 2 with ZeRO-1 and sequence parallelism "
    "matches one rank tensor by tensor",
    "[mpi]") {
  expect_layout_matches_one_rank(
      {"parallel.tp=2", "parallel.pp=2", "parallel.zero1=true", "parallel.sequence_parallel=true"},
      kLlama);
}

TEST_CASE(
    "layouts: the llama family under cp 2 (ring) x tp 2 x pp 2 matches one rank tensor by "
    "tensor",
    "[mpi]") {
  expect_layout_matches_one_rank({"parallel.cp=2", "parallel.cp_comm=ring", "parallel.tp=2",
                                  "parallel.pp=2", "parallel.sequence_parallel=true"},
                                 kLlama);
}

// The qwen3 family: QK-norm weights shared by the heads that tp splits (their gradients summed
// over TP with or without sequence parallelism).
TEST_CASE(
    "layouts: the qwen3 family under tp 2 x pp 2 x dp 2 with ZeRO-1 matches one rank tensor "
    "by tensor",
    "[mpi]") {
  expect_layout_matches_one_rank(
      {"parallel.tp=2", "parallel.pp=2", "parallel.zero1=true", "parallel.sequence_parallel=false"},
      {"model.family=qwen3"});
}

TEST_CASE(
    "layouts: the qwen3 family under cp 2 (ring) x tp 2 x pp 2 with sequence parallelism "
    "matches one rank tensor by tensor",
    "[mpi]") {
  expect_layout_matches_one_rank({"parallel.cp=2", "parallel.cp_comm=ring", "parallel.tp=2",
                                  "parallel.pp=2", "parallel.sequence_parallel=true"},
                                 {"model.family=qwen3"});
}

// The pipeline schedules (parallel.pipeline_schedule) with the other parallelisms. Each ctest
// entry is its own process, so each reference is computed once.
TEST_CASE(
    "layouts: interleaved v 2 x pp 2 x tp 2 x dp 2 with ZeRO-1 and sequence parallelism match one "
    "rank tensor by tensor",
    "[mpi]") {
  expect_layout_matches_one_rank({"parallel.pipeline_schedule=interleaved",
                                  "parallel.virtual_stages=2", "parallel.tp=2", "parallel.pp=2",
                                  "parallel.zero1=true", "parallel.sequence_parallel=true"});
}

TEST_CASE(
    "layouts: zero-bubble pp 2 x tp 2 x dp 2 with ZeRO-1 and sequence parallelism match one rank "
    "tensor by tensor",
    "[mpi]") {
  expect_layout_matches_one_rank({"parallel.pipeline_schedule=zero_bubble", "parallel.tp=2",
                                  "parallel.pp=2", "parallel.zero1=true",
                                  "parallel.sequence_parallel=true"});
}

TEST_CASE(
    "layouts: interleaved v 2 x pp 4 x dp 2 with ZeRO-1 and full recompute match one rank tensor "
    "by tensor",
    "[mpi]") {
  // 8 layers in 8 virtual stages; micro-batches of one sample: 4 per step, a multiple of pp.
  expect_layout_matches_one_rank(
      {"parallel.pipeline_schedule=interleaved", "parallel.virtual_stages=2", "parallel.pp=4",
       "parallel.zero1=true"},
      {"model.num_layers=8", "train.micro_batch=1", "train.recompute=full"});
}

TEST_CASE(
    "layouts: zero-bubble pp 4 x dp 2 with ZeRO-1 and full recompute match one rank tensor by "
    "tensor",
    "[mpi]") {
  expect_layout_matches_one_rank(
      {"parallel.pipeline_schedule=zero_bubble", "parallel.pp=4", "parallel.zero1=true"},
      {"train.micro_batch=1", "train.recompute=full"});
}

TEST_CASE("layouts: interleaved v 2 and zero-bubble under cp 2 x tp 2 x pp 2 match one rank",
          "[mpi]") {
  expect_layout_matches_one_rank({"parallel.pipeline_schedule=interleaved",
                                  "parallel.virtual_stages=2", "parallel.cp=2", "parallel.tp=2",
                                  "parallel.pp=2", "parallel.sequence_parallel=true"});
  expect_layout_matches_one_rank({"parallel.pipeline_schedule=zero_bubble", "parallel.cp=2",
                                  "parallel.cp_comm=ring", "parallel.tp=2", "parallel.pp=2",
                                  "train.recompute=selective"});
}

// The qwen3_moe family: layers 0, 1 and 3 a mixture of 4 experts, 2 chosen per token (layer 2
// dense), the load-balancing loss weighed 0.02: the router whole on every TP rank, each expert's
// intermediate split over TP, the router statistics carried along the pipeline (and summed over
// CP) and the loss's gradient carried back.
const std::vector<std::string> kMoe = {
    "model.family=qwen3_moe",    "model.num_experts=4",
    "model.experts_per_token=2", "model.moe_intermediate_size=32",
    "model.mlp_only_layers=[2]", "model.router_aux_loss_coef=0.02"};

TEST_CASE(
    "layouts: the qwen3_moe family under tp 2 x pp 2 x dp 2 with ZeRO-1 and sequence "
    "parallelism matches one rank tensor by tensor",
    "[mpi]") {
  expect_layout_matches_one_rank(
      {"parallel.tp=2", "parallel.pp=2", "parallel.zero1=true", "parallel.sequence_parallel=true"},
      kMoe);
}

TEST_CASE(
    "layouts: the qwen3_moe family under cp 2 (ring) x tp 2 x pp 2 with zero-bubble and "
    "selective recompute matches one rank tensor by tensor",
    "[mpi]") {
  expect_layout_matches_one_rank(
      {"parallel.pipeline_schedule=zero_bubble", "parallel.cp=2", "parallel.cp_comm=ring",
       "parallel.tp=2", "parallel.pp=2", "train.recompute=selective"},
      kMoe);
}

TEST_CASE(
    "layouts: the qwen3_moe family under interleaved v 2 x pp 2 x tp 2 x dp 2 with full "
    "recompute matches one rank tensor by tensor",
    "[mpi]") {
  expect_layout_matches_one_rank(
      {"parallel.pipeline_schedule=interleaved", "parallel.virtual_stages=2", "parallel.tp=2",
       "parallel.pp=2", "train.recompute=full"},
      kMoe);
}

// Expert parallelism: the experts split over ep ranks of dp x cp, the routed rows exchanged, the
// experts' gradients reduced (and under ZeRO-1 sharded) over their own replicas.
TEST_CASE(
    "layouts: the qwen3_moe family under tp 2 x ep 2 x pp 2 with ZeRO-1 and sequence "
    "parallelism matches one rank tensor by tensor",
    "[mpi]") {
  expect_layout_matches_one_rank({"parallel.tp=2", "parallel.pp=2", "parallel.ep=2",
                                  "parallel.zero1=true", "parallel.sequence_parallel=true"},
                                 kMoe);
}

// With a capacity factor each rank drops its own micro-batch's overflow before the exchange, as
// one rank does for the same micro-batch.
TEST_CASE(
    "layouts: the qwen3_moe family under ep 2 of dp 4 x pp 2 with ZeRO-1 and zero-bubble and "
    "selective recompute and a capacity factor matches one rank tensor by tensor",
    "[mpi]") {
  std::vector<std::string> moe = kMoe;
  moe.push_back("model.capacity_factor=0.75");
  expect_layout_matches_one_rank(
      {"parallel.pp=2", "parallel.ep=2", "parallel.zero1=true",
       "parallel.pipeline_schedule=zero_bubble", "train.recompute=selective"},
      moe);
}

TEST_CASE(
    "layouts: the qwen3_moe family under ep 4 of cp 2 x dp 2 x pp 2 with full recompute "
    "matches one rank tensor by tensor",
    "[mpi]") {
  expect_layout_matches_one_rank(
      {"parallel.cp=2", "parallel.pp=2", "parallel.ep=4", "train.recompute=full"}, kMoe);
}

// FP8 projections (train.precision: fp8) under layouts: every rank runs the casts and FP8
// products its op list says (step_once checks them), in a whole backward with the TP overlap and
// in a zero-bubble one's two passes. Not against one rank: each rank scales its own shards of
// the operands, so FP8's rounding depends on the layout (tests/run/test_fp8_train.cpp trains it).
TEST_CASE(
    "layouts: FP8 projections run the listed ops under tp with sp and under cp with zero-bubble",
    "[mpi]") {
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"parallel.tp=2", "parallel.pp=2", "parallel.zero1=true",
                                 "parallel.sequence_parallel=true", "parallel.overlap_tp=true"},
        std::vector<std::string>{"parallel.pipeline_schedule=zero_bubble", "parallel.cp=2",
                                 "parallel.tp=2", "parallel.pp=2", "train.recompute=selective"}}) {
    test::RunDir dir(1);
    std::vector<std::string> sets = kShape;
    sets.push_back("train.precision=fp8");
    sets.insert(sets.end(), layout.begin(), layout.end());
    const Stepped run = step_once(dir, sets, /*mpi=*/true);
    CHECK(std::isfinite(run.m.loss));
  }
}

// FP8 trains under tp 2 x pp 2 x dp 2 with ZeRO-1 and sequence parallelism: 30 steps of the
// licence texts, each rank scaling its own shards, reach the same layout's fp32 loss (the mean
// of the last 10 steps within 2%) without being fp32.
TEST_CASE("layouts: FP8 under tp 2 x pp 2 x dp 2 with ZeRO-1 trains to the fp32 loss", "[mpi]") {
  constexpr int kSteps = 30;
  int rank = 0;
  const auto losses = [&](const char* precision) {
    test::RunDir dir(1);
    test::write_licence_texts(dir.dir / "train");
    Session s;
    s.opts.config = dir.config;
    s.opts.sets = kShape;
    for (const char* set : {"parallel.tp=2", "parallel.pp=2", "parallel.zero1=true",
                            "parallel.sequence_parallel=true"})
      s.opts.sets.emplace_back(set);
    s.opts.sets.push_back(std::string("train.precision=") + precision);
    s.opts.sets.push_back("train.steps=" + std::to_string(kSteps));
    s.groups.world = make_mpi_world();
    rank = s.groups.world->rank();
    TR_ASSERT(open_session(s) == kExitOk, "the session did not open (its error is above)");
    StepGuard guard(s.cfg.train);
    absl::StatusOr<FaultInjector> fault = FaultInjector::from_switches();
    TR_ASSERT(fault.ok(), fault.status().ToString());
    std::vector<double> out;
    for (int i = 0; i < kSteps; ++i) {
      StepMetrics m;
      const StepOutcome step = train_step(s, m, guard, *fault);
      TR_ASSERT(step.code == kExitOk && step.ran, "the step failed: " + step.status.ToString());
      out.push_back(m.loss);
    }
    return out;
  };
  const std::vector<double> fp32 = losses("bf16"), fp8 = losses("fp8");
  if (rank != 0) return;  // rank 0 reports the step's loss
  double a = 0, b = 0;
  for (int i = kSteps - 10; i < kSteps; ++i) a += fp32[i] / 10, b += fp8[i] / 10;
  INFO("mean loss of the last 10 steps: fp32 " << a << ", fp8 " << b << " (from " << fp32[0]
                                               << ")");
  CHECK(a < fp32[0] - 1.0);
  CHECK(std::abs(b - a) / a < 0.02);
  CHECK(fp8[0] != fp32[0]);
}

}  // namespace
}  // namespace tr

int main(int argc, char** argv) {
  if (!tr::launched_by_mpi_launcher()) {
    std::printf("test_layouts: needs mpirun -n %d (ctest runs it so); skipped\n", tr::kRanks);
    return 77;
  }
  tr::MpiRuntime mpi(&argc, &argv);
  {
    std::unique_ptr<tr::Comm> world = tr::make_mpi_world();
    if (world->size() != tr::kRanks) {
      std::printf("test_layouts: needs %d ranks, has %d; skipped\n", tr::kRanks, world->size());
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
