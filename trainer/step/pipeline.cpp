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

// The point-to-point operations of a pipeline communication action, appended to `group`: the
// activation or its gradient, then what the model passes beside it (DecoderModel::
// stage_side_input), when anything.
void p2p_of(const PipelineRank& r, const PipeAction& a, int slot, std::vector<P2P>& group) {
  const auto both = [&](P2P::Kind kind, Tensor main, Tensor side) {
    group.push_back({kind, main, a.peer});
    if (!side.empty()) group.push_back({kind, side, a.peer});
  };
  switch (a.kind) {
    case PipeAction::send_act:
      return both(P2P::send, r.model.stage_output(slot, a.chunk),
                  r.model.stage_side_output(slot, a.chunk));
    case PipeAction::recv_act:
      return both(P2P::recv, r.model.stage_input(slot, a.chunk),
                  r.model.stage_side_input(slot, a.chunk));
    case PipeAction::send_grad:
      return both(P2P::send, r.model.send_grad_buffer(), r.model.send_side_grad_buffer());
    case PipeAction::recv_grad:
      return both(P2P::recv, r.model.recv_grad_buffer(), r.model.recv_side_grad_buffer());
    default:
      break;
  }
  TR_ASSERT(false, "not a communication action");
}

// Runs `actions` (one rank's list; with stop polls when it has them): each compute action
// through `compute` with its activation slot, and each group of messages between two compute
// actions posted together: its sends started and left in flight, then its receives waited for.
// The rank computes on while its sends travel (a zero-bubble stage's W runs while its input
// gradient is on the way; no stage waits for its neighbour to take an activation), and completes
// them before it posts the next group, before a backward (which writes the running gradient, the
// buffer a gradient is sent from) and before a forward that writes the activation being sent.
// Returns the micro-batch the step was cut at (m when it was not).
template <typename Compute>
int run_actions(const PipelineRank& r, const std::vector<PipeAction>& actions, int m,
                PipelineRun* run, Compute&& compute) {
  const int lag = stop_poll_lag(r.topo().pp);
  int cut_at = m;          // actions on micro-batches >= cut_at are dropped
  int32_t poll_flag = 0;   // the poll in flight: this rank's stop signal, then every rank's max
  std::vector<P2P> group;  // communication between two compute actions, posted together
  std::vector<P2P> sending, receiving;   // a group's sends (in flight after it) and receives
  Comm::Ticket in_flight = Comm::kDone;  // the sends' exchange
  Comm& pp = r.pp;
  for (size_t i = 0; i < actions.size(); ++i) {
    const PipeAction& a = actions[i];
    const bool dropped = a.micro_batch >= cut_at;  // polls too: none from here on was started
    const int slot = a.slot;  // the schedule's activation slot for (chunk, micro-batch)
    if (a.is_comm()) {        // what is left of a group is posted at its end
      if (!dropped) p2p_of(r, a, slot, group);
      if (!group.empty() && (i + 1 == actions.size() || !actions[i + 1].is_comm())) {
        pp.wait(in_flight);
        in_flight = Comm::kDone;
        sending.clear();
        receiving.clear();
        for (const P2P& x : group) (x.kind == P2P::send ? sending : receiving).push_back(x);
        if (!sending.empty()) in_flight = pp.exchange_start(sending);
        if (!receiving.empty()) pp.exchange(receiving);
        group.clear();
      }
    } else if (dropped) {
      continue;
    } else if (a.kind == PipeAction::poll_start) {
      poll_flag = static_cast<int32_t>(g_stop_signal);
      r.world.all_reduce_start(Tensor(&poll_flag, DType::i32, Device::cpu, {1}), ReduceOp::max);
    } else if (a.kind == PipeAction::poll_wait) {
      r.world.wait_all();
      if (adopt_stop_signal(poll_flag)) {
        run->stop = true;
        cut_at = std::min(m, a.micro_batch + lag);
        run->cut = cut_at < m;
      }
    } else {
      const bool overwrites = a.kind == PipeAction::bwd || a.kind == PipeAction::bwd_input ||
                              (a.kind == PipeAction::fwd &&
                               std::any_of(sending.begin(), sending.end(), [&](const P2P& x) {
                                 return x.buf.data == r.model.stage_output(slot, a.chunk).data;
                               }));
      if (overwrites) {
        pp.wait(in_flight);
        in_flight = Comm::kDone;
      }
      compute(a, slot);
    }
  }
  pp.wait_all();  // (the MPI group also forgets its completed requests)
  return cut_at;
}

}  // namespace

PipelineRun run_pipeline(const PipelineRank& r, const data::StepBatch& batch, float grad_scale) {
  const int m = static_cast<int>(batch.micro_batches.size());
  TR_ASSERT(m == r.layout.micro_batches, "a step's micro-batches are the layout's");
  const std::vector<PipeAction> actions =
      with_stop_polls({r.layout.pipeline_actions()}, stop_poll_lag(r.topo().pp))[0];
  TR_ASSERT(slots_needed(actions) <= r.model.activation_slots(),
            "the schedule needs more activation slots than the model holds");
  const int last_chunk = r.model.dims().num_chunks() - 1;
  PipelineRun run;
  // TR_TRACE_PIPELINE=1: each stage's first TP/DP rank prints the compute order it executed.
  const bool trace = switch_on(Switch::trace_pipeline);
  std::vector<PipeAction> executed;
  run_actions(r, actions, m, &run, [&](const PipeAction& a, int slot) {
    if (trace) executed.push_back(a);
    const Tensor tokens = r.io.inputs(a.micro_batch);
    // The last micro-batch's weight gradients finish each layer's: DP buckets start.
    const bool last = a.micro_batch == m - 1;
    if (a.kind == PipeAction::fwd) {
      const ScopedPhase forward(Phase::forward);
      r.model.forward_stage(slot, tokens, a.chunk, r.io.docs(a.micro_batch));
      if (r.topo().last_stage() && a.chunk == last_chunk)
        r.model.stage_loss(slot, r.io.targets(a.micro_batch), grad_scale, true, r.io.loss_sum(),
                           r.io.moe_sums());
      return;
    }
    const ScopedPhase backward(Phase::backward);
    if (a.kind == PipeAction::bwd)
      r.model.backward_stage(slot, tokens, last, a.chunk);
    else if (a.kind == PipeAction::bwd_input)
      r.model.backward_input(slot, tokens, a.chunk);
    else
      r.model.backward_weight(slot, last, a.chunk);
  });
  if (trace && r.topo().tp_rank == 0 && r.topo().cp_rank == 0 && r.topo().dp_rank == 0)
    std::fprintf(stderr, "pipeline stage %d executed: %s\n", r.topo().pp_rank,
                 compute_order(executed).c_str());
  return run;
}

void stage_batch(const PipelineRank& r, const data::StepBatch& batch) {
  std::vector<const int32_t*> inputs, targets, doc_starts, positions;
  for (const data::MicroBatch& mb : batch.micro_batches) {
    inputs.push_back(mb.inputs.data());
    targets.push_back(mb.targets.data());
    if (!mb.doc_start.empty()) doc_starts.push_back(mb.doc_start.data());
    if (!mb.positions.empty()) positions.push_back(mb.positions.data());
  }
  r.io.stage(inputs, targets, r.model.tokens_per_micro_batch(), doc_starts, positions);
}

double forward_pipeline(const PipelineRank& r, const data::StepBatch& batch) {
  stage_batch(r, batch);
  r.io.reset();
  const int m = static_cast<int>(batch.micro_batches.size());
  const int last_chunk = r.model.dims().num_chunks() - 1;
  PipelineRun unused;
  // One micro-batch at a time down every virtual stage, in slot 0.
  run_actions(r, forward_only(r.topo().pp, last_chunk + 1, m)[r.topo().pp_rank], m, &unused,
              [&](const PipeAction& a, int) {
                r.model.forward_stage(0, r.io.inputs(a.micro_batch), a.chunk,
                                      r.io.docs(a.micro_batch));
                if (r.topo().last_stage() && a.chunk == last_chunk)
                  r.model.stage_loss(0, r.io.targets(a.micro_batch), 0.0f, false, r.io.loss_sum());
              });
  return r.io.take().loss_sum;
}

}  // namespace tr
