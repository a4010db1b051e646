#include "trainer/step/step.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/switches.h"
#include "kernels/ops.h"
#include "trainer/obs/step_timing.h"
#include "trainer/step/pipeline.h"

namespace tr {
namespace {

// The session's parts the pipeline runs on.
PipelineRank pipeline_rank(Session& s) {
  return {*s.model, *s.io, *s.groups.pp, *s.groups.world, s.layout};
}

void all_reduce_sum(Comm& c, double* values, int64_t n) {
  c.all_reduce(Tensor(values, DType::f64, Device::cpu, {n}), ReduceOp::sum);
}

// The step's documents over its global batch (data::DocumentStats summed): the targets the loss
// keeps (data.eod_mask_loss), and the sum of the documents' lengths squared (block-causal
// attention's FLOPs). One all-reduce over the data- and context-parallel ranks when a document
// option is on; a context-parallel rank holds its own targets but the whole samples' documents.
struct StepDocs {
  double loss_targets = 0, doc_len_sq = 0;
};
StepDocs step_documents(Session& s, const data::StepBatch& batch) {
  if (!s.cfg.data.documents()) {
    const double seq = static_cast<double>(s.cfg.data.seq_len);
    return {static_cast<double>(s.layout.tokens_per_step),
            static_cast<double>(s.cfg.train.global_batch) * seq * seq};
  }
  double sums[2] = {0, 0};
  for (const data::MicroBatch& mb : batch.micro_batches) {
    sums[0] += static_cast<double>(mb.docs.loss_targets);
    sums[1] += mb.docs.doc_len_sq / static_cast<double>(s.topo().cp);
  }
  all_reduce_sum(*s.groups.dp_cp, sums, 2);
  return {sums[0], sums[1]};
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

// TR_TRACE_DP=1 (world rank 0): how many DP buckets had started during backward, and how many
// buckets of the last step's ZeRO-1 weight all-gather this step's forward completed itself,
// layer by layer.
void trace_dp(const Topology& topo, const DistributedOptimizer& opt, int64_t step) {
  if (topo.rank != 0 || !take(Switch::trace_dp)) return;
  int early = 0, buckets = 0, waited = 0, weight_buckets = 0;  // over the flat buffer's regions
  for (const auto& red : opt.reducers()) {
    early += red->early_buckets();
    buckets += red->buckets();
    waited += red->buckets_waited_in_forward();
    weight_buckets += red->weight_buckets();
  }
  std::fprintf(stderr,
               "step %lld: %d of %d dp buckets started during backward; %d of %d weight buckets "
               "completed by the forward\n",
               static_cast<long long>(step), early, buckets, waited, weight_buckets);
}

// TR_TRACE_TP=1 (world rank 0): how many column-parallel input-gradient reductions ran over TP
// beside their weight-gradient GEMMs this step (parallel.overlap_tp).
void trace_tp(DecoderModel& model, const Topology& topo, int64_t step) {
  const int64_t overlapped = model.take_tp_overlapped();
  if (topo.rank != 0 || !take(Switch::trace_tp)) return;
  std::fprintf(stderr,
               "step %lld: %lld tp input-gradient reductions ran beside the weight "
               "gradients\n",
               static_cast<long long>(step), static_cast<long long>(overlapped));
}

// The step's loss (summed over the tokens of the global batch) and this rank's squared
// gradient norm: the step's one host sync. Grad-norm clipping needs the global norm.
struct StepScalars {
  double loss_sum = 0;
  // A mixture of experts' load-balancing loss (its share of loss_sum) and its micro-batches'
  // summed expert imbalance, over the job.
  double moe_aux_sum = 0, moe_imbalance_sum = 0;
  bool own_loss_bad = false;  // this rank's own loss was not finite (it names itself)
};
StepScalars read_step_scalars(Session& s, StepMetrics& m, const FaultInjector& fault,
                              int64_t step) {
  s.opt->accumulate_norm(s.io->norm_squares());
  const StepIO::Scalars read = s.io->take();  // the step's host sync
  if (s.device_phases) s.device_phases->at_sync();
  double sums[3] = {read.loss_sum, read.moe_aux_sum, read.moe_imbalance_sum};
  if (fault.nan_loss(step, s.topo().rank) && s.topo().last_stage())
    sums[0] = std::numeric_limits<double>::quiet_NaN();
  StepScalars out;
  out.own_loss_bad = !std::isfinite(sums[0]);
  all_reduce_sum(*s.groups.pp, sums, 3);  // they live on the last stage
  all_reduce_sum(*s.groups.dp_cp, sums, 3);
  out.loss_sum = sums[0];
  out.moe_aux_sum = sums[1];
  out.moe_imbalance_sum = sums[2];
  m.grad_norm = s.opt->global_norm(read.norm_squares);
  return out;
}

// Clip and the update (which keeps the tied embedding's copies equal).
void apply_update(DistributedOptimizer& opt, const StepMetrics& m, int64_t step) {
  const ScopedPhase updating(Phase::optimizer);
  opt.clip(m.grad_norm);
  opt.update(m.lr, step);
}

// The step's verdict (apply, or skip a step without targets, a non-finite or a spiking one),
// agreed by every rank with any stop signal riding along; applies the update or reports the
// skip. `targets`: the global batch's kept targets, the same on every rank.
bool judge_and_apply(Session& s, StepMetrics& m, StepGuard& guard, const StepScalars& scalars,
                     double targets, int64_t step) {
  // Nothing non-finite (or, with train.spike_factor, spiking) is applied. The loss and the
  // norm are the same on every rank; the ranks still agree on the verdict.
  std::string why;
  const Agreed agreed =
      agree(*s.groups.world, static_cast<int32_t>(guard.judge(m.loss, m.grad_norm, targets, &why)));
  const auto v = static_cast<StepGuard::Verdict>(agreed.value);
  guard.record(v, m.loss);
  m.skipped = skip_name(v);
  m.skipped_total = guard.skipped_total();
  if (v != StepGuard::Verdict::apply)
    report_skip(s, guard, v, step, why, scalars.own_loss_bad);
  else
    apply_update(*s.opt, m, step);
  return agreed.stop;
}

// The run's state after step `step`, for checkpoints.
void record_state(ckpt::TrainState& state, const data::DataLoader& train, const StepMetrics& m,
                  const StepGuard& guard) {
  state.step = m.step;
  state.consumed_samples = train.consumed_samples();
  state.tokens_seen += m.tokens;
  state.lr = m.lr;
  state.loss_window = guard.window();
  state.skipped_in_a_row = guard.skipped_in_a_row();
  state.skipped_total = guard.skipped_total();
}

}  // namespace

void finalize_grads(DecoderModel& model, DistributedOptimizer& opt) {
  model.sync_replicated_grads();
  opt.reduce_grads();
}

StepOutcome train_step(Session& s, StepMetrics& m, StepGuard& guard, const FaultInjector& fault) {
  const auto t0 = Clock::now();
  phase_clock().start();
  const int64_t syncs_before = host_sync_count();
  const int64_t step = s.state.step + 1;
  const int64_t tokens = s.layout.tokens_per_step;
  absl::StatusOr<data::StepBatch> batch = [&] {
    const ScopedPhase waiting(Phase::data_wait);
    return s.train->next();
  }();
  // A bad token found by one rank's loader must end every rank, not leave them in a collective.
  StepOutcome out =
      agree_on_step(*s.groups.world, batch.ok() ? kExitOk : kExitBadInput, batch.status());
  if (out.code != kExitOk) return out;
  if (out.stop) {  // asked before any work: the last step stays the last
    out.ran = false;
    return out;
  }
  fault.at_step_start(step, s.topo().rank);
  const StepDocs docs = step_documents(s, *batch);
  // The loss is the mean over the global batch's kept targets (every token's without
  // data.eod_mask_loss).
  const double loss_targets = std::max(docs.loss_targets, 1.0);
  const auto grad_scale = static_cast<float>(1.0 / loss_targets);
  // From here to the end of the step the host waits for the device once: the loss sum and the
  // squared gradient norm, read together (metrics: host_syncs).
  const PipelineRank pipeline = pipeline_rank(s);
  stage_batch(pipeline, *batch);
  s.io->reset();
  if (take(Switch::test_poison_grads)) poison_grads(*s.params);
  s.model->begin_step_grads();  // each gradient's first write assigns: no zeroing pass
  const PipelineRun pipe = run_pipeline(pipeline, *batch, grad_scale);
  if (pipe.cut) {  // partial gradients: nothing of this step is applied
    out.stop = true;
    out.ran = false;
    return out;
  }
  const auto t1 = Clock::now();
  finalize_grads(*s.model, *s.opt);
  int64_t fault_syncs = 0;  // the fault's own copy is not the step's
  if (fault.nan_in_reduced_grads(step, s.topo().rank)) {
    const int64_t before = host_sync_count();
    s.opt->poison_first_grad();
    fault_syncs = host_sync_count() - before;
  }
  const StepScalars scalars = read_step_scalars(s, m, fault, step);
  trace_dp(s.topo(), *s.opt, step);
  trace_tp(*s.model, s.topo(), step);
  m.lr = lr_at(s.cfg.optim, s.cfg.train.steps, step);
  m.loss = scalars.loss_sum / loss_targets * fault.loss_factor(step);
  if (s.model->dims().moe.aux_loss()) {
    m.moe_aux_loss = scalars.moe_aux_sum / loss_targets;
    m.moe_imbalance = scalars.moe_imbalance_sum /
                      static_cast<double>(s.layout.micro_batches * s.groups.dp_cp->size());
  }
  // A stop signal that came during the step is acted on right after it.
  out.stop = judge_and_apply(s, m, guard, scalars, docs.loss_targets, step) || pipe.stop;
  // No synchronize here: the update runs on while the next step's data is fetched, and the next
  // step's read waits for it (so in steady state each step's time is its own).
  m.optimizer_s = seconds_since(t1);
  m.host_syncs = host_sync_count() - syncs_before - fault_syncs;
  m.step = step;
  m.tokens = tokens;
  m.flops_per_token = flops_per_token(s.cfg, static_cast<double>(tokens), docs.doc_len_sq);
  m.phase_s = phase_clock().seconds();
  m.step_time_s = seconds_since(t0);
  // On GPUs the parts as the device ran them, read after the step's one host sync.
  if (s.device_phases) m.phase_s = fit_to_step(s.device_phases->collect(), m.step_time_s);
  phase_clock().stop();
  record_state(s.state, *s.train, m, guard);
  return out;
}

StepOutcome evaluate(Session& s, double* val_loss) {
  s.valid->reset(0);
  s.model->weights_changed();  // by the last step's update
  double sums[2] = {0, 0};     // loss, tokens
  for (int64_t i = 0; i < s.cfg.train.eval_steps; ++i) {
    absl::StatusOr<data::StepBatch> b = s.valid->next();
    StepOutcome out = agree_on_step(*s.groups.world, b.ok() ? kExitOk : kExitBadInput, b.status());
    if (out.code != kExitOk || out.stop) return out;
    sums[0] += forward_pipeline(pipeline_rank(s), *b);
    for (const data::MicroBatch& mb : b->micro_batches)
      sums[1] += static_cast<double>(mb.docs.loss_targets);
  }
  all_reduce_sum(*s.groups.pp, sums, 1);  // the loss lives on the last stage
  all_reduce_sum(*s.groups.dp_cp, sums, 2);
  *val_loss = sums[0] / sums[1];
  return {};
}

}  // namespace tr
