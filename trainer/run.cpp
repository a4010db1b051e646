#include "trainer/run.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint.h"
#include "data/loader.h"
#include "kernels/ops.h"
#include "parallel/topology.h"
#include "trainer/config.h"
#include "trainer/metrics.h"
#include "trainer/model.h"
#include "trainer/optim.h"

namespace tr {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Set by SIGTERM/SIGINT (Slurm sends SIGTERM before a time limit or preemption): the loop
// finishes the current step, saves a checkpoint and exits.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// An error that ends the run, with its exit code.
struct Failure {
  absl::Status status;
  int code;
};

struct Run {
  CliOptions opts;
  Config cfg;
  Topology topo;
  Ctx ctx;
  std::unique_ptr<Qwen2Model> model;
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<data::DataLoader> train, valid;
  MetricsLog log;
  ckpt::TrainState state;
  int64_t last_saved_step = -1;
};

absl::Status resolve_backend(Run& r) {
  std::string& b = r.cfg.train.backend;
#ifdef TRAINER_HAVE_CUDA
  if (b == "cuda")
    return absl::InvalidArgumentError(
        "train.backend=cuda: the CUDA backend is not implemented yet in this build; set "
        "train.backend=cpu (or auto)");
#else
  if (b == "cuda")
    return absl::InvalidArgumentError(
        "train.backend=cuda but this trainer was built without CUDA (TRAINER_CUDA=OFF or no nvcc); "
        "rebuild with -DTRAINER_CUDA=ON or set train.backend=cpu");
#endif
  b = "cpu";  // auto: the CUDA backend is not available yet
  r.ctx = Ctx{Device::cpu, nullptr};
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<data::DataLoader>> make_loader(const Run& r,
                                                              const std::vector<DataSource>& srcs,
                                                              bool shuffle) {
  data::LoaderOptions o;
  for (const DataSource& s : srcs) o.paths.push_back({s.path, s.weight});
  absl::StatusOr<data::SourceFormat> fmt = data::parse_source_format(r.cfg.data.format);
  if (!fmt.ok()) return fmt.status();
  o.format = *fmt;
  o.seq_len = r.cfg.data.seq_len;
  o.seed = static_cast<uint64_t>(r.cfg.data.seed);
  o.shuffle = shuffle;
  o.dp_rank = r.topo.dp_rank;
  o.dp_size = r.topo.dp;
  o.global_batch = r.cfg.train.global_batch;
  o.micro_batch = r.cfg.train.micro_batch;
  o.consumed_samples = 0;  // the train loader is reset to the checkpoint's count on resume
  o.vocab_size = r.cfg.model.vocab_size;
  return data::DataLoader::create(o);
}

// Checkpoint views of the flat buffers: global names and shapes (vocab rows unpadded).
std::vector<ckpt::TensorRef> tensor_refs(const Qwen2Model& m, Tensor flat) {
  std::vector<ckpt::TensorRef> refs;
  for (const ParamInfo& p : m.layout().tensors)
    refs.push_back({p.name, p.global_shape, flat.at(p.offset, {p.numel}).ptr<float>()});
  return refs;
}

std::string layout_json(const Run& r) {
  nlohmann::json j = {{"world", r.topo.world},
                      {"tp", r.topo.tp},
                      {"pp", r.topo.pp},
                      {"dp", r.topo.dp},
                      {"backend", r.cfg.train.backend},
                      {"vocab_padded", r.model->dims().vocab_padded}};
  return j.dump();
}

absl::Status save_checkpoint(Run& r) {
  const auto t0 = Clock::now();
  std::vector<ckpt::TensorRef> p = tensor_refs(*r.model, r.model->params());
  std::vector<ckpt::TensorRef> m = tensor_refs(*r.model, r.opt->exp_avg());
  std::vector<ckpt::TensorRef> v = tensor_refs(*r.model, r.opt->exp_avg_sq());
  ckpt::SaveRequest req;
  req.root = r.cfg.checkpoint.dir;
  req.step = r.state.step;
  req.keep_last = static_cast<int>(r.cfg.checkpoint.keep_last);
  req.params = p;
  req.exp_avg = m;
  req.exp_avg_sq = v;
  req.state = r.state;
  req.config_yaml = to_yaml(r.cfg);
  req.layout_json = layout_json(r);
  if (absl::Status st = ckpt::save(req); !st.ok()) return st;
  r.last_saved_step = r.state.step;
  const double dt = seconds_since(t0);
  std::printf("checkpoint %s/%s saved in %.2fs\n", r.cfg.checkpoint.dir.c_str(),
              ckpt::step_dir_name(r.state.step).c_str(), dt);
  r.log.note(absl::StrFormat("\"step\": %d, \"event\": \"checkpoint\", \"seconds\": %.3f",
                             r.state.step, dt));
  return absl::OkStatus();
}

// The checkpoint to resume from: "" = start fresh.
absl::StatusOr<std::string> resume_path(const Run& r) {
  const std::string& how = r.opts.resume;
  const std::string& root = r.cfg.checkpoint.dir;
  if (how == "auto") return ckpt::find_latest(root);
  if (how == "none") {
    absl::StatusOr<std::string> latest = ckpt::find_latest(root);
    if (latest.ok() && !latest->empty())
      return absl::InvalidArgumentError(absl::StrCat(
          "--resume none but checkpoint.dir '", root, "' already holds checkpoints (latest ",
          *latest, "); pass --resume auto to continue them or choose another checkpoint.dir"));
    return std::string();
  }
  if (!fs::is_directory(how))
    return absl::InvalidArgumentError(
        absl::StrCat("--resume ", how, ": no such checkpoint directory"));
  fs::path dir = fs::path(how).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "x/step_00000010/"
  if (!ckpt::parse_step_dir_name(dir.filename().string()))
    return absl::InvalidArgumentError(absl::StrCat(
        "--resume ", how,
        ": not a committed checkpoint directory (expected CHECKPOINT_DIR/step_NNNNNNNN)"));
  if (absl::Status st = ckpt::verify(how); !st.ok()) return st;
  return how;
}

absl::Status load_checkpoint(Run& r, const std::string& path) {
  std::vector<ckpt::TensorRef> p = tensor_refs(*r.model, r.model->params());
  std::vector<ckpt::TensorRef> m = tensor_refs(*r.model, r.opt->exp_avg());
  std::vector<ckpt::TensorRef> v = tensor_refs(*r.model, r.opt->exp_avg_sq());
  ckpt::LoadTarget dst{p, m, v};
  std::string stored_yaml;
  if (absl::Status st = ckpt::load(path, dst, &r.state, &stored_yaml); !st.ok()) return st;
  r.last_saved_step = r.state.step;
  for (const std::string& d : config_differences(stored_yaml, to_yaml(r.cfg)))
    std::printf("note: config differs from the checkpoint's: %s\n", d.c_str());
  const double lr_now = lr_at(r.cfg.optim, r.cfg.train.steps, r.state.step);
  if (r.state.step > 0 &&
      std::abs(lr_now - r.state.lr) > 1e-9 * std::max(1.0, std::abs(r.state.lr)))
    std::printf(
        "note: the LR schedule changed: step %lld ran at lr %.4g, the new config gives %.4g "
        "there\n",
        static_cast<long long>(r.state.step), r.state.lr, lr_now);
  std::printf("resumed from %s: step %lld, %lld samples consumed\n", path.c_str(),
              static_cast<long long>(r.state.step),
              static_cast<long long>(r.state.consumed_samples));
  return absl::OkStatus();
}

// Training FLOPs per token, causal counting (llm.c / Megatron-Core): 6 N_matmul + 6 L s (nh hd),
// N_matmul = parameters in matrix products, LM head included, input embedding excluded.
double flops_per_token(const Config& c) {
  const ModelConfig& m = c.model;
  const double H = static_cast<double>(m.hidden_size), hd = static_cast<double>(m.head_dim);
  const double q = static_cast<double>(m.num_heads) * hd,
               kv = static_cast<double>(m.num_kv_heads) * hd;
  const double per_layer =
      H * (q + 2 * kv) + q * H + 3 * H * static_cast<double>(m.intermediate_size);
  const double n_matmul =
      static_cast<double>(m.num_layers) * per_layer + static_cast<double>(m.vocab_size) * H;
  return 6 * n_matmul +
         6 * static_cast<double>(m.num_layers) * static_cast<double>(c.data.seq_len) * q;
}

void print_plan(const Run& r) {
  const double mib = 1024.0 * 1024.0;
  const int64_t P = r.model->layout().total;
  std::printf("resolved config:\n%s", to_yaml(r.cfg).c_str());
  std::printf("topology: %s; backend %s\n", r.topo.describe().c_str(), r.cfg.train.backend.c_str());
  std::printf("model: %lld parameters on this rank (vocab padded to %lld); %.3g GFLOP per token\n",
              static_cast<long long>(P), static_cast<long long>(r.model->dims().vocab_padded),
              flops_per_token(r.cfg) / 1e9);
  std::printf("memory: weights %.1f MiB, grads %.1f MiB, adam m+v %.1f MiB, activations %.1f MiB\n",
              P * 4 / mib, P * 4 / mib, 2 * P * 4 / mib, r.model->activation_bytes() / mib);
  int64_t samples = 0;
  for (int i = 0; i < r.train->space().num_sources(); ++i)
    samples += r.train->space().num_samples(i);
  std::printf(
      "data: %lld train samples per epoch; %lld samples per step, %lld micro-batches of %lld\n",
      static_cast<long long>(samples), static_cast<long long>(r.cfg.train.global_batch),
      static_cast<long long>(r.cfg.train.global_batch / r.cfg.train.micro_batch / r.topo.dp),
      static_cast<long long>(r.cfg.train.micro_batch));
  std::fflush(stdout);
}

// Mean validation loss per token over eval_steps batches read in order from the start.
absl::StatusOr<double> evaluate(Run& r) {
  r.valid->reset(0);
  double sum = 0;
  int64_t tokens = 0;
  for (int64_t i = 0; i < r.cfg.train.eval_steps; ++i) {
    absl::StatusOr<data::StepBatch> b = r.valid->next();
    if (!b.ok()) return b.status();
    for (const data::MicroBatch& mb : b->micro_batches) {
      sum += r.model->forward_loss(mb.inputs.data(), mb.targets.data());
      tokens += static_cast<int64_t>(mb.targets.size());
    }
  }
  return sum / static_cast<double>(tokens);
}

// One optimizer step: micro-batches with gradient accumulation, clip, AdamW.
absl::Status train_step(Run& r, StepMetrics& m) {
  const auto t0 = Clock::now();
  absl::StatusOr<data::StepBatch> batch = r.train->next();
  if (!batch.ok()) return batch.status();
  m.data_wait_s = seconds_since(t0);
  const int64_t step = r.state.step + 1;
  const int64_t tokens = r.cfg.train.global_batch * r.cfg.data.seq_len;
  const float grad_scale = 1.0f / static_cast<float>(tokens);  // mean loss over the global batch
  zero_(r.ctx, r.model->grads());
  double loss_sum = 0;
  for (const data::MicroBatch& mb : batch->micro_batches)
    loss_sum += r.model->forward_backward(mb.inputs.data(), mb.targets.data(), grad_scale);
  const auto t1 = Clock::now();
  m.grad_norm = r.opt->clip_grad_norm();
  m.lr = lr_at(r.cfg.optim, r.cfg.train.steps, step);
  r.opt->update(m.lr, step);
  m.optimizer_s = seconds_since(t1);
  m.loss = loss_sum / static_cast<double>(tokens);
  m.step = step;
  m.tokens = tokens;
  m.step_time_s = seconds_since(t0);
  r.state.step = step;
  r.state.consumed_samples = r.train->consumed_samples();
  r.state.tokens_seen += tokens;
  r.state.lr = m.lr;
  return absl::OkStatus();
}

absl::Status train_loop(Run& r) {
  const auto start = Clock::now();
  StepMetrics m;
  m.total_steps = r.cfg.train.steps;
  m.flops_per_token = flops_per_token(r.cfg);
  m.world = r.topo.world;
  const TrainConfig& t = r.cfg.train;
  while (r.state.step < t.steps) {
    if (absl::Status st = train_step(r, m); !st.ok()) return st;
    ++m.steps_done_here;
    m.elapsed_s = seconds_since(start);
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    m.peak_mem_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB
    if (!std::isfinite(m.loss))
      return absl::InternalError(
          absl::StrFormat("loss is %f at step %d; stopping (last checkpoint: step %d)", m.loss,
                          m.step, r.last_saved_step));
    r.log.step(m, m.step % r.cfg.log.interval == 0 || m.step == t.steps || m.step == 1);
    if (t.eval_interval > 0 && (m.step % t.eval_interval == 0 || m.step == t.steps)) {
      const auto e0 = Clock::now();
      absl::StatusOr<double> val = evaluate(r);
      if (!val.ok()) return val.status();
      r.log.eval(m.step, *val, seconds_since(e0));
    }
    const bool interval = r.cfg.checkpoint.interval > 0 && m.step % r.cfg.checkpoint.interval == 0;
    const bool exit_now = t.exit_interval > 0 && m.step % t.exit_interval == 0 && m.step < t.steps;
    if (interval || exit_now || m.step == t.steps || g_stop_signal) {
      if (absl::Status st = save_checkpoint(r); !st.ok())
        return absl::InternalError(absl::StrCat("checkpoint save failed: ", st.message()));
    }
    if (g_stop_signal) {
      std::printf("stopped by signal %d after step %lld; resume with --resume auto\n",
                  static_cast<int>(g_stop_signal), static_cast<long long>(m.step));
      return absl::OkStatus();
    }
    if (exit_now) {
      std::printf("exit_interval: stopping after step %lld; resume with --resume auto\n",
                  static_cast<long long>(m.step));
      return absl::OkStatus();
    }
  }
  std::printf("done: %lld steps, last loss %.4f, %s\n", static_cast<long long>(r.state.step),
              m.loss, format_duration(seconds_since(start)).c_str());
  return absl::OkStatus();
}

// Everything before the first step, cheapest checks first: config, layout, backend, the
// checkpoint to resume and every data file are validated before the model is allocated. Any
// error here is bad input (exit 2).
absl::Status setup(Run& r) {
  absl::StatusOr<Config> cfg = load_config(r.opts.config, r.opts.sets);
  if (!cfg.ok()) return cfg.status();
  r.cfg = *cfg;
  absl::StatusOr<Topology> topo =
      Topology::make(1, 0, static_cast<int>(r.cfg.parallel.tp), static_cast<int>(r.cfg.parallel.pp),
                     static_cast<int>(r.cfg.parallel.dp));
  if (!topo.ok()) return topo.status();
  r.topo = *topo;
  if (absl::Status st = resolve_backend(r); !st.ok()) return st;
  absl::StatusOr<std::string> resume = resume_path(r);
  if (!resume.ok()) return resume.status();
  absl::StatusOr<std::unique_ptr<data::DataLoader>> train = make_loader(r, r.cfg.data.train, true);
  if (!train.ok()) return train.status();
  r.train = std::move(*train);
  if (r.cfg.train.eval_interval > 0) {
    absl::StatusOr<std::unique_ptr<data::DataLoader>> valid =
        make_loader(r, r.cfg.data.valid, false);
    if (!valid.ok()) return valid.status();
    r.valid = std::move(*valid);
  }
  r.model = std::make_unique<Qwen2Model>(ModelDims::from(r.cfg.model, r.topo),
                                         r.cfg.train.micro_batch, r.cfg.data.seq_len, r.ctx);
  r.opt = std::make_unique<AdamW>(r.cfg.optim, *r.model, r.ctx);
  r.model->init_weights(static_cast<uint64_t>(r.cfg.train.seed), r.cfg.model.init_std);
  r.state.rng_state = static_cast<uint64_t>(r.cfg.train.seed);
  if (!resume->empty()) {
    if (absl::Status st = load_checkpoint(r, *resume); !st.ok()) return st;
    r.train->reset(r.state.consumed_samples);  // continue the sample order exactly
  }
  return absl::OkStatus();
}

absl::Status write_run_files(Run& r) {
  if (absl::Status st = r.log.open(r.cfg.log.dir, r.state.step); !st.ok()) return st;
  std::ofstream f(fs::path(r.cfg.log.dir) / "config.yaml", std::ios::trunc);
  f << to_yaml(r.cfg);
  if (!f)
    return absl::InvalidArgumentError(absl::StrCat("cannot write ", r.cfg.log.dir, "/config.yaml"));
  return absl::OkStatus();
}

}  // namespace

int run(const CliOptions& opts) {
  Run r;
  r.opts = opts;
  if (absl::Status st = setup(r); !st.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(st.message()).c_str());
    return kExitBadInput;
  }
  print_plan(r);
  if (opts.dry_run) return kExitOk;
  if (r.state.step >= r.cfg.train.steps) {
    std::printf("checkpoint is at step %lld >= train.steps %lld: nothing to do\n",
                static_cast<long long>(r.state.step), static_cast<long long>(r.cfg.train.steps));
    return kExitOk;
  }
  if (absl::Status st = write_run_files(r); !st.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(st.message()).c_str());
    return kExitBadInput;
  }
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  if (absl::Status st = train_loop(r); !st.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(st.message()).c_str());
    // A bad token or unreadable shard found mid-run is still bad input.
    return st.code() == absl::StatusCode::kInternal ? kExitFailure : kExitBadInput;
  }
  return kExitOk;
}

}  // namespace tr
