#include "parallel/schedule.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace tr {
namespace {

// Appends a chunk's forward or backward on pipeline rank r with its messages: the receive
// before, the send after. Virtual stage vs = chunk * p + r runs after vs - 1 (rank (vs-1) % p)
// and before vs + 1.
struct ListBuilder {
  int p, v, r;
  std::vector<PipeAction>& a;
  int virtual_stage(int chunk) const { return chunk * p + r; }
  bool first(int chunk) const { return virtual_stage(chunk) == 0; }
  bool last(int chunk) const { return virtual_stage(chunk) == p * v - 1; }
  // Appends the message of compute action `pass` (a forward or a backward of a chunk): the
  // receive of its input, or with `send` the send of its output; none at the ends of the
  // virtual pipeline. Activations go downstream, gradients upstream.
  void message(const PipeAction& pass, bool send, std::vector<PipeAction>& out) const {
    const bool fwd = pass.kind == PipeAction::fwd;
    const bool downstream = fwd == send;  // with virtual stage vs + 1 (else vs - 1)
    if (downstream ? last(pass.chunk) : first(pass.chunk)) return;
    const PipeAction::Kind kind = fwd ? (send ? PipeAction::send_act : PipeAction::recv_act)
                                      : (send ? PipeAction::send_grad : PipeAction::recv_grad);
    out.push_back({kind, pass.micro_batch, pass.chunk, (r + (downstream ? 1 : p - 1)) % p});
  }
  void pass(const PipeAction& x) {
    message(x, false, a);
    a.push_back(x);
    message(x, true, a);
  }
  void forward(int mb, int chunk) { pass({PipeAction::fwd, mb, chunk}); }
  void backward(int mb, int chunk, PipeAction::Kind kind = PipeAction::bwd) {
    pass({kind, mb, chunk});
  }
  void weight(int mb) { a.push_back({PipeAction::bwd_weight, mb, 0}); }
};

}  // namespace

const char* schedule_name(PipeScheduleKind kind) {
  switch (kind) {
    case PipeScheduleKind::one_f_one_b:
      return "1f1b";
    case PipeScheduleKind::interleaved:
      return "interleaved";
    case PipeScheduleKind::zero_bubble:
      return "zero_bubble";
  }
  return "?";
}

bool parse_schedule(const std::string& name, PipeScheduleKind* kind) {
  for (PipeScheduleKind k : {PipeScheduleKind::one_f_one_b, PipeScheduleKind::interleaved,
                             PipeScheduleKind::zero_bubble})
    if (name == schedule_name(k)) {
      *kind = k;
      return true;
    }
  return false;
}

PipeSchedule one_f_one_b(int stages, int micro_batches) {
  TR_ASSERT(stages >= 1 && micro_batches >= 1, "1F1B needs at least one stage and micro-batch");
  PipeSchedule schedule(stages);
  for (int s = 0; s < stages; ++s) {
    ListBuilder b{stages, 1, s, schedule[s]};
    const int warmup = std::min(stages - 1 - s, micro_batches);
    for (int mb = 0; mb < warmup; ++mb) b.forward(mb, 0);
    for (int i = 0; i < micro_batches - warmup; ++i) {  // steady state: one forward, one backward
      b.forward(warmup + i, 0);
      b.backward(i, 0);
    }
    for (int mb = micro_batches - warmup; mb < micro_batches; ++mb) b.backward(mb, 0);
  }
  return schedule;
}

PipeSchedule interleaved_1f1b(int stages, int virtual_stages, int micro_batches) {
  const std::string why =
      schedule_unsupported(PipeScheduleKind::interleaved, stages, virtual_stages, micro_batches);
  TR_ASSERT(why.empty(), why);
  const int p = stages, v = virtual_stages, total = micro_batches * v;
  // Virtual micro-batch k: micro-batch group k / (p v), chunk (k / p) % v within it.
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  PipeSchedule schedule(p);
  for (int r = 0; r < p; ++r) {
    // Iterations: a warm-up forward, a steady forward and backward, a cool-down backward. As in
    // Megatron, the messages go between iterations in one exchange: the sends of what this
    // iteration computed, and the receives of what the next one computes. (Sending each
    // output right after its pass instead deadlocks when two ranks each send to the other
    // first.)
    std::vector<std::vector<PipeAction>> iters;
    const int warmup = std::min(2 * (p - 1 - r) + (v - 1) * p, total);
    const auto f = [&](int k) { return PipeAction{PipeAction::fwd, mb_of(k), chunk_of(k, true)}; };
    const auto b = [&](int k) { return PipeAction{PipeAction::bwd, mb_of(k), chunk_of(k, false)}; };
    for (int k = 0; k < warmup; ++k) iters.push_back({f(k)});
    for (int i = 0; i < total - warmup; ++i) iters.push_back({f(warmup + i), b(i)});
    for (int k = total - warmup; k < total; ++k) iters.push_back({b(k)});
    std::vector<PipeAction>& a = schedule[r];
    const ListBuilder lb{p, v, r, a};
    // An iteration's sends (or the next one's receives): its forward's, then its backward's.
    auto messages = [&](const std::vector<PipeAction>& it, bool send) {
      for (PipeAction::Kind kind : {PipeAction::fwd, PipeAction::bwd})
        for (const PipeAction& c : it)
          if (c.kind == kind) lb.message(c, send, a);
    };
    messages(iters.front(), false);
    for (size_t j = 0; j < iters.size(); ++j) {
      a.insert(a.end(), iters[j].begin(), iters[j].end());
      messages(iters[j], true);
      if (j + 1 < iters.size()) messages(iters[j + 1], false);
    }
  }
  return schedule;
}

PipeSchedule zero_bubble_h1(int stages, int micro_batches) {
  TR_ASSERT(stages >= 1 && micro_batches >= 1, "ZB-H1 needs at least one stage and micro-batch");
  PipeSchedule schedule(stages);
  for (int s = 0; s < stages; ++s) {
    ListBuilder b{stages, 1, s, schedule[s]};
    const int warmup = std::min(stages - 1 - s, micro_batches);
    int next_w = 0;  // the next micro-batch whose W is due
    for (int mb = 0; mb < warmup; ++mb) b.forward(mb, 0);
    for (int i = 0; i < micro_batches - warmup; ++i) {
      b.forward(warmup + i, 0);
      b.backward(i, 0, PipeAction::bwd_input);
      if (i >= s) b.weight(next_w++);  // W runs s micro-batches behind B
    }
    for (int mb = micro_batches - warmup; mb < micro_batches; ++mb) {
      b.backward(mb, 0, PipeAction::bwd_input);
      if (next_w <= mb) b.weight(next_w++);  // one deferred W in each cool-down gap
    }
    while (next_w < micro_batches) b.weight(next_w++);
  }
  return schedule;
}

PipeSchedule forward_only(int stages, int virtual_stages, int micro_batches) {
  PipeSchedule schedule(stages);
  for (int r = 0; r < stages; ++r) {
    ListBuilder b{stages, virtual_stages, r, schedule[r]};
    for (int mb = 0; mb < micro_batches; ++mb)
      for (int c = 0; c < virtual_stages; ++c) b.forward(mb, c);
    for (PipeAction& a : schedule[r]) a.slot = 0;
  }
  return schedule;
}

std::string schedule_unsupported(PipeScheduleKind kind, int stages, int virtual_stages,
                                 int64_t micro_batches) {
  if (stages < 1 || micro_batches < 1) return "a pipeline needs a stage and a micro-batch";
  if (kind != PipeScheduleKind::interleaved) {
    if (virtual_stages != 1)
      return absl::StrCat("parallel.virtual_stages ", virtual_stages, " needs ",
                          "parallel.pipeline_schedule: interleaved");
    return "";
  }
  if (stages < 2) return "the interleaved schedule needs parallel.pp >= 2";
  if (virtual_stages < 2)
    return "the interleaved schedule needs parallel.virtual_stages >= 2 (1 is plain 1f1b)";
  if (micro_batches % stages != 0)
    return absl::StrCat("micro-batches run in groups of pp: ", micro_batches,
                        " per step (train.global_batch / (micro_batch x dp)) are not a multiple "
                        "of pp ",
                        stages, "; change the batch sizes or pp");
  return "";
}

void assign_slots(PipeSchedule& schedule) {
  for (std::vector<PipeAction>& actions : schedule) {
    std::map<std::pair<int, int>, size_t> last;  // (chunk, micro-batch) -> its last action
    for (size_t i = 0; i < actions.size(); ++i)
      if (!actions[i].is_poll()) last[{actions[i].chunk, actions[i].micro_batch}] = i;
    std::map<std::pair<int, int>, int> held;  // (chunk, micro-batch) -> slot
    std::vector<bool> busy;
    for (size_t i = 0; i < actions.size(); ++i) {
      PipeAction& a = actions[i];
      if (a.is_poll()) continue;
      const std::pair<int, int> key{a.chunk, a.micro_batch};
      auto it = held.find(key);
      if (it == held.end()) {
        const auto free = std::find(busy.begin(), busy.end(), false);
        const int slot = static_cast<int>(free - busy.begin());
        if (free == busy.end()) busy.push_back(true);
        busy[static_cast<size_t>(slot)] = true;
        it = held.emplace(key, slot).first;
      }
      a.slot = it->second;
      if (last[key] == i) {
        busy[static_cast<size_t>(a.slot)] = false;
        held.erase(it);
      }
    }
  }
}

int slots_needed(const std::vector<PipeAction>& actions) {
  int most = 0;
  for (const PipeAction& a : actions) most = std::max(most, a.slot + 1);
  return most;
}

PipeSchedule make_schedule(PipeScheduleKind kind, int stages, int virtual_stages,
                           int micro_batches) {
  PipeSchedule schedule;
  switch (kind) {
    case PipeScheduleKind::interleaved:
      schedule = interleaved_1f1b(stages, virtual_stages, micro_batches);
      break;
    case PipeScheduleKind::zero_bubble:
      schedule = zero_bubble_h1(stages, micro_batches);
      break;
    case PipeScheduleKind::one_f_one_b:
      schedule = one_f_one_b(stages, micro_batches);
      break;
  }
  assign_slots(schedule);
  return schedule;
}

double bubble_fraction(PipeScheduleKind kind, int stages, int virtual_stages,
                       int64_t micro_batches) {
  const double idle = stages - 1, m = static_cast<double>(micro_batches);
  switch (kind) {
    case PipeScheduleKind::interleaved:
      return idle / (virtual_stages * m + idle);
    case PipeScheduleKind::zero_bubble:
      // Fewer micro-batches than stages: the step takes 2 (p + m) - 1 passes' time.
      if (micro_batches < stages) return 1 - 3 * m / (2 * (stages + m) - 1);
      return idle / (3 * m + idle);
    case PipeScheduleKind::one_f_one_b:
      break;
  }
  return idle / (m + idle);
}

int rank_in_flight(const std::vector<PipeAction>& actions) {
  int now = 0, most = 0;
  for (const PipeAction& a : actions) {
    if (a.kind == PipeAction::fwd) most = std::max(most, ++now);
    if (a.finishes_weights()) --now;
  }
  return most;
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
      if (x.kind == PipeAction::fwd && x.chunk == 0 && x.micro_batch % lag == 0 && pending < 0) {
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
    const char* k = a.kind == PipeAction::fwd ? "F" : a.kind == PipeAction::bwd_weight ? "W" : "B";
    absl::StrAppend(&out, out.empty() ? "" : " ", k, a.micro_batch);
    if (a.chunk != 0) absl::StrAppend(&out, ".", a.chunk);
  }
  return out;
}

}  // namespace tr
