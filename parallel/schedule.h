// Pipeline schedules as data: a schedule function returns, for every pipeline rank, the ordered
// list of actions that rank performs in one optimizer step; one executor (with the model) runs
// any list. Three schedules:
//   1f1b         PipeDream-Flush as in Megatron-LM: bubble (p-1)/(m+p-1), p-s micro-batches in
//                flight on stage s.
//   interleaved  Megatron's interleaved 1F1B: each rank holds v chunks of layers, chunk c of rank
//                r being virtual stage c p + r; bubble (p-1)/(v m + p-1) at the price of more
//                messages and, on early ranks, more micro-batches in flight. Needs m % p == 0.
//   zero_bubble  ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2024): each backward is
//                split into B (input gradient, on the critical path) and W (weight gradient),
//                and stage s runs its W passes s micro-batches late, so that every stage holds p
//                micro-batches in flight (1F1B's peak) and the W passes fill the cool-down's
//                bubbles: with equal F, B and W times the bubble is (p-1)/(3m+p-1), a third of
//                1F1B's (for m >= p).
//
// Executor contract: compute actions run in order; the communication actions between two
// compute actions are posted together as one grouped exchange (Comm::exchange), so a send
// and the matching peer's receive never wait on each other. Messages between two ranks are
// matched in the order they are posted (NCCL's and MPI's order on one pair of ranks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tr {

enum class PipeScheduleKind { one_f_one_b, interleaved, zero_bubble };
// "1f1b", "interleaved", "zero_bubble" (parallel.pipeline_schedule).
const char* schedule_name(PipeScheduleKind kind);
bool parse_schedule(const std::string& name, PipeScheduleKind* kind);

struct PipeAction {
  // fwd: a chunk's forward. bwd: its whole backward; or, under zero_bubble, bwd_input (B: the
  // input gradient, sent upstream) then later bwd_weight (W: the weight gradients).
  // poll_start / poll_wait: a stop poll (with_stop_polls); micro_batch is the poll's number.
  enum Kind {
    fwd,
    bwd,
    send_act,
    recv_act,
    send_grad,
    recv_grad,
    poll_start,
    poll_wait,
    bwd_input,
    bwd_weight
  } kind;
  int micro_batch;
  int chunk = 0;  // the rank's layer chunk (interleaved: virtual stage chunk * p + rank)
  int peer = -1;  // pipeline rank a message goes to or comes from
  // The activation slot of (chunk, micro-batch) on this rank: where its forward keeps what its
  // backward needs, from its activation's receive (or forward) to its last action
  // (make_schedule assigns them; -1 = none yet).
  int slot = -1;
  bool is_compute() const {
    return kind == fwd || kind == bwd || kind == bwd_input || kind == bwd_weight;
  }
  bool is_comm() const { return !is_compute() && !is_poll(); }  // a point-to-point message
  bool is_poll() const { return kind == poll_start || kind == poll_wait; }
  // The step's last gradient contribution of its micro-batch to the chunk's weights.
  bool finishes_weights() const { return kind == bwd || kind == bwd_weight; }
  bool operator==(const PipeAction&) const = default;
};

using PipeSchedule = std::vector<std::vector<PipeAction>>;  // [stage] -> actions in order

// 1F1B: stage s runs min(p-1-s, m) warm-up forwards, then alternates one forward and one
// backward, then drains the remaining backwards. Works for any m >= 1, including m < p.
PipeSchedule one_f_one_b(int stages, int micro_batches);
// Interleaved 1F1B over v >= 2 chunks per rank (pp >= 2, m a multiple of pp): forwards go through
// the virtual micro-batches in groups of p micro-batches, chunk after chunk (backwards the
// chunks in reverse); rank r warms up with 2 (p-1-r) + (v-1) p of them (Megatron's order).
PipeSchedule interleaved_1f1b(int stages, int virtual_stages, int micro_batches);
// ZB-H1: 1F1B's order of forwards and input-gradient backwards, with stage s running W of
// micro-batch j after B of j + s, and its deferred W passes in the cool-down's gaps.
PipeSchedule zero_bubble_h1(int stages, int micro_batches);
// Forward only (evaluation): micro-batch after micro-batch, each down every virtual stage, all
// in slot 0.
PipeSchedule forward_only(int stages, int virtual_stages, int micro_batches);
// Gives every action of each rank's list the activation slot of its (chunk, micro-batch): the
// lowest free one when the pair is first named, free again after its last action. A slot
// holds one chunk's layers; a rank needs slots_needed() of them, the most (chunk, micro-batch)
// pairs it holds at once.
void assign_slots(PipeSchedule& schedule);
int slots_needed(const std::vector<PipeAction>& actions);
// The schedule `kind` with its slots assigned (virtual_stages is used by interleaved only).
PipeSchedule make_schedule(PipeScheduleKind kind, int stages, int virtual_stages,
                           int micro_batches);
// Why `kind` cannot run p stages, v chunks and m micro-batches ("" when it can).
std::string schedule_unsupported(PipeScheduleKind kind, int stages, int virtual_stages,
                                 int64_t micro_batches);

// The schedule's idle fraction of a step by its closed form, for F, B (whole backward 2 F) and,
// zero_bubble, B = W = F: 1f1b (p-1)/(m+p-1); interleaved (p-1)/(v m+p-1); zero_bubble
// (p-1)/(3m+p-1) for m >= p, and 1 - 3m/(2(p+m)-1) with fewer micro-batches.
double bubble_fraction(PipeScheduleKind kind, int stages, int virtual_stages,
                       int64_t micro_batches);

// Most (chunk, micro-batch) pairs in flight on this rank at once: forwarded, and their weight
// gradients not yet computed (the activation memory the schedule needs; slots_needed equals it).
int rank_in_flight(const std::vector<PipeAction>& actions);

// Stop polls, so that a stop request (a signal) is acted on within a step, at a micro-batch
// boundary every rank agrees on. Poll k (k = 0, lag, 2 lag, ...) is a non-blocking all-reduce of
// the ranks' stop flags that each rank starts right after its forward of micro-batch k (its
// first chunk) and waits for before its first action on a micro-batch >= k + lag (before the
// whole exchange group holding that action), or at the end of its list. When poll k says stop,
// every rank drops its actions on micro-batches >= k + lag: the cut is the same on every stage,
// so every send left still meets its receive. With lag = stages no rank waits for a poll that
// another rank cannot start yet, under every schedule (tests/parallel/test_schedule.cpp
// simulates them).
int stop_poll_lag(int stages);
PipeSchedule with_stop_polls(const PipeSchedule& schedule, int lag);

// Compact text of one stage's compute actions, e.g. "F0 F1 B0 F2 B1 B2"; chunks other than 0
// are written after a dot ("F3.1"), and weight-gradient passes as W.
std::string compute_order(const std::vector<PipeAction>& actions);

}  // namespace tr
