// bench_ops: each op of one GPU's training step, timed at the shapes `trainer plan` models for a
// config and layout, beside the planner's prediction for it (trainer/plan/step_model.h). On a
// GPU this measures what the planner assumes (the GEMMs' shape factor, attention's fractions of
// the peak, the memory-bound passes' share of the copy bandwidth), op by op; on the CPU it runs
// the same ops at the same shapes (slowly: for a small config, to check the tool).
//
//   bench_ops --config FILE [--set K=V ...] [--backend cuda|cpu] [--gpu NAME] [--nodes N]
//             [--gpus-per-node G] [--stage S] [--repeats R] [--only TEXT] [--json FILE]
//             [--doc-len L] [--hardware FILE ...] [--calibration FILE] [--fp8]
// (--help lists the flags; tools/flags.h reads them.)
//
// Prints one Markdown table (op, shape, times per step, predicted and measured microseconds per
// run, their ratio, the rate reached, the step's seconds in it) and the totals by op class. The
// layout (tp, pp, cp 1, micro-batch) gives the per-GPU shapes: the 72B job's tp 8 stage runs on
// one GPU here. Inputs are random (never zeros), each op runs once to warm up, then R times;
// the median run counts. Then what the ops reached, as the efficiencies of the planner's GPU
// table (core/hardware.h), which --calibration writes as a `trainer plan --hardware` file.
// --fp8 adds a table of each GEMM run as the FP8 path runs it (time_fp8).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/bf16.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "tools/flags.h"
#include "trainer/config/config.h"
#include "trainer/model/model_layout.h"
#include "trainer/plan/hardware_file.h"
#include "trainer/plan/plan.h"
#include "trainer/plan/step_model.h"

// The flags, read by tools/flags.h's parser; --help lists them from these definitions.
ABSL_FLAG(std::string, config, "", "FILE: the trainer config whose step is timed (required)");
ABSL_FLAG(tr::tools::Repeated, set, {},
          "K=V: overrides a key of the config, as the trainer's --set");
ABSL_FLAG(std::string, backend, "",
          "cuda or cpu (default: cuda where a device is visible, else cpu)");
ABSL_FLAG(std::string, gpu, "",
          "the GPU table entry the prediction uses (default: this device's, else h100)");
ABSL_FLAG(tr::tools::Positive, nodes, tr::tools::Positive{1}, "N: nodes of the layout");
ABSL_FLAG(std::optional<tr::tools::Positive>, gpus_per_node, std::nullopt,
          "G: GPUs per node (default: one node of tp x pp x cp, dp 1)");
ABSL_FLAG(std::optional<tr::tools::Count>, stage, std::nullopt,
          "S: the pipeline stage whose ops are timed (default: the slowest)");
ABSL_FLAG(std::optional<tr::tools::Positive>, repeats, std::nullopt,
          "R: timed runs per op, after one to warm up; the median counts (default 10 on cuda, 1 "
          "on cpu)");
ABSL_FLAG(std::string, only, "", "TEXT: times only the ops whose name contains TEXT");
ABSL_FLAG(std::string, json, "", "FILE: writes every row to FILE");
ABSL_FLAG(std::optional<tr::tools::Positive>, doc_len, std::nullopt,
          "L: runs attention block-causal over documents of L tokens (the planner's span)");
ABSL_FLAG(tr::tools::Repeated, hardware, {},
          "FILE: overrides the GPU table's numbers as trainer plan's --hardware does, each file "
          "over the last");
ABSL_FLAG(std::string, calibration, "",
          "FILE: writes what the ops reached (GEMM fill, attention fractions at this head_dim, "
          "stream fraction) as a file for trainer plan --hardware");
ABSL_FLAG(bool, fp8, false,
          "also times each GEMM as linear_fp8 on FP8 codes and the fp8_cast of its operand, in a "
          "table of their own");

namespace {

using tr::Device;
using tr::DType;
using tr::StepOp;
using tr::Tensor;

const tr::tools::Usage kUsage{
    .tool = "bench_ops",
    .file = __FILE__,
    .synopsis =
        "bench_ops --config FILE [--set K=V ...] [--backend cuda|cpu] [--gpu NAME] "
        "[--nodes N] [--gpus-per-node G] [--stage S] [--repeats R] [--only TEXT] "
        "[--json FILE] [--doc-len L] [--hardware FILE ...] [--calibration FILE] [--fp8]",
    .about =
        "Times each op of one GPU's step at the shapes trainer plan models for the config's "
        "layout (pipeline stage S), beside the planner's prediction, on N x G GPUs; then "
        "what the ops reached, as the GPU table's efficiencies.",
    .positionals = false,
    .error_prefix = "bench_ops: "};

struct Args {
  std::string config, backend, gpu, only, json, calibration;
  std::vector<std::string> sets, hardware;
  int nodes = 1, gpus_per_node = 0, stage = -1, repeats = 0;  // 0: tp x pp x cp GPUs
  int doc_len = 0;  // > 0: block-causal attention over documents of this many tokens
  bool fp8 = false;
};

// The flags, checked together (the defaults that depend on the device filled in).
absl::StatusOr<Args> parse(int argc, char** argv) {
  tr::tools::parse_or_exit(argc, argv, kUsage);
  Args a;
  a.config = absl::GetFlag(FLAGS_config);
  a.sets = absl::GetFlag(FLAGS_set).values;
  a.backend = absl::GetFlag(FLAGS_backend);
  a.gpu = absl::GetFlag(FLAGS_gpu);
  a.only = absl::GetFlag(FLAGS_only);
  a.json = absl::GetFlag(FLAGS_json);
  a.hardware = absl::GetFlag(FLAGS_hardware).values;
  a.calibration = absl::GetFlag(FLAGS_calibration);
  a.fp8 = absl::GetFlag(FLAGS_fp8);
  a.nodes = static_cast<int>(absl::GetFlag(FLAGS_nodes).value);
  a.gpus_per_node = static_cast<int>(tr::tools::value_or(absl::GetFlag(FLAGS_gpus_per_node), 0));
  a.stage = static_cast<int>(tr::tools::value_or(absl::GetFlag(FLAGS_stage), -1));
  a.doc_len = static_cast<int>(tr::tools::value_or(absl::GetFlag(FLAGS_doc_len), 0));
  if (a.config.empty()) return absl::InvalidArgumentError("--config is required; see --help");
  if (a.backend.empty()) a.backend = tr::cuda::device_available() ? "cuda" : "cpu";
  if (a.backend != "cuda" && a.backend != "cpu")
    return absl::InvalidArgumentError("--backend " + a.backend + ": use cuda or cpu");
  if (a.backend == "cuda" && !tr::cuda::device_available())
    return absl::InvalidArgumentError("--backend cuda: no CUDA device here; use --backend cpu");
  a.repeats = static_cast<int>(
      tr::tools::value_or(absl::GetFlag(FLAGS_repeats), a.backend == "cuda" ? 10 : 1));
  return a;
}

// Device buffers of random values (uniform in [-1, 1), bf16 or f32): a host block of random
// values copied over the buffer, so that a large buffer costs one upload and device copies.
class Arena {
 public:
  Arena(tr::Ctx ctx, DType act) : ctx_(ctx), act_(act) {}
  Tensor random(DType dt, std::initializer_list<int64_t> shape) {
    Tensor t = empty(dt, shape);
    fill(t.view({t.numel()}));
    return t;
  }
  // Not filled (for an op's output: FP8 codes, a scale).
  Tensor empty(DType dt, std::initializer_list<int64_t> shape) {
    Tensor t(nullptr, dt, ctx_.device, shape);
    buffers_.emplace_back(std::max<size_t>(t.nbytes(), 1), ctx_.device);
    t.data = buffers_.back().data();
    return t;
  }
  Tensor act(std::initializer_list<int64_t> shape) { return random(act_, shape); }
  // i32 ids in [0, below).
  Tensor ids(int64_t n, int64_t below) {
    std::vector<int32_t> h(static_cast<size_t>(n));
    std::mt19937 rng(7);
    for (int32_t& x : h) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(below));
    buffers_.emplace_back(static_cast<size_t>(n) * 4, ctx_.device);
    Tensor t(buffers_.back().data(), DType::i32, ctx_.device, {n});
    tr::copy_tensor(t, Tensor(h.data(), DType::i32, Device::cpu, {n}));
    return t;
  }
  // i32 `values` on the device.
  Tensor ints(const std::vector<int32_t>& values) {
    const auto n = static_cast<int64_t>(values.size());
    buffers_.emplace_back(static_cast<size_t>(std::max<int64_t>(n, 1)) * 4, ctx_.device);
    Tensor t(buffers_.back().data(), DType::i32, ctx_.device, {n});
    tr::copy_tensor(t, Tensor(const_cast<int32_t*>(values.data()), DType::i32, Device::cpu, {n}));
    return t;
  }
  void clear() { buffers_.clear(); }

 private:
  void fill(Tensor t) {
    const int64_t n = t.numel();
    const int64_t block = std::min<int64_t>(n, int64_t{1} << 22);
    std::vector<uint8_t> host(static_cast<size_t>(block) * tr::dtype_size(t.dtype));
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t i = 0; i < block; ++i) {
      const float x = u(rng);
      if (t.dtype == DType::bf16)
        reinterpret_cast<uint16_t*>(host.data())[i] = tr::f32_to_bf16(x);
      else if (t.dtype == DType::f32)
        reinterpret_cast<float*>(host.data())[i] = x;
      else
        reinterpret_cast<double*>(host.data())[i] = x;
    }
    for (int64_t at = 0; at < n; at += block) {
      const int64_t c = std::min(block, n - at);
      tr::copy_tensor(t.at(at, {c}), Tensor(host.data(), t.dtype, Device::cpu, {c}));
    }
  }
  tr::Ctx ctx_;
  DType act_;
  std::vector<tr::Buffer> buffers_;
};

// Seconds of each of `repeats` runs of `run` after one to warm up: CUDA events around each run
// on a GPU (no host sync between them), the host clock around each on the CPU.
std::vector<double> time_runs(tr::Ctx& ctx, int repeats, const std::function<void()>& run) {
  run();
  tr::synchronize(ctx);
  std::vector<double> s;
  if (ctx.device == Device::cuda) {
    tr::cuda::EventTimeline timeline(ctx, repeats + 1);
    for (int i = 0; i < repeats; ++i) {
      timeline.mark(i);
      run();
    }
    timeline.mark(repeats);
    tr::synchronize(ctx);
    std::vector<double> each(static_cast<size_t>(repeats), 0.0);
    timeline.collect(each.data(), repeats, timeline.marked());
    return each;
  }
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The kernel call that runs `op` (at its shape, on random inputs made in `arena`), or empty for
// an op this tool does not run.
// --doc-len: a micro-batch's document starts (documents of `len` tokens, each sequence's last
// one shorter where len does not divide it), their bounds, and the keys a query attends to on
// average (the planner's attention span: the documents' lengths squared per token).
struct Documents {
  std::vector<int32_t> start;
  tr::DocCount found;
  double span = 0;
  Documents(int64_t batch, int64_t seq, int64_t len) {
    double sq = 0;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t at = 0; at < seq; at += len) {
        const int64_t n = std::min(len, seq - at);
        sq += static_cast<double>(n * n);
        start.insert(start.end(), static_cast<size_t>(n), static_cast<int32_t>(at));
      }
    found = tr::count_documents(start.data(), batch * seq, seq);
    span = sq / static_cast<double>(batch * seq);
  }
};

// A call of the kernel that runs `op` (StepOp::kernel, at its shape), on buffers of `arena`;
// empty for a kernel this tool has no call for.
std::function<void()> runner(const StepOp& op, const tr::ModelDims& d, const tr::Config& cfg,
                             tr::Ctx& ctx, Arena& arena, const Documents* documents) {
  const std::string& kernel = op.kernel;
  const DType f32 = DType::f32;
  if (op.cls == tr::OpClass::gemm) {
    // Back to the projection's own shape: out [T, N] = in [T, K] . W [N, K]^T.
    int64_t T = op.m, N = op.n, K = op.k;
    if (kernel == "linear_bwd.din") T = op.m, N = op.k, K = op.n;
    if (kernel == "linear_bwd.dweight") T = op.k, N = op.m, K = op.n;
    Tensor in = arena.act({T, K}), w = arena.act({N, K}), out = arena.act({T, N});
    if (kernel == "linear_fwd")
      return [&ctx, out, in, w] { tr::linear_fwd(ctx, out, in, w, Tensor()); };
    if (kernel == "linear_bwd.din") {
      Tensor din = arena.act({T, K});
      return [&ctx, din, in, w, out] { tr::linear_bwd(ctx, din, Tensor(), Tensor(), out, in, w); };
    }
    Tensor dw = arena.random(f32, {N, K});
    return [&ctx, dw, out, in, w] { tr::linear_bwd(ctx, Tensor(), dw, Tensor(), out, in, w); };
  }
  const int64_t T = op.m, W = op.n;
  const int batch = static_cast<int>(cfg.train.micro_batch);
  const int seq = static_cast<int>(cfg.data.seq_len);  // parallel.cp 1
  const int nh = static_cast<int>(d.heads), nkv = static_cast<int>(d.kv_heads),
            hd = static_cast<int>(d.head_dim);
  if (kernel == "attention_fwd" || kernel == "attention_bwd") {
    const int64_t rows = static_cast<int64_t>(batch) * seq;
    tr::attention_prepare(ctx, batch, seq, nh, nkv, hd, 0, documents != nullptr);
    Tensor qkv = arena.act({rows, d.qkv_out()}), out = arena.act({rows, int64_t{nh} * hd});
    Tensor lse = arena.random(f32, {int64_t{batch}, int64_t{nh}, int64_t{seq}});
    const tr::DocStarts docs =
        documents == nullptr ? tr::DocStarts{}
                             : tr::DocStarts{arena.ints(documents->start), documents->start.data()};
    // lse and out for the backward (and the ragged graphs built before the timing)
    tr::attention_fwd(ctx, out, lse, qkv, batch, seq, nh, nkv, hd, docs);
    if (kernel == "attention_fwd")
      return [=, &ctx] { tr::attention_fwd(ctx, out, lse, qkv, batch, seq, nh, nkv, hd, docs); };
    Tensor dout = arena.act({rows, int64_t{nh} * hd}), dqkv = arena.act({rows, d.qkv_out()});
    return [=, &ctx] {
      tr::attention_bwd(ctx, dqkv, dout, out, lse, qkv, batch, seq, nh, nkv, hd, docs);
    };
  }
  const float eps = static_cast<float>(cfg.model.rms_norm_eps);
  if (kernel == "rmsnorm_fwd" || kernel == "rmsnorm_bwd" || kernel == "add_rmsnorm_fwd") {
    Tensor in = arena.act({T, W}), w = arena.act({W}), out = arena.act({T, W});
    Tensor rstd = arena.random(f32, {T});
    if (kernel == "rmsnorm_fwd") return [=, &ctx] { tr::rmsnorm_fwd(ctx, out, rstd, in, w, eps); };
    if (kernel == "add_rmsnorm_fwd") {
      Tensor b = arena.act({T, W}), sum = arena.act({T, W});
      return [=, &ctx] { tr::add_rmsnorm_fwd(ctx, sum, out, rstd, in, b, w, eps); };
    }
    Tensor dw = arena.random(f32, {W});
    return [=, &ctx] { tr::rmsnorm_bwd(ctx, out, dw, in, in, w, rstd); };
  }
  if (kernel == "add") {
    Tensor a = arena.act({T, W}), b = arena.act({T, W}), out = arena.act({T, W});
    return [=, &ctx] { tr::add(ctx, out, a, b); };
  }
  if (kernel == "cast") {
    Tensor in = arena.act({T, W}), out = arena.act({T, W});
    return [=, &ctx] { tr::cast(ctx, out, in); };
  }
  if (kernel == "zero_") {
    Tensor x = arena.random(f32, {T, W});
    return [=, &ctx] { tr::zero_(ctx, x); };
  }
  if (kernel == "qkv_split" || kernel == "qkv_join") {
    Tensor qkv = arena.act({T, d.qkv_out()}), q = arena.act({T, int64_t{nh}, int64_t{hd}});
    Tensor k = arena.act({T, int64_t{nkv}, int64_t{hd}}), v = arena.act({T, int64_t{nkv}, hd});
    if (kernel == "qkv_split") return [=, &ctx] { tr::qkv_split(ctx, q, k, v, qkv); };
    return [=, &ctx] { tr::qkv_join(ctx, qkv, q, k, v); };
  }
  if (kernel == "rope_fwd" || kernel == "rope_bwd") {
    Tensor x = arena.act({T, nh + 2 * int64_t{nkv}, hd});
    const tr::Rope rope = d.rope;
    const int rope_heads = nh + nkv;
    if (kernel == "rope_fwd") return [=, &ctx] { tr::rope_fwd(ctx, x, rope_heads, seq, rope); };
    return [=, &ctx] { tr::rope_bwd(ctx, x, rope_heads, seq, rope); };
  }
  if (kernel == "swiglu_fwd" || kernel == "swiglu_bwd") {
    Tensor gateup = arena.act({T, 2 * W}), out = arena.act({T, W});
    if (kernel == "swiglu_fwd") return [=, &ctx] { tr::swiglu_fwd(ctx, out, gateup); };
    Tensor dgateup = arena.act({T, 2 * W});
    return [=, &ctx] { tr::swiglu_bwd(ctx, dgateup, out, gateup); };
  }
  if (kernel == "embedding_fwd" || kernel == "embedding_bwd") {
    Tensor tokens = arena.ids(T, d.vocab_local), table = arena.act({d.vocab_local, W});
    Tensor out = arena.act({T, W});
    if (kernel == "embedding_fwd")
      return [=, &ctx] { tr::embedding_fwd(ctx, out, tokens, table, 0); };
    Tensor dtable = arena.random(f32, {d.vocab_local, W});
    return [=, &ctx] { tr::embedding_bwd(ctx, dtable, out, tokens, 0); };
  }
  const int64_t valid = d.vocab_valid_local();
  if (kernel == "cross_entropy_fwd_bwd" || kernel == "xent_shard_stats" ||
      kernel == "xent_loss_grad") {
    Tensor logits = arena.act({T, W}), targets = arena.ids(T, valid);
    Tensor losses = arena.random(f32, {T});
    if (kernel == "cross_entropy_fwd_bwd")
      return [=, &ctx] {
        tr::cross_entropy_fwd_bwd(ctx, losses, logits, targets, valid, 1e-4f, true);
      };
    if (kernel == "xent_shard_stats") {
      Tensor stats = arena.random(f32, {T, 3});
      return [=, &ctx] { tr::xent_shard_stats(ctx, stats, logits, targets, 0, valid); };
    }
    Tensor row_max = arena.random(f32, {T}), sums = arena.random(f32, {T, 2});
    return [=, &ctx] {
      tr::xent_loss_grad(ctx, losses, logits, targets, row_max, sums, 0, valid, 1e-4f, true);
    };
  }
  if (kernel == "xent_combine") {
    Tensor row_max = arena.random(f32, {T}), sums = arena.random(f32, {T, 2});
    Tensor all = arena.random(f32, {int64_t{d.tp}, T, 3});
    return [=, &ctx] { tr::xent_combine(ctx, row_max, sums, all); };
  }
  if (kernel == "accumulate_sum") {
    Tensor x = arena.random(f32, {T}), acc = arena.random(DType::f64, {1});
    return [=, &ctx] { tr::accumulate_sum(ctx, acc, x); };
  }
  if (kernel == "adamw_update_pieces") {
    Tensor p = arena.random(f32, {T}), g = arena.random(f32, {T}), m = arena.random(f32, {T}),
           v = arena.random(f32, {T});
    // The bf16 weights the update writes on a GPU (the CPU computes in f32: none).
    Tensor copy = ctx.device == Device::cuda ? arena.act({T}) : Tensor();
    // Pieces of kAdamWPieceElems elements, all with weight decay, flat and shard alike.
    const int64_t n = (T + tr::kAdamWPieceElems - 1) / tr::kAdamWPieceElems;
    std::vector<int64_t> h;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t first = i * tr::kAdamWPieceElems;
      h.insert(h.end(), {first, std::min(tr::kAdamWPieceElems, T - first), 1, first});
    }
    Tensor pieces = arena.random(DType::i64, {n, 4});
    tr::copy_tensor(pieces, Tensor(h.data(), DType::i64, Device::cpu, {n, 4}));
    const tr::AdamWParams a{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10};
    return [=, &ctx] {
      tr::adamw_update_pieces(ctx, p, g, m, v, copy, pieces, tr::AdamWIndex{}, a, 1.0f);
    };
  }
  if (kernel == "accumulate_sum_squares_pieces") {  // the norm's read of every gradient
    Tensor g = arena.random(f32, {T}), acc = arena.random(DType::f64, {1});
    return [=, &ctx] { tr::accumulate_sum_squares(ctx, acc, g); };
  }
  return {};
}

std::string shape_of(const StepOp& op) {
  if (op.cls == tr::OpClass::gemm) return absl::StrFormat("%d x %d x %d", op.m, op.n, op.k);
  if (op.cls == tr::OpClass::attention) return "";
  return op.n > 1 ? absl::StrFormat("%d x %d", op.m, op.n) : absl::StrFormat("%d", op.m);
}

// What the timed ops reached, as efficiencies of the planner's GPU table (core/hardware.h) under
// the keys of trainer plan --hardware, each the value that makes the model's time for its ops the
// measured one: attention's fractions at this head_dim (an anchor of the model: 64 or below, 128
// or above; not written between them, nor under --doc-len, whose attention is ragged), scaled by
// predicted over measured time; stream_fraction the same over the memory-bound passes, the loss
// and the optimizer; gemm_fill the fill constant whose predictions (`remodel` re-runs the step
// model with it) come nearest the GEMMs' times, by least squares of the log ratio weighted by the
// measured time, over a log grid from 1 to 65536, at the table's GEMM ceiling. A fraction above 1
// (ops whose data stayed in L2 beat the copy ceiling) is written as 1, saying so. `measured[i]`
// is ops[i]'s median run, 0 where it was not timed.
std::vector<std::pair<std::string, double>> calibrate(
    const std::vector<StepOp>& ops, const std::vector<double>& measured, const tr::GpuSpec& gpu,
    int64_t head_dim, bool documents,
    const std::function<std::vector<StepOp>(const tr::GpuSpec&)>& remodel) {
  std::vector<std::pair<std::string, double>> out;
  auto fraction = [&](const std::string& key, double f) {
    if (f > 1)
      std::printf("%s: the ops reached %.3g of the ceiling (their data in L2?); written as 1\n",
                  key.c_str(), f);
    out.emplace_back(key, std::min(f, 1.0));
  };
  // A value outside its key's range (a fraction so small trainer plan would refuse it) is
  // written as the range's end, saying so.
  auto in_range = [&]() {
    for (auto& [key, value] : out)
      for (const tr::HardwareKey& k : tr::hardware_keys())
        if (key == k.name && (value < k.min || value > k.max)) {
          std::printf("%s: %.3g lies outside trainer plan's range [%g, %g]; written as %g\n",
                      key.c_str(), value, k.min, k.max, std::clamp(value, k.min, k.max));
          value = std::clamp(value, k.min, k.max);
        }
  };
  // The fraction `now` scaled so that the ops `pick` selects take their measured time.
  auto scaled = [&](auto pick, double now) {
    double predicted = 0, took = 0;
    for (size_t i = 0; i < ops.size(); ++i)
      if (measured[i] > 0 && pick(ops[i])) {
        predicted += ops[i].total_s();
        took += ops[i].count * measured[i];
      }
    return took > 0 ? now * predicted / took : 0.0;
  };
  bool any_gemm = false;
  for (size_t i = 0; i < ops.size(); ++i)
    any_gemm |= measured[i] > 0 && ops[i].cls == tr::OpClass::gemm;
  if (any_gemm) {
    auto error = [&](double fill) {
      tr::GpuSpec g = gpu;
      g.gemm_fill = fill;
      const std::vector<StepOp> model = remodel(g);
      double e = 0;
      for (size_t i = 0; i < ops.size(); ++i)
        if (measured[i] > 0 && ops[i].cls == tr::OpClass::gemm) {
          const double r = std::log(measured[i] / model[i].seconds);
          e += ops[i].count * measured[i] * r * r;
        }
      return e;
    };
    double best = gpu.gemm_fill, least = error(best);
    for (int step = 0; step <= 480; ++step) {
      const double fill = std::pow(2.0, step / 30.0);
      if (const double e = error(fill); e < least) std::tie(best, least) = std::pair(fill, e);
    }
    out.emplace_back("gemm_fill", best);
  }
  const char* anchor = tr::attention_anchor(head_dim);
  for (const bool backward : {false, true}) {
    auto pick = [&](const StepOp& op) {
      return op.cls == tr::OpClass::attention && (op.name == "attention: backward") == backward;
    };
    const double f = scaled(pick, tr::attention_fraction(gpu, head_dim, backward));
    if (f > 0 && anchor != nullptr && !documents)
      fraction(absl::StrCat("attention_", backward ? "bwd_" : "fwd_", anchor), f);
  }
  const double stream = scaled(
      [](const StepOp& op) {
        return op.cls == tr::OpClass::memory || op.cls == tr::OpClass::loss ||
               op.cls == tr::OpClass::optimizer;
      },
      gpu.stream_fraction);
  if (stream > 0) fraction("stream_fraction", stream);
  in_range();
  return out;
}

// --fp8: each GEMM of the list at its product out [m, n] = a [m, k] . b [n, k]^T as the FP8 path
// runs it: linear_fp8 on the codes of a (E5M2 for the backward's output gradient, else E4M3)
// and of b (E4M3), into the GEMM's out dtype (a weight gradient accumulated in f32), beside the
// bf16 GEMM's median (`bf16_s`, 0: not timed); and fp8_cast of a's source into its codes and
// their transpose (an activation's or output gradient's: the forward or input gradient reads
// one, the weight gradient the other). Rates against the GPU table's dense FP8 peak (1979
// TFLOP/s on an H100 or H200; none on an A100: 0), and the copy bandwidth (bytes read plus written;
// the cast reads its input twice, once for amax).
void time_fp8(const std::vector<StepOp>& ops, const std::vector<double>& bf16_s, tr::Ctx& ctx,
              DType act, const Args& a, const tr::GpuSpec& gpu) {
  std::printf(
      "\n| FP8 GEMM | shape | bf16 us | fp8 us | bf16 / fp8 | TFLOP/s | of FP8 peak | cast us | "
      "cast GB/s | of copy |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < ops.size(); ++i) {
    const StepOp& op = ops[i];
    if (op.cls != tr::OpClass::gemm || (!a.only.empty() && !absl::StrContains(op.name, a.only)))
      continue;
    const int64_t m = op.m, n = op.n, k = op.k;
    if (ctx.device == Device::cuda && (n % tr::kFp8GemmAlign != 0 || k % tr::kFp8GemmAlign != 0)) {
      std::printf("| %s | %s | N or K not a multiple of %lld: not run |\n", op.name.c_str(),
                  shape_of(op).c_str(), static_cast<long long>(tr::kFp8GemmAlign));
      continue;
    }
    Arena arena(ctx, act);
    const DType fa = op.kernel == "linear_fwd" ? DType::f8e4m3 : DType::f8e5m2;
    const bool accumulate = op.kernel == "linear_bwd.dweight";
    Tensor src = arena.act({m, k}), codes = arena.empty(fa, {m, k}),
           codes_t = arena.empty(fa, {k, m}), scale_inv = arena.empty(DType::f32, {1});
    Tensor b = arena.empty(DType::f8e4m3, {n, k}), b_scale_inv = arena.empty(DType::f32, {1});
    Tensor out = arena.random(accumulate ? DType::f32 : act, {m, n});
    tr::fp8_cast(ctx, b, Tensor(), b_scale_inv, arena.act({n, k}));
    const double cast_s = median(
        time_runs(ctx, a.repeats, [&] { tr::fp8_cast(ctx, codes, codes_t, scale_inv, src); }));
    const double s = median(time_runs(ctx, a.repeats, [&] {
      tr::linear_fp8(ctx, out, codes, scale_inv, b, b_scale_inv, Tensor(), accumulate);
    }));
    const double flop = 2.0 * static_cast<double>(m * n * k);
    const double bytes =
        static_cast<double>(m * k) * (2.0 * static_cast<double>(tr::dtype_size(act)) + 2);
    const std::string bf16 = bf16_s[i] > 0 ? absl::StrFormat("%.1f", bf16_s[i] * 1e6) : "-";
    const std::string ratio = bf16_s[i] > 0 ? absl::StrFormat("%.2f", bf16_s[i] / s) : "-";
    std::printf("| %s | %s | %s | %.1f | %s | %.4g | %.3f | %.1f | %.4g | %.3f |\n",
                op.name.c_str(), shape_of(op).c_str(), bf16.c_str(), s * 1e6, ratio.c_str(),
                flop / s / 1e12, gpu.peak_fp8_flops > 0 ? flop / s / gpu.peak_fp8_flops : 0.0,
                cast_s * 1e6, bytes / cast_s / 1e9, bytes / cast_s / gpu.copy_bw);
    std::fflush(stdout);
  }
}

int run(const Args& a) {
  absl::StatusOr<tr::Config> cfg = tr::load_config(a.config, a.sets);
  if (!cfg.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(cfg.status().message()).c_str());
    return 2;
  }
  if (cfg->parallel.cp != 1) {
    std::fprintf(stderr, "error: bench_ops times whole-sequence attention; set parallel.cp=1\n");
    return 2;
  }
  std::unique_ptr<tr::cuda::DeviceContext> device;
  tr::Ctx ctx{};
  std::string device_name = "cpu";
  if (a.backend == "cuda") {
    device = std::make_unique<tr::cuda::DeviceContext>(0, tr::kCudaWorkspaceBytes);
    ctx = device->ctx();
    device_name = tr::cuda::device_name(0);
  }
  std::string gpu_name = a.gpu;
  if (gpu_name.empty()) {
    const tr::GpuSpec* here = tr::gpu_of_device(device_name);
    gpu_name = here != nullptr ? here->name : "h100";
  }
  // A calibration is this device's: filed under another table entry it would mislead its plans.
  if (const tr::GpuSpec* here = tr::gpu_of_device(device_name);
      !a.calibration.empty() && a.backend == "cuda" &&
      (here == nullptr || here->name != gpu_name)) {
    std::fprintf(stderr,
                 "error: --calibration measures this device (%s), not --gpu %s; drop --gpu%s\n",
                 device_name.c_str(), gpu_name.c_str(),
                 here == nullptr ? " and add its type to the GPU table (core/hardware.cpp)" : "");
    return 2;
  }
  absl::StatusOr<tr::GpuSpec> gpu = tr::gpu_spec(gpu_name);
  for (const std::string& file : a.hardware)
    if (gpu.ok()) gpu = tr::override_gpu_spec(*gpu, file);
  absl::StatusOr<tr::Plan> plan = absl::InternalError("");
  const auto per_node = static_cast<int>(a.gpus_per_node > 0 ? a.gpus_per_node
                                                             : cfg->parallel.tp * cfg->parallel.pp *
                                                                   cfg->parallel.cp);
  std::optional<Documents> documents;
  if (a.doc_len > 0) documents.emplace(cfg->train.micro_batch, cfg->data.seq_len, a.doc_len);
  if (gpu.ok())
    plan = tr::make_plan(*cfg, *gpu, a.nodes, per_node, {}, documents ? documents->span : 0.0);
  for (const absl::Status& st : {gpu.status(), plan.status()}) {
    if (st.ok()) continue;
    std::fprintf(stderr, "error: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  const int stage = a.stage >= 0 ? a.stage : plan->slowest_stage;
  if (stage >= plan->layout.topo.pp) {
    std::fprintf(stderr, "error: --stage %d: the layout has %d pipeline stages\n", stage,
                 plan->layout.topo.pp);
    return 2;
  }
  const tr::Topology topo = plan->layout.of_rank(plan->layout.topo.rank_at(0, 0, stage)).topo;
  const tr::ModelDims d = tr::ModelDims::from(*cfg, topo);
  // The stage's ops on one GPU: its collectives need the group's ranks (preflight measures the
  // links they cross).
  const auto gpu_ops = [&](const tr::GpuSpec& g) {
    std::vector<StepOp> ops = tr::stage_ops(*cfg, plan->layout, g, stage,
                                            plan->stages[static_cast<size_t>(stage)].grads / 4,
                                            documents ? documents->span : 0.0);
    std::erase_if(ops, [](const StepOp& op) { return op.cls == tr::OpClass::communication; });
    return ops;
  };
  const std::vector<StepOp> ops = gpu_ops(*gpu);
  ctx.deterministic = cfg->train.deterministic;
  const DType act = ctx.device == Device::cuda ? DType::bf16 : DType::f32;
  std::printf(
      "bench_ops: %s on %s (predicted for %s); tp %d, pp stage %d of %d, %lld micro-batches of "
      "%lld tokens; %d runs per op, the median\n",
      a.config.c_str(), device_name.c_str(), gpu->name.c_str(), topo.tp, stage, topo.pp,
      static_cast<long long>(plan->layout.micro_batches),
      static_cast<long long>(cfg->train.micro_batch * cfg->data.seq_len), a.repeats);
  if (documents)
    std::printf(
        "attention: block-causal over documents of %d tokens (%lld per micro-batch): "
        "%.1f keys per query\n",
        a.doc_len, static_cast<long long>(documents->found.count), documents->span);
  std::printf(
      "| op | shape | per step | predicted us | measured us | measured / predicted | rate | "
      "step s |\n|---|---|---|---|---|---|---|---|\n");
  std::map<std::string, std::pair<double, double>> by_class;  // predicted, measured s per step
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::string> untimed;  // ops of the model this tool has no kernel call for
  std::vector<double> measured_s(ops.size(), 0.0);
  for (size_t i = 0; i < ops.size(); ++i) {
    const StepOp& op = ops[i];
    if (!a.only.empty() && !absl::StrContains(op.name, a.only)) continue;
    Arena arena(ctx, act);
    std::function<void()> fn = runner(op, d, *cfg, ctx, arena, documents ? &*documents : nullptr);
    if (!fn) {
      untimed.push_back(op.name);
      continue;
    }
    const double s = median(time_runs(ctx, a.repeats, fn));
    measured_s[i] = s;
    const std::string rate = op.flop > 0 ? absl::StrFormat("%.4g TFLOP/s", op.flop / s / 1e12)
                                         : absl::StrFormat("%.4g GB/s", op.bytes / s / 1e9);
    std::printf("| %s | %s | %.0f | %.1f | %.1f | %.2f | %s | %.4f |\n", op.name.c_str(),
                shape_of(op).c_str(), op.count, op.seconds * 1e6, s * 1e6, s / op.seconds,
                rate.c_str(), op.count * s);
    std::fflush(stdout);
    auto& [predicted, measured] = by_class[tr::op_class_name(op.cls)];
    predicted += op.total_s();
    measured += op.count * s;
    rows.push_back({{"op", op.name},
                    {"class", tr::op_class_name(op.cls)},
                    {"m", op.m},
                    {"n", op.n},
                    {"k", op.k},
                    {"count", op.count},
                    {"flop", op.flop},
                    {"bytes", op.bytes},
                    {"predicted_s", op.seconds},
                    {"measured_s", s}});
  }
  double predicted = 0, measured = 0;
  std::printf(
      "\n| op class | predicted s per step | measured s per step | measured / predicted |\n"
      "|---|---|---|---|\n");
  for (const auto& [cls, pm] : by_class) {
    std::printf("| %s | %.6g | %.6g | %.2f |\n", cls.c_str(), pm.first, pm.second,
                pm.second / pm.first);
    predicted += pm.first;
    measured += pm.second;
  }
  std::printf("| all timed | %.6g | %.6g | %.2f |\n", predicted, measured, measured / predicted);
  if (!untimed.empty())
    std::printf("not timed (no single kernel call): %s\n", absl::StrJoin(untimed, ", ").c_str());
  if (a.fp8) time_fp8(ops, measured_s, ctx, act, a, *gpu);
  const std::vector<std::pair<std::string, double>> calibration =
      calibrate(ops, measured_s, *gpu, cfg->model.head_dim, documents.has_value(), gpu_ops);
  std::string keys;
  nlohmann::json calibration_json = nlohmann::json::object();
  for (const auto& [key, value] : calibration) {
    absl::StrAppendFormat(&keys, "%s%s %.6g", keys.empty() ? "" : ", ", key, value);
    calibration_json[key] = value;
  }
  if (!calibration.empty())
    std::printf("what the ops reached, as trainer plan --hardware keys (--calibration): %s%s\n",
                keys.c_str(), a.only.empty() ? "" : " (from the ops --only picked)");
  if (documents)
    std::printf(
        "attention over documents is not a calibration of the whole sequences' fractions; "
        "run without --doc-len for those\n");
  else if (tr::attention_anchor(cfg->model.head_dim) == nullptr)
    std::printf(
        "attention at head_dim %lld lies between the model's anchors (64, 128): not "
        "calibrated\n",
        static_cast<long long>(cfg->model.head_dim));
  if (!a.calibration.empty()) {
    std::ofstream f(a.calibration, std::ios::trunc);
    f << "# bench_ops --config " << a.config << " on " << device_name
      << ": what its ops reached, for trainer plan --hardware\nname: " << gpu->name
      << "\nmeasured_by: bench_ops\n";
    for (const auto& [key, value] : calibration) f << absl::StrFormat("%s: %.6g\n", key, value);
    if (!f) {
      std::fprintf(stderr, "error: cannot write --calibration %s\n", a.calibration.c_str());
      return 1;
    }
  }
  if (!a.json.empty()) {
    std::ofstream f(a.json, std::ios::trunc);
    f << nlohmann::json({{"device", device_name},
                         {"gpu", gpu->name},
                         {"ops", rows},
                         {"calibration", calibration_json}})
             .dump(1)
      << "\n";
    if (!f) {
      std::fprintf(stderr, "error: cannot write --json %s\n", a.json.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<Args> a = parse(argc, argv);
  if (!a.ok()) tr::tools::bad_input(kUsage, a.status().message());
  return run(*a);
}
