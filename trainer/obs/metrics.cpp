#include "trainer/obs/metrics.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/clock.h"

namespace tr {

namespace fs = std::filesystem;

namespace {

// The process's start, for the start event's start-up time (static initialisation runs before
// main).
const Clock::time_point kProcessStart = Clock::now();

std::string utc_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

}  // namespace

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%dh%02dm%02ds", t / 3600, t / 60 % 60, t % 60);
  if (t >= 60) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%ds", t);
}

absl::Status MetricsLog::open(const std::string& dir, int64_t resume_step, bool tensorboard) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return absl::InvalidArgumentError(
        absl::StrCat("log.dir '", dir, "' cannot be created: ", ec.message()));
  path_ = (fs::path(dir) / "metrics.jsonl").string();
  const bool exists = fs::exists(path_) && fs::file_size(path_, ec) > 0;
  if (exists && resume_step == 0) {
    // A fresh run: the earlier run's file is kept under a name of its own, never replaced.
    const std::string stamp = fs::path(path_).string() + "." + utc_stamp();
    std::string aside = stamp;
    for (int n = 2; fs::exists(aside); ++n) aside = absl::StrCat(stamp, "-", n);
    fs::rename(path_, aside, ec);
    if (ec)
      return absl::InvalidArgumentError(
          absl::StrCat("cannot move ", path_, " aside to ", aside, ": ", ec.message()));
  }
  f_ = std::fopen(path_.c_str(), "a");
  if (!f_) return absl::InvalidArgumentError(absl::StrCat("cannot open ", path_, " for writing"));
  if (exists && resume_step > 0) {
    // Appended, never rewritten: a line cut short by a crash is ended here, and the resume line
    // tells readers that the lines of later steps before it are superseded.
    std::ifstream in(path_, std::ios::binary | std::ios::ate);
    char last = '\n';
    if (in && in.tellg() > 0) {
      in.seekg(-1, std::ios::end);
      in.get(last);
    }
    if (last != '\n') write_line("");
    write_line(nlohmann::json{{"event", "resume"}, {"step", resume_step}}.dump());
  }
  // Every start (fresh or resumed), for tools/goodput: when, from which step, and how long the
  // process took to get here (start-up, checks, loading).
  const double startup = seconds_since(kProcessStart);
  if (tensorboard)
    if (absl::Status st = tb_.open((fs::path(dir) / "tb").string(), resume_step); !st.ok())
      return st;
  write_line(nlohmann::json{
      {"event", "start"}, {"step", resume_step}, {"time", unix_time()}, {"startup_s", startup}}
                 .dump());
  return absl::OkStatus();
}

absl::Status MetricsLog::open_tensorboard(const std::string& dir, int64_t resume_step) {
  return tb_.open(dir, resume_step);
}

void MetricsLog::write_line(const std::string& line) {
  if (f_ == nullptr) return;
  const bool ok = std::fprintf(f_, "%s\n", line.c_str()) >= 0 && std::fflush(f_) == 0;
  if (ok || failed_) return;
  failed_ = true;
  std::fprintf(stderr,
               "warning: cannot write %s (%s): metrics are being lost; training goes on and the "
               "run exits 1 at its end\n",
               path_.c_str(), std::strerror(errno));
  std::fflush(stderr);
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

namespace {

// What a step line's values are computed from.
struct StepLine {
  const StepMetrics& m;
  double tok_s, flops;  // tokens/s and model FLOP/s of the whole job in this step
  double now;           // Unix time of the line
};

// One key of metrics.jsonl: the line it is on, its unit, its meaning, and for step lines how it
// is computed (null: absent from this step). The one table metrics.jsonl and docs/metrics.md are
// made from.
struct MetricKey {
  const char* name;
  const char* line;  // "step", "eval", "checkpoint" or "resume"
  const char* unit;
  const char* doc;
  nlohmann::json (*value)(const StepLine&) = nullptr;
};

template <Phase P>
nlohmann::json phase_seconds(const StepLine& l) {
  return l.m.phase_s[static_cast<int>(P)];
}

const std::vector<MetricKey>& metric_keys() {
  using L = const StepLine&;
  static const std::vector<MetricKey> keys = {
      {"step", "every line", "step", "the step the line is about (the last applied step)",
       [](L l) -> nlohmann::json { return l.m.step; }},
      {"time", "step, start, exit", "s (Unix)", "wall-clock time the line was written",
       [](L l) -> nlohmann::json { return l.now; }},
      {"loss", "step", "nats/token", "training loss, mean over the global batch's tokens",
       [](L l) -> nlohmann::json { return l.m.loss; }},
      {"lr", "step", "", "learning rate of the step", [](L l) -> nlohmann::json { return l.m.lr; }},
      {"grad_norm", "step", "", "global gradient norm before clipping",
       [](L l) -> nlohmann::json { return l.m.grad_norm; }},
      {"moe_aux_loss", "step (mixture of experts)", "nats/token",
       "the load-balancing loss's share of loss: router_aux_loss_coef x Hugging Face's aux_loss, "
       "averaged over the micro-batches",
       [](L l) -> nlohmann::json {
         return std::isnan(l.m.moe_aux_loss) ? nlohmann::json() : nlohmann::json(l.m.moe_aux_loss);
       }},
      {"moe_imbalance", "step (mixture of experts)", "",
       "the most-routed expert's tokens over the mean (pooled over the sparse layers, averaged "
       "over the micro-batches): 1 is perfect balance, num_experts / experts_per_token the worst",
       [](L l) -> nlohmann::json {
         return std::isnan(l.m.moe_imbalance) ? nlohmann::json()
                                              : nlohmann::json(l.m.moe_imbalance);
       }},
      {"tokens_per_s", "step", "tokens/s", "the whole job's tokens per second of step time",
       [](L l) -> nlohmann::json { return l.tok_s; }},
      {"tokens_per_s_per_rank", "step", "tokens/s", "tokens_per_s / ranks",
       [](L l) -> nlohmann::json { return l.tok_s / l.m.world; }},
      {"step_time_s", "step", "s", "wall time of the step on rank 0",
       [](L l) -> nlohmann::json { return l.m.step_time_s; }},
      {"data_wait_s", "step", "s",
       "waiting for the step's batch from the loader (a phase of the step: see time_*_s)",
       phase_seconds<Phase::data_wait>},
      {"optimizer_s", "step", "s",
       "finalising the gradients (TP sync of replicated tensors, tied embedding, DP reduction), "
       "clipping and the AdamW update, as queued (on GPUs the update runs on into the next step)",
       [](L l) -> nlohmann::json { return l.m.optimizer_s; }},
      {"host_syncs", "step", "count",
       "times rank 0's host waited for its device in the step (1 on GPUs: the loss and norm)",
       [](L l) -> nlohmann::json { return l.m.host_syncs; }},
      {"tflops_per_rank", "step", "TFLOP/s",
       "model FLOPs (causal counting; under block-causal attention each document's own) per "
       "second per rank",
       [](L l) -> nlohmann::json { return l.flops / l.m.world / 1e12; }},
      {"peak_mem_mib", "step", "MiB", "peak resident host memory of rank 0's process",
       [](L l) -> nlohmann::json { return l.m.peak_mem_mib; }},
      {"tokens", "step", "tokens", "tokens trained in the step (all ranks)",
       [](L l) -> nlohmann::json { return l.m.tokens; }},
      {"skipped_steps", "step", "count", "steps not applied so far, counted across resumes",
       [](L l) -> nlohmann::json { return l.m.skipped_total; }},
      // Where the step's time went: these and data_wait_s add up to step_time_s
      // (trainer/obs/step_timing.h). On GPUs they are the device's times, from CUDA events read at
      // the step's host sync (the update queued after it counts in the next step), and time_other_s
      // the step time the named phases leave.
      {"time_forward_s", "step", "s", "the forward of this rank's stage and its loss",
       phase_seconds<Phase::forward>},
      {"time_backward_s", "step", "s", "their backward", phase_seconds<Phase::backward>},
      {"time_pipeline_wait_s", "step", "s",
       "sending and receiving activations and gradients between pipeline stages (and the loss's "
       "sum over them)",
       phase_seconds<Phase::pipeline_wait>},
      {"time_tp_comm_s", "step", "s", "tensor-parallel collectives", phase_seconds<Phase::tp_comm>},
      {"time_cp_comm_s", "step", "s",
       "context parallelism's exchange of keys, values and their gradients (0 with parallel.cp 1)",
       phase_seconds<Phase::cp_comm>},
      {"time_dp_wait_s", "step", "s",
       "the data-parallel gradient reduction and ZeRO-1's weight all-gather, as far as the step "
       "waits for them, and the tied embedding's gradient sum",
       phase_seconds<Phase::dp_wait>},
      {"time_optimizer_s", "step", "s", "clipping and the AdamW update",
       phase_seconds<Phase::optimizer>},
      {"time_other_s", "step", "s",
       "the rest: the ranks' agreements, the gradient norm, bookkeeping",
       phase_seconds<Phase::other>},
      {"skipped", "step (skipped steps)", "",
       "why the step was not applied: non_finite, spike or no_targets",
       [](L l) -> nlohmann::json {
         return *l.m.skipped != '\0' ? nlohmann::json(l.m.skipped) : nlohmann::json();
       }},
      {"slowest_rank", "step (straggler reports)", "rank",
       "every log.interval steps on several ranks: the rank with the most own work per step",
       [](L l) -> nlohmann::json {
         return l.m.slowest_rank >= 0 ? nlohmann::json(l.m.slowest_rank) : nlohmann::json();
       }},
      {"slowest_busy_s", "step (straggler reports)", "s",
       "that rank's own work per step (step time minus time blocked in MPI)",
       [](L l) -> nlohmann::json {
         return l.m.slowest_rank >= 0 ? nlohmann::json(l.m.slowest_busy_s) : nlohmann::json();
       }},
      {"median_busy_s", "step (straggler reports)", "s", "the median rank's own work per step",
       [](L l) -> nlohmann::json {
         return l.m.slowest_rank >= 0 ? nlohmann::json(l.m.median_busy_s) : nlohmann::json();
       }},
      {"mfu", "step (GPUs)", "fraction",
       "model FLOPs utilisation: tflops_per_rank over the GPU's dense bf16 peak (core/hardware.h)",
       [](L l) -> nlohmann::json {
         return l.m.peak_flops > 0 ? nlohmann::json(l.flops / l.m.world / l.m.peak_flops)
                                   : nlohmann::json();
       }},
      {"device_mem_mib", "step (GPUs)", "MiB", "GPU memory in use (total minus free) on rank 0",
       [](L l) -> nlohmann::json {
         return l.m.device_mem_mib > 0 ? nlohmann::json(l.m.device_mem_mib) : nlohmann::json();
       }},
      {"attention_bwd", "step (GPUs)", "",
       "the cuDNN attention backward that ran this step: deterministic, or fast (asked for, or "
       "where cuDNN could not give the deterministic one for some of the step's attention)",
       [](L l) -> nlohmann::json {
         return *l.m.attention_bwd != '\0' ? nlohmann::json(l.m.attention_bwd) : nlohmann::json();
       }},
      {"attention_ragged", "step (GPUs)", "count",
       "block-causal attention's cuDNN launches over ragged batches of documents since the last "
       "step line (one per power-of-two part of each call's documents; data.document_mask: "
       "block_causal)",
       [](L l) -> nlohmann::json {
         return l.m.attention_ragged >= 0 ? nlohmann::json(l.m.attention_ragged) : nlohmann::json();
       }},
      {"val_loss", "eval", "nats/token", "validation loss, mean over train.eval_steps batches"},
      {"eval_time_s", "eval", "s", "wall time of the evaluation"},
      {"event", "checkpoint, local_checkpoint, resume, start, exit", "",
       "checkpoint: a save was committed; local_checkpoint: a node-local save was (rank 0's "
       "part); resume: a restart continued from `step` (lines of later steps before it are "
       "superseded); start: a process began training at `step` (every start, fresh or resumed); "
       "exit: it ended with exit code `code` after `step` (absent when it was killed)"},
      {"startup_s", "start", "s",
       "the process's time from its start to its first step: checks, "
       "loading, building"},
      {"code", "exit", "", "the exit code (README's table)"},
      {"seconds", "checkpoint, local_checkpoint", "s",
       "the save's whole time, background writing included"},
      {"stall_s", "checkpoint, local_checkpoint", "s", "how long training waited for the save"},
      {"bytes", "local_checkpoint", "bytes", "the size of rank 0's part"},
  };
  return keys;
}

}  // namespace

std::string metrics_docs_markdown() {
  std::string md =
      "| key | line | unit | TensorBoard and W&B tag | meaning |\n|---|---|---|---|---|\n";
  for (const MetricKey& k : metric_keys()) {
    // The numbers of step and evaluation lines are scalars (MetricsLog::step, eval): all but
    // the step, the clock and the two words (skipped, attention_bwd).
    const std::string name = k.name, line = k.line;
    const bool scalar = (line.starts_with("step") || line == "eval") && name != "step" &&
                        name != "time" && name != "skipped" && name != "attention_bwd";
    absl::StrAppend(&md, "| `", name, "` | ", line, " | ", k.unit, " | ",
                    scalar ? absl::StrCat("`", tb_tag(name), "`") : "", " | ", k.doc, " |\n");
  }
  return md;
}

std::vector<std::string> metric_names() {
  std::vector<std::string> names;
  for (const MetricKey& k : metric_keys()) names.push_back(k.name);
  return names;
}

void MetricsLog::step(const StepMetrics& m, bool print) {
  const double tok_s = m.tokens / m.step_time_s;
  const double flops = m.flops_per_token * tok_s;
  const double eta = m.steps_done_here > 0 ? m.elapsed_s / static_cast<double>(m.steps_done_here) *
                                                 static_cast<double>(m.total_steps - m.step)
                                           : 0;
  const StepLine line{m, tok_s, flops, unix_time()};
  nlohmann::json j = nlohmann::json::object();
  for (const MetricKey& k : metric_keys()) {
    if (k.value == nullptr) continue;
    nlohmann::json v = k.value(line);
    if (!v.is_null()) j[k.name] = std::move(v);
  }
  write_line(j.dump());
  // TensorBoard: every number of the line but the step and the clock.
  for (const auto& [key, value] : j.items())
    if (value.is_number() && key != "step" && key != "time")
      tb_.scalar(tb_tag(key), m.step, value.get<double>());
  if (!print) return;
  tb_.flush();
  std::string mfu = m.peak_flops > 0
                        ? absl::StrFormat(" | mfu %.1f%%", 100 * flops / m.world / m.peak_flops)
                        : absl::StrFormat(" | %.1f GFLOP/s", flops / 1e9);
  const std::string skipped =
      *m.skipped != '\0' ? absl::StrCat(" | skipped (", m.skipped, ")") : std::string();
  const std::string moe =
      std::isnan(m.moe_aux_loss)
          ? std::string()
          : absl::StrFormat(" (aux %.4f, imbalance %.2f)", m.moe_aux_loss, m.moe_imbalance);
  std::printf(
      "step %*lld/%lld | loss %.4f%s | lr %.3e | grad-norm %.3f | tok/s %.0f%s | step %.3fs | "
      "eta %s%s\n",
      static_cast<int>(std::to_string(m.total_steps).size()), static_cast<long long>(m.step),
      static_cast<long long>(m.total_steps), m.loss, moe.c_str(), m.lr, m.grad_norm, tok_s,
      mfu.c_str(), m.step_time_s, format_duration(eta).c_str(), skipped.c_str());
  std::fflush(stdout);
}

std::string tb_tag(std::string_view key) {
  const char* section = "train/";
  if (key.ends_with("_mib"))
    section = "memory/";
  else if (key.starts_with("tokens") || key == "tflops_per_rank" || key == "mfu" ||
           key == "host_syncs" || key == "slowest_rank")
    section = "perf/";  // tokens_per_s is a rate, not a duration
  else if (key.starts_with("time_") || key.ends_with("_s"))
    section = "time/";
  return std::string(section) + std::string(key);
}

void MetricsLog::eval(int64_t step, double val_loss, double seconds) {
  nlohmann::json j = {{"step", step}, {"val_loss", val_loss}, {"eval_time_s", seconds}};
  write_line(j.dump());
  tb_.scalar(tb_tag("val_loss"), step, val_loss);
  tb_.scalar(tb_tag("eval_time_s"), step, seconds);
  tb_.flush();
  std::printf("eval step %lld | val_loss %.4f | %.2fs\n", static_cast<long long>(step), val_loss,
              seconds);
  std::fflush(stdout);
}

void MetricsLog::text(const std::string& tag, int64_t step, const std::string& markdown) {
  tb_.text(tag, step, markdown);
  tb_.flush();
}

void MetricsLog::exit(int64_t step, int code) {
  write_line(
      nlohmann::json{{"event", "exit"}, {"step", step}, {"code", code}, {"time", unix_time()}}
          .dump());
}

void MetricsLog::note(const std::string& fields) {
  write_line(absl::StrCat("{", fields, "}"));
}

}  // namespace tr
