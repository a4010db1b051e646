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
  enum Kind { fwd, bwd, send_act, recv_act, send_grad, recv_grad } kind;
  int micro_batch;
  bool is_comm() const { return kind != fwd && kind != bwd; }
  bool operator==(const PipeAction&) const = default;
};

using PipeSchedule = std::vector<std::vector<PipeAction>>;  // [stage] -> actions in order

// 1F1B (PipeDream-Flush, as in Megatron-LM): stage s runs min(p-1-s, m) warm-up forwards, then
// alternates one forward and one backward, then drains the remaining backwards. At most
// p - s micro-batches are in flight on stage s. Works for any m >= 1, including m < p.
PipeSchedule one_f_one_b(int stages, int micro_batches);

// Compact text of one stage's compute actions, e.g. "F0 F1 B0 F2 B1 B2" (for tests and logs).
std::string compute_order(const std::vector<PipeAction>& actions);

}  // namespace tr
