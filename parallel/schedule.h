// Pipeline schedules as data: a schedule function returns, for every stage, the ordered list
// of actions that stage performs in one optimizer step; one executor (with the model) runs any
// list. Adding a schedule (e.g. interleaved virtual stages) means adding a function here.
//
// Executor contract: compute actions run in order; the communication actions between two
// compute actions are posted together as one grouped exchange (Comm::exchange), so a send
// and the matching peer's receive never wait on each other.
#pragma once

#include <string>
#include <vector>

namespace tr {

struct PipeAction {
  // poll_start / poll_wait: a stop poll (with_stop_polls); micro_batch is the poll's number.
  enum Kind { fwd, bwd, send_act, recv_act, send_grad, recv_grad, poll_start, poll_wait } kind;
  int micro_batch;
  bool is_compute() const { return kind == fwd || kind == bwd; }
  bool is_comm() const { return !is_compute() && !is_poll(); }  // a point-to-point message
  bool is_poll() const { return kind == poll_start || kind == poll_wait; }
  bool operator==(const PipeAction&) const = default;
};

using PipeSchedule = std::vector<std::vector<PipeAction>>;  // [stage] -> actions in order

// 1F1B (PipeDream-Flush, as in Megatron-LM): stage s runs min(p-1-s, m) warm-up forwards, then
// alternates one forward and one backward, then drains the remaining backwards. At most
// p - s micro-batches are in flight on stage s. Works for any m >= 1, including m < p.
PipeSchedule one_f_one_b(int stages, int micro_batches);

// Stop polls, so that a stop request (a signal) is acted on within a step, at a micro-batch
// boundary every rank agrees on. Poll k (k = 0, lag, 2 lag, ...) is a non-blocking all-reduce of
// the ranks' stop flags that each rank starts right after its forward of micro-batch k and waits
// for before its first action on a micro-batch >= k + lag (before the whole exchange group
// holding that action), or at the end of its list. When poll k says stop, every rank drops
// its actions on micro-batches >= k + lag: the cut is the same on every stage, so every send
// left still meets its receive. Before any stage's first action on micro-batch j, every stage
// has finished its forward of j - stages, so lag = stages never waits for a poll that a rank
// cannot start (tests/parallel/test_schedule.cpp simulates it).
int stop_poll_lag(int stages);
PipeSchedule with_stop_polls(const PipeSchedule& schedule, int lag);

// Compact text of one stage's compute actions, e.g. "F0 F1 B0 F2 B1 B2" (for tests and logs).
std::string compute_order(const std::vector<PipeAction>& actions);

}  // namespace tr
