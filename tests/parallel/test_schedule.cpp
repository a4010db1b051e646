// Pipeline schedules: the 1F1B compute order per stage equals the textbook one, and a
// simulated run of all stages (grouped exchanges between compute actions, FIFO links)
// finishes without deadlock with every message matching.
#include <algorithm>
#include <catch2/catch.hpp>
#include <deque>
#include <string>
#include <vector>

#include "parallel/schedule.h"

namespace tr {
namespace {

struct SimResult {
  bool finished = false;
  std::string error;
  std::vector<int> max_in_flight;  // per stage
  std::vector<int> forwards;       // forwards run, per stage
};

// Every stage runs its list; the comm actions between two compute actions are posted together
// (sends at once), and the group completes when each receive finds its message at the front of
// the link from that peer. A poll_wait completes once every stage has started that poll; when
// it is poll `stop_poll`, the stage then skips every action on a micro-batch >= stop_poll + lag
// (the executor's cut, trainer/run/loop.cpp).
SimResult simulate(const PipeSchedule& sched, int stop_poll = -1, int lag = 1) {
  const int p = static_cast<int>(sched.size());
  std::vector<std::deque<int>> act(p), grad(p);  // act[s]: s -> s+1; grad[s]: s+1 -> s
  std::vector<size_t> pc(p, 0);
  std::vector<bool> posted(p, false);
  std::vector<std::vector<int>> state(
      p);  // per micro-batch: 0 none, 1 forward done, 2 backward done
  std::vector<std::vector<int>> started(p);  // polls started, per stage
  std::vector<int> cut(p, 1 << 30);          // micro-batches from here on are dropped
  SimResult res;
  res.max_in_flight.assign(p, 0);
  res.forwards.assign(p, 0);
  auto group_end = [&](int s) {
    size_t e = pc[s];
    while (e < sched[s].size() && sched[s][e].is_comm()) ++e;
    return e;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const std::vector<PipeAction>& a = sched[s];
      if (pc[s] == a.size()) continue;
      if (a[pc[s]].micro_batch >= cut[s]) {
        ++pc[s];
        progress = true;
        continue;
      }
      if (a[pc[s]].kind == PipeAction::poll_start) {
        started[s].push_back(a[pc[s]++].micro_batch);
        progress = true;
        continue;
      }
      if (a[pc[s]].kind == PipeAction::poll_wait) {
        const int k = a[pc[s]].micro_batch;
        bool all = true;
        for (int t = 0; t < p; ++t)
          all &= std::find(started[t].begin(), started[t].end(), k) != started[t].end();
        if (!all) continue;
        if (k == stop_poll) cut[s] = k + lag;
        ++pc[s];
        progress = true;
        continue;
      }
      if (!a[pc[s]].is_comm()) {
        const PipeAction& x = a[pc[s]++];
        std::vector<int>& st = state[s];
        if (st.size() <= static_cast<size_t>(x.micro_batch)) st.resize(x.micro_batch + 1, 0);
        if (x.kind == PipeAction::bwd && st[x.micro_batch] != 1)
          res.error = "backward before forward";
        st[x.micro_batch] = x.kind == PipeAction::fwd ? 1 : 2;
        res.forwards[s] += x.kind == PipeAction::fwd;
        int in_flight = 0;
        for (int v : st) in_flight += v == 1;
        res.max_in_flight[s] = std::max(res.max_in_flight[s], in_flight);
        progress = true;
        continue;
      }
      const size_t end = group_end(s);
      if (!posted[s]) {
        for (size_t i = pc[s]; i < end; ++i) {
          if (a[i].micro_batch >= cut[s]) continue;
          if (a[i].kind == PipeAction::send_act) act[s].push_back(a[i].micro_batch);
          if (a[i].kind == PipeAction::send_grad) grad[s - 1].push_back(a[i].micro_batch);
        }
        posted[s] = true;
        progress = true;
      }
      bool ready = true;
      for (size_t i = pc[s]; i < end; ++i) {
        if (a[i].micro_batch >= cut[s]) continue;
        if (a[i].kind == PipeAction::recv_act) ready &= !act[s - 1].empty();
        if (a[i].kind == PipeAction::recv_grad) ready &= !grad[s].empty();
      }
      if (!ready) continue;
      for (size_t i = pc[s]; i < end; ++i) {
        if (a[i].micro_batch >= cut[s]) continue;
        std::deque<int>* q = a[i].kind == PipeAction::recv_act    ? &act[s - 1]
                             : a[i].kind == PipeAction::recv_grad ? &grad[s]
                                                                  : nullptr;
        if (!q) continue;
        if (q->front() != a[i].micro_batch) res.error = "message order differs between peers";
        q->pop_front();
      }
      pc[s] = end;
      posted[s] = false;
      progress = true;
    }
  }
  res.finished = true;
  for (int s = 0; s < p; ++s) res.finished &= pc[s] == sched[s].size();
  for (int s = 0; s < p; ++s)
    if (!act[s].empty() || !grad[s].empty()) res.error = "a message nobody received";
  return res;
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
  const std::vector<PipeAction> want = {{PipeAction::recv_act, 0}, {PipeAction::fwd, 0},
                                        {PipeAction::send_act, 0}, {PipeAction::recv_grad, 0},
                                        {PipeAction::bwd, 0},      {PipeAction::send_grad, 0}};
  CHECK(s[1] == want);
  CHECK(one_f_one_b(1, 3)[0].size() == 6);  // no pipeline: F0 B0 F1 B1 F2 B2, no messages
}

TEST_CASE("schedule: 1F1B runs to the end on every stage, in-flight bounded by p - s",
          "[schedule]") {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 7, 8, 16}) {
      INFO("pp " << p << ", micro-batches " << m);
      PipeSchedule sched = one_f_one_b(p, m);
      SimResult r = simulate(sched);
      CHECK(r.finished);
      CHECK(r.error.empty());
      for (int s = 0; s < p; ++s) {
        CHECK(r.max_in_flight[s] == std::min(p - s, m));
        int f = 0, b = 0;
        for (const PipeAction& a : sched[s])
          f += a.kind == PipeAction::fwd, b += a.kind == PipeAction::bwd;
        CHECK(f == m);
        CHECK(b == m);
      }
    }
  }
}

// Stop polls: with lag = pp, no rank ever waits for a poll that another rank cannot start,
// with or without a stop; a stop at poll k cuts every stage at the same micro-batch k + lag, and
// every message sent before the cut is received.
TEST_CASE("schedule: stop polls never deadlock, and a stop cuts every stage at one micro-batch",
          "[schedule]") {
  CHECK(stop_poll_lag(1) == 1);
  CHECK(stop_poll_lag(4) == 4);
  // pp 2, 5 micro-batches: polls after F0, F2, F4; each waited before micro-batch k + 2.
  PipeSchedule two = with_stop_polls(one_f_one_b(2, 5), 2);
  auto text = [](const std::vector<PipeAction>& a) {
    std::string t;
    for (const PipeAction& x : a) {
      const char* k[] = {"F", "B", "sa", "ra", "sg", "rg", "P", "W"};
      t += std::string(t.empty() ? "" : " ") + k[x.kind] + std::to_string(x.micro_batch);
    }
    return t;
  };
  CHECK(text(two[0]) ==
        "F0 P0 sa0 F1 sa1 rg0 B0 W0 F2 P2 sa2 rg1 B1 F3 sa3 rg2 B2 W2 F4 P4 sa4 rg3 B3 rg4 B4 W4");
  CHECK(text(two[1]) ==
        "ra0 F0 P0 B0 sg0 ra1 F1 B1 W0 sg1 ra2 F2 P2 B2 sg2 ra3 F3 B3 W2 sg3 ra4 F4 P4 B4 sg4 W4");
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 5, 8, 16}) {
      const int lag = stop_poll_lag(p);
      const PipeSchedule sched = with_stop_polls(one_f_one_b(p, m), lag);
      for (int stop = -1; stop < m; ++stop) {
        if (stop >= 0 && stop % lag != 0) continue;  // polls are at multiples of lag
        INFO("pp " << p << ", micro-batches " << m << ", stop at poll " << stop);
        SimResult r = simulate(sched, stop, lag);
        CHECK(r.finished);
        CHECK(r.error.empty());
        for (int s = 0; s < p; ++s)
          CHECK(r.forwards[s] == (stop < 0 ? m : std::min(m, stop + lag)));
      }
    }
  }
  // One lag too short deadlocks (pp 3, lag 2): the simulation can tell.
  CHECK_FALSE(simulate(with_stop_polls(one_f_one_b(3, 8), 1), -1, 1).finished);
}

}  // namespace
}  // namespace tr
