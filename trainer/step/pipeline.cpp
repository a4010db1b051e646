#include "trainer/step/pipeline.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/switches.h"
#include "parallel/schedule.h"
#include "trainer/obs/step_timing.h"
#include "trainer/step/agree.h"

namespace tr {
namespace {

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

}  // namespace

PipelineRun run_pipeline(Session& s, const data::StepBatch& batch, float grad_scale) {
  const int m = static_cast<int>(batch.micro_batches.size());
  const int lag = stop_poll_lag(s.topo().pp);
  const std::vector<PipeAction> actions =
      with_stop_polls(one_f_one_b(s.topo().pp, m), lag)[s.topo().pp_rank];
  const int slots =
      std::min(s.layout.in_flight(), m);  // micro-batches in flight (eval: m may be fewer)
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
      if (trace) absl::StrAppend(&executed, executed.empty() ? "" : " ", "F", a.micro_batch);
      const ScopedPhase forward(Phase::forward);
      s.model->forward_stage(slot, s.io->inputs(a.micro_batch));
      if (s.topo().last_stage())
        s.model->stage_loss(slot, s.io->targets(a.micro_batch), grad_scale, true, s.io->loss_sum());
    } else {
      if (trace) absl::StrAppend(&executed, executed.empty() ? "" : " ", "B", a.micro_batch);
      // The last micro-batch's backward finishes each layer's gradients: DP buckets start.
      const ScopedPhase backward(Phase::backward);
      s.model->backward_stage(slot, s.io->inputs(a.micro_batch), a.micro_batch == m - 1);
    }
  }
  if (trace && s.topo().tp_rank == 0 && s.topo().cp_rank == 0 && s.topo().dp_rank == 0)
    std::fprintf(stderr, "pipeline stage %d executed: %s\n", s.topo().pp_rank, executed.c_str());
  return run;
}

void stage_batch(Session& s, const data::StepBatch& batch) {
  std::vector<const int32_t*> inputs, targets;
  for (const data::MicroBatch& mb : batch.micro_batches) {
    inputs.push_back(mb.inputs.data());
    targets.push_back(mb.targets.data());
  }
  s.io->stage(inputs, targets, s.model->tokens_per_micro_batch());
}

double forward_pipeline(Session& s, const data::StepBatch& batch) {
  const int stage = s.topo().pp_rank;
  stage_batch(s, batch);
  s.io->reset();
  for (size_t i = 0; i < batch.micro_batches.size(); ++i) {
    if (!s.topo().first_stage()) s.groups.pp->recv(s.model->stage_input(0), stage - 1);
    s.model->forward_stage(0, s.io->inputs(i));
    if (s.topo().last_stage())
      s.model->stage_loss(0, s.io->targets(i), 0.0f, false, s.io->loss_sum());
    else
      s.groups.pp->send(s.model->stage_output(0), stage + 1);
  }
  return s.io->take().first;
}

}  // namespace tr
