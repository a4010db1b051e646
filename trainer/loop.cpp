// The training loop: steps with gradient accumulation and data-parallel reduction, evaluation,
// checkpoints, and the per-step agreement between ranks (errors, stop signals).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/ops.h"
#include "trainer/session.h"
#include "trainer/shard.h"

namespace tr {

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void all_reduce_sum(Comm& c, double* values, int64_t n) {
  c.all_reduce(Tensor(values, DType::f64, Device::cpu, {n}), ReduceOp::sum);
}

std::string layout_json(const Session& s) {
  nlohmann::json j = {{"world", s.topo.world},
                      {"tp", s.topo.tp},
                      {"pp", s.topo.pp},
                      {"dp", s.topo.dp},
                      {"backend", s.cfg.train.backend},
                      {"vocab_padded", s.model->dims().vocab_padded}};
  return j.dump();
}

// Every rank calls this (the gathers are collectives); rank 0 writes. The Adam states are
// gathered over DP under ZeRO-1, then weights and states over TP into global tensors.
// (Fine at CPU scale; at GPU scale each rank will write its own slices instead.)
absl::Status save_checkpoint(Session& s) {
  const auto t0 = Clock::now();
  const ParamLayout& layout = s.model->layout();
  std::vector<float> m_local(layout.capacity), v_local(layout.capacity);
  s.opt->gather_state(m_local.data(), v_local.data());
  GlobalTensors p(layout), m(layout), v(layout);
  gather_global(layout, *s.groups.tp, s.model->params().ptr<float>(), p);
  gather_global(layout, *s.groups.tp, m_local.data(), m);
  gather_global(layout, *s.groups.tp, v_local.data(), v);
  if (!s.logger()) return absl::OkStatus();
  ckpt::SaveRequest req;
  req.root = s.cfg.checkpoint.dir;
  req.step = s.state.step;
  req.keep_last = static_cast<int>(s.cfg.checkpoint.keep_last);
  req.params = p.refs;
  req.exp_avg = m.refs;
  req.exp_avg_sq = v.refs;
  req.state = s.state;
  req.config_yaml = to_yaml(s.cfg);
  req.layout_json = layout_json(s);
  if (absl::Status st = ckpt::save(req); !st.ok())
    return absl::InternalError(absl::StrCat("checkpoint save failed: ", st.message()));
  const double dt = seconds_since(t0);
  std::printf("checkpoint %s/%s saved in %.2fs\n", s.cfg.checkpoint.dir.c_str(),
              ckpt::step_dir_name(s.state.step).c_str(), dt);
  s.log.note(absl::StrFormat("\"step\": %d, \"event\": \"checkpoint\", \"seconds\": %.3f",
                             s.state.step, dt));
  return absl::OkStatus();
}

// Mean validation loss per token over eval_steps batches read in order from the start, over
// all data-parallel ranks.
absl::StatusOr<double> evaluate(Session& s) {
  s.valid->reset(0);
  double sums[2] = {0, 0};  // loss, tokens
  for (int64_t i = 0; i < s.cfg.train.eval_steps; ++i) {
    absl::StatusOr<data::StepBatch> b = s.valid->next();
    if (!b.ok()) return b.status();
    for (const data::MicroBatch& mb : b->micro_batches) {
      sums[0] += s.model->forward_loss(mb.inputs.data(), mb.targets.data());
      sums[1] += static_cast<double>(mb.targets.size());
    }
  }
  all_reduce_sum(*s.groups.dp, sums, 2);
  return sums[0] / sums[1];
}

// Forward and backward of this rank's micro-batches; the loss sum is returned.
absl::StatusOr<double> forward_backward(Session& s, StepMetrics& m, float grad_scale) {
  const auto t0 = Clock::now();
  absl::StatusOr<data::StepBatch> batch = s.train->next();
  m.data_wait_s = seconds_since(t0);
  if (!batch.ok()) return batch.status();
  zero_(s.ctx, s.model->grads());
  double loss_sum = 0;
  for (const data::MicroBatch& mb : batch->micro_batches)
    loss_sum += s.model->forward_backward(mb.inputs.data(), mb.targets.data(), grad_scale);
  return loss_sum;
}

struct StepOutcome {
  int code = kExitOk;   // agreed by all ranks
  absl::Status status;  // this rank's own error, if any
  bool stop = false;    // a rank received SIGTERM/SIGINT
};

// Exchanges this rank's error code and stop signal with every rank (max of each).
StepOutcome agree_on_step(Session& s, int code, absl::Status status) {
  int32_t ctl[2] = {code, static_cast<int32_t>(g_stop_signal)};
  s.groups.world->all_reduce(Tensor(ctl, DType::i32, Device::cpu, {2}), ReduceOp::max);
  if (ctl[1] != 0 && g_stop_signal == 0) g_stop_signal = ctl[1];
  return {ctl[0], std::move(status), ctl[1] != 0};
}

// One optimizer step: micro-batches with gradient accumulation, DP reduction, clip, AdamW.
StepOutcome train_step(Session& s, StepMetrics& m) {
  const auto t0 = Clock::now();
  const int64_t step = s.state.step + 1;
  const int64_t tokens = s.cfg.train.global_batch * s.cfg.data.seq_len;
  const float grad_scale = 1.0f / static_cast<float>(tokens);  // mean over the global batch
  absl::StatusOr<double> local = forward_backward(s, m, grad_scale);
  // A bad token found by one rank's loader must end every rank, not leave them in a collective.
  StepOutcome out = agree_on_step(s, local.ok() ? kExitOk : kExitBadInput, local.status());
  if (out.code != kExitOk) return out;
  double loss_sum = *local;
  all_reduce_sum(*s.groups.dp, &loss_sum, 1);
  const auto t1 = Clock::now();
  m.grad_norm = s.opt->reduce_and_clip();
  m.lr = lr_at(s.cfg.optim, s.cfg.train.steps, step);
  s.opt->update(m.lr, step);
  m.optimizer_s = seconds_since(t1);
  m.loss = loss_sum / static_cast<double>(tokens);
  m.step = step;
  m.tokens = tokens;
  m.step_time_s = seconds_since(t0);
  s.state.step = step;
  s.state.consumed_samples = s.train->consumed_samples();
  s.state.tokens_seen += tokens;
  s.state.lr = m.lr;
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

int train_loop(Session& s) {
  const auto start = Clock::now();
  StepMetrics m;
  m.total_steps = s.cfg.train.steps;
  m.flops_per_token = flops_per_token(s.cfg);
  m.world = s.topo.world;
  const TrainConfig& t = s.cfg.train;
  while (s.state.step < t.steps) {
    StepOutcome out = train_step(s, m);
    if (out.code != kExitOk) return agree_on_exit(s, out.code, out.status);
    ++m.steps_done_here;
    m.elapsed_s = seconds_since(start);
    m.peak_mem_mib = peak_mem_mib();
    if (!std::isfinite(m.loss))  // the same on every rank: the loss is all-reduced
      return agree_on_exit(s, kExitFailure,
                           absl::InternalError(absl::StrFormat(
                               "loss is %f at step %d; stopping (last checkpoint: step %d)", m.loss,
                               m.step, s.last_saved_step)));
    if (s.logger())
      s.log.step(m, m.step % s.cfg.log.interval == 0 || m.step == t.steps || m.step == 1);
    if (t.eval_interval > 0 && (m.step % t.eval_interval == 0 || m.step == t.steps)) {
      const auto e0 = Clock::now();
      absl::StatusOr<double> val = evaluate(s);
      if (!val.ok()) return agree_on_exit(s, kExitBadInput, val.status());
      if (s.logger()) s.log.eval(m.step, *val, seconds_since(e0));
    }
    const bool interval = s.cfg.checkpoint.interval > 0 && m.step % s.cfg.checkpoint.interval == 0;
    const bool exit_now = t.exit_interval > 0 && m.step % t.exit_interval == 0 && m.step < t.steps;
    if (interval || exit_now || m.step == t.steps || out.stop) {
      absl::Status saved = save_checkpoint(s);
      if (int code = agree_on_exit(s, saved.ok() ? kExitOk : kExitFailure, saved); code != kExitOk)
        return code;
      s.last_saved_step = s.state.step;
    }
    if (out.stop) {
      std::printf("stopped by signal %d after step %lld; resume with --resume auto\n",
                  static_cast<int>(g_stop_signal), static_cast<long long>(m.step));
      return kExitOk;
    }
    if (exit_now) {
      std::printf("exit_interval: stopping after step %lld; resume with --resume auto\n",
                  static_cast<long long>(m.step));
      return kExitOk;
    }
  }
  std::printf("done: %lld steps, last loss %.4f, %s\n", static_cast<long long>(s.state.step),
              m.loss, format_duration(seconds_since(start)).c_str());
  return kExitOk;
}

}  // namespace tr
