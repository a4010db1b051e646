#include "parallel/schedule.h"

#include <algorithm>

#include "core/check.h"

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

int stop_poll_lag(int stages) {
  return std::max(stages, 1);
}

PipeSchedule with_stop_polls(const PipeSchedule& schedule, int lag) {
  TR_ASSERT(lag >= 1, "stop polls need a lag of at least one micro-batch");
  PipeSchedule out(schedule.size());
  for (size_t s = 0; s < schedule.size(); ++s) {
    const std::vector<PipeAction>& in = schedule[s];
    std::vector<PipeAction>& a = out[s];
    int pending = -1;        // the poll started and not yet waited for
    size_t group_start = 0;  // in `a`: where the current run of comm actions began
    for (const PipeAction& x : in) {
      if (x.is_comm() && (a.empty() || !a.back().is_comm())) group_start = a.size();
      if (pending >= 0 && x.micro_batch >= pending + lag) {
        const PipeAction wait{PipeAction::poll_wait, pending};
        if (x.is_comm())  // before the whole group: a group is posted as one exchange
          a.insert(a.begin() + static_cast<std::ptrdiff_t>(group_start), wait);
        else
          a.push_back(wait);
        pending = -1;
      }
      a.push_back(x);
      if (x.kind == PipeAction::fwd && x.micro_batch % lag == 0 && pending < 0) {
        a.push_back({PipeAction::poll_start, x.micro_batch});
        pending = x.micro_batch;
      }
    }
    if (pending >= 0) a.push_back({PipeAction::poll_wait, pending});
  }
  return out;
}

std::string compute_order(const std::vector<PipeAction>& actions) {
  std::string out;
  for (const PipeAction& a : actions) {
    if (!a.is_compute()) continue;
    if (!out.empty()) out += ' ';
    out += a.kind == PipeAction::fwd ? 'F' : 'B';
    out += std::to_string(a.micro_batch);
  }
  return out;
}

}  // namespace tr
