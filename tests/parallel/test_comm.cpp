// Collectives and groups with rank-valued inputs and closed-form results. Runs as a single
// process (self communicators) and under mpirun with 2, 4 and 8 ranks (see CMakeLists.txt).
#define CATCH_CONFIG_RUNNER
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "kernels/cpu/chunk_attention.h"
#include "kernels/ops.h"
#include "parallel/context_parallel.h"
#include "parallel/cp_attention.h"
#include "parallel/dp_shards.h"
#include "parallel/grad_reducer.h"
#include "parallel/groups.h"
#include "parallel/mpi_comm.h"
#include "parallel/nccl_comm.h"
#include "tests/host_tensor.h"
#include "tests/test_util.h"

namespace tr {
namespace {

std::unique_ptr<Comm> world_comm() {
  return launched_by_mpi_launcher() ? make_mpi_world() : make_self_comm("world");
}

Tensor host(std::vector<float>& v) {
  return Tensor(v.data(), DType::f32, Device::cpu, {static_cast<int64_t>(v.size())});
}

TEST_CASE("comm: all-reduce sum and max of rank-valued vectors", "[comm]") {
  auto w = world_comm();
  const int r = w->rank(), n = w->size();
  std::vector<float> v = {1.0f * (r + 1), 2.0f * (r + 1), 3.0f * (r + 1)};
  w->all_reduce(host(v), ReduceOp::sum);
  for (int i = 0; i < 3; ++i) CHECK(v[i] == (i + 1) * n * (n + 1) / 2.0f);
  std::vector<float> m = {static_cast<float>(r), -static_cast<float>(r)};
  w->all_reduce(host(m), ReduceOp::max);
  CHECK(m[0] == n - 1);
  CHECK(m[1] == 0);
  std::vector<double> d = {0.5 * r};
  w->all_reduce(Tensor(d.data(), DType::f64, Device::cpu, {1}), ReduceOp::sum);
  CHECK(d[0] == 0.25 * n * (n - 1));
  std::vector<int32_t> k = {r * 10};
  w->all_reduce(Tensor(k.data(), DType::i32, Device::cpu, {1}), ReduceOp::sum);
  CHECK(k[0] == 5 * n * (n - 1));
}

// bf16 (gradient reduction in bf16, parallel.grad_reduce_dtype): MPI has no bf16 type, so sums
// and maxima go through our own operations. Small integers are exact in bf16; 1 + 2^-8 per rank
// is not, and each partial sum rounds to bf16, so the result is one of the roundings the
// ranks' order allows, equal on every rank and in every repetition.
TEST_CASE("comm: bf16 all-reduce, reduce and reduce-scatter", "[comm]") {
  auto w = world_comm();
  const int r = w->rank(), n = w->size();
  auto bf16 = [](std::vector<uint16_t>& v) {
    return Tensor(v.data(), DType::bf16, Device::cpu, {static_cast<int64_t>(v.size())});
  };
  std::vector<uint16_t> v = {f32_to_bf16(1.0f * (r + 1)), f32_to_bf16(-2.0f * r)};
  w->all_reduce(bf16(v), ReduceOp::sum);
  CHECK(bf16_to_f32(v[0]) == n * (n + 1) / 2.0f);
  CHECK(bf16_to_f32(v[1]) == -1.0f * n * (n - 1));
  std::vector<uint16_t> m = {f32_to_bf16(static_cast<float>(r))};
  w->all_reduce(bf16(m), ReduceOp::max);
  CHECK(bf16_to_f32(m[0]) == n - 1);
  // Started and completed like a gradient bucket; the same bits as the blocking one.
  std::vector<uint16_t> a = {f32_to_bf16(1.00390625f)}, b = a;
  w->all_reduce(bf16(a), ReduceOp::sum);
  w->all_reduce_start(bf16(b), ReduceOp::sum);
  w->wait_all();
  CHECK(a == b);
  CHECK(std::abs(bf16_to_f32(a[0]) - 1.00390625f * n) <= 0.01f * n);
  std::vector<uint16_t> all = {a[0]};
  std::vector<uint16_t> gathered(n);
  w->all_gather(bf16(gathered), bf16(all));
  for (int q = 0; q < n; ++q) CHECK(gathered[q] == a[0]);  // every rank agrees
  // A started reduce-scatter (ZeRO-1's bf16 buckets): rank r's piece of the sum.
  std::vector<uint16_t> in(2 * n), out(2, 0);
  for (int q = 0; q < n; ++q) in[2 * q] = f32_to_bf16(3.0f), in[2 * q + 1] = f32_to_bf16(0.5f * r);
  w->reduce_scatter_start(bf16(out), bf16(in), ReduceOp::sum);
  w->wait_all();
  CHECK(bf16_to_f32(out[0]) == 3.0f * n);
  CHECK(bf16_to_f32(out[1]) == 0.25f * n * (n - 1));
  std::vector<uint16_t> big(2 * n), mine(2);
  for (int j = 0; j < 2 * n; ++j) big[j] = f32_to_bf16(static_cast<float>(j + r));
  w->reduce_scatter(bf16(mine), bf16(big), ReduceOp::sum);
  for (int k = 0; k < 2; ++k)
    CHECK(bf16_to_f32(mine[k]) == n * (2.0f * r + k) + n * (n - 1) / 2.0f);
}

TEST_CASE("comm: all-gather, reduce-scatter and broadcast", "[comm]") {
  auto w = world_comm();
  const int r = w->rank(), n = w->size();
  std::vector<float> in = {static_cast<float>(r), -static_cast<float>(r)}, out(2 * n, -1.0f);
  w->all_gather(host(out), host(in));
  for (int q = 0; q < n; ++q) {
    CHECK(out[2 * q] == q);
    CHECK(out[2 * q + 1] == -q);
  }
  // in[j] = 1000 r + j; rank r keeps block r of the sum: sum_q (1000 q + 2 r + k).
  std::vector<float> big(2 * n), mine(2);
  for (int j = 0; j < 2 * n; ++j) big[j] = 1000.0f * r + j;
  w->reduce_scatter(host(mine), host(big), ReduceOp::sum);
  for (int k = 0; k < 2; ++k) CHECK(mine[k] == 1000.0f * n * (n - 1) / 2 + n * (2.0f * r + k));
  std::vector<float> b = {static_cast<float>(r == n - 1 ? 42 + n : r)};
  w->broadcast(host(b), n - 1);
  CHECK(b[0] == 42 + n);
  w->barrier();
}

// Asynchronous all-gathers complete by ticket in any order (and the rest by wait_all, beside a
// started reduction and reduce-scatter), in place and not.
TEST_CASE("comm: all-gathers started together complete by ticket", "[comm]") {
  auto w = world_comm();
  const int r = w->rank(), n = w->size();
  constexpr int kBuckets = 5, kPiece = 3;
  std::vector<float> all(kBuckets * n * kPiece, -1.0f);
  auto block = [&](int b) {
    return Tensor(all.data() + b * n * kPiece, DType::f32, Device::cpu, {n * kPiece});
  };
  auto mine = [&](int b) {
    return Tensor(all.data() + (b * n + r) * kPiece, DType::f32, Device::cpu, {kPiece});
  };
  for (int b = 0; b < kBuckets; ++b)
    for (int k = 0; k < kPiece; ++k) all[(b * n + r) * kPiece + k] = 100.0f * b + 10.0f * r + k;
  std::vector<float> sep = {static_cast<float>(r)}, sep_out(n, -1.0f);
  std::vector<int64_t> tickets;
  for (int b = 0; b < kBuckets; ++b) tickets.push_back(w->all_gather_start(block(b), mine(b)));
  tickets.push_back(w->all_gather_start(host(sep_out), host(sep)));  // not in place
  std::vector<float> red = {1.0f};
  w->all_reduce_start(host(red), ReduceOp::sum);
  // in[j] = 1000 r + j; rank r gets block r of the sum: sum_q (1000 q + 2 r + k).
  std::vector<float> big(2 * n), scattered(2, -1.0f);
  for (int j = 0; j < 2 * n; ++j) big[j] = 1000.0f * r + j;
  w->reduce_scatter_start(host(scattered), host(big), ReduceOp::sum);
  auto bucket_ok = [&](int b) {
    for (int q = 0; q < n; ++q)
      for (int k = 0; k < kPiece; ++k)
        if (all[(b * n + q) * kPiece + k] != 100.0f * b + 10.0f * q + k) return false;
    return true;
  };
  w->wait(tickets[3]);
  CHECK(bucket_ok(3));
  w->wait(tickets[0]);
  CHECK(bucket_ok(0));
  w->wait(tickets[0]);  // again: nothing to do
  w->wait_all();        // buckets 1, 2, 4, the separate one and the reduction
  for (int b = 0; b < kBuckets; ++b) CHECK(bucket_ok(b));
  for (int q = 0; q < n; ++q) CHECK(sep_out[q] == q);
  CHECK(red[0] == n);
  for (int k = 0; k < 2; ++k) CHECK(scattered[k] == 1000.0f * n * (n - 1) / 2 + n * (2.0f * r + k));
  w->wait(tickets[1]);  // after wait_all: nothing to do
  w->barrier();
}

// Every operation may be started beside the compute and completed by its ticket, with the
// result of the same operation run in order: broadcast, a ring exchange, send/recv pairs and
// a barrier, started together and waited in reverse.
TEST_CASE("comm: every operation started beside completes by its ticket", "[comm]") {
  auto w = world_comm();
  const int r = w->rank(), n = w->size();
  std::vector<float> b = {static_cast<float>(r == 0 ? 7 + n : -r)}, b_now = b;
  std::vector<Comm::Ticket> tickets;
  tickets.push_back(w->start(CommOp(CommOp::broadcast, host(b), {}, {}, 0), Lane::beside));
  w->broadcast(host(b_now), 0);
  std::vector<float> mine = {10.0f * r}, from_left = {-1.0f};
  std::vector<P2P> ring;
  if (n > 1)
    ring = {{P2P::send, host(mine), (r + 1) % n}, {P2P::recv, host(from_left), (r + n - 1) % n}};
  tickets.push_back(w->start(CommOp(CommOp::exchange, {}, {}, {}, 0, ring), Lane::beside));
  // Pairs (0,1), (2,3), ...: the even rank sends its rank + 0.5, the odd one receives it.
  std::vector<float> pair = {r + 0.5f};
  const bool paired = n > 1 && (r % 2 == 1 || r + 1 < n);
  if (paired) {
    const bool sender = r % 2 == 0;
    tickets.push_back(w->start(
        CommOp(sender ? CommOp::send : CommOp::recv, host(pair), {}, {}, sender ? r + 1 : r - 1),
        Lane::beside));
  }
  tickets.push_back(w->start(CommOp(CommOp::barrier), Lane::beside));
  if (n > 1) {
    for (Comm::Ticket t : tickets) CHECK(t != Comm::kDone);  // truly started, not run
  }
  for (auto t = tickets.rbegin(); t != tickets.rend(); ++t) w->wait(*t);
  CHECK(b[0] == 7 + n);
  CHECK(b == b_now);
  if (n > 1) CHECK(from_left[0] == 10.0f * ((r + n - 1) % n));
  if (paired && r % 2 == 1) CHECK(pair[0] == r - 1 + 0.5f);
  // In order, the same ticket is kDone: complete when start returns.
  std::vector<float> s = {1.0f};
  CHECK(w->start(CommOp(CommOp::all_reduce, host(s)), Lane::in_order) == Comm::kDone);
  CHECK(s[0] == n);
  w->wait_all();
}

// Context-parallel attention over the world as one CP group: each rank's chunks of a 6 n-token
// sequence give exactly the whole sequence's outputs, lse and gradients (fp64), by all-gather
// and by ring.
TEST_CASE("comm: context-parallel attention equals the whole sequence's", "[comm]") {
  auto w = world_comm();
  const int r = w->rank(), n = w->size();
  const int64_t S = 6 * n, nh = 4, nkv = 2, hd = 8;  // two chunks of 3 tokens per rank
  std::mt19937 rng(16);                              // the same sequence on every rank
  std::uniform_real_distribution<double> u(-1, 1);
  auto random = [&](int64_t count) {
    std::vector<double> x(static_cast<size_t>(count));
    for (double& e : x) e = u(rng);
    return x;
  };
  std::vector<double> q = random(S * nh * hd), k = random(S * nkv * hd), v = random(S * nkv * hd),
                      dout = random(S * nh * hd);
  auto t64 = [](std::vector<double>& x, int64_t rows, int64_t heads) {
    return Tensor(x.data(), DType::f64, Device::cpu, {rows, heads, hd});
  };
  // The whole sequence on one rank.
  std::vector<int64_t> all(S);
  for (int64_t i = 0; i < S; ++i) all[i] = i;
  std::vector<double> out(q.size()), lse(nh * S, -INFINITY), dq(q.size()), dk(k.size()),
      dv(v.size());
  cpu::chunk_attention_fwd(t64(out, S, nh), Tensor(lse.data(), DType::f64, Device::cpu, {nh, S}),
                           t64(q, S, nh), t64(k, S, nkv), t64(v, S, nkv), all, all);
  cpu::chunk_attention_bwd(t64(dq, S, nh), t64(dk, S, nkv), t64(dv, S, nkv), t64(dout, S, nh),
                           t64(out, S, nh), Tensor(lse.data(), DType::f64, Device::cpu, {nh, S}),
                           t64(q, S, nh), t64(k, S, nkv), t64(v, S, nkv), all, all);
  const std::vector<int64_t> pos = cp_positions(S, n, r);
  const int64_t L = static_cast<int64_t>(pos.size());
  auto rows = [&](const std::vector<double>& x, int64_t heads) {
    std::vector<double> y(static_cast<size_t>(L * heads * hd));
    for (int64_t i = 0; i < L; ++i)
      std::copy_n(x.begin() + pos[i] * heads * hd, heads * hd, y.begin() + i * heads * hd);
    return y;
  };
  auto lse_rows = [&] {  // cp_attention's order: [2 chunks, nh, L / 2]
    std::vector<double> y(static_cast<size_t>(nh * L));
    const int64_t C = L / 2;
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t i = 0; i < C; ++i) y[(a * nh + h) * C + i] = lse[h * S + pos[a * C + i]];
    return y;
  };
  // Each method in f64, and in f32 with f64 accumulators (the path bf16 takes on GPUs with f32
  // ones: every partial and gradient share cast into the accumulators, which are cast back once).
  struct Mode {
    DType dtype, acc;
    double tol_out, tol_grad;
  };
  for (CpExchange how : {CpExchange::all_gather, CpExchange::ring})
    for (const Mode& m :
         {Mode{DType::f64, DType::f64, 1e-12, 1e-10}, Mode{DType::f32, DType::f64, 1e-6, 1e-5}}) {
      INFO((how == CpExchange::ring ? "ring" : "all-gather")
           << " over " << n << " ranks, " << dtype_name(m.dtype) << " with " << dtype_name(m.acc)
           << " accumulators");
      // This rank's rows of the sequence, and room for the results, in m.dtype.
      std::vector<test::HostTensor> in;
      for (auto [x, heads] : {std::pair{&q, nh}, {&k, nkv}, {&v, nkv}, {&dout, nh}})
        in.emplace_back(m.dtype, std::initializer_list<int64_t>{L, heads, hd}, rows(*x, heads));
      test::HostTensor lo(m.dtype, {L, nh, hd}), ll(stat_dtype(m.dtype), {nh, L});
      test::HostTensor gq(m.dtype, {L, nh, hd}), gk(m.dtype, {L, nkv, hd}),
          gv(m.dtype, {L, nkv, hd});
      Arena measure = Arena::planner(Device::cpu);
      CpScratch::alloc(measure, how, n, L, nh, nkv, hd, m.dtype, m.acc);
      Arena arena(measure.used(), Device::cpu);
      const CpScratch sc = CpScratch::alloc(arena, how, n, L, nh, nkv, hd, m.dtype, m.acc);
      Ctx host;
      cp_attention_fwd(host, *w, how, sc, lo.t, ll.t, in[0].t, in[1].t, in[2].t, S);
      CHECK(test::rel_err(lo.values(), rows(out, nh)) < m.tol_out);
      CHECK(test::rel_err(ll.values(), lse_rows()) < m.tol_out);
      cp_attention_bwd(host, *w, how, sc, gq.t, gk.t, gv.t, in[3].t, lo.t, ll.t, in[0].t, in[1].t,
                       in[2].t, S);
      CHECK(test::rel_err(gq.values(), rows(dq, nh)) < m.tol_grad);
      CHECK(test::rel_err(gk.values(), rows(dk, nkv)) < m.tol_grad);
      CHECK(test::rel_err(gv.values(), rows(dv, nkv)) < m.tol_grad);
    }
}

// ZeRO-1's layout: every bucket cut into dp equal pieces, each element owned by exactly one
// rank, each rank's runs a bijection onto its shard with bucket b's piece at lo_b / dp, and the
// runs of a sub-range the restriction of the whole.
TEST_CASE("comm: DpShards give every rank one piece of each bucket", "[comm]") {
  for (int dp : {1, 2, 3, 4, 8}) {
    for (int64_t capacity : {int64_t{0}, int64_t{dp}, int64_t{24} * dp, int64_t{1000} * dp}) {
      for (int64_t bucket : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1} << 20}) {
        INFO("dp " << dp << " capacity " << capacity << " bucket " << bucket);
        std::vector<int> owner(static_cast<size_t>(capacity), -1);
        for (int r = 0; r < dp; ++r) {
          const DpShards s(capacity, bucket, dp, r);
          CHECK(s.bucket_elems() % (DpShards::kAlign * dp) == 0);
          CHECK(s.bucket_elems() >= bucket);
          CHECK(s.shard_size() * dp == capacity);
          std::vector<int> hit(static_cast<size_t>(s.shard_size()), 0);
          for (const ShardRun& run : s.runs(0, capacity)) {
            for (int64_t k = 0; k < run.count; ++k) {
              CHECK(owner[run.flat + k] == -1);
              owner[run.flat + k] = r;
              ++hit[run.shard + k];
            }
          }
          CHECK(std::all_of(hit.begin(), hit.end(), [](int h) { return h == 1; }));
          for (int64_t b = 0; b < s.buckets(); ++b) {
            const auto [lo, hi] = s.bucket(b);
            CHECK(s.piece(b) * dp == hi - lo);
            CHECK(s.shard_offset(b) == lo / dp);
            const std::vector<ShardRun> one = s.runs(lo, hi);
            REQUIRE(one.size() == 1);
            CHECK(one[0].flat == s.piece_begin(b, r));
            CHECK(one[0].shard == s.shard_offset(b));
            if (capacity % DpShards::capacity_multiple(dp) == 0) {  // 16-byte aligned pieces
              CHECK(s.piece(b) % DpShards::kAlign == 0);
              CHECK(s.piece_begin(b, r) % DpShards::kAlign == 0);
              CHECK(s.shard_offset(b) % DpShards::kAlign == 0);
            }
          }
          // A sub-range: the same elements, each at the same shard index.
          const int64_t a = capacity / 3, c = capacity - capacity / 5;
          int64_t in_range = 0;
          for (const ShardRun& run : s.runs(a, c)) {
            CHECK(run.flat >= a);
            CHECK(run.flat + run.count <= c);
            for (int64_t k = 0; k < run.count; ++k) CHECK(owner[run.flat + k] == r);
            in_range += run.count;
          }
          int64_t want = 0;
          for (int64_t i = a; i < c; ++i) want += owner[i] == r;
          CHECK(in_range == want);
        }
        CHECK(std::all_of(owner.begin(), owner.end(), [](int o) { return o >= 0; }));
      }
    }
  }
}

// The weight all-gather of ZeRO-1 through GradReducer: each rank's pieces of every bucket to
// every rank, bucket by bucket; wait_weights completes the buckets of a range (the forward's
// wait), finish_weights the rest; without overlap all complete at once.
TEST_CASE("comm: ZeRO-1's weight all-gather completes bucket by bucket", "[comm]") {
  auto w = world_comm();
  const int r = w->rank(), n = w->size();
  const int64_t capacity = 40 * n, total = capacity - 1;
  for (bool overlap : {true, false}) {
    const DpShards shards(capacity, 6, n, r);
    std::vector<float> reduced(static_cast<size_t>(shards.shard_size()));
    GradReducer red(w.get(), Ctx{}, total, shards,
                    Tensor(reduced.data(), DType::f32, Device::cpu, {shards.shard_size()}));
    red.configure(6, true, DType::f32, overlap);
    std::vector<float> weights(static_cast<size_t>(capacity), -1.0f);
    for (const ShardRun& run : shards.runs(0, capacity))
      for (int64_t k = 0; k < run.count; ++k)
        weights[run.flat + k] = static_cast<float>(run.flat + k);
    red.gather_weights(Tensor(weights.data(), DType::f32, Device::cpu, {capacity}));
    CHECK(red.weight_buckets() == (n > 1 ? shards.buckets() : 0));  // one rank: whole already
    auto done = [&](int64_t a, int64_t c) {
      for (int64_t i = a; i < c; ++i)
        if (weights[i] != static_cast<float>(i)) return false;
      return true;
    };
    const int64_t a = 2 * shards.bucket_elems() + 1, c = 4 * shards.bucket_elems() - 1;
    red.wait_weights(a, c);
    CHECK(done(shards.bucket(2).first, shards.bucket(3).second));
    if (n > 1) CHECK(red.buckets_waited_in_forward() == (overlap ? 2 : 0));
    red.wait_weights(a, c);  // again: nothing left to wait for there
    if (n > 1) CHECK(red.buckets_waited_in_forward() == (overlap ? 2 : 0));
    red.finish_weights();
    CHECK(done(0, capacity));
  }
  w->barrier();
}

TEST_CASE("comm: grouped send/recv around a ring", "[comm]") {
  auto w = world_comm();
  const int r = w->rank(), n = w->size();
  if (n == 1) return;  // no peer: exchange within one rank is a programming error
  std::vector<float> to_right = {static_cast<float>(r)}, from_left = {-1.0f};
  const P2P ops[] = {{P2P::send, host(to_right), (r + 1) % n},
                     {P2P::recv, host(from_left), (r + n - 1) % n}};
  w->exchange(ops);
  CHECK(from_left[0] == (r + n - 1) % n);
  // Blocking send/recv, even ranks first.
  std::vector<float> msg = {100.0f + r};
  const int peer = r ^ 1;
  if (peer < n) {
    if (r % 2 == 0) {
      w->send(host(msg), peer);
      w->recv(host(msg), peer);
    } else {
      std::vector<float> got = {0};
      w->recv(host(got), peer);
      w->send(host(msg), peer);
      msg = got;
    }
    CHECK(msg[0] == 100.0f + peer);
  }
}

TEST_CASE("comm: tp, cp, dp and pp groups follow the rank layout", "[comm]") {
  auto w = world_comm();
  const int n = w->size();
  // 2: tp 2; 4: tp 2 x cp 2; 8: tp 2 x cp 2 x dp 2; 16: and pp 2.
  const int tp = n % 2 == 0 ? 2 : 1, cp = n % 4 == 0 ? 2 : 1, pp = n % 16 == 0 ? 2 : 1;
  absl::StatusOr<Topology> t = Topology::make(n, w->rank(), tp, pp, 0, cp);
  REQUIRE(t.ok());
  ProcessGroups g = make_groups(*t, std::move(w));
  // As GPU ranks with parallel.comm=mpi build them: host tensors pass straight through.
  use_device_comms(g, /*nccl=*/false, nullptr, 0);
  CHECK(g.tp->size() == t->tp);
  CHECK(g.cp->size() == t->cp);
  CHECK(g.dp_cp->size() == t->dp * t->cp);
  CHECK(g.pp->size() == t->pp);
  CHECK(g.tp->rank() == t->tp_rank);
  CHECK(g.cp->rank() == t->cp_rank);
  CHECK(g.dp_cp->rank() == t->cp_rank + t->cp * t->dp_rank);
  CHECK(g.pp->rank() == t->pp_rank);
  // Sum of the world ranks in each group, in closed form from rank_at().
  auto group_sum = [&](Comm& c) {
    std::vector<float> v = {static_cast<float>(t->rank)};
    c.all_reduce(host(v), ReduceOp::sum);
    return v[0];
  };
  float want_tp = 0, want_cp = 0, want_dp_cp = 0, want_pp = 0;
  for (int i = 0; i < t->tp; ++i) want_tp += t->rank_at(i, t->dp_rank, t->pp_rank, t->cp_rank);
  for (int i = 0; i < t->cp; ++i) want_cp += t->rank_at(t->tp_rank, t->dp_rank, t->pp_rank, i);
  for (int i = 0; i < t->dp; ++i)
    for (int j = 0; j < t->cp; ++j) want_dp_cp += t->rank_at(t->tp_rank, i, t->pp_rank, j);
  for (int i = 0; i < t->pp; ++i) want_pp += t->rank_at(t->tp_rank, t->dp_rank, i, t->cp_rank);
  CHECK(group_sum(*g.tp) == want_tp);
  CHECK(group_sum(*g.cp) == want_cp);
  CHECK(group_sum(*g.dp_cp) == want_dp_cp);
  CHECK(group_sum(*g.pp) == want_pp);
  // Every other op on every group, with the group rank as the value.
  for (Comm* c : {g.tp.get(), g.cp.get(), g.dp_cp.get(), g.pp.get(), g.embed.get()}) {
    INFO("group " << c->name());
    const int r = c->rank(), n = c->size();
    std::vector<float> mx = {static_cast<float>(r)};
    c->all_reduce(host(mx), ReduceOp::max);
    CHECK(mx[0] == n - 1);
    std::vector<float> mine = {static_cast<float>(r)}, all(n, -1.0f);
    c->all_gather(host(all), host(mine));
    for (int q = 0; q < n; ++q) CHECK(all[q] == q);
    std::vector<float> in(n), out(1);
    for (int q = 0; q < n; ++q) in[q] = static_cast<float>(10 * r + q);
    c->reduce_scatter(host(out), host(in), ReduceOp::sum);
    CHECK(out[0] == 10.0f * n * (n - 1) / 2 + n * r);
    std::vector<float> b = {static_cast<float>(r == 0 ? 7 : -1)};
    c->broadcast(host(b), 0);
    CHECK(b[0] == 7);
    if (n > 1) {
      std::vector<float> to = {static_cast<float>(r)}, from = {-1.0f};
      const P2P ops[] = {{P2P::send, host(to), (r + 1) % n},
                         {P2P::recv, host(from), (r + n - 1) % n}};
      c->exchange(ops);
      CHECK(from[0] == (r + n - 1) % n);
    }
  }
  // The embedding group joins the first and last pipeline stage of each pp group.
  const bool ends = t->first_stage() || t->last_stage();
  CHECK(g.embed->size() == (ends ? std::min(t->pp, 2) : t->pp - 2));
}

// The staging communicator (parallel.comm=mpi on GPUs) with every tensor staged through its host
// buffers, so that the staging itself runs here: in-place all-gather, bf16 reduced in f32,
// several buffers in one exchange.
TEST_CASE("comm: the staging communicator matches the closed forms", "[comm]") {
  auto c = make_staging_comm(world_comm(), /*stage_host_tensors=*/true);
  const int r = c->rank(), n = c->size();
  CHECK(c->name() == "world");
  std::vector<float> v = {1.0f * (r + 1), -2.0f * (r + 1)};
  c->all_reduce(host(v), ReduceOp::sum);
  CHECK(v[0] == n * (n + 1) / 2.0f);
  CHECK(v[1] == -n * (n + 1.0f));
  // bf16: 1 + r/256 rounds each rank's value; the sum is taken in f32 and rounded once.
  std::vector<uint16_t> h = {f32_to_bf16(1.0f + r / 256.0f), f32_to_bf16(r)};
  c->all_reduce(Tensor(h.data(), DType::bf16, Device::cpu, {2}), ReduceOp::sum);
  float want = 0;
  for (int q = 0; q < n; ++q) want += round_to_bf16(1.0f + q / 256.0f);
  CHECK(bf16_to_f32(h[0]) == round_to_bf16(want));
  CHECK(bf16_to_f32(h[1]) == n * (n - 1) / 2.0f);
  std::vector<float> all(3 * n, -1.0f);  // in place: this rank's block is the input
  for (int k = 0; k < 3; ++k) all[3 * r + k] = 10.0f * r + k;
  c->all_gather(host(all), Tensor(all.data() + 3 * r, DType::f32, Device::cpu, {3}));
  for (int q = 0; q < n; ++q)
    for (int k = 0; k < 3; ++k) CHECK(all[3 * q + k] == 10.0f * q + k);
  std::vector<float> in(2 * n), out(2);
  for (int j = 0; j < 2 * n; ++j) in[j] = 1000.0f * r + j;
  c->reduce_scatter(host(out), host(in), ReduceOp::max);
  for (int k = 0; k < 2; ++k) CHECK(out[k] == 1000.0f * (n - 1) + 2 * r + k);
  std::vector<int32_t> b = {r == n - 1 ? 99 : r};
  c->broadcast(Tensor(b.data(), DType::i32, Device::cpu, {1}), n - 1);
  CHECK(b[0] == 99);
  if (n > 1) {
    std::vector<float> right(5, static_cast<float>(r)), left(5, -1.0f), tag = {r + 0.5f},
                                                                        got = {-1.0f};
    const P2P ops[] = {{P2P::send, host(right), (r + 1) % n},
                       {P2P::recv, host(left), (r + n - 1) % n},
                       {P2P::send, host(tag), (r + n - 1) % n},
                       {P2P::recv, host(got), (r + 1) % n}};
    c->exchange(ops);
    for (float x : left) CHECK(x == (r + n - 1) % n);
    CHECK(got[0] == (r + 1) % n + 0.5f);
  }
  c->barrier();
}

// The pipeline's pattern (trainer/step/pipeline.cpp): each rank starts its sends, receives, then
// waits for the sends. Through the staging communicator the sends must stay in flight while the
// receives are posted: sends that waited for their receiver would deadlock every rank here (1 MiB
// messages, far above MPI's eager limit), as the stages of a 1F1B pipeline on ranks sharing a GPU.
TEST_CASE("comm: the staging communicator leaves sends in flight while receiving", "[comm]") {
  auto c = make_staging_comm(world_comm(), /*stage_host_tensors=*/true);
  const int r = c->rank(), n = c->size();
  if (n < 2) return;
  const int64_t count = 1 << 18;
  for (int round = 0; round < 3; ++round) {
    std::vector<float> right(count), back(count), from_left(count, -1.0f), from_right(count, -1.0f);
    for (int64_t i = 0; i < count; ++i) {
      right[i] = static_cast<float>(1000 * r + round) + static_cast<float>(i % 7);
      back[i] = -right[i];
    }
    const P2P sends[] = {{P2P::send, host(right), (r + 1) % n},
                         {P2P::send, host(back), (r + n - 1) % n}};
    const Comm::Ticket in_flight = c->exchange_start(sends);
    // The buffers are the caller's again once the sends are staged: overwriting them must not
    // change what arrives.
    std::fill(right.begin(), right.end(), 0.0f);
    const P2P recvs[] = {{P2P::recv, host(from_left), (r + n - 1) % n},
                         {P2P::recv, host(from_right), (r + 1) % n}};
    c->exchange(recvs);
    c->wait(in_flight);
    const int left = (r + n - 1) % n, right_peer = (r + 1) % n;
    CHECK(from_left[5] == static_cast<float>(1000 * left + round) + 5.0f);
    CHECK(from_left[count - 1] ==
          static_cast<float>(1000 * left + round) + static_cast<float>((count - 1) % 7));
    CHECK(from_right[3] == -(static_cast<float>(1000 * right_peer + round) + 3.0f));
  }
  c->wait_all();
}

// A failed MPI call on one rank must end every rank (MPI_Abort), naming the rank and the call,
// while the others wait in a barrier. Hidden: run by ctest, which checks the output.
TEST_CASE("comm: a failed MPI call aborts every rank", "[.abort]") {
  auto w = world_comm();
  REQUIRE(w->size() >= 2);
  std::vector<float> v = {1.0f};
  if (w->rank() == 1) w->send(host(v), w->size());  // no such peer: MPI_ERR_RANK
  w->barrier();                                     // the other ranks wait here until aborted
  FAIL("the job was not aborted");
}

}  // namespace
}  // namespace tr

int main(int argc, char** argv) {
  std::unique_ptr<tr::MpiRuntime> mpi;
  if (tr::launched_by_mpi_launcher()) mpi = std::make_unique<tr::MpiRuntime>(&argc, &argv);
  return Catch::Session().run(argc, argv);
}
