// preflight: measures what a training job will run on, before the job spends its budget.
// Collectives over a size sweep (in the manner of nccl-tests: time, algbw, busbw and a #wrong
// count from closed-form results) within each node and across all nodes, a GEMM's FLOP/s and
// the device memory bandwidth; then compares them with a threshold table of the GPU type and
// exits non-zero naming what fell short.
//
//   srun --mpi=pmix -N 2 --ntasks-per-node 8 preflight --backend cuda [--gpu h100]
//   mpirun -n 4 preflight --backend cpu --max-bytes 1M --expect node_busbw_gbps=0.5
//
// Exit 0: every check passed (or none applied); 1: a check failed or a collective computed a
// wrong element; 2: bad input.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/bf16.h"
#include "core/fs_io.h"
#include "kernels/ops.h"
#include "parallel/mpi_comm.h"
#include "parallel/nccl_comm.h"
#include "tools/flags.h"
#include "trainer/plan/plan.h"
#include "trainer/run/run.h"
#ifdef TRAINER_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_ops.h"
#endif

// The flags, read by tools/flags.h's parser; --help lists them from these definitions.
ABSL_FLAG(std::string, backend, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, comm, "nccl",
          "the GPUs' collectives on cuda: nccl, or mpi (staged through host memory)");
ABSL_FLAG(std::vector<std::string>, ops,
          std::vector<std::string>({"all_reduce", "all_gather", "reduce_scatter", "sendrecv"}),
          "the collectives measured, of all_reduce, all_gather, reduce_scatter, sendrecv");
ABSL_FLAG(tr::tools::Bytes, min_bytes, tr::tools::Bytes{1024}, "the smallest message");
ABSL_FLAG(std::optional<tr::tools::Bytes>, max_bytes, std::nullopt,
          "the largest message (default 1G on cuda, 4M on cpu)");
ABSL_FLAG(double, factor, 4, "the step from one message size to the next, > 1");
ABSL_FLAG(tr::tools::Positive, iters, tr::tools::Positive{20},
          "timed repetitions per size, after --warmup");
ABSL_FLAG(tr::tools::Count, warmup, tr::tools::Count{5}, "untimed repetitions per size");
ABSL_FLAG(std::optional<tr::tools::Count>, gemm, std::nullopt,
          "N: an N x N x N GEMM, bf16 on cuda, f32 on cpu (default 8192 on cuda, 256 on cpu; "
          "0 skips it)");
ABSL_FLAG(std::optional<tr::tools::Bytes>, mem_bytes, std::nullopt,
          "the device copy that measures the memory bandwidth (default 1G on cuda, 64M on cpu; "
          "0 skips it)");
ABSL_FLAG(std::string, gpu, "",
          "the threshold table of this GPU type: h100, h200, b200, b300 (default on cuda: from "
          "the device name)");
ABSL_FLAG(std::string, hardware, "",
          "FILE: overrides of that table's numbers (the YAML of `trainer plan --hardware`)");
ABSL_FLAG(tr::tools::Repeated, expect, {},
          "KEY=VALUE: a threshold of your own, over the table's: node_busbw_gbps, "
          "network_busbw_gbps (all-reduce at the largest size), gemm_tflops, memory_gbps");
ABSL_FLAG(std::string, json, "",
          "FILE: writes what was measured under those keys (rank 0), and the smallest "
          "all-reduce's time as node_latency_us and network_latency_us (over network_nodes "
          "nodes), for `trainer plan --hardware FILE`");
ABSL_FLAG(tr::tools::Count, ranks_per_node, tr::tools::Count{0},
          "N: groups ranks into nodes by rank / N (0: by hostname)");
ABSL_FLAG(tr::tools::Count, corrupt, tr::tools::Count{0},
          "(for testing) 1: world rank 1 perturbs one input element of every checked call, so "
          "the #wrong counts and the exit code must show it");

namespace {

using tr::Comm;
using tr::Device;
using tr::DType;
using tr::Tensor;
using Clock = std::chrono::steady_clock;

const tr::tools::Usage kUsage{
    .tool = "preflight",
    .file = __FILE__,
    .synopsis =
        "preflight [--backend cpu|cuda] [--comm nccl|mpi] [--ops LIST] [--min-bytes N] "
        "[--max-bytes N] [--factor F] [--iters N] [--warmup N] [--gemm N] [--mem-bytes N] "
        "[--gpu h100|h200|b200|b300] [--hardware FILE] [--expect KEY=VALUE ...] "
        "[--json FILE]",
    .about =
        "Measures collectives over a size sweep (time, algbw, busbw, #wrong), a GEMM and the "
        "memory bandwidth, and checks them against the GPU type's thresholds. Under srun or "
        "mpirun: every rank takes part; rank 0 prints. Sizes take K, M, G suffixes.\n"
        "Exit 0: all checks passed; 1: a check fell short or a collective was wrong; 2: bad "
        "input.\n"
        "Scaling across node counts (a short training run at 2, 4, 8, 16 nodes, efficiency "
        "against the smallest): tools/sweep with grid {nodes: [2, 4, 8, 16]}, see "
        "docs/sweep.md.",
    .positionals = false,
    .error_prefix = "preflight: "};

struct Args {
  std::string backend, comm, gpu, hardware, json;
  std::vector<std::string> ops;
  int64_t min_bytes = 0, max_bytes = 0, gemm = 0, mem_bytes = 0;
  double factor = 4;
  int iters = 0, warmup = 0, ranks_per_node = 0, corrupt = 0;
  std::map<std::string, double> expect;
};

// The flags, checked together (the defaults that depend on --backend filled in); "" or the error.
std::string parse_args(int argc, char** argv, Args* a) {
  tr::tools::parse_or_exit(argc, argv, kUsage);
  a->backend = absl::GetFlag(FLAGS_backend);
  a->comm = absl::GetFlag(FLAGS_comm);
  a->ops = absl::GetFlag(FLAGS_ops);
  a->factor = absl::GetFlag(FLAGS_factor);
  a->iters = static_cast<int>(absl::GetFlag(FLAGS_iters).value);
  a->warmup = static_cast<int>(absl::GetFlag(FLAGS_warmup).value);
  a->ranks_per_node = static_cast<int>(absl::GetFlag(FLAGS_ranks_per_node).value);
  a->corrupt = static_cast<int>(absl::GetFlag(FLAGS_corrupt).value);
  a->gpu = absl::GetFlag(FLAGS_gpu);
  a->hardware = absl::GetFlag(FLAGS_hardware);
  a->json = absl::GetFlag(FLAGS_json);
  const std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "sendrecv"},
                                 keys = {"node_busbw_gbps", "network_busbw_gbps", "gemm_tflops",
                                         "memory_gbps"};
  auto known = [](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  if (a->backend != "cpu" && a->backend != "cuda")
    return "--backend '" + a->backend + "' must be cpu or cuda";
  if (a->comm != "nccl" && a->comm != "mpi") return "--comm '" + a->comm + "' must be nccl or mpi";
  // --ops '' (no op) reads as the unknown op ''.
  for (const std::string& op : a->ops.empty() ? std::vector<std::string>{""} : a->ops)
    if (!known(ops, op)) return "--ops: unknown '" + op + "'; known: " + absl::StrJoin(ops, ", ");
  if (!(a->factor > 1)) return absl::StrCat("--factor '", a->factor, "' must be a number > 1");
  for (const std::string& v : absl::GetFlag(FLAGS_expect).values) {
    const size_t eq = v.find('=');
    const std::string key = v.substr(0, eq);
    if (eq == std::string::npos || !absl::SimpleAtod(v.substr(eq + 1), &a->expect[key]))
      return "--expect '" + v + "' must be KEY=NUMBER";
    if (!known(keys, key))
      return "--expect: unknown key '" + key + "'; known: " + absl::StrJoin(keys, ", ");
  }
  const bool gpu = a->backend == "cuda";
  a->min_bytes = absl::GetFlag(FLAGS_min_bytes).value;
  a->max_bytes = tr::tools::value_or(absl::GetFlag(FLAGS_max_bytes),
                                     gpu ? int64_t{1} << 30 : int64_t{4} << 20);
  a->gemm = tr::tools::value_or(absl::GetFlag(FLAGS_gemm), gpu ? 8192 : 256);
  a->mem_bytes = tr::tools::value_or(absl::GetFlag(FLAGS_mem_bytes),
                                     gpu ? int64_t{1} << 30 : int64_t{64} << 20);
  if (a->min_bytes < 4 || a->min_bytes > a->max_bytes)
    return absl::StrCat("--min-bytes ", a->min_bytes, " must be >= 4 and <= --max-bytes ",
                        a->max_bytes);
  return "";
}

// Where the benchmark's tensors live and how the ops reach them.
struct Target {
  tr::Ctx ctx;                  // ctx.device: cpu or cuda
  std::shared_ptr<void> owner;  // the CUDA DeviceContext
  std::string name = "cpu";
};

tr::Buffer alloc(const Target& d, int64_t bytes) {
  return tr::Buffer(static_cast<size_t>(std::max<int64_t>(bytes, 4)), d.ctx.device);
}

// Host values -> t (any device) and back.
void upload(Tensor t, const std::vector<float>& v) {
  tr::copy_tensor(t, Tensor(const_cast<float*>(v.data()), DType::f32, Device::cpu,
                            {static_cast<int64_t>(v.size())}));
}
std::vector<float> download(Tensor t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  tr::copy_tensor(Tensor(v.data(), DType::f32, Device::cpu, {t.numel()}), t);
  return v;
}

// Exact in f32 for the rank and size ranges used: small integers.
float value(int rank, int64_t i) {
  return static_cast<float>(rank + 1 + i % 7);
}

struct Row {
  int64_t bytes = 0, count = 0;
  double seconds = 0, algbw = 0, busbw = 0;
  int64_t wrong = 0;
};

double max_over(Comm& world, double x) {
  world.all_reduce(Tensor(&x, DType::f64, Device::cpu, {1}), tr::ReduceOp::max);
  return x;
}

// One collective at one size: warm-up, `iters` timed calls (the slowest rank's time), then one
// call on fresh inputs whose every element is checked against its closed form.
Row measure(const std::string& op, Comm& c, Comm& world, const Target& d, int64_t bytes,
            const Args& a) {
  const bool corrupt = a.corrupt > 0 && world.rank() == 1;
  const int n = c.size(), r = c.rank();
  // The nccl-tests convention for `bytes`: all_reduce the buffer, all_gather the output,
  // reduce_scatter the input, sendrecv the message.
  int64_t count = bytes / 4;
  if (op == "all_gather" || op == "reduce_scatter") count = std::max<int64_t>(count / n, 1);
  const int64_t total = op == "all_gather" || op == "reduce_scatter" ? count * n : count;
  tr::Buffer big = alloc(d, total * 4), small = alloc(d, count * 4);
  Tensor tbig(big.data(), DType::f32, d.ctx.device, {total});
  Tensor tsmall(small.data(), DType::f32, d.ctx.device, {count});
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  auto call = [&] {
    if (op == "all_reduce") {
      c.all_reduce(tsmall, tr::ReduceOp::sum);
    } else if (op == "all_gather") {
      c.all_gather(tbig, tsmall);
    } else if (op == "reduce_scatter") {
      c.reduce_scatter(tsmall, tbig, tr::ReduceOp::sum);
    } else if (n > 1) {  // sendrecv around the ring
      const tr::P2P ops[] = {{tr::P2P::send, tsmall, right}, {tr::P2P::recv, tbig, left}};
      c.exchange(ops);
    }
  };
  for (int i = 0; i < a.warmup; ++i) call();
  tr::synchronize(d.ctx);
  c.barrier();
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < a.iters; ++i) call();
  tr::synchronize(d.ctx);
  Row row;
  row.seconds = max_over(world, std::chrono::duration<double>(Clock::now() - t0).count()) / a.iters;
  row.count = op == "all_gather" || op == "reduce_scatter" ? total : count;
  row.bytes = row.count * 4;
  const double factor = op == "all_reduce" ? 2.0 * (n - 1) / n
                        : op == "sendrecv" ? 1.0
                                           : static_cast<double>(n - 1) / n;
  row.algbw = static_cast<double>(row.bytes) / row.seconds;
  row.busbw = row.algbw * factor;

  // Correctness on fresh inputs.
  std::vector<float> in_small(static_cast<size_t>(count)), in_big(static_cast<size_t>(total));
  for (int64_t i = 0; i < count; ++i) in_small[i] = value(r, i);
  for (int64_t i = 0; i < total; ++i) in_big[i] = value(r, i);
  if (corrupt) {
    in_small[0] += 1;
    in_big[0] += 1;
  }
  upload(tsmall, in_small);
  upload(tbig, op == "reduce_scatter" ? in_big : std::vector<float>(total, -1.0f));
  call();
  tr::synchronize(d.ctx);
  const float ranks_sum = n * (n + 1) / 2.0f;
  if (op == "all_reduce") {
    std::vector<float> got = download(tsmall);
    for (int64_t i = 0; i < count; ++i) row.wrong += got[i] != ranks_sum + n * (i % 7);
  } else if (op == "all_gather") {
    std::vector<float> got = download(tbig);
    for (int64_t i = 0; i < total; ++i)
      row.wrong += got[i] != value(static_cast<int>(i / count), i % count);
  } else if (op == "reduce_scatter") {
    std::vector<float> got = download(tsmall);
    for (int64_t i = 0; i < count; ++i)
      row.wrong += got[i] != ranks_sum + n * ((r * count + i) % 7);
  } else if (n > 1) {
    std::vector<float> got = download(tbig);
    for (int64_t i = 0; i < count; ++i) row.wrong += got[i] != value(left, i);
  }
  double wrong = static_cast<double>(row.wrong);
  world.all_reduce(Tensor(&wrong, DType::f64, Device::cpu, {1}), tr::ReduceOp::sum);
  row.wrong = static_cast<int64_t>(wrong);
  return row;
}

// `iters` N x N x N GEMMs through the trainer's linear op: TFLOP/s of the slowest rank.
double gemm_tflops(const Target& d, Comm& world, int64_t n, int iters) {
  const DType dt = d.ctx.device == Device::cuda ? DType::bf16 : DType::f32;
  std::vector<tr::Buffer> bufs;
  std::vector<Tensor> t;
  for (int i = 0; i < 3; ++i) {
    bufs.push_back(alloc(d, n * n * static_cast<int64_t>(tr::dtype_size(dt))));
    t.emplace_back(bufs.back().data(), dt, d.ctx.device, std::initializer_list<int64_t>{n, n});
  }
  // Random-looking operands (all-zero operands draw less power and run faster than real ones).
  for (int i = 0; i < 2; ++i) {
    std::vector<float> v(static_cast<size_t>(n * n));
    for (int64_t j = 0; j < n * n; ++j)
      v[j] = static_cast<float>((j * 2654435761u + i) % 1000) / 1000 - 0.5f;
    if (dt == DType::f32) {
      upload(t[i], v);
    } else {
      std::vector<uint16_t> h(v.size());
      for (size_t j = 0; j < v.size(); ++j) h[j] = tr::f32_to_bf16(v[j]);
      tr::copy_tensor(t[i], Tensor(h.data(), dt, Device::cpu, {n, n}));
    }
  }
  tr::Ctx ctx = d.ctx;
  tr::linear_fwd(ctx, t[2], t[0], t[1], Tensor());  // warm-up (plan selection)
  tr::synchronize(ctx);
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < iters; ++i) tr::linear_fwd(ctx, t[2], t[0], t[1], Tensor());
  tr::synchronize(ctx);
  const double s = max_over(world, std::chrono::duration<double>(Clock::now() - t0).count());
  return 2.0 * n * n * n * iters / s / 1e12;
}

// Waits for everything on the device: the compute stream and the legacy stream that
// copy_tensor's device-to-device cudaMemcpy uses (it returns before the copy is done).
void sync_device(const Target& d) {
  tr::synchronize(d.ctx);
#ifdef TRAINER_HAVE_CUDA
  if (d.ctx.device == Device::cuda) cudaDeviceSynchronize();
#endif
}

// Device-to-device copies of `bytes`: read + write bytes per second of the slowest rank.
double memory_gbps(const Target& d, Comm& world, int64_t bytes, int iters) {
  const int64_t count = bytes / 4;
  tr::Buffer a = alloc(d, count * 4), b = alloc(d, count * 4);
  Tensor ta(a.data(), DType::f32, d.ctx.device, {count}),
      tb(b.data(), DType::f32, d.ctx.device, {count});
  tr::copy_tensor(tb, ta);
  sync_device(d);
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < iters; ++i) tr::copy_tensor(tb, ta);
  sync_device(d);
  const double s = max_over(world, std::chrono::duration<double>(Clock::now() - t0).count());
  return 2.0 * count * 4 * iters / s / 1e9;
}

// This rank's hostname, all-gathered: the lowest world rank on the same node.
int node_leader(Comm& world, int ranks_per_node) {
  if (ranks_per_node > 0) return world.rank() / ranks_per_node * ranks_per_node;
  constexpr int kWords = 16;
  int32_t mine[kWords] = {};
  gethostname(reinterpret_cast<char*>(mine), sizeof(mine) - 1);
  std::vector<int32_t> all(static_cast<size_t>(kWords) * world.size());
  world.all_gather(Tensor(all.data(), DType::i32, Device::cpu, {kWords * world.size()}),
                   Tensor(mine, DType::i32, Device::cpu, {kWords}));
  for (int q = 0; q < world.size(); ++q)
    if (std::memcmp(&all[static_cast<size_t>(q) * kWords], mine, sizeof(mine)) == 0) return q;
  return world.rank();
}

struct Check {
  std::string what;
  double got, want;
  std::string basis;  // where `want` comes from
};

// What was measured, by the --expect keys (the largest all-reduce's bus bandwidth per group, the
// GEMM and the memory copy), for --json.
using Measured = std::map<std::string, double>;

// A threshold per measurement key, and where it comes from.
using Wants = std::map<std::string, std::pair<double, std::string>>;

// The device of this rank: the CPU, or its GPU (node-local rank order). An error is bad input.
absl::StatusOr<Target> open_device(const Args& a, tr::MpiRuntime* mpi, Comm& world) {
  Target d;
  if (a.backend != "cuda") return d;
#ifdef TRAINER_HAVE_CUDA
  if (!tr::cuda::device_available())
    return absl::InvalidArgumentError(
        "--backend cuda but no CUDA device is visible; use --backend cpu");
  const int gpu = (mpi ? mpi->local_rank() : 0) % tr::cuda::device_count();
  auto dev = std::make_shared<tr::cuda::DeviceContext>(gpu, size_t{64} << 20);
  d.ctx = dev->ctx();
  d.owner = dev;
  d.name = tr::cuda::device_name(gpu);
  if (a.comm == "nccl")  // the trainer's check: one GPU per rank
    if (absl::Status st = tr::check_gpu_binding(world, gpu); !st.ok()) return st;
  return d;
#else
  (void)mpi;
  (void)world;
  return absl::InvalidArgumentError("--backend cuda but this build has no CUDA; use --backend cpu");
#endif
}

// The threshold table: a GPU type's numbers (named with --gpu, or recognised from the device
// by the GPU table), then the user's --expect values over them. `gpu` is the type used, or "".
absl::StatusOr<Wants> thresholds(const Args& a, const Target& d, bool root, std::string* gpu) {
  Wants want;
  *gpu = a.gpu;
  if (gpu->empty() && d.ctx.device == Device::cuda) {
    // The table holds the SXM parts: PCIe and NVL cards, and GH200, need --gpu or --hardware.
    const bool other = d.name.find("PCIe") != std::string::npos ||
                       d.name.find("NVL") != std::string::npos ||
                       d.name.find("GH200") != std::string::npos;
    if (const tr::GpuSpec* g = tr::gpu_of_device(d.name); g != nullptr && !other) *gpu = g->name;
    if (gpu->empty() && root)
      std::printf(
          "device %s is not in the threshold table: name a type (--gpu, --hardware) or "
          "pass --expect\n",
          d.name.c_str());
  }
  if (!gpu->empty()) {
    absl::StatusOr<tr::GpuSpec> spec = tr::gpu_spec(*gpu);
    if (spec.ok() && !a.hardware.empty()) spec = tr::override_gpu_spec(*spec, a.hardware);
    if (!spec.ok()) return spec.status();
    want["node_busbw_gbps"] = {0.7 * spec->nvlink_bw / 1e9,
                               absl::StrFormat("0.7 x NVLink %.0f GB/s", spec->nvlink_bw / 1e9)};
    want["network_busbw_gbps"] = {
        0.8 * spec->network_bw / 1e9,
        absl::StrFormat("0.8 x network %.0f GB/s per GPU", spec->network_bw / 1e9)};
    want["gemm_tflops"] = {0.6 * spec->peak_bf16_flops / 1e12,
                           absl::StrFormat("0.6 x bf16 peak %.0f", spec->peak_bf16_flops / 1e12)};
    want["memory_gbps"] = {0.75 * spec->hbm_bw / 1e9,
                           absl::StrFormat("0.75 x HBM %.0f GB/s", spec->hbm_bw / 1e9)};
  } else if (!a.hardware.empty()) {
    return absl::InvalidArgumentError("--hardware needs --gpu TYPE (the table it overrides)");
  }
  for (const auto& [k, v] : a.expect) want[k] = {v, "--expect"};
  return want;
}

// The groups measured: the ranks of each node (NVLink on a GPU node), and all ranks (the
// network when they span nodes), on the comm the trainer would use.
struct Groups {
  std::unique_ptr<Comm> node, all;
  double nodes = 1;
};
Groups make_groups(const Args& a, const Target& d, tr::MpiRuntime* mpi, Comm& world) {
  Groups g;
  const int leader = node_leader(world, a.ranks_per_node);
  g.node =
      mpi ? tr::split_mpi_comm(world, leader, world.rank(), "node") : tr::make_self_comm("node");
  g.nodes = world.rank() == leader ? 1 : 0;
  world.all_reduce(Tensor(&g.nodes, DType::f64, Device::cpu, {1}), tr::ReduceOp::sum);
  g.all = mpi ? tr::split_mpi_comm(world, 0, world.rank(), "world") : tr::make_self_comm("world");
  if (d.ctx.device == Device::cuda && a.comm == "nccl") {
    // One rank too: a communicator of one GPU still runs NCCL's kernels and our checks.
    g.node = tr::make_nccl_comm(std::move(g.node), d.ctx.stream, 300);
    g.all = tr::make_nccl_comm(std::move(g.all), d.ctx.stream, 300);
  } else if (d.ctx.device == Device::cuda) {
    g.node = tr::make_staging_comm(std::move(g.node));
    g.all = tr::make_staging_comm(std::move(g.all));
  }
  return g;
}

// Every collective of --ops over each group, at every size; a table per op and group, the
// largest all-reduce against its threshold.
void measure_collectives(const Args& a, const Target& d, Comm& world, Groups& g, Wants& want,
                         std::vector<Check>& checks, std::vector<std::string>& failures,
                         Measured& measured) {
  const bool root = world.rank() == 0;
  struct Scope {
    Comm* comm;
    std::string label, key, latency_key;
  };
  std::vector<Scope> scopes;
  // Every rank must take the same branches (the measurements are collectives over world).
  double largest_node = g.node->size();
  world.all_reduce(Tensor(&largest_node, DType::f64, Device::cpu, {1}), tr::ReduceOp::max);
  if (largest_node > 1 || d.ctx.device == Device::cuda)
    scopes.push_back({g.node.get(), "node", "node_busbw_gbps", "node_latency_us"});
  if (g.nodes > 1)
    scopes.push_back(
        {g.all.get(), "network (all ranks)", "network_busbw_gbps", "network_latency_us"});
  if (scopes.empty() && root)
    std::printf("one rank: no collectives to measure (launch with srun or mpirun)\n");
  for (const Scope& s : scopes) {
    for (const std::string& op : a.ops) {
      if (op == "sendrecv" && s.comm->size() == 1) continue;  // no peer
      if (root)
        std::printf("\n# %s, f32%s, group %s (%d ranks)\n%12s %12s %10s %11s %11s %7s\n",
                    op.c_str(), op == "all_reduce" || op == "reduce_scatter" ? " sum" : "",
                    s.label.c_str(), s.comm->size(), "bytes", "count", "time_us", "algbw_GB/s",
                    "busbw_GB/s", "#wrong");
      Row last, first;
      for (double b = static_cast<double>(a.min_bytes); b <= static_cast<double>(a.max_bytes);
           b *= a.factor) {
        last = measure(op, *s.comm, world, d, static_cast<int64_t>(b), a);
        if (first.bytes == 0) first = last;
        if (root)
          std::printf("%12lld %12lld %10.1f %11.3f %11.3f %7lld\n",
                      static_cast<long long>(last.bytes), static_cast<long long>(last.count),
                      last.seconds * 1e6, last.algbw / 1e9, last.busbw / 1e9,
                      static_cast<long long>(last.wrong));
        if (last.wrong > 0)
          failures.push_back(
              absl::StrFormat("%s on group %s computed %d wrong elements at %d bytes", op, s.label,
                              last.wrong, last.bytes));
      }
      if (op == "all_reduce" && s.comm->size() > 1) {
        measured[s.key] = last.busbw / 1e9;
        // The smallest all-reduce's time: a collective's fixed cost (the planner's latency),
        // across the network with the nodes it spanned (the planner splits it into per-call and
        // per-step parts: trainer/plan/collectives.h).
        measured[s.latency_key] = first.seconds * 1e6;
        if (s.comm == g.all.get()) measured["network_nodes"] = g.nodes;
      }
      if (op == "all_reduce" && want.count(s.key) && s.comm->size() > 1)
        checks.push_back({s.label + " all_reduce busbw (GB/s, largest size)", last.busbw / 1e9,
                          want[s.key].first, want[s.key].second});
    }
  }
}

// The GEMM and memory-copy measurements, each against its threshold.
void measure_device(const Args& a, const Target& d, Comm& world, Wants& want,
                    std::vector<Check>& checks, Measured& measured) {
  const bool root = world.rank() == 0, gpu = d.ctx.device == Device::cuda;
  if (a.gemm > 0) {
    const double tf = gemm_tflops(d, world, a.gemm, gpu ? 20 : 3);
    measured["gemm_tflops"] = tf;
    measured["gemm_n"] = static_cast<double>(a.gemm);
    if (root)
      std::printf("\ngemm %s %lld^3: %.2f TFLOP/s per rank\n", gpu ? "bf16" : "f32",
                  static_cast<long long>(a.gemm), tf);
    if (want.count("gemm_tflops"))
      checks.push_back({"gemm TFLOP/s", tf, want["gemm_tflops"].first, want["gemm_tflops"].second});
  }
  if (a.mem_bytes > 0) {
    const double gbps = memory_gbps(d, world, a.mem_bytes, gpu ? 20 : 5);
    measured["memory_gbps"] = gbps;
    if (root)
      std::printf("memory copy %lld MiB: %.1f GB/s per rank (read + write)\n",
                  static_cast<long long>(a.mem_bytes >> 20), gbps);
    if (want.count("memory_gbps"))
      checks.push_back(
          {"memory bandwidth (GB/s)", gbps, want["memory_gbps"].first, want["memory_gbps"].second});
  }
}

// --json FILE: the measurements under the --expect keys, with the GPU type (or device) as the
// name; `trainer plan --hardware FILE` reads it (JSON is YAML).
absl::Status write_measured(const std::string& path, const std::string& name,
                            const Measured& measured) {
  nlohmann::json j = {{"name", name}, {"measured_by", "preflight"}};
  for (const auto& [key, value] : measured) j[key] = value;
  return tr::fs::write_file_atomic(path, j.dump(2) + "\n");
}

// Rank 0's verdict: every check, then passed or the problems (FAIL lines on stderr).
void report(const std::vector<Check>& checks, std::vector<std::string>& failures,
            bool have_gpu_type) {
  if (!checks.empty()) std::printf("\nchecks:\n");
  for (const Check& c : checks) {
    const bool ok = c.got >= c.want;
    std::printf("  %-4s %s %.3g %s %.3g (%s)\n", ok ? "ok" : "FAIL", c.what.c_str(), c.got,
                ok ? ">=" : "<", c.want, c.basis.c_str());
    if (!ok)
      failures.push_back(absl::StrFormat("%s %.3g < %.3g (%s)", c.what, c.got, c.want, c.basis));
  }
  if (checks.empty() && !have_gpu_type)
    std::printf("\nno thresholds: name a GPU type (--gpu) or pass --expect KEY=VALUE\n");
  if (failures.empty()) {
    std::printf("preflight: passed\n");
    return;
  }
  for (const std::string& f : failures) std::fprintf(stderr, "preflight: FAIL %s\n", f.c_str());
  std::printf("preflight: %zu problem(s); see the FAIL lines\n", failures.size());
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (std::string err = parse_args(argc, argv, &a); !err.empty()) tr::tools::bad_input(kUsage, err);
  std::unique_ptr<tr::MpiRuntime> mpi;
  if (tr::launched_by_mpi_launcher()) mpi = std::make_unique<tr::MpiRuntime>(&argc, &argv);
  std::unique_ptr<Comm> world = mpi ? tr::make_mpi_world() : tr::make_self_comm("world");
  const bool root = world->rank() == 0;
  auto fail_input = [&](const absl::Status& st) {
    if (root) std::fprintf(stderr, "preflight: %s\n", std::string(st.message()).c_str());
    return 2;
  };
  absl::StatusOr<Target> d = open_device(a, mpi.get(), *world);
  if (!d.ok()) return fail_input(d.status());
  std::string gpu;
  absl::StatusOr<Wants> want = thresholds(a, *d, root, &gpu);
  if (!want.ok()) return fail_input(want.status());
  Groups groups = make_groups(a, *d, mpi.get(), *world);
  if (root)
    std::printf(
        "preflight: %d ranks on %.0f node(s), backend %s%s, device %s\n", world->size(),
        groups.nodes, a.backend.c_str(),
        d->ctx.device == Device::cuda && world->size() > 1 ? (", comm " + a.comm).c_str() : "",
        d->name.c_str());
  std::vector<Check> checks;
  std::vector<std::string> failures;
  Measured measured;
  measure_collectives(a, *d, *world, groups, *want, checks, failures, measured);
  measure_device(a, *d, *world, *want, checks, measured);
  if (root && !a.json.empty()) {
    if (absl::Status st = write_measured(a.json, gpu.empty() ? d->name : gpu, measured); !st.ok())
      failures.push_back(std::string(st.message()));
  }
  if (root) report(checks, failures, !gpu.empty());
  double failed = failures.empty() ? 0 : 1;
  world->all_reduce(Tensor(&failed, DType::f64, Device::cpu, {1}), tr::ReduceOp::max);
  return failed > 0 ? 1 : 0;
}
