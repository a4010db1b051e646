// The training loop: steps with gradient accumulation and data-parallel reduction, evaluation,
// checkpoints, and the per-step agreement between ranks (errors, stop signals).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kernels/core/fs_io.h"
#include "kernels/core/switches.h"
#include "kernels/ops.h"
#include "parallel/schedule.h"
#include "trainer/guard.h"
#include "trainer/saver.h"
#include "trainer/session.h"
#include "trainer/shard.h"

namespace tr {

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

namespace {

using Clock = std::chrono::steady_clock;

// A stop signal agreed by the ranks (the max of theirs; 0 = none) becomes this rank's too, so
// that every rank reports and acts on the same one. Returns whether one was agreed.
bool adopt_stop_signal(int32_t agreed) {
  if (agreed != 0 && g_stop_signal == 0) g_stop_signal = agreed;
  return agreed != 0;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void all_reduce_sum(Comm& c, double* values, int64_t n) {
  c.all_reduce(Tensor(values, DType::f64, Device::cpu, {n}), ReduceOp::sum);
}

// The point-to-point operation of a pipeline communication action.
P2P p2p_of(Session& s, const PipeAction& a, int slot) {
  const int stage = s.topo().pp_rank;
  switch (a.kind) {
    case PipeAction::send_act:
      return {P2P::send, s.model->stage_output(slot), stage + 1};
    case PipeAction::recv_act:
      return {P2P::recv, s.model->stage_input(slot), stage - 1};
    case PipeAction::send_grad:
      return {P2P::send, s.model->send_grad_buffer(), stage - 1};
    case PipeAction::recv_grad:
      return {P2P::recv, s.model->recv_grad_buffer(), stage + 1};
    default:
      break;
  }
  TR_ASSERT(false, "not a communication action");
}

// How a step's pipeline ended: run to the end, or cut at a micro-batch boundary by a stop poll.
struct PipelineRun {
  bool cut = false;   // a stop poll cut the step: its gradients are partial, nothing is applied
  bool stop = false;  // a rank asked to stop (the step may still have run to the end)
};

// Runs this stage's 1F1B action list over the step's micro-batches; gradients accumulate. Stop
// polls (parallel/schedule.h) let a signal cut the step at a micro-batch boundary that every
// rank agrees on.
PipelineRun run_pipeline(Session& s, const data::StepBatch& batch, float grad_scale) {
  const std::vector<data::MicroBatch>& mbs = batch.micro_batches;
  const int m = static_cast<int>(mbs.size());
  const int lag = stop_poll_lag(s.topo().pp);
  const std::vector<PipeAction> actions =
      with_stop_polls(one_f_one_b(s.topo().pp, m), lag)[s.topo().pp_rank];
  const int slots =
      std::min(s.facts.in_flight(), m);  // micro-batches in flight (eval: m may be fewer)
  PipelineRun run;
  int cut_at = m;          // actions on micro-batches >= cut_at are dropped
  int32_t poll_flag = 0;   // the poll in flight: this rank's stop signal, then every rank's max
  std::vector<P2P> group;  // communication between two compute actions, posted together
  // TR_TRACE_PIPELINE=1: each stage's first TP/DP rank prints the compute order it executed.
  const bool trace = switch_on(Switch::trace_pipeline);
  std::string executed;
  for (size_t i = 0; i < actions.size(); ++i) {
    const PipeAction& a = actions[i];
    const bool dropped = a.micro_batch >= cut_at;  // polls too: none from here on was started
    const int slot = a.micro_batch % slots;
    if (a.is_comm()) {  // what is left of a group is posted at its end
      if (!dropped) group.push_back(p2p_of(s, a, slot));
      if (!group.empty() && (i + 1 == actions.size() || !actions[i + 1].is_comm())) {
        s.groups.pp->exchange(group);
        group.clear();
      }
    } else if (dropped) {
      continue;
    } else if (a.kind == PipeAction::poll_start) {
      poll_flag = static_cast<int32_t>(g_stop_signal);
      s.groups.world->all_reduce_start(Tensor(&poll_flag, DType::i32, Device::cpu, {1}),
                                       ReduceOp::max);
    } else if (a.kind == PipeAction::poll_wait) {
      s.groups.world->wait_all();
      if (adopt_stop_signal(poll_flag)) {
        run.stop = true;
        cut_at = std::min(m, a.micro_batch + lag);
        run.cut = cut_at < m;
      }
    } else if (a.kind == PipeAction::fwd) {
      const data::MicroBatch& mb = mbs[a.micro_batch];
      if (trace) absl::StrAppend(&executed, executed.empty() ? "" : " ", "F", a.micro_batch);
      s.model->forward_stage(slot, mb.inputs.data());
      if (s.topo().last_stage()) s.model->stage_loss(slot, mb.targets.data(), grad_scale, true);
    } else {
      if (trace) absl::StrAppend(&executed, executed.empty() ? "" : " ", "B", a.micro_batch);
      // The last micro-batch's backward finishes each layer's gradients: DP buckets start.
      const bool last = a.micro_batch == m - 1 && s.opt->reducer().overlaps();
      if (last)
        s.model->set_layer_grads_hook([&s](int64_t begin, int64_t end) {
          s.opt->reducer().grads_final(s.model->grads_padded(), begin, end);
        });
      s.model->backward_stage(slot, mbs[a.micro_batch].inputs.data());
      if (last) s.model->set_layer_grads_hook({});
    }
  }
  if (trace && s.topo().tp_rank == 0 && s.topo().dp_rank == 0)
    std::fprintf(stderr, "pipeline stage %d executed: %s\n", s.topo().pp_rank, executed.c_str());
  return run;
}

// The batch's token ids and targets on the device for the time of one step (or evaluation
// batch): uploaded ahead of its micro-batches, forgotten at the end (the arrays are freed).
class UploadedTokens {
 public:
  UploadedTokens(Session& s, const data::StepBatch& batch) : s_(s) {
    std::vector<const int32_t*> inputs, targets;
    for (const data::MicroBatch& mb : batch.micro_batches) {
      inputs.push_back(mb.inputs.data());
      targets.push_back(mb.targets.data());
    }
    s_.model->upload_tokens(inputs, targets);
  }
  ~UploadedTokens() { s_.model->forget_tokens(); }
  UploadedTokens(const UploadedTokens&) = delete;
  UploadedTokens& operator=(const UploadedTokens&) = delete;

 private:
  Session& s_;
};

// Forward only, micro-batch after micro-batch down the pipeline; the loss sum (last stage).
double forward_pipeline(Session& s, const data::StepBatch& batch) {
  const int stage = s.topo().pp_rank;
  const UploadedTokens uploaded(s, batch);
  s.model->reset_step_scalars();
  for (const data::MicroBatch& mb : batch.micro_batches) {
    if (!s.topo().first_stage()) s.groups.pp->recv(s.model->stage_input(0), stage - 1);
    s.model->forward_stage(0, mb.inputs.data());
    if (s.topo().last_stage())
      s.model->stage_loss(0, mb.targets.data(), 0.0f, false);
    else
      s.groups.pp->send(s.model->stage_output(0), stage + 1);
  }
  return s.model->take_step_scalars().first;
}

struct StepOutcome {
  int code = kExitOk;   // agreed by all ranks
  int own = kExitOk;    // this rank's own exit code (for agree_on_exit: who reports)
  absl::Status status;  // this rank's own error, if any
  bool stop = false;    // a rank received a stop signal: save and exit
  bool ran = true;      // the step was applied (false: stopped before or within it)
};

// Exchanges this rank's error code and stop signal with every rank (max of each).
StepOutcome agree_on_step(Session& s, int code, absl::Status status) {
  int32_t ctl[2] = {code, static_cast<int32_t>(g_stop_signal)};
  s.groups.world->all_reduce(Tensor(ctl, DType::i32, Device::cpu, {2}), ReduceOp::max);
  return {ctl[0], code, std::move(status), adopt_stop_signal(ctl[1])};
}

// Mean validation loss per token over eval_steps batches read in order from the start, over
// all data-parallel ranks and pipeline stages. Every rank learns of a bad batch on any rank, and
// of a stop signal on any rank before each batch: the evaluation ends there (stop set).
StepOutcome evaluate(Session& s, double* val_loss) {
  s.valid->reset(0);
  double sums[2] = {0, 0};  // loss, tokens
  for (int64_t i = 0; i < s.cfg.train.eval_steps; ++i) {
    absl::StatusOr<data::StepBatch> b = s.valid->next();
    StepOutcome out = agree_on_step(s, b.ok() ? kExitOk : kExitBadInput, b.status());
    if (out.code != kExitOk || out.stop) return out;
    sums[0] += forward_pipeline(s, *b);
    for (const data::MicroBatch& mb : b->micro_batches)
      sums[1] += static_cast<double>(mb.targets.size());
  }
  all_reduce_sum(*s.groups.pp, sums, 1);  // the loss lives on the last stage
  all_reduce_sum(*s.groups.dp, sums, 2);
  *val_loss = sums[0] / sums[1];
  return {};
}

// A test hook for the fault-injection tests: TR_TEST_FAULT=KIND:STEP[:COUNT[:ARG]] makes steps
// STEP .. STEP+COUNT-1 go wrong, as a faulty GPU or a diverging run would:
//   grad_nan    world rank ARG (default 0) writes NaN into the first element of its reduced
//               gradients (after the data-parallel reduction, which it would race on GPUs)
//   loss_nan    world rank ARG (default 0), if it is on the last stage, makes its loss NaN
//   loss_spike  every rank multiplies the step's (reduced) loss by ARG
//   hang        world rank ARG stops itself (SIGSTOP, as `kill -STOP` does) at the step's start
//   slow        world rank ARG sleeps 0.1 s in each step (a straggler)
//   sigterm     world rank ARG raises SIGTERM once the step has begun (after the step-start
//               agreement), so that a stop poll inside the step sees it first
struct Fault {
  std::string kind;
  int64_t step = 0, count = 1;
  double arg = 0;
  bool at(int64_t s, const char* k) const { return kind == k && s >= step && s < step + count; }
};

absl::StatusOr<Fault> fault_from_env() {
  Fault f;
  const std::string env = setting(Setting::test_fault);
  if (env.empty()) return f;
  std::vector<std::string> parts = absl::StrSplit(env, ':');
  bool ok = parts.size() >= 2 && parts.size() <= 4 && absl::SimpleAtoi(parts[1], &f.step) &&
            (parts.size() < 3 || absl::SimpleAtoi(parts[2], &f.count)) &&
            (parts.size() < 4 || absl::SimpleAtod(parts[3], &f.arg));
  f.kind = parts[0];
  const char* kinds[] = {"grad_nan", "loss_nan", "loss_spike", "hang", "slow", "sigterm"};
  if (!ok || std::find(std::begin(kinds), std::end(kinds), f.kind) == std::end(kinds))
    return absl::InvalidArgumentError(
        absl::StrCat("TR_TEST_FAULT='", env,
                     "': expected KIND:STEP[:COUNT[:ARG]] with KIND grad_nan, loss_nan, "
                     "loss_spike, hang, slow or sigterm"));
  return f;
}

// Says why step `step` is skipped, once: the lowest rank that sees a non-finite gradient or
// loss of its own names it and its coordinates; rank 0 speaks when none does (a spike).
void report_skip(Session& s, const StepGuard& guard, StepGuard::Verdict v, int64_t step,
                 const std::string& why, bool own_loss_bad) {
  Comm& w = *s.groups.world;
  std::string where;
  if (v == StepGuard::Verdict::skip_non_finite) {
    const std::string tensor = s.opt->first_non_finite();
    if (!tensor.empty())
      where = absl::StrCat("first non-finite gradient '", tensor, "'");
    else if (own_loss_bad)
      where = "its own loss is not finite";
  }
  int32_t speaker = where.empty() ? -w.size() : -w.rank();  // max of -rank = lowest rank
  w.all_reduce(Tensor(&speaker, DType::i32, Device::cpu, {1}), ReduceOp::max);
  if (speaker == -w.size()) speaker = 0;
  if (-speaker != w.rank()) return;
  const std::string seen =
      where.empty() ? ""
                    : absl::StrFormat("; rank %d (tp %d, pp %d, dp %d): %s", w.rank(),
                                      s.topo().tp_rank, s.topo().pp_rank, s.topo().dp_rank, where);
  std::fprintf(stderr,
               "warning: step %lld skipped, no update: %s%s; %lld skipped in a row (the run stops "
               "at train.max_skipped_steps=%lld)\n",
               static_cast<long long>(step), why.c_str(), seen.c_str(),
               static_cast<long long>(guard.skipped_in_a_row()),
               static_cast<long long>(s.cfg.train.max_skipped_steps));
  std::fflush(stderr);
}

// TR_TEST_POISON_GRADS=1 (tests): every gradient is NaN before the step begins, so a gradient that
// the step's first write does not assign (or that begin_step_grads does not zero) poisons the
// loss or the weights.
void poison(Session& s) {
  std::vector<float> nan(static_cast<size_t>(s.model->grads().numel()),
                         std::numeric_limits<float>::quiet_NaN());
  copy_tensor(s.model->grads(),
              Tensor(nan.data(), DType::f32, Device::cpu, {s.model->grads().numel()}));
}

// One optimizer step: micro-batches through the pipeline with gradient accumulation, the tied
// embedding's gradient shared by the first and last stage, DP reduction, clip, AdamW.
StepOutcome train_step(Session& s, StepMetrics& m, StepGuard& guard, const Fault& fault) {
  const auto t0 = Clock::now();
  const int64_t syncs_before = host_sync_count();
  const int64_t step = s.state.step + 1;
  const int64_t tokens = s.facts.tokens_per_step;
  const float grad_scale = 1.0f / static_cast<float>(tokens);  // mean over the global batch
  absl::StatusOr<data::StepBatch> batch = s.train->next();
  m.data_wait_s = seconds_since(t0);
  // A bad token found by one rank's loader must end every rank, not leave them in a collective.
  StepOutcome out = agree_on_step(s, batch.ok() ? kExitOk : kExitBadInput, batch.status());
  if (out.code != kExitOk) return out;
  if (out.stop) {  // asked before any work: the last step stays the last
    out.ran = false;
    return out;
  }
  const bool faulty_rank = s.topo().rank == static_cast<int>(fault.arg);
  if (faulty_rank && fault.at(step, "hang")) std::raise(SIGSTOP);
  if (faulty_rank && fault.at(step, "slow"))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (faulty_rank && fault.at(step, "sigterm")) std::raise(SIGTERM);
  // From here to the end of the step the host waits for the device once: the loss sum and the
  // squared gradient norm, read together (metrics: host_syncs).
  const UploadedTokens uploaded(s, *batch);
  s.model->reset_step_scalars();
  if (take(Switch::test_poison_grads)) poison(s);
  s.model->begin_step_grads();  // each gradient's first write assigns: no zeroing pass
  const PipelineRun pipe = run_pipeline(s, *batch, grad_scale);
  if (pipe.cut) {  // partial gradients: nothing of this step is applied
    out.stop = true;
    out.ran = false;
    return out;
  }
  s.model->sync_replicated_grads();
  if (s.topo().pp > 1 && s.cfg.model.tie_embeddings &&
      (s.topo().first_stage() || s.topo().last_stage()))
    s.groups.embed->all_reduce(s.model->grad(s.model->layout().find("embed_tokens/weight")),
                               ReduceOp::sum);
  const auto t1 = Clock::now();
  s.opt->reduce_grads();
  int64_t fault_syncs = 0;  // the fault's own copy is not the step's
  if (faulty_rank && fault.at(step, "grad_nan")) {
    const int64_t before = host_sync_count();
    s.opt->poison_first_grad();
    fault_syncs = host_sync_count() - before;
  }
  s.opt->accumulate_norm(s.model->step_scalars().slice(1, 1));
  auto [loss_sum, own_squares] = s.model->take_step_scalars();  // the step's host sync
  if (faulty_rank && fault.at(step, "loss_nan") && s.topo().last_stage())
    loss_sum = std::numeric_limits<double>::quiet_NaN();
  const bool own_loss_bad = !std::isfinite(loss_sum);
  all_reduce_sum(*s.groups.pp, &loss_sum, 1);  // the loss lives on the last stage
  all_reduce_sum(*s.groups.dp, &loss_sum, 1);
  m.grad_norm = s.opt->global_norm(own_squares);
  // TR_TRACE_DP=1 (world rank 0): how many DP buckets had started during backward, and how
  // many buckets of the last step's ZeRO-1 weight all-gather this step's forward completed
  // itself, layer by layer.
  if (s.topo().rank == 0 && take(Switch::trace_dp)) {
    const GradReducer& red = s.opt->reducer();
    std::fprintf(stderr,
                 "step %lld: %d of %d dp buckets started during backward; %d of %d weight buckets "
                 "completed by the forward\n",
                 static_cast<long long>(step), red.early_buckets(), red.buckets(),
                 red.buckets_waited_in_forward(), red.weight_buckets());
  }
  m.lr = lr_at(s.cfg.optim, s.cfg.train.steps, step);
  m.loss = loss_sum / static_cast<double>(tokens);
  if (fault.at(step, "loss_spike")) m.loss *= fault.arg;
  // Nothing non-finite (or, with train.spike_factor, spiking) is applied. The loss and the norm
  // are the same on every rank; the ranks still agree on the verdict.
  // A stop signal rides along: one that came during the step is acted on right after it.
  std::string why;
  int32_t agreed[2] = {static_cast<int32_t>(guard.judge(m.loss, m.grad_norm, &why)),
                       static_cast<int32_t>(g_stop_signal)};
  s.groups.world->all_reduce(Tensor(agreed, DType::i32, Device::cpu, {2}), ReduceOp::max);
  out.stop = adopt_stop_signal(agreed[1]) || pipe.stop;
  const auto v = static_cast<StepGuard::Verdict>(agreed[0]);
  guard.record(v, m.loss);
  m.skipped = skip_name(v);
  m.skipped_total = guard.skipped_total();
  if (v != StepGuard::Verdict::apply) {
    report_skip(s, guard, v, step, why, own_loss_bad);
  } else {
    s.opt->clip(m.grad_norm);
    s.opt->update(m.lr, step);
    if (s.topo().pp > 1 && s.cfg.model.tie_embeddings &&
        (s.topo().first_stage() || s.topo().last_stage())) {
      // The two copies took the same update up to summation order; make them bit-identical
      // (with sharded masters, the weights the two stages compute with).
      const ParamInfo& embed = s.model->layout().find("embed_tokens/weight");
      // Its all-gather first (ZeRO-1: on the last stage the tied copy's buckets come last, so
      // the overlap with the next forward is lost there).
      s.opt->reducer().wait_weights(embed.offset, embed.offset + embed.numel);
      if (s.model->masters_sharded()) {
        s.groups.embed->broadcast(s.model->compute_param(embed), 0);
      } else {
        s.groups.embed->broadcast(s.model->param(embed), 0);
        s.model->refresh_compute_copy(&embed);
      }
    }
  }
  // No synchronize here: the update runs on while the next step's data is fetched, and the next
  // step's read waits for it (so in steady state each step's time is its own).
  m.optimizer_s = seconds_since(t1);
  m.host_syncs = host_sync_count() - syncs_before - fault_syncs;
  m.step = step;
  m.tokens = tokens;
  m.step_time_s = seconds_since(t0);
  s.state.step = step;
  s.state.consumed_samples = s.train->consumed_samples();
  s.state.tokens_seen += tokens;
  s.state.lr = m.lr;
  s.state.loss_window = guard.window();
  s.state.skipped_in_a_row = guard.skipped_in_a_row();
  s.state.skipped_total = guard.skipped_total();
  return out;
}

double peak_mem_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB
}

}  // namespace

int agree_on_exit(Session& s, int code, const absl::Status& status) {
  Comm& w = *s.groups.world;
  int32_t v[2] = {code, code != kExitOk ? -w.rank() : -w.size()};  // max of -rank = min rank
  w.all_reduce(Tensor(v, DType::i32, Device::cpu, {2}), ReduceOp::max);
  if (code != kExitOk && -v[1] == w.rank() && !status.message().empty()) {
    const std::string who = w.size() > 1 ? absl::StrCat("rank ", w.rank(), ": ") : "";
    std::fprintf(stderr, "error: %s%s\n", who.c_str(), std::string(status.message()).c_str());
  }
  return v[0];
}

// Saves the state at s.state.step unless that is already saved or in flight; with `wait`, the
// save (and one in flight) is committed before it returns. Returns the agreed exit code.
int save_step(Session& s, Saver& saver, bool wait) {
  absl::Status st = wait ? saver.settle(true) : absl::OkStatus();  // it may be this very step
  if (st.ok() && s.last_saved_step != s.state.step) st = saver.save();
  if (st.ok() && wait) st = saver.settle(true);
  return agree_on_exit(s, st.ok() ? kExitOk : kExitFailure, st);
}

// A stop signal: the last applied step is saved (unless it is already) and the run ends with
// kExitStopped, so that a requeue script can tell it from a finished run.
int stop_and_save(Session& s, Saver& saver, bool step_applied) {
  const int sig = static_cast<int>(g_stop_signal);
  const std::string when = step_applied ? absl::StrCat("after step ", s.state.step)
                                        : absl::StrCat("within step ", s.state.step + 1,
                                                       " at a micro-batch boundary (not applied)");
  if (s.state.step > 0)
    if (int code = save_step(s, saver, true); code != kExitOk) return code;
  std::printf("stopped by signal %d (%s) %s; last checkpoint: %s; resume with --resume auto\n", sig,
              strsignal(sig), when.c_str(), s.last_checkpoint().c_str());
  std::fflush(stdout);
  return kExitStopped;
}

// The straggler report, every log.interval steps: each rank's own work per step (its step time
// minus its time blocked in MPI calls; on NCCL ranks the whole step) is gathered, and the
// slowest rank goes into the metrics, with a console line when it is more than
// log.straggler_percent over the median. Collective over world.
void report_stragglers(Session& s, StepMetrics& m, double busy_per_step) {
  Comm& w = *s.groups.world;
  std::vector<double> all(static_cast<size_t>(w.size()));
  w.all_gather(Tensor(all.data(), DType::f64, Device::cpu, {w.size()}),
               Tensor(&busy_per_step, DType::f64, Device::cpu, {1}));
  const auto slowest = std::max_element(all.begin(), all.end());
  std::vector<double> sorted = all;
  const size_t mid = static_cast<size_t>(w.size() - 1) / 2;  // the lower median
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(mid), sorted.end());
  m.slowest_rank = static_cast<int>(slowest - all.begin());
  m.slowest_busy_s = *slowest;
  m.median_busy_s = sorted[mid];
  const double pct = s.cfg.log.straggler_percent;
  if (pct > 0 && s.logger() && m.slowest_busy_s > m.median_busy_s * (1 + pct / 100)) {
    const Topology t = s.topo().of_rank(m.slowest_rank);
    std::printf(
        "straggler: rank %d (tp %d, pp %d, dp %d) worked %.3f s per step over the last %lld "
        "steps, %.0f%% over the median rank's %.3f s (log.straggler_percent=%g)\n",
        m.slowest_rank, t.tp_rank, t.pp_rank, t.dp_rank, m.slowest_busy_s,
        static_cast<long long>(s.cfg.log.interval), 100 * (m.slowest_busy_s / m.median_busy_s - 1),
        m.median_busy_s, pct);
  }
}

static int train_loop_steps(Session& s) {
  const auto start = Clock::now();
  StepMetrics m;
  m.total_steps = s.cfg.train.steps;
  m.flops_per_token = s.facts.flops_per_token;
  m.peak_flops = device_info(s.ctx).peak_bf16_flops;
  if (s.ctx.device == Device::cuda)
    m.attention_bwd = s.model->attention_bwd_deterministic() ? "deterministic" : "fast";
  m.world = s.topo().world;
  const TrainConfig& t = s.cfg.train;
  absl::StatusOr<Fault> fault = fault_from_env();
  if (!fault.ok()) return agree_on_exit(s, kExitBadInput, fault.status());
  StepGuard guard(t);
  guard.restore(s.state.loss_window, s.state.skipped_in_a_row, s.state.skipped_total);
  Saver saver(s);
  // The newest checkpoint from before the current run of skipped steps: interval saves pause
  // while steps are being skipped, so a diverging run never pushes its good checkpoints out.
  int64_t before_skips = s.last_saved_step;
  double busy_s = 0;  // this rank's own work since the last straggler report
  while (s.state.step < t.steps) {
    const double blocked_before = mpi_blocked_seconds();
    StepOutcome out = train_step(s, m, guard, *fault);
    if (out.code != kExitOk) return agree_on_exit(s, out.own, out.status);
    if (!out.ran) return stop_and_save(s, saver, false);
    if (saver.in_flight()) {  // an asynchronous save commits once every rank has written it
      absl::Status st = saver.settle(false);
      if (int code = agree_on_exit(s, st.ok() ? kExitOk : kExitFailure, st); code != kExitOk)
        return code;
    }
    busy_s += m.step_time_s - (mpi_blocked_seconds() - blocked_before);
    ++m.steps_done_here;
    m.slowest_rank = -1;
    if (s.topo().world > 1 && m.step % s.cfg.log.interval == 0) {
      report_stragglers(s, m, busy_s / static_cast<double>(s.cfg.log.interval));
      busy_s = 0;
    }
    m.elapsed_s = seconds_since(start);
    m.peak_mem_mib = peak_mem_mib();
    if (s.ctx.device != Device::cpu) m.device_mem_mib = device_info(s.ctx).memory_used_mib;
    if (s.logger())
      s.log.step(m, m.step % s.cfg.log.interval == 0 || m.step == t.steps || m.step == 1 ||
                        *m.skipped != '\0');
    if (guard.diverged())  // the same on every rank: the verdicts were agreed
      return agree_on_exit(
          s, kExitDiverged,
          absl::AbortedError(
              before_skips < 0
                  ? absl::StrFormat("training diverged: %d steps in a row skipped "
                                    "(train.max_skipped_steps) up to step %d, before any "
                                    "checkpoint; start again with a lower optim.lr",
                                    guard.skipped_in_a_row(), m.step)
                  : absl::StrFormat(
                        "training diverged: %d steps in a row skipped (train.max_skipped_steps) "
                        "up to step %d; the last checkpoint before them is %s: resume from it "
                        "with --resume %s and a lower optim.lr, or from an earlier one",
                        guard.skipped_in_a_row(), m.step, ckpt::step_dir_name(before_skips),
                        fs::join(s.cfg.checkpoint.dir, ckpt::step_dir_name(before_skips)))));
    if (t.eval_interval > 0 && (m.step % t.eval_interval == 0 || m.step == t.steps)) {
      const auto e0 = Clock::now();
      double val = 0;
      StepOutcome eval = evaluate(s, &val);
      if (eval.code != kExitOk) return agree_on_exit(s, eval.own, eval.status);
      if (eval.stop) return stop_and_save(s, saver, true);  // step m.step was applied
      if (s.logger()) s.log.eval(m.step, val, seconds_since(e0));
    }
    // No interval save while steps are being skipped (the weights are those of the last applied
    // step, already saved or about to be after the skips end).
    const bool interval = s.cfg.checkpoint.interval > 0 &&
                          m.step % s.cfg.checkpoint.interval == 0 && guard.skipped_in_a_row() == 0;
    const bool exit_now = t.exit_interval > 0 && m.step % t.exit_interval == 0 && m.step < t.steps;
    if (out.stop) return stop_and_save(s, saver, true);
    if (interval || exit_now || m.step == t.steps) {
      if (int code = save_step(s, saver, exit_now || m.step == t.steps); code != kExitOk)
        return code;
    }
    if (exit_now) {
      std::printf(
          "exit_interval: stopping after step %lld (exit code %d); resume with --resume auto\n",
          static_cast<long long>(m.step), kExitStopped);
      return kExitStopped;
    }
    if (guard.skipped_in_a_row() == 0) before_skips = s.last_saved_step;
  }
  std::printf("done: %lld steps, last loss %.4f, %s\n", static_cast<long long>(s.state.step),
              m.loss, format_duration(seconds_since(start)).c_str());
  return kExitOk;
}

int train_loop(Session& s) {
  const int code = train_loop_steps(s);
  s.opt->reducer().finish_weights();  // ZeRO-1: no weight all-gather outlives the run
  return code;
}

}  // namespace tr
