#include "parallel/schedule.h"

#include <algorithm>

#include "kernels/core/check.h"

namespace tr {

PipeSchedule one_f_one_b(int stages, int micro_batches) {
  TR_ASSERT(stages >= 1 && micro_batches >= 1, "1F1B needs at least one stage and micro-batch");
  PipeSchedule schedule(stages);
  for (int s = 0; s < stages; ++s) {
    std::vector<PipeAction>& a = schedule[s];
    const bool first = s == 0, last = s == stages - 1;
    auto forward = [&](int mb) {
      if (!first) a.push_back({PipeAction::recv_act, mb});
      a.push_back({PipeAction::fwd, mb});
      if (!last) a.push_back({PipeAction::send_act, mb});
    };
    auto backward = [&](int mb) {
      if (!last) a.push_back({PipeAction::recv_grad, mb});
      a.push_back({PipeAction::bwd, mb});
      if (!first) a.push_back({PipeAction::send_grad, mb});
    };
    const int warmup = std::min(stages - 1 - s, micro_batches);
    for (int mb = 0; mb < warmup; ++mb) forward(mb);
    for (int i = 0; i < micro_batches - warmup; ++i) {  // steady state: one forward, one backward
      forward(warmup + i);
      backward(i);
    }
    for (int mb = micro_batches - warmup; mb < micro_batches; ++mb) backward(mb);  // cool-down
  }
  return schedule;
}

std::string compute_order(const std::vector<PipeAction>& actions) {
  std::string out;
  for (const PipeAction& a : actions) {
    if (a.is_comm()) continue;
    if (!out.empty()) out += ' ';
    out += a.kind == PipeAction::fwd ? 'F' : 'B';
    out += std::to_string(a.micro_batch);
  }
  return out;
}

}  // namespace tr
