// The observability room: metrics (here), TensorBoard event files (tensorboard.h), the step's time
// by phase (step_timing.h) and the build's version (version.h). It uses no other room, so every
// room above can report through it.
//
// Per-step metrics: a console line every log.interval steps and one JSON object per step in
// <log.dir>/metrics.jsonl (rank 0 only).
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "trainer/obs/step_timing.h"
#include "trainer/obs/tensorboard.h"

namespace tr {

struct StepMetrics {
  int64_t step = 0, total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  // A mixture of experts with a load-balancing loss (NaN otherwise): that loss's share of `loss`
  // (router_aux_loss_coef x Hugging Face's aux_loss, averaged over the micro-batches), and the
  // most-routed expert's tokens over the mean (pooled over the sparse layers, averaged over the
  // micro-batches; 1 is perfect balance).
  double moe_aux_loss = std::numeric_limits<double>::quiet_NaN();
  double moe_imbalance = std::numeric_limits<double>::quiet_NaN();
  double step_time_s = 0, optimizer_s = 0;
  // Where the step's time went, by phase (trainer/obs/step_timing.h): they add up to step_time_s.
  std::array<double, kPhases> phase_s{};
  int64_t host_syncs = 0;  // times this rank's host waited for its device in the step (1 on a GPU)
  int64_t tokens = 0;      // tokens in this step (all ranks)
  double flops_per_token = 0;  // training FLOPs per token (causal counting)
  double peak_flops = 0;       // dense peak of the device, 0 when unknown (CPU)
  int world = 1;
  double peak_mem_mib = 0;    // peak resident memory of this process (host)
  double device_mem_mib = 0;  // GPU memory in use (0 on the CPU)
  // GPUs: which attention backward runs ("deterministic" or "fast"; cuDNN may have built only the
  // other mode than train.deterministic asked for); "" on the CPU (always deterministic).
  const char* attention_bwd = "";
  // GPUs under block-causal attention: its ragged cuDNN launches this step; -1 = not logged.
  int64_t attention_ragged = -1;
  double elapsed_s = 0;         // since this process started training
  int64_t steps_done_here = 0;  // steps run by this process (for the ETA)
  // Why this step was not applied ("non_finite", "spike", "no_targets"); "" = it was.
  const char* skipped = "";
  int64_t skipped_total = 0;  // steps skipped by this process
  // The straggler report (every log.interval steps on more than one rank; -1 = none this step):
  // the rank with the most own work per step (step time minus time blocked in MPI), and the
  // median rank's.
  int slowest_rank = -1;
  double slowest_busy_s = 0, median_busy_s = 0;
};

// The TensorBoard tag of a metrics.jsonl key, in one of four sections: memory/ (*_mib), time/
// (the step's breakdown and every other duration, *_s), perf/ (throughput, MFU, host syncs,
// tokens, the slowest rank) and train/ (loss, lr, grad_norm, val_loss, skipped steps).
std::string tb_tag(std::string_view key);

class MetricsLog {
 public:
  // Opens <dir>/metrics.jsonl, which is only ever appended to. Resuming at `resume_step` > 0
  // appends {"event": "resume", "step": resume_step}: lines of later steps before it (a crashed
  // run logs steps past its last checkpoint) are superseded, and a reader keeps the last line of
  // each step (tools/plot_metrics does). A fresh run moves an existing file aside to
  // metrics.jsonl.<UTC time> first.
  // With `tensorboard`, also a new event file in <dir>/tb (trainer/obs/tensorboard.h) that gets
  // every scalar of the step and eval lines, flushed with each console line and at the end.
  absl::Status open(const std::string& dir, int64_t resume_step, bool tensorboard = false);
  // Only a TensorBoard event file in `dir` (a rank other than 0, log.tensorboard_all_ranks):
  // step() writes its scalars there and no metrics.jsonl line.
  absl::Status open_tensorboard(const std::string& dir, int64_t resume_step);
  // Whether step() writes anything (metrics.jsonl or an event file).
  bool writes() const { return f_ != nullptr || tb_.is_open(); }
  ~MetricsLog();
  void step(const StepMetrics& m, bool print);
  void eval(int64_t step, double val_loss, double seconds);
  void note(const std::string& json_object_fields);  // e.g. "\"event\": \"checkpoint\", ..."
  // `markdown` as TensorBoard text at `step` (the resolved config); nothing without TensorBoard.
  void text(const std::string& tag, int64_t step, const std::string& markdown);
  // {"event": "exit", "step": step, "code": code, "time": ...}: the process ends here.
  void exit(int64_t step, int code);
  // A line could not be written (a full disk): warned once; the run should end non-zero.
  bool failed() const { return failed_; }

 private:
  void write_line(const std::string& line);
  std::FILE* f_ = nullptr;
  std::string path_;
  EventFileWriter tb_;
  bool failed_ = false;
};

// docs/metrics.md's table: every key of metrics.jsonl, the line it is on, its unit and meaning,
// from the one table MetricsLog writes the step lines from.
std::string metrics_docs_markdown();
// The keys of that table, in order.
std::vector<std::string> metric_names();

// "1h02m03s" / "4m05s" / "12s".
std::string format_duration(double seconds);

}  // namespace tr
