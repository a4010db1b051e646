#include "trainer/run/run.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/fs_io.h"
#include "core/switches.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "trainer/checkpoint/hf.h"
#include "trainer/checkpoint/local_ckpt.h"
#include "trainer/checkpoint/ownership.h"
#include "trainer/model/init.h"
#include "trainer/obs/step_timing.h"
#include "trainer/plan/plan.h"
#include "trainer/plan/resilience.h"
#include "trainer/run/startup.h"
#include "trainer/session/session.h"
#include "trainer/step/agree.h"

namespace tr {
namespace {

namespace fs = std::filesystem;

// Config keys that identify a run: a checkpoint whose values differ was written by another
// run, and is resumed only with --force.
constexpr const char* kRunIdentity[] = {"train.seed", "data.seed", "data.train"};

// Rank 0, once every input checked out and before the first step: makes the directory say
// what this run continues. Starting over moves the old checkpoints aside; resuming an earlier
// step points `latest` at it and moves the later ones aside, so that a crash before the first
// save resumes this run's point, not an abandoned branch. Nothing is deleted.
absl::Status settle_checkpoint_dir(Session& s) {
  const std::string stamp = tr::fs::utc_now("%Y%m%dT%H%M%SZ");
  const std::string& root = s.cfg.checkpoint.dir;
  absl::StatusOr<std::vector<std::string>> moved =
      s.start_over            ? ckpt::abandon_checkpoints(root, stamp)
      : s.resume_from.empty() ? std::vector<std::string>{}
                              : ckpt::adopt_resume_point(root, s.resume_from, stamp);
  if (!moved.ok())
    return absl::Status(moved.status().code(),
                        absl::StrCat("cannot set up checkpoint.dir '", root,
                                     "' for this run: ", moved.status().message()));
  if (!moved->empty())
    std::printf("note: %s: moved %zu entr%s of checkpoint.dir aside (kept, not deleted): %s\n",
                s.start_over ? "starting over (--resume none --force)"
                             : "resuming an earlier step than checkpoint.dir's newest",
                moved->size(), moved->size() == 1 ? "y" : "ies",
                absl::StrJoin(*moved, ", ").c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

// After a load failed: the model.* keys where this run differs from the checkpoint's config
// (its config.yaml), with the fix, to follow the error; "" when the model is the same.
std::string model_changes(const std::string& path, const Config& cfg) {
  const absl::StatusOr<std::string> stored = tr::fs::read_file(tr::fs::join(path, "config.yaml"));
  std::vector<std::string> changed;
  if (stored.ok())
    for (const std::string& d : config_differences(*stored, to_yaml(cfg)))
      if (d.starts_with("model.")) changed.push_back(d);
  if (changed.empty()) return "";
  return absl::StrCat("; this run's model differs from the checkpoint's (",
                      absl::StrJoin(changed, ", "),
                      "): set those fields back to the checkpoint's, or give this model a new "
                      "checkpoint.dir");
}

// Every rank reads only its part: its TP slice of its stage's weights and, of those, its
// ZeRO-1 range of the Adam states (the files were verified in check_inputs).
absl::Status load_checkpoint(Session& s, const std::string& path) {
  std::string stored_yaml;
  // Read on the host: the weights staged and then set (the masters this rank keeps, and the
  // compute copy); the Adam states in place on the host, staged for a device.
  std::vector<float> weights(static_cast<size_t>(s.params->layout().total));
  Tensor states[2] = {s.opt->exp_avg(), s.opt->exp_avg_sq()};
  std::vector<float> staged[2];
  float* into[2];
  for (int i = 0; i < 2; ++i) {
    if (states[i].device == Device::cpu) {
      into[i] = states[i].ptr<float>();
    } else {
      staged[i].resize(static_cast<size_t>(states[i].numel()));
      into[i] = staged[i].data();
    }
  }
  if (absl::Status st = load_rank_part(path, s.cfg, s.topo(), weights.data(), into[0], into[1],
                                       &s.state, &stored_yaml);
      !st.ok())
    return absl::Status(st.code(), absl::StrCat(st.message(), model_changes(path, s.cfg)));
  s.opt->weights_from_host(weights);
  for (int i = 0; i < 2; ++i)
    if (!staged[i].empty())
      copy_tensor(states[i],
                  Tensor(staged[i].data(), DType::f32, Device::cpu, {states[i].numel()}));
  s.last_saved_step = s.state.step;
  const std::vector<std::string> diffs = config_differences(stored_yaml, to_yaml(s.cfg));
  for (const std::string& d : diffs) {
    const bool identity = std::any_of(std::begin(kRunIdentity), std::end(kRunIdentity),
                                      [&](const char* k) { return d.starts_with(k); });
    if (identity && !s.opts.force)
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path, " was written by another run: ", d,
          " (train.seed, data.seed and data.train identify a run); resume it anyway with "
          "--force, or choose another checkpoint.dir"));
    std::printf("note: config differs from the checkpoint's: %s\n", d.c_str());
  }
  const double lr_now = lr_at(s.cfg.optim, s.cfg.train.steps, s.state.step);
  if (s.state.step > 0 &&
      std::abs(lr_now - s.state.lr) > 1e-9 * std::max(1.0, std::abs(s.state.lr)))
    std::printf(
        "note: the LR schedule changed: step %lld ran at lr %.4g, the new config gives %.4g "
        "there\n",
        static_cast<long long>(s.state.step), s.state.lr, lr_now);
  std::printf("resumed from %s: step %lld, %lld samples consumed\n", path.c_str(),
              static_cast<long long>(s.state.step),
              static_cast<long long>(s.state.consumed_samples));
  return absl::OkStatus();
}

// model.init_from on a fresh start: this rank's slices of the Hugging Face weights (read on
// the host, then copied to the device), a fresh optimizer, step 0.
absl::Status load_init_from(Session& s) {
  std::vector<float> staged(static_cast<size_t>(s.params->layout().total));
  if (absl::Status st = load_hf_rank_part(*s.init_from, s.cfg, s.topo(), staged.data()); !st.ok())
    return st;
  s.opt->weights_from_host(staged);
  const size_t files = s.init_from->file_count();
  std::printf("initialised from %s (Hugging Face weights, %zu file%s); optimizer fresh, step 0\n",
              s.cfg.model.init_from.c_str(), files, files == 1 ? "" : "s");
  s.init_from.reset();  // unmaps the files
  return absl::OkStatus();
}

}  // namespace

namespace {

void print_plan(const Session& s) {
  const double mib = 1024.0 * 1024.0;
  const int64_t P = s.params->layout().total;
  std::printf("resolved config:\n%s", to_yaml(s.cfg).c_str());
  if (const std::vector<std::string> on = active_switches(); !on.empty())
    std::printf("debug switches: %s (docs/debug.md)\n", absl::StrJoin(on, " ").c_str());
  std::printf("topology: %s; backend %s\n", s.topo().describe().c_str(),
              s.cfg.train.backend.c_str());
  if (s.topo().pp > 1)
    std::printf(
        "pipeline: %s, %lld micro-batches per step: bubble %.1f%% by its closed form; %d in "
        "flight on this stage\n",
        s.layout.schedule_text().c_str(), static_cast<long long>(s.layout.micro_batches),
        100 * bubble_fraction(s.layout.schedule, s.topo().pp, s.layout.virtual_stages,
                              s.layout.micro_batches),
        s.layout.in_flight());
  std::printf("model: %lld parameters on this rank (vocab padded to %lld); %.3g GFLOP per token\n",
              static_cast<long long>(P), static_cast<long long>(s.model->dims().vocab_padded),
              s.layout.flops_per_token / 1e9);
  const WeightMemory w = weight_memory(*s.params, s.opt->master_bytes());
  std::printf(
      "memory on %s: weights %.1f MiB%s, compute copy %.1f MiB, grads %.1f MiB, adam m+v %.1f "
      "MiB, activations %.1f MiB (loss chunks of %lld tokens), workspace %.1f MiB + attention "
      "%.1f MiB\n",
      device_name(s.ctx.device), w.masters / mib,
      s.opt->masters_sharded() ? " (this rank's zero1 shard)" : "", w.compute_copy / mib,
      s.params->grad_bytes() / mib, 2.0 * s.opt->state_elems() * 4 / mib,
      s.model->activation_bytes() / mib, static_cast<long long>(s.model->loss_chunk()),
      s.ctx.workspace_bytes / mib, s.model->attention_workspace_bytes() / mib);
  if (s.ctx.device != Device::cpu) {
    const DeviceInfo info = device_info(s.ctx);
    std::printf("device: %s, %.0f MiB in use after set-up\n", info.name.c_str(),
                info.memory_used_mib);
  }
  int64_t samples = 0;
  for (int i = 0; i < s.train->space().num_sources(); ++i)
    samples += s.train->space().num_samples(i);
  std::printf(
      "data: %lld train samples per epoch; %lld samples per step, %lld micro-batches of %lld\n",
      static_cast<long long>(samples), static_cast<long long>(s.cfg.train.global_batch),
      static_cast<long long>(s.layout.micro_batches),
      static_cast<long long>(s.cfg.train.micro_batch));
  std::fflush(stdout);
}

// The run id a fresh start with node-local checkpoints records in checkpoint.dir, so that a
// restart before the first persistent save knows which local parts are its own (and a run
// started again after checkpoint.dir was deleted takes none).
constexpr char kLocalRunIdFile[] = "local_run_id";

// The run whose local parts a resume may take: the persistent checkpoint's, else the one
// recorded in checkpoint.dir (read by rank 0, the same on every rank); 0 = none.
uint64_t local_run_id(Session& s) {
  uint64_t id = s.resume_from.empty() ? 0 : s.state.run_id;
  if (id == 0 && s.logger()) {
    absl::StatusOr<std::string> text =
        tr::fs::read_file(tr::fs::join(s.cfg.checkpoint.dir, kLocalRunIdFile));
    if (text.ok() && !absl::SimpleHexAtoi(absl::StripAsciiWhitespace(*text), &id)) id = 0;
  }
  s.groups.world->broadcast(Tensor(&id, DType::i64, Device::cpu, {1}), 0);
  return id;
}

// Node-local checkpoints at start-up: with --resume auto, the newest one every rank has from this
// run and layout replaces the persistent checkpoint just loaded when it is newer; any other start
// removes this rank's parts (not a dry run), so that no later resume takes a step of an abandoned
// branch.
absl::Status resume_local(Session& s) {
  LocalCheckpoints local(s);
  if (!local.enabled()) return absl::OkStatus();
  const uint64_t run_id = s.opts.resume == "auto" && !s.start_over ? local_run_id(s) : 0;
  if (run_id == 0) {
    if (!s.opts.dry_run) local.discard_own();
    return absl::OkStatus();
  }
  const int64_t persistent = s.resume_from.empty() ? -1 : s.state.step;
  const int64_t step = local.newest(std::max<int64_t>(persistent, 0), run_id);
  absl::Status st = step >= 0 ? local.load(step) : absl::NotFoundError("");
  if (!st.ok()) {
    const std::string why = step >= 0 ? std::string(st.message()) : local.why_not();
    if (s.logger() && !why.empty())
      std::printf("note: %s; resuming from %s\n", why.c_str(),
                  persistent >= 0 ? ckpt::step_dir_name(persistent).c_str() : "the start");
    // The run continues from the persistent checkpoint: no later resume may take a local part
    // this one did not (of another layout, or damaged).
    if (!s.opts.dry_run) local.discard_own();
    return absl::OkStatus();
  }
  s.train->reset(s.state.consumed_samples);
  if (s.logger())
    std::printf(
        "resumed from the local checkpoint of step %lld in %s (newer than %s): %lld "
        "samples consumed\n",
        static_cast<long long>(step), local.dir().c_str(),
        persistent >= 0 ? ("persistent step " + std::to_string(persistent)).c_str()
                        : "any persistent checkpoint",
        static_cast<long long>(s.state.consumed_samples));
  std::fflush(stdout);
  return absl::OkStatus();
}

// Rank 0 records the run's id in checkpoint.dir for the local checkpoints (see kLocalRunIdFile).
absl::Status record_local_run_id(const Session& s) {
  if (s.cfg.checkpoint.local_interval <= 0 || !s.logger() || s.opts.dry_run)
    return absl::OkStatus();
  return tr::fs::write_file_atomic(tr::fs::join(s.cfg.checkpoint.dir, kLocalRunIdFile),
                                   absl::StrFormat("%016x\n", s.state.run_id));
}

// Model, optimizer, initial weights, and the checkpoint when resuming (its shapes are checked
// here: a mismatch is bad input).
absl::Status build_model(Session& s) {
  const bool zero1 = s.layout.zero1;
  // TR_LOSS_CHUNK_TOKENS=N overrides loss_chunk_tokens() (trainer/model/model.h), to bisect a GPU
  // regression against the old 16M-logit chunks (docs/PERFORMANCE.md).
  const int64_t loss_chunk = setting_int(Setting::loss_chunk_tokens);
  // A separate compute copy: bf16 on GPUs; on the CPU an fp32 one when TR_TEST_COMPUTE_COPY=1,
  // so that the GPU's layout (and ZeRO-1's sharded masters) runs and is tested on CPU ranks.
  const bool test_copy = take(Switch::test_compute_copy);
  const ModelDims dims = ModelDims::from(s.cfg, s.topo());
  const ModelOptions options = model_options(s.cfg, s.layout, s.ctx.device, test_copy, loss_chunk);
  s.params = std::make_unique<ParamBuffer>(make_param_buffer(dims, options, s.ctx.device));
  s.model = std::make_unique<DecoderModel>(dims, options, *s.params, s.ctx);
  s.model->set_tp_comm(s.groups.tp.get());
  s.model->set_cp_comm(s.groups.cp.get());
  s.model->set_ep_comm(s.groups.ep.get());
  const OptimizerGroups groups{s.groups.dp_cp.get(), s.groups.expert_replicas(), s.groups.tp.get(),
                               s.groups.pp.get(),
                               s.layout.tied_embedding_copies() ? s.groups.embed.get() : nullptr};
  s.opt = std::make_unique<DistributedOptimizer>(s.cfg.optim, *s.params, s.ctx, groups, zero1,
                                                 options.shards, options.separate_compute_copy);
  s.opt->configure_reduction(s.cfg.parallel.dp_bucket_elems, s.cfg.parallel.overlap_dp,
                             grad_reduce_dtype(s.cfg.parallel),
                             s.cfg.parallel.overlap_param_gather);
  s.model->set_param_events(s.opt.get());
  s.io = std::make_unique<StepIO>(s.ctx);
  s.opt->weights_from_host(initial_weights(
      s.params->layout(), dims, static_cast<uint64_t>(s.cfg.train.seed), s.cfg.model.init_std));
  s.state.rng_state = static_cast<uint64_t>(s.cfg.train.seed);
  absl::Status loaded;
  if (!s.resume_from.empty()) {
    loaded = load_checkpoint(s, s.resume_from);
    if (loaded.ok()) s.train->reset(s.state.consumed_samples);  // continue the sample order
  } else if (s.init_from) {
    loaded = load_init_from(s);
  }
  // A load that failed on some ranks ends every rank here, before the collectives below (the
  // failing ranks' errors are agreed by the caller).
  if (!all_ok(*s.groups.world, loaded.ok())) return loaded;
  if (absl::Status st = resume_local(s); !st.ok()) return st;
  // A fresh run's identity (also for a checkpoint from before run ids), the same on every rank:
  // rank 0 draws it. Every shard is stamped with it (ckpt::TrainState::run_id).
  if (s.state.run_id == 0) {
    uint64_t id = 0;
    if (s.groups.world->rank() == 0) {
      std::random_device rd;
      id = (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
    }
    s.groups.world->broadcast(Tensor(&id, DType::i64, Device::cpu, {1}), 0);
    s.state.run_id = id;
  }
  if (absl::Status st = record_local_run_id(s); !st.ok()) return st;
  return absl::OkStatus();
}

// The tp, dp, pp and embed groups of the run's layout (on GPU ranks NCCL or staging ones), each
// charging its calls to its phase of the step (trainer/obs/step_timing.h); the embedding group
// carries a gradient reduction, as dp does. Collective over world.
void make_step_groups(Session& s) {
  s.groups = make_groups(s.topo(), std::move(s.groups.world));
  if (s.ctx.device == Device::cuda)
    use_device_comms(s.groups, s.cfg.parallel.comm == "nccl", s.ctx.stream,
                     s.cfg.parallel.timeout_s);
  s.groups.tp = timed_comm(std::move(s.groups.tp), Phase::tp_comm);
  s.groups.pp = timed_comm(std::move(s.groups.pp), Phase::pipeline_wait);
  s.groups.cp = timed_comm(std::move(s.groups.cp), Phase::cp_comm);
  s.groups.dp_cp = timed_comm(std::move(s.groups.dp_cp), Phase::dp_wait);
  s.groups.embed = timed_comm(std::move(s.groups.embed), Phase::dp_wait);
}

absl::Status write_run_files(Session& s) {
  if (absl::Status st = s.log.open(s.cfg.log.dir, s.state.step, s.cfg.log.tensorboard); !st.ok())
    return st;
  const std::string yaml = to_yaml(s.cfg);
  s.log.text("config", s.state.step, "```yaml\n" + yaml + "```\n");
  std::ofstream f(fs::path(s.cfg.log.dir) / "config.yaml", std::ios::trunc);
  f << yaml;
  if (!f)
    return absl::InvalidArgumentError(absl::StrCat("cannot write ", s.cfg.log.dir, "/config.yaml"));
  return absl::OkStatus();
}

// Rank 0's metrics.jsonl, event file and config.yaml; with log.tensorboard_all_ranks the other
// ranks' event files (log.dir/tb/rank_<r>).
absl::Status open_logs(Session& s) {
  if (s.logger()) return write_run_files(s);
  if (!s.cfg.log.tensorboard || !s.cfg.log.tensorboard_all_ranks) return absl::OkStatus();
  return s.log.open_tensorboard(
      (fs::path(s.cfg.log.dir) / "tb" / absl::StrCat("rank_", s.topo().rank)).string(),
      s.state.step);
}

}  // namespace

absl::Status check_gpu_binding(Comm& world, int gpu) {
  if (world.size() == 1 || gpu < 0) return absl::OkStatus();
  constexpr int kWords = 24;  // 64 bytes of host name, 32 of PCI bus id
  int32_t mine[kWords] = {};
  char* bytes = reinterpret_cast<char*>(mine);
  gethostname(bytes, 63);
  const std::string pci = cuda::device_pci_bus_id(gpu);
  std::memcpy(bytes + 64, pci.data(), std::min<size_t>(pci.size(), 31));
  std::vector<int32_t> all(static_cast<size_t>(kWords) * world.size());
  world.all_gather(Tensor(all.data(), DType::i32, Device::cpu, {kWords * world.size()}),
                   Tensor(mine, DType::i32, Device::cpu, {kWords}));
  for (int a = 0; a < world.size(); ++a)
    for (int b = a + 1; b < world.size(); ++b) {
      const char* x = reinterpret_cast<const char*>(&all[static_cast<size_t>(a) * kWords]);
      const char* y = reinterpret_cast<const char*>(&all[static_cast<size_t>(b) * kWords]);
      if (std::memcmp(x, y, sizeof(mine)) == 0)
        return absl::InvalidArgumentError(absl::StrCat(
            "parallel.comm=nccl needs one GPU per rank, but ranks ", a, " and ", b, " on ",
            std::string(x), " share GPU ", std::string(x + 64),
            "; launch at most one rank per GPU (srun --gpus-per-task=1, or fewer tasks per "
            "node), or set parallel.comm=mpi (ranks share GPUs; for tests)"));
    }
  return absl::OkStatus();
}

int run_plan(const CliOptions& opts) {
  absl::StatusOr<Config> cfg = load_config(opts.config, opts.sets);
  absl::StatusOr<GpuSpec> gpu = gpu_spec(opts.gpu);
  StorageSpec storage;
  for (const std::string& file : opts.hardware)
    if (gpu.ok()) gpu = override_gpu_spec(*gpu, file, &storage);
  absl::StatusOr<Plan> plan = absl::InternalError("");
  // Block-causal attention costs what the data's documents make it: measured on the first
  // samples of data.train where it can be read, else planned over whole sequences (a bound).
  double span = 0;
  std::string span_note;
  bool span_measured = false;
  if (cfg.ok() && cfg->data.document_mask == "block_causal") {
    absl::StatusOr<AttentionSpan> measured = measure_attention_span(*cfg);
    span_measured = measured.ok();
    if (measured.ok()) {
      span = measured->keys;
      span_note = absl::StrFormat(
          "attention: block-causal, %.0f keys per query on average (the documents of the first "
          "%d samples of data.train; %d for whole sequences)\n",
          span, measured->samples, cfg->data.seq_len);
    } else {
      span_note = absl::StrCat(
          "attention: block-causal, planned over whole sequences (an upper bound): the "
          "documents of data.train could not be measured: ",
          measured.status().message(), "\n");
    }
  }
  if (cfg.ok() && gpu.ok()) plan = make_plan(*cfg, *gpu, opts.nodes, opts.gpus_per_node, {}, span);
  for (const absl::Status& st : {cfg.status(), gpu.status(), plan.status()}) {
    if (st.ok()) continue;
    std::fprintf(stderr, "error: %s\n", std::string(st.message()).c_str());
    return kExitBadInput;
  }
  std::string out = opts.json ? plan_json(*cfg, *plan) : format_plan(*cfg, *plan) + span_note;
  if (opts.json && cfg->data.document_mask == "block_causal") {
    // Whether attention_span was measured on the data, or is the sequence (unreadable data).
    nlohmann::json j = nlohmann::json::parse(out);
    j["attention_span_measured"] = span_measured;
    out = j.dump() + "\n";
  }
  if (opts.explain && !opts.json) out += explain_plan(*cfg, *plan);
  if (opts.mtbf_hours > 0) {
    const FailurePlan f = plan_failures(*cfg, *plan, opts.mtbf_hours, storage);
    if (opts.json) {
      nlohmann::json j = nlohmann::json::parse(out);
      j["failures"] = nlohmann::json::parse(failures_json(f));
      out = j.dump() + "\n";
    } else {
      out += format_failures(f);
    }
  }
  if (opts.suggest) {
    absl::StatusOr<std::string> table =
        suggest_layouts(*cfg, *gpu, opts.nodes, opts.gpus_per_node, 8, span);
    if (!table.ok()) {
      std::fputs(out.c_str(), stdout);
      std::fflush(stdout);
      std::fprintf(stderr, "error: %s\n", std::string(table.status().message()).c_str());
      return kExitBadInput;
    }
    out += *table;
  }
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

int run_export_hf(const CliOptions& opts) {
  ExportOptions o;
  o.checkpoint = opts.checkpoint;
  o.out = opts.out;
  o.dtype = opts.dtype == "fp32" ? st::ElemType::f32 : st::ElemType::bf16;
  o.tokenizer = opts.tokenizer;
  o.max_shard_gib = opts.max_shard_gib;
  const absl::Status st = export_hf(o);
  if (st.ok()) return kExitOk;
  std::fprintf(stderr, "error: %s\n", std::string(st.message()).c_str());
  return st.code() == absl::StatusCode::kInternal ? kExitFailure : kExitBadInput;
}

namespace {

// trainer --dry-run --world N: a job's checks without its ranks (trainer/run/startup.h).
int run_dry_world(const CliOptions& opts) {
  Session s;
  s.opts = opts;
  s.groups.world = make_self_comm("world");
  const absl::StatusOr<GpuSpec> gpu = gpu_spec(opts.gpu);
  const absl::Status st =
      gpu.ok() ? check_inputs_for_world(s, opts.world, *gpu, opts.gpus_per_node) : gpu.status();
  if (st.ok()) return kExitOk;
  std::fflush(stdout);
  std::fprintf(stderr, "error: %s\n", std::string(st.message()).c_str());
  return kExitBadInput;
}

}  // namespace

int open_session(Session& s) {
  absl::Status st = check_inputs(s);
  // A checkpoint.dir held by a live trainer is busy, not bad input: a retry may succeed.
  if (int code = agree_on_exit(*s.groups.world,
                               st.ok()                   ? kExitOk
                               : absl::IsUnavailable(st) ? kExitBusy
                                                         : kExitBadInput,
                               st);
      code != kExitOk)
    return code;
  if (s.mpi) s.mpi->watch(s.cfg.parallel.timeout_s);
  if (s.ctx.device == Device::cuda && s.cfg.parallel.comm == "nccl") {
    st = check_gpu_binding(*s.groups.world, s.gpu);
    if (int code = agree_on_exit(*s.groups.world, st.ok() ? kExitOk : kExitBadInput, st);
        code != kExitOk)
      return code;
  }
  make_step_groups(s);
  {
    MpiPatience loading(s.cfg.checkpoint.save_timeout_s);  // ranks wait for the slowest reader
    st = build_model(s);
  }
  return agree_on_exit(*s.groups.world, st.ok() ? kExitOk : kExitBadInput, st);
}

int run(const CliOptions& opts) {
  if (opts.dry_run && opts.world > 0) return run_dry_world(opts);
  // From the start, so that a stop during set-up is acted on before the first step instead of
  // killing the rank. SIGUSR1/SIGUSR2: what Slurm's --signal sends, and what mpirun and srun
  // pass on to every rank without ending the job.
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGUSR2}) std::signal(sig, on_stop_signal);
  Session s;
  s.opts = opts;
  // Under srun or mpirun every rank runs this; a lone process needs no launcher.
  if (const std::optional<std::string> n = launcher_env("SLURM_STEP_NUM_TASKS");
      n && std::atoi(n->c_str()) > 1 && !launched_by_mpi_launcher()) {
    std::fprintf(stderr,
                 "error: started by srun with %s tasks but without PMI, so the ranks cannot "
                 "connect; launch with srun --mpi=pmix (or set MpiDefault=pmix in slurm.conf)\n",
                 n->c_str());
    return kExitBadInput;
  }
  if (launched_by_mpi_launcher()) s.mpi = std::make_unique<MpiRuntime>(nullptr, nullptr);
  s.groups.world = s.mpi ? make_mpi_world() : make_self_comm("world");
  if (s.groups.world->rank() != 0) {  // rank 0 logs, and says what a stop signal will do
    (void)!std::freopen("/dev/null", "w", stdout);
    g_stop_notice = 0;
  }
  if (int code = open_session(s); code != kExitOk) return code;
  print_plan(s);
  if (opts.dry_run) return kExitOk;
  if (s.state.step >= s.cfg.train.steps) {
    std::printf("checkpoint is at step %lld >= train.steps %lld: nothing to do\n",
                static_cast<long long>(s.state.step), static_cast<long long>(s.cfg.train.steps));
    return kExitOk;
  }
  absl::Status st = s.logger() ? settle_checkpoint_dir(s) : absl::OkStatus();
  if (int code = agree_on_exit(*s.groups.world, st.ok() ? kExitOk : kExitFailure, st);
      code != kExitOk)
    return code;
  st = open_logs(s);
  if (int code = agree_on_exit(*s.groups.world, st.ok() ? kExitOk : kExitBadInput, st);
      code != kExitOk)
    return code;
  int code = train_loop(s);
  if (s.logger() && s.log.failed() && code == kExitOk) {
    std::fprintf(stderr,
                 "error: lines of %s/metrics.jsonl could not be written (see the warning above); "
                 "the checkpoints are complete\n",
                 s.cfg.log.dir.c_str());
    code = kExitFailure;
  }
  // Which switched paths ran, per rank (only when a switch is set): a test of the process can
  // see that a switch still changes what runs.
  if (const std::vector<std::string> taken = taken_switches(); !taken.empty())
    std::fprintf(stderr, "rank %d: debug switches taken: %s\n", s.topo().rank,
                 absl::StrJoin(taken, ", ").c_str());
  if (s.logger()) s.log.exit(s.state.step, code);
  return code;
}

}  // namespace tr
