// Pipeline schedules: the compute orders are the published ones, and a simulated run of all
// ranks (grouped exchanges between compute actions; a message completes when both its send and
// its receive are posted, as NCCL's and MPI's rendezvous sends; each pair of ranks matches
// messages in posting order) finishes without deadlock with every message matching, every
// micro-batch's F before its B before its W on every chunk, and the schedule's bubble, timed
// with unit passes, equal to its closed form.
#include <algorithm>
#include <catch2/catch.hpp>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/schedule.h"

namespace tr {
namespace {

struct SimResult {
  bool finished = false;
  std::string error;
  std::string stuck;          // where each rank stopped, when not finished
  std::vector<int> forwards;  // chunk forwards run, per rank
  double makespan = 0;        // in pass times (F = 1, whole B = 2, B = W = 1)
  double busy = 0;            // compute time summed over the ranks
  double bubble() const { return 1 - busy / (static_cast<double>(forwards.size()) * makespan); }
};

double duration(PipeAction::Kind k) {
  return k == PipeAction::bwd ? 2 : 1;
}

// A posted message: which one it is (from the sender's view) and when it was posted.
struct Msg {
  bool act;              // an activation (else a gradient)
  int mb, from_virtual;  // micro-batch, sender's virtual stage
  double posted;
  size_t op;  // the action's index on its rank
};

// Every rank runs its list. With `rendezvous`, a message completes when both sides have posted
// it (the sender waits for its receiver: the strict test of deadlock freedom); without, a send
// completes when posted and a receive when its message was sent (the timing the closed forms
// assume: messages cost nothing and never hold up their sender). A poll_wait completes once every
// rank has started that poll; when it is poll `stop_poll`, the rank then skips every action on a
// micro-batch >= stop_poll + lag (the executor's cut, trainer/step/pipeline.cpp).
SimResult simulate(const PipeSchedule& sched, bool rendezvous, int stop_poll = -1, int lag = 1) {
  const int p = static_cast<int>(sched.size());
  int chunks = 1;
  for (const auto& list : sched)
    for (const PipeAction& a : list) chunks = std::max(chunks, a.chunk + 1);
  auto virtual_stage = [&](int rank, int chunk) { return chunk * p + rank; };
  // Link (from, to): sends posted and not matched, and receives posted and not matched.
  std::map<std::pair<int, int>, std::deque<Msg>> sends, recvs;
  std::vector<size_t> pc(p, 0);
  std::vector<bool> posted(p, false);
  std::vector<double> clock(p, 0);
  std::vector<std::map<size_t, double>> done(p);   // rank -> op index -> match time
  std::map<std::tuple<int, int, int>, int> state;  // (rank, chunk, mb) -> 1 F, 2 B, 3 W
  std::vector<std::set<int>> started(p);           // polls started, per rank
  std::vector<int> cut(p, 1 << 30);
  // Activation slots (make_schedule's): rank -> slot -> the (chunk, micro-batch) holding it.
  std::vector<std::map<int, std::pair<int, int>>> holder(p);
  SimResult res;
  // A pair holds its slot from its first action to its backward's last pass (what it keeps
  // there); its gradient's send after that reads the running gradient, not the slot.
  // (Evaluation's forward-only lists reuse slot 0 for every pair: no backward needs it.)
  bool training = false;
  for (const auto& list : sched)
    for (const PipeAction& a : list) training |= a.finishes_weights();
  auto occupy = [&](int s, const PipeAction& x) {
    if (!training || x.slot < 0 || x.kind == PipeAction::send_grad) return;
    const std::pair<int, int> key{x.chunk, x.micro_batch};
    auto [it, fresh] = holder[s].emplace(x.slot, key);
    if (!fresh && it->second != key) res.error = "two micro-batches in one activation slot";
    if (x.finishes_weights()) holder[s].erase(it);
  };
  res.forwards.assign(p, 0);
  auto group_end = [&](int s) {
    size_t e = pc[s];
    while (e < sched[s].size() && sched[s][e].is_comm()) ++e;
    return e;
  };
  auto match = [&](std::pair<int, int> link) {
    std::deque<Msg>& sq = sends[link];
    std::deque<Msg>& rq = recvs[link];
    while (!sq.empty() && !rq.empty()) {
      const Msg& s = sq.front();
      const Msg& r = rq.front();
      if (s.act != r.act || s.mb != r.mb || s.from_virtual != r.from_virtual)
        res.error = "message order differs between peers";
      const double t = std::max(s.posted, r.posted);
      if (rendezvous) done[link.first][s.op] = t;
      done[link.second][r.op] = t;
      sq.pop_front();
      rq.pop_front();
    }
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const std::vector<PipeAction>& a = sched[s];
      if (pc[s] == a.size()) continue;
      const PipeAction& x = a[pc[s]];
      if (x.micro_batch >= cut[s] && !x.is_comm()) {
        ++pc[s];
        progress = true;
        continue;
      }
      if (x.kind == PipeAction::poll_start) {
        started[s].insert(x.micro_batch);
        ++pc[s];
        progress = true;
        continue;
      }
      if (x.kind == PipeAction::poll_wait) {
        bool all = true;
        for (int t = 0; t < p; ++t) all &= started[t].count(x.micro_batch) > 0;
        if (!all) continue;
        if (x.micro_batch == stop_poll) cut[s] = x.micro_batch + lag;
        ++pc[s];
        progress = true;
        continue;
      }
      if (x.is_compute()) {
        occupy(s, x);
        int& st = state[{s, x.chunk, x.micro_batch}];
        const int want = x.kind == PipeAction::fwd ? 0 : x.kind == PipeAction::bwd_weight ? 2 : 1;
        if (st != want) res.error = "a pass out of order (F, then B, then W)";
        st = x.kind == PipeAction::fwd ? 1 : x.kind == PipeAction::bwd_weight ? 3 : 2;
        res.forwards[s] += x.kind == PipeAction::fwd;
        clock[s] += duration(x.kind);
        res.busy += duration(x.kind);
        ++pc[s];
        progress = true;
        continue;
      }
      const size_t end = group_end(s);
      if (!posted[s]) {
        for (size_t i = pc[s]; i < end; ++i) {
          const PipeAction& m = a[i];
          if (m.micro_batch >= cut[s]) continue;
          occupy(s, m);
          const bool act = m.kind == PipeAction::send_act || m.kind == PipeAction::recv_act;
          if (m.kind == PipeAction::send_act || m.kind == PipeAction::send_grad) {
            sends[{s, m.peer}].push_back(
                {act, m.micro_batch, virtual_stage(s, m.chunk), clock[s], i});
            if (!rendezvous) done[s][i] = clock[s];
            match({s, m.peer});
          } else {
            const int from = virtual_stage(s, m.chunk) + (act ? -1 : 1);
            recvs[{m.peer, s}].push_back({act, m.micro_batch, from, clock[s], i});
            match({m.peer, s});
          }
        }
        posted[s] = true;
        progress = true;
      }
      bool complete = true;
      double t = clock[s];
      for (size_t i = pc[s]; i < end; ++i) {
        if (a[i].micro_batch >= cut[s]) continue;
        auto it = done[s].find(i);
        if (it == done[s].end()) {
          complete = false;
          break;
        }
        t = std::max(t, it->second);
      }
      if (!complete) continue;
      clock[s] = t;
      pc[s] = end;
      posted[s] = false;
      progress = true;
    }
  }
  res.finished = true;
  for (int s = 0; s < p; ++s) {
    res.finished &= pc[s] == sched[s].size();
    if (pc[s] == sched[s].size()) continue;
    const PipeAction& x = sched[s][pc[s]];
    res.stuck += "rank " + std::to_string(s) + " at action " + std::to_string(pc[s]) + " (kind " +
                 std::to_string(x.kind) + ", micro-batch " + std::to_string(x.micro_batch) +
                 ", chunk " + std::to_string(x.chunk) + "); ";
  }
  for (auto& [link, q] : sends)
    if (!q.empty()) res.error = "a message nobody received";
  for (auto& [link, q] : recvs)
    if (!q.empty()) res.error = "a receive nobody sent to";
  for (int s = 0; s < p; ++s) res.makespan = std::max(res.makespan, clock[s]);
  return res;
}

// Every chunk of every rank runs each micro-batch's F and its backward (B and W) exactly once.
void check_complete(const PipeSchedule& sched, int v, int m) {
  for (size_t r = 0; r < sched.size(); ++r) {
    std::map<std::pair<int, int>, int> f, b, w;
    bool split = false;
    for (const PipeAction& a : sched[r]) {
      const std::pair<int, int> key{a.chunk, a.micro_batch};
      if (a.kind == PipeAction::fwd) ++f[key];
      if (a.kind == PipeAction::bwd || a.kind == PipeAction::bwd_input) ++b[key];
      if (a.kind == PipeAction::bwd_weight) ++w[key], split = true;
    }
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < m; ++mb) {
        CHECK(f[{c, mb}] == 1);
        CHECK(b[{c, mb}] == 1);
        if (split) CHECK(w[{c, mb}] == 1);
      }
    CHECK(f.size() == static_cast<size_t>(v * m));
  }
}

std::string text(const std::vector<PipeAction>& a) {
  std::string t;
  for (const PipeAction& x : a) {
    const char* k[] = {"F", "B", "sa", "ra", "sg", "rg", "P", "W", "Bi", "Bw"};
    t += std::string(t.empty() ? "" : " ") + k[x.kind] + std::to_string(x.micro_batch);
  }
  return t;
}

TEST_CASE("schedule: 1F1B compute order is the textbook one", "[schedule]") {
  PipeSchedule s = one_f_one_b(4, 8);
  CHECK(compute_order(s[0]) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(compute_order(s[1]) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  CHECK(compute_order(s[2]) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  CHECK(compute_order(s[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  s = one_f_one_b(2, 3);
  CHECK(compute_order(s[0]) == "F0 F1 B0 F2 B1 B2");
  CHECK(compute_order(s[1]) == "F0 B0 F1 B1 F2 B2");
  // Fewer micro-batches than stages: warm-up is cut to m, no steady state on early stages.
  s = one_f_one_b(4, 2);
  CHECK(compute_order(s[0]) == "F0 F1 B0 B1");
  CHECK(compute_order(s[2]) == "F0 F1 B0 B1");
  CHECK(compute_order(s[3]) == "F0 B0 F1 B1");
  // Communication around one stage-1 forward and backward of pp 3.
  s = one_f_one_b(3, 1);
  const std::vector<PipeAction> want = {
      {PipeAction::recv_act, 0, 0, 0},  {PipeAction::fwd, 0}, {PipeAction::send_act, 0, 0, 2},
      {PipeAction::recv_grad, 0, 0, 2}, {PipeAction::bwd, 0}, {PipeAction::send_grad, 0, 0, 0}};
  CHECK(s[1] == want);
  CHECK(one_f_one_b(1, 3)[0].size() == 6);  // no pipeline: F0 B0 F1 B1 F2 B2, no messages
}

TEST_CASE("schedule: interleaved and zero-bubble orders are Megatron's and ZB-H1's", "[schedule]") {
  // pp 2, v 2, 4 micro-batches: rank 0 warms up with 2 (p-1) + (v-1) p = 4 chunk forwards,
  // micro-batches in groups of p, chunk 0 then chunk 1; backwards the chunks in reverse.
  PipeSchedule s = interleaved_1f1b(2, 2, 4);
  CHECK(compute_order(s[0]) == "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3");
  CHECK(compute_order(s[1]) == "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3");
  // Messages wrap around: rank 1's chunk 0 feeds rank 0's chunk 1, whose gradient goes back.
  CHECK(s[1][2] == PipeAction{PipeAction::send_act, 0, 0, 0});
  CHECK(s[0][std::find(s[0].begin(), s[0].end(), PipeAction{PipeAction::fwd, 0, 1}) - s[0].begin() -
             1] == PipeAction{PipeAction::recv_act, 0, 1, 1});
  // ZB-H1, pp 4: stage s runs each W s micro-batches after its B; p in flight everywhere.
  s = zero_bubble_h1(4, 8);
  CHECK(compute_order(s[0]) ==
        "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
  CHECK(compute_order(s[1]) ==
        "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7");
  CHECK(compute_order(s[3]) ==
        "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
  for (const auto& list : s) CHECK(rank_in_flight(list) == 4);
  for (int r = 0; r < 4; ++r) CHECK(rank_in_flight(one_f_one_b(4, 8)[r]) == 4 - r);
  // The most in flight is reached within the first 4 p micro-batches (RunLayout::in_flight
  // counts no further): a longer step holds no more.
  for (PipeScheduleKind kind : {PipeScheduleKind::one_f_one_b, PipeScheduleKind::interleaved,
                                PipeScheduleKind::zero_bubble})
    for (int p : {2, 3, 4, 8})
      for (int v : {1, 2, 4}) {
        if (!schedule_unsupported(kind, p, v, 4 * p).empty()) continue;
        INFO(schedule_name(kind) << ", pp " << p << ", v " << v);
        const PipeSchedule four = make_schedule(kind, p, v, 4 * p),
                           many = make_schedule(kind, p, v, 16 * p);
        for (int r = 0; r < p; ++r) {
          CHECK(rank_in_flight(four[r]) == rank_in_flight(many[r]));
          // The slots: as many as pairs in flight at the peak, no more.
          CHECK(slots_needed(four[r]) == rank_in_flight(four[r]));
          CHECK(slots_needed(many[r]) == rank_in_flight(many[r]));
        }
      }
}

TEST_CASE("schedule: every schedule runs to the end with its closed-form bubble", "[schedule]") {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 7, 8, 16, 32}) {
      INFO("pp " << p << ", micro-batches " << m);
      for (PipeScheduleKind kind : {PipeScheduleKind::one_f_one_b, PipeScheduleKind::zero_bubble,
                                    PipeScheduleKind::interleaved}) {
        for (int v : {1, 2, 3}) {
          if (!schedule_unsupported(kind, p, v, m).empty()) continue;
          INFO(schedule_name(kind) << ", v " << v);
          const PipeSchedule sched = make_schedule(kind, p, v, m);
          check_complete(sched, v, m);
          const SimResult strict = simulate(sched, true);
          CHECK(strict.finished);
          INFO(strict.error << strict.stuck);
          CHECK(strict.error.empty());
          const SimResult r = simulate(sched, false);
          CHECK(r.bubble() == Approx(bubble_fraction(kind, p, v, m)).margin(1e-12));
        }
      }
    }
  }
  // Evaluation's forward-only lists run through every virtual stage in order.
  for (int p : {1, 2, 4})
    for (int v : {1, 2, 3})
      for (int m : {1, 3}) {
        INFO("forward only: pp " << p << ", v " << v << ", micro-batches " << m);
        const PipeSchedule sched = forward_only(p, v, m);
        const SimResult r = simulate(sched, true);
        CHECK(r.finished);
        CHECK(r.error.empty());
        for (int s = 0; s < p; ++s) CHECK(r.forwards[s] == v * m);
      }
  // The schedules' bubbles for a pp 8 run of 32 micro-batches: interleaved v 2 halves 1F1B's,
  // ZB-H1 a third.
  CHECK(bubble_fraction(PipeScheduleKind::one_f_one_b, 8, 1, 32) == Approx(7.0 / 39));
  CHECK(bubble_fraction(PipeScheduleKind::interleaved, 8, 2, 32) == Approx(7.0 / 71));
  CHECK(bubble_fraction(PipeScheduleKind::zero_bubble, 8, 1, 32) == Approx(7.0 / 103));
  CHECK_FALSE(schedule_unsupported(PipeScheduleKind::interleaved, 4, 2, 6).empty());
  CHECK_FALSE(schedule_unsupported(PipeScheduleKind::interleaved, 1, 2, 4).empty());
  CHECK_FALSE(schedule_unsupported(PipeScheduleKind::one_f_one_b, 2, 2, 4).empty());
}

// Stop polls: at lag pp, under every schedule, no rank ever waits for a poll that another rank
// cannot start, with or without a stop; a stop at poll k cuts every rank at the same micro-batch k
// + lag, and every message sent before the cut is received.
TEST_CASE("schedule: stop polls never deadlock, and a stop cuts every stage at one micro-batch",
          "[schedule]") {
  CHECK(stop_poll_lag(1) == 1);
  CHECK(stop_poll_lag(4) == 4);
  // pp 2, 5 micro-batches: polls after F0, F2, F4; each waited before micro-batch k + 2.
  PipeSchedule two = with_stop_polls(one_f_one_b(2, 5), 2);
  CHECK(text(two[0]) ==
        "F0 P0 sa0 F1 sa1 rg0 B0 W0 F2 P2 sa2 rg1 B1 F3 sa3 rg2 B2 W2 F4 P4 sa4 rg3 B3 rg4 B4 W4");
  CHECK(text(two[1]) ==
        "ra0 F0 P0 B0 sg0 ra1 F1 B1 W0 sg1 ra2 F2 P2 B2 sg2 ra3 F3 B3 W2 sg3 ra4 F4 P4 B4 sg4 W4");
  for (PipeScheduleKind kind : {PipeScheduleKind::one_f_one_b, PipeScheduleKind::zero_bubble,
                                PipeScheduleKind::interleaved}) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int m : {1, 2, 3, 4, 5, 8, 16}) {
        const int v = kind == PipeScheduleKind::interleaved ? 2 : 1;
        if (!schedule_unsupported(kind, p, v, m).empty()) continue;
        const int lag = stop_poll_lag(p);
        const PipeSchedule sched = with_stop_polls(make_schedule(kind, p, v, m), lag);
        for (int stop = -1; stop < m; ++stop) {
          if (stop >= 0 && stop % lag != 0) continue;  // polls are at multiples of lag
          INFO(schedule_name(kind)
               << ", pp " << p << ", micro-batches " << m << ", stop at poll " << stop);
          SimResult r = simulate(sched, true, stop, lag);
          CHECK(r.finished);
          CHECK(r.error.empty());
          for (int s = 0; s < p; ++s)
            CHECK(r.forwards[s] == v * (stop < 0 ? m : std::min(m, stop + lag)));
        }
      }
    }
  }
  // One lag too short deadlocks (pp 3, lag 1): the simulation can tell.
  CHECK_FALSE(simulate(with_stop_polls(one_f_one_b(3, 8), 1), true, -1, 1).finished);
}

}  // namespace
}  // namespace tr
