// Tests of the CPU reference op set: closed-form forwards (integer inputs where exact), fp64
// central finite differences for every backward, the gradient rule (parameter grads
// ACCUMULATE, activation grads are ASSIGNED) and op-specific properties.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "kernels/cpu/chunk_attention.h"
#include "kernels/gemm_bucket.h"
#include "kernels/ops.h"
#include "kernels/ragged.h"
#include "kernels/versions.h"
#include "parallel/context_parallel.h"
#include "tests/host_tensor.h"
#include "tests/test_util.h"

namespace tr {
namespace {

constexpr double kFdTol = 1e-6;   // fp64 finite differences vs analytic gradients
constexpr double kF32Tol = 1e-5;  // f32 vs f64 of the same op
constexpr double kF64Tol = 1e-12;

Ctx ctx;  // CPU

using test::HostTensor;

std::vector<double> random_values(int64_t n, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

void randomize(HostTensor& x, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  x.assign(random_values(x.size(), rng, lo, hi));
}

// ‖a − b‖ / ‖b‖.
using test::rel_err;

// sum(out * w): a scalar loss whose gradient with respect to out is w.
double weighted_sum(const HostTensor& out, const std::vector<double>& w) {
  double s = 0.0;
  for (int64_t i = 0; i < out.size(); ++i) s += out.get(i) * w[i];
  return s;
}

// Central finite differences of loss() with respect to every element of the f64 tensor x;
// loss() reruns the forward on x's current values.
std::vector<double> numeric_grad(HostTensor& x, const std::function<double()>& loss,
                                 double h = 1e-5) {
  std::vector<double> g(x.size());
  for (int64_t i = 0; i < x.size(); ++i) {
    const double x0 = x.get(i);
    x.set(i, x0 + h);
    const double up = loss();
    x.set(i, x0 - h);
    const double down = loss();
    x.set(i, x0);
    g[i] = (up - down) / (2.0 * h);
  }
  return g;
}

// Runs bwd twice. Parameter grads (zeroed first) must double: they ACCUMULATE. Activation
// grads, refilled with garbage before each call, must come out the same: they are ASSIGNED.
// With `bwd_assign` (the same op with GradWrite::assign): it overwrites what the parameter
// gradients held (NaN here) with the values that adding to zeros gives, bit for bit.
void check_grad_rule(const std::function<void()>& bwd, std::vector<HostTensor*> params,
                     std::vector<HostTensor*> acts, const std::function<void()>& bwd_assign = {}) {
  for (HostTensor* p : params) p->fill(0.0);
  for (HostTensor* a : acts) a->fill(123.0);
  bwd();
  std::vector<std::vector<double>> p1, a1;
  for (HostTensor* p : params) p1.push_back(p->values());
  for (HostTensor* a : acts) a1.push_back(a->values());
  for (HostTensor* a : acts) a->fill(-7.0);
  bwd();
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<double> twice = p1[i];
    for (double& x : twice) x *= 2.0;
    CHECK(rel_err(params[i]->values(), twice) < kF64Tol);
  }
  for (size_t i = 0; i < acts.size(); ++i) CHECK(rel_err(acts[i]->values(), a1[i]) < kF64Tol);
  if (!bwd_assign) return;
  for (HostTensor* p : params) p->fill(std::numeric_limits<double>::quiet_NaN());
  bwd_assign();
  for (size_t i = 0; i < params.size(); ++i) CHECK(params[i]->values() == p1[i]);
}

const DType kFloatTypes[] = {DType::f32, DType::f64};

// ---------------------------------------------------------------- embedding

TEST_CASE("kernels: embedding_fwd picks this rank's rows and zeroes the others", "[kernels]") {
  for (DType dt : kFloatTypes) {
    HostTensor table(dt, {4, 3}), out(dt, {6, 3}), tokens(DType::i32, {6});
    for (int64_t i = 0; i < 12; ++i) table.set(i, 10 * (i / 3) + i % 3);
    tokens.assign({2, 5, 3, 1, 6, 5});  // vocab_offset 2: rows 0, 3, 1, none, none, 3
    out.fill(99.0);
    embedding_fwd(ctx, out.t, tokens.t, table.t, 2);
    CHECK(out.values() ==
          std::vector<double>{0, 1, 2, 30, 31, 32, 10, 11, 12, 0, 0, 0, 0, 0, 0, 30, 31, 32});
  }
}

TEST_CASE("kernels: embedding_bwd matches finite differences and accumulates", "[kernels]") {
  std::mt19937 rng(1);
  HostTensor table(DType::f64, {5, 4}), dtable(DType::f64, {5, 4}), out(DType::f64, {7, 4});
  HostTensor tokens(DType::i32, {7});
  tokens.assign({3, 4, 3, 9, 1, 7, 5});  // offset 3: token 3 twice, 1 and 9 off this rank
  randomize(table, rng);
  const std::vector<double> w = random_values(out.size(), rng);
  HostTensor dout(DType::f64, {7, 4});
  dout.assign(w);
  auto loss = [&] {
    embedding_fwd(ctx, out.t, tokens.t, table.t, 3);
    return weighted_sum(out, w);
  };
  auto bwd = [&] { embedding_bwd(ctx, dtable.t, dout.t, tokens.t, 3); };
  bwd();
  CHECK(rel_err(dtable.values(), numeric_grad(table, loss)) < kFdTol);
  check_grad_rule(bwd, {&dtable}, {});
}

// ---------------------------------------------------------------- rmsnorm

TEST_CASE("kernels: rmsnorm_fwd on rows with known rms", "[kernels]") {
  for (DType dt : kFloatTypes) {
    HostTensor in(dt, {2, 4}), w(dt, {4}), out(dt, {2, 4}), rstd(dt, {2});
    in.assign({2, 2, 2, 2, 3, -3, 3, -3});
    w.assign({1, 2, 3, 4});
    rmsnorm_fwd(ctx, out.t, rstd.t, in.t, w.t, 0.0f);
    CHECK(rstd.get(0) == 0.5);
    CHECK(rstd.get(1) == Approx(1.0 / 3.0).epsilon(1e-7));
    const std::vector<double> want = {1, 2, 3, 4, 1, -2, 3, -4};
    for (int64_t i = 0; i < 8; ++i) CHECK(out.get(i) == Approx(want[i]).epsilon(1e-7));
    in.assign({1, 1, 1, 1, 2, 0, 0, 0});  // mean(in^2) = 1, so rstd = 1/sqrt(1 + eps)
    rmsnorm_fwd(ctx, out.t, rstd.t, in.t, w.t, 3.0f);
    CHECK(rstd.values() == std::vector<double>{0.5, 0.5});
  }
}

TEST_CASE("kernels: rmsnorm_bwd matches finite differences and dweight accumulates or is assigned",
          "[kernels]") {
  std::mt19937 rng(2);
  const float eps = 1e-5f;
  HostTensor in(DType::f64, {4, 6}), w(DType::f64, {6}), out(DType::f64, {4, 6}),
      rstd(DType::f64, {4}), din(DType::f64, {4, 6}), dw(DType::f64, {6}), dout(DType::f64, {4, 6});
  randomize(in, rng);
  randomize(w, rng, 0.5, 1.5);
  dout.assign(random_values(dout.size(), rng));
  const std::vector<double> g = dout.values();
  auto loss = [&] {
    rmsnorm_fwd(ctx, out.t, rstd.t, in.t, w.t, eps);
    return weighted_sum(out, g);
  };
  loss();
  auto bwd = [&] { rmsnorm_bwd(ctx, din.t, dw.t, dout.t, in.t, w.t, rstd.t); };
  check_grad_rule(bwd, {&dw}, {&din}, [&] {
    rmsnorm_bwd(ctx, din.t, dw.t, dout.t, in.t, w.t, rstd.t, false, GradWrite::assign);
  });
  const std::vector<double> din_a = din.values();
  dw.fill(0.0);
  bwd();
  CHECK(rel_err(din_a, numeric_grad(in, loss)) < kFdTol);
  CHECK(rel_err(dw.values(), numeric_grad(w, loss)) < kFdTol);
}

// ---------------------------------------------------------------- linear

TEST_CASE("kernels: linear_fwd with and without bias on integers", "[kernels]") {
  for (DType dt : kFloatTypes) {
    HostTensor in(dt, {2, 3}), w(dt, {2, 3}), b(dt, {2}), out(dt, {2, 2});
    in.assign({1, 2, 3, 4, 5, 6});
    w.assign({1, 0, -1, 2, 1, 0});
    b.assign({10, 20});
    linear_fwd(ctx, out.t, in.t, w.t, b.t);
    CHECK(out.values() == std::vector<double>{8, 24, 8, 33});
    linear_fwd(ctx, out.t, in.t, w.t, Tensor());
    CHECK(out.values() == std::vector<double>{-2, 4, -2, 13});
  }
}

TEST_CASE(
    "kernels: linear_bwd matches finite differences and dweight and dbias accumulate or are "
    "assigned",
    "[kernels]") {
  std::mt19937 rng(3);
  HostTensor in(DType::f64, {5, 4}), w(DType::f64, {3, 4}), b(DType::f64, {3}),
      out(DType::f64, {5, 3}), dout(DType::f64, {5, 3});
  HostTensor din(DType::f64, {5, 4}), dw(DType::f64, {3, 4}), db(DType::f64, {3});
  randomize(in, rng);
  randomize(w, rng);
  randomize(b, rng);
  randomize(dout, rng);
  const std::vector<double> g = dout.values();
  auto loss = [&] {
    linear_fwd(ctx, out.t, in.t, w.t, b.t);
    return weighted_sum(out, g);
  };
  auto bwd = [&] { linear_bwd(ctx, din.t, dw.t, db.t, dout.t, in.t, w.t); };
  check_grad_rule(bwd, {&dw, &db}, {&din}, [&] {
    linear_bwd(ctx, din.t, dw.t, db.t, dout.t, in.t, w.t, GradWrite::assign);
  });
  dw.fill(0.0);
  db.fill(0.0);
  bwd();
  CHECK(rel_err(din.values(), numeric_grad(in, loss)) < kFdTol);
  CHECK(rel_err(dw.values(), numeric_grad(w, loss)) < kFdTol);
  CHECK(rel_err(db.values(), numeric_grad(b, loss)) < kFdTol);

  HostTensor dw2(DType::f64, {3, 4});  // empty din and dbias are skipped
  linear_bwd(ctx, Tensor(), dw2.t, Tensor(), dout.t, in.t, w.t);
  CHECK(rel_err(dw2.values(), dw.values()) < kF64Tol);
}

TEST_CASE("kernels: linear f32 agrees with f64", "[kernels]") {
  std::mt19937 rng(4);
  const int64_t T = 64, K = 48, O = 32;
  const std::vector<double> x = random_values(T * K, rng), wv = random_values(O * K, rng),
                            bv = random_values(O, rng), g = random_values(T * O, rng);
  std::vector<std::vector<double>> results[2];
  for (int i = 0; i < 2; ++i) {
    const DType dt = kFloatTypes[i];
    HostTensor in(dt, {T, K}), w(dt, {O, K}), b(dt, {O}), out(dt, {T, O}), dout(dt, {T, O});
    HostTensor din(dt, {T, K}), dw(dt, {O, K}), db(dt, {O});
    in.assign(x);
    w.assign(wv);
    b.assign(bv);
    dout.assign(g);
    linear_fwd(ctx, out.t, in.t, w.t, b.t);
    linear_bwd(ctx, din.t, dw.t, db.t, dout.t, in.t, w.t);
    results[i] = {out.values(), din.values(), dw.values(), db.values()};
  }
  for (size_t k = 0; k < results[0].size(); ++k)
    CHECK(rel_err(results[0][k], results[1][k]) < kF32Tol);
}

// ---------------------------------------------------------------- rope

TEST_CASE("kernels: rope_fwd rotates only the first n_rope_heads heads by the HF angles",
          "[kernels]") {
  const int seq = 3, heads = 3, rope_heads = 2, hd = 4;
  const float theta = 100.0f;  // inv_freq = {1, 0.1}
  for (DType dt : kFloatTypes) {
    HostTensor x(dt, {2 * seq, heads, hd});
    for (int64_t i = 0; i < x.size(); ++i) x.set(i, static_cast<double>(i % 7) - 3.0);
    const std::vector<double> x0 = x.values();
    rope_fwd(ctx, x.t, rope_heads, seq, Rope::plain(theta));
    for (int64_t t = 0; t < 2 * seq; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < hd / 2; ++i) {
          const int64_t a = (t * heads + h) * hd + i, b = a + hd / 2;
          const double ang = h < rope_heads ? static_cast<double>(t % seq) * (i ? 0.1 : 1.0) : 0;
          CHECK(x.get(a) == Approx(x0[a] * std::cos(ang) - x0[b] * std::sin(ang)).margin(1e-6));
          CHECK(x.get(b) == Approx(x0[b] * std::cos(ang) + x0[a] * std::sin(ang)).margin(1e-6));
          if (h >= rope_heads || t % seq == 0) CHECK((x.get(a) == x0[a] && x.get(b) == x0[b]));
        }
      }
    }
  }
}

// rope_bwd is the transpose of rope_fwd: with a scale s (YaRN's attention factor) their product
// is s^2 times the identity, and rope_bwd is the finite-difference gradient, plain and YaRN.
TEST_CASE("kernels: rope_bwd inverts rope_fwd and matches finite differences", "[kernels]") {
  std::mt19937 rng(5);
  const int seq = 4, rope_heads = 3;
  const double theta = 10000.0;
  for (const Rope& rope : {Rope::plain(theta), Rope::yarn_of(theta, 4.0, 3.0)}) {
    INFO("yarn " << rope.yarn);
    HostTensor x(DType::f64, {2 * seq, 4, 8}), y(DType::f64, {2 * seq, 4, 8}),
        dx(DType::f64, {2 * seq, 4, 8});
    randomize(x, rng);
    y.assign(x.values());
    rope_fwd(ctx, y.t, rope_heads, seq, rope);
    rope_bwd(ctx, y.t, rope_heads, seq, rope);
    std::vector<double> want = x.values();
    const double s2 = rope.attention_factor * rope.attention_factor;
    for (int64_t i = 0; i < x.size(); ++i)
      if (i / 8 % 4 < rope_heads) want[i] *= s2;  // heads past rope_heads are untouched
    CHECK(rel_err(y.values(), want) < kF64Tol);

    const std::vector<double> g = random_values(x.size(), rng);
    auto loss = [&] {
      y.assign(x.values());
      rope_fwd(ctx, y.t, rope_heads, seq, rope);
      return weighted_sum(y, g);
    };
    dx.assign(g);
    rope_bwd(ctx, dx.t, rope_heads, seq, rope);
    CHECK(rel_err(dx.values(), numeric_grad(x, loss)) < kFdTol);
  }
}

// With positions (a context-parallel rank's tokens of each sequence), a token turns by its
// position's angle: rotating a rank's rows equals rotating whole sequences and taking its rows,
// plain and YaRN, forward and backward, for two sequences of 8 tokens.
TEST_CASE("kernels: rope with positions rotates by each token's position", "[kernels]") {
  std::mt19937 rng(6);
  const int64_t S = 8, B = 2, heads = 3, hd = 8;
  const int rope_heads = 2;
  for (const Rope& rope : {Rope::plain(10000), Rope::yarn_of(10000, 4.0, 2)}) {
    for (bool bwd : {false, true}) {
      HostTensor whole(DType::f64, {B * S, heads, hd});
      randomize(whole, rng);
      const std::vector<double> x = whole.values();
      (bwd ? rope_bwd : rope_fwd)(ctx, whole.t, rope_heads, S, rope, Tensor());
      for (int r = 0; r < 2; ++r) {
        const std::vector<int64_t> p = cp_positions(S, 2, r);
        std::vector<int32_t> pos(p.begin(), p.end());
        const int64_t L = static_cast<int64_t>(pos.size());
        HostTensor mine(DType::f64, {B * L, heads, hd});
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < L; ++i)
            for (int64_t e = 0; e < heads * hd; ++e)
              mine.set((b * L + i) * heads * hd + e, x[(b * S + p[i]) * heads * hd + e]);
        (bwd ? rope_bwd : rope_fwd)(ctx, mine.t, rope_heads, S, rope,
                                    Tensor(pos.data(), DType::i32, Device::cpu, {L}));
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < L; ++i)
            for (int64_t e = 0; e < heads * hd; ++e)
              CHECK(mine.get((b * L + i) * heads * hd + e) ==
                    Approx(whole.get((b * S + p[i]) * heads * hd + e)).epsilon(1e-14));
      }
    }
  }
}

// YaRN's frequencies in closed form (the values transformers 5 computes for this case): hd 8,
// theta 10000, trained on 16 positions, factor 4. The correction range is pairs [0, 1] (beta_fast
// 32 gives -1.1, floored and clamped to 0; beta_slow 1 gives 0.41, ceiled to 1), so pair 0 keeps
// its frequency and pairs 1-3 turn 4 times slower; cos and sin scale by 0.1 ln 4 + 1.
TEST_CASE("kernels: YaRN's frequencies and attention factor", "[kernels]") {
  const Rope y = Rope::yarn_of(10000, 4.0, 16);
  const std::vector<double> f = y.inv_freq(8);
  REQUIRE(f.size() == 4);
  CHECK(f[0] == Approx(1.0));
  CHECK(f[1] == Approx(0.1 / 4));
  CHECK(f[2] == Approx(0.01 / 4));
  CHECK(f[3] == Approx(0.001 / 4));
  CHECK(y.attention_factor == Approx(0.1 * std::log(4.0) + 1));
  // Plain RoPE, and YaRN with factor 1, give theta^(-2i/hd); a given attention_factor stands.
  for (const Rope& r : {Rope::plain(10000), Rope::yarn_of(10000, 1.0, 16)}) {
    const std::vector<double> p = r.inv_freq(8);
    for (int i = 0; i < 4; ++i) CHECK(p[i] == Approx(std::pow(10000.0, -2.0 * i / 8)));
    CHECK(r.attention_factor == 1.0);
  }
  CHECK(Rope::yarn_of(10000, 4.0, 16, 32, 1, 1.5).attention_factor == 1.5);
  // A wider ramp (trained on 4096 positions, hd 128): frequencies fall monotonically, fast pairs
  // untouched, the slowest divided by the factor.
  const Rope wide = Rope::yarn_of(1e6, 4.0, 4096);
  const std::vector<double> w = wide.inv_freq(128), plain = Rope::plain(1e6).inv_freq(128);
  CHECK(w[0] == plain[0]);
  CHECK(w[63] == Approx(plain[63] / 4));
  for (int i = 1; i < 64; ++i) CHECK(w[i] < w[i - 1]);
}

// Llama 3's frequencies in closed form (transformers' _compute_llama3_parameters): hd 8, theta
// 10000, trained on 64 positions, factor 8, low_freq_factor 1, high_freq_factor 4. Pair i turns
// 64 f_i / 2 pi times over the trained context: pair 0 (10.2 turns, >= 4) keeps its frequency,
// pairs 2 and 3 (under 1 turn) are 8 times slower, pair 1 (1.02 turns) blends the two with weight
// (1.02 - 1) / (4 - 1) on the original; cos and sin are not scaled.
TEST_CASE("kernels: Llama 3's RoPE frequencies", "[kernels]") {
  const Rope l = Rope::llama3_of(10000, 8.0, 1.0, 4.0, 64);
  const std::vector<double> f = l.inv_freq(8);
  REQUIRE(f.size() == 4);
  CHECK(f[0] == 1.0);
  const double s = (64 * 0.1 / (2 * std::numbers::pi) - 1) / 3;
  CHECK(f[1] == Approx((1 - s) * 0.1 / 8 + s * 0.1).epsilon(1e-14));
  CHECK(f[2] == Approx(0.01 / 8).epsilon(1e-14));
  CHECK(f[3] == Approx(0.001 / 8).epsilon(1e-14));
  CHECK(l.attention_factor == 1.0);
  // Llama 3.1's own numbers (theta 500000, factor 8, 1, 4, 8192; hd 128): the fastest pair
  // untouched, the slowest 8 times slower, monotonic between.
  const std::vector<double> w = Rope::llama3_of(500000, 8, 1, 4, 8192).inv_freq(128),
                            plain = Rope::plain(500000).inv_freq(128);
  CHECK(w[0] == plain[0]);
  CHECK(w[63] == Approx(plain[63] / 8).epsilon(1e-14));
  for (int i = 1; i < 64; ++i) CHECK(w[i] < w[i - 1]);
}

// ---------------------------------------------------------------- attention

// qkv, out, lse, dqkv and dout of one attention problem, zero-filled.
struct Attn {
  int batch, seq, nh, nkv, hd;
  HostTensor qkv, out, lse, dqkv, dout;
  Attn(DType dt, int b, int s, int nh_, int nkv_, int hd_)
      : batch(b),
        seq(s),
        nh(nh_),
        nkv(nkv_),
        hd(hd_),
        qkv(dt, {b * s, (nh_ + 2 * nkv_) * hd_}),
        out(dt, {b * s, nh_ * hd_}),
        lse(dt, {b, nh_, s}),
        dqkv(dt, {b * s, (nh_ + 2 * nkv_) * hd_}),
        dout(dt, {b * s, nh_ * hd_}) {}
  int64_t width() const { return (nh + 2 * nkv) * hd; }
  // Element e of q head h / k head g / v head g of token row r.
  int64_t q(int64_t r, int64_t h, int64_t e) const { return r * width() + h * hd + e; }
  int64_t k(int64_t r, int64_t g, int64_t e) const { return q(r, nh + g, e); }
  int64_t v(int64_t r, int64_t g, int64_t e) const { return q(r, nh + nkv + g, e); }
  void fwd(DocStarts docs = {}) {
    attention_fwd(ctx, out.t, lse.t, qkv.t, batch, seq, nh, nkv, hd, docs);
  }
  void bwd(DocStarts docs = {}) {
    attention_bwd(ctx, dqkv.t, dout.t, out.t, lse.t, qkv.t, batch, seq, nh, nkv, hd, docs);
  }
};

TEST_CASE("kernels: attention_fwd on two tokens by hand", "[kernels]") {
  for (DType dt : kFloatTypes) {
    Attn a(dt, 1, 2, 1, 1, 4);                           // scale 1/2
    a.qkv.assign({1, 1, 1, 1, 2, 0, 0, 0, 1, 2, 3, 4,    // token 0: q, k, v
                  1, 1, 0, 0, 0, 0, 0, 0, 5, 6, 7, 8});  // token 1: scores {1, 0}
    a.fwd();
    const double e = std::exp(1.0);
    const std::vector<double> want = {1,
                                      2,
                                      3,
                                      4,
                                      (e + 5) / (e + 1),
                                      (2 * e + 6) / (e + 1),
                                      (3 * e + 7) / (e + 1),
                                      (4 * e + 8) / (e + 1)};
    for (int64_t i = 0; i < 8; ++i) CHECK(a.out.get(i) == Approx(want[i]).epsilon(1e-6));
    CHECK(a.lse.get(0) == Approx(1.0).epsilon(1e-7));
    CHECK(a.lse.get(1) == Approx(std::log(e + 1)).epsilon(1e-7));
  }
}

TEST_CASE("kernels: GQA attention with zero keys averages the right KV head's values",
          "[kernels]") {
  struct Shape {
    int batch, seq, hd;
  };
  std::mt19937 rng(6);
  for (Shape s : {Shape{2, 6, 8}, Shape{1, 256, 64}}) {
    for (DType dt : kFloatTypes) {
      Attn a(dt, s.batch, s.seq, 4, 2, s.hd);  // query heads {0,1} read KV 0, {2,3} read KV 1
      randomize(a.qkv, rng);
      for (int64_t r = 0; r < s.batch * s.seq; ++r)
        for (int64_t g = 0; g < 2; ++g)
          for (int64_t e = 0; e < s.hd; ++e) a.qkv.set(a.k(r, g, e), 0.0);
      a.fwd();
      std::vector<double> want, got;
      for (int64_t b = 0; b < s.batch; ++b) {
        for (int64_t h = 0; h < 4; ++h) {
          for (int64_t e = 0; e < s.hd; ++e) {
            double sum = 0.0;
            for (int64_t i = 0; i < s.seq; ++i) {
              sum += a.qkv.get(a.v(b * s.seq + i, h / 2, e));
              want.push_back(sum / static_cast<double>(i + 1));
              got.push_back(a.out.get((b * s.seq + i) * 4 * s.hd + h * s.hd + e));
            }
          }
          for (int64_t i = 0; i < s.seq; ++i)
            CHECK(a.lse.get((b * 4 + h) * s.seq + i) == Approx(std::log(i + 1.0)).margin(1e-6));
        }
      }
      CHECK(rel_err(got, want) < (dt == DType::f32 ? kF32Tol : kF64Tol));
    }
  }
}

TEST_CASE("kernels: attention is causal and batch elements are independent", "[kernels]") {
  std::mt19937 rng(7);
  Attn a(DType::f64, 2, 6, 4, 2, 8);
  randomize(a.qkv, rng);
  a.fwd();
  const std::vector<double> out0 = a.out.values();
  const int64_t changed = 3;  // token 3 of batch element 0: its q, k and v
  for (int64_t c = 0; c < a.width(); ++c) a.qkv.set(changed * a.width() + c, 5.0);
  a.fwd();
  const std::vector<double> out1 = a.out.values();
  const int64_t row = 4 * 8;
  for (int64_t r = 0; r < 12; ++r) {
    const bool same =
        std::equal(out0.begin() + r * row, out0.begin() + (r + 1) * row, out1.begin() + r * row);
    CHECK(same == (r < changed || r >= 6));
  }
}

TEST_CASE("kernels: GQA attention_bwd matches finite differences and assigns dqkv", "[kernels]") {
  std::mt19937 rng(8);
  Attn a(DType::f64, 2, 5, 4, 2, 4);
  randomize(a.qkv, rng, -1.5, 1.5);
  randomize(a.dout, rng);
  const std::vector<double> g = a.dout.values();
  auto loss = [&] {
    a.fwd();
    return weighted_sum(a.out, g);
  };
  loss();
  check_grad_rule([&] { a.bwd(); }, {}, {&a.dqkv});
  CHECK(rel_err(a.dqkv.values(), numeric_grad(a.qkv, loss)) < kFdTol);
}

// Block-causal attention (documents packed in a sequence): each document's rows of out, lse and
// dqkv equal those of its own causal attention run as a sequence of its own, and the backward
// matches finite differences.
TEST_CASE("kernels: block-causal attention is each document's own attention", "[kernels]") {
  // Two sequences of 12: documents [0, 4), [4, 9), [9, 12); and one document of 12.
  const std::vector<std::pair<int, int>> docs0 = {{0, 4}, {4, 9}, {9, 12}};
  std::vector<int32_t> starts;
  for (const auto& [lo, hi] : docs0)
    for (int i = lo; i < hi; ++i) starts.push_back(lo);
  for (int i = 0; i < 12; ++i) starts.push_back(0);
  const DocCount found = count_documents(starts.data(), 24, 12);
  CHECK(found.count == 4);
  CHECK(found.longest == 12);
  const DocStarts doc_start = host_doc_starts(Tensor(starts.data(), DType::i32, Device::cpu, {24}));
  CHECK(doc_start.documents(12).count == 4);
  CHECK(doc_start.slice(12, 12).documents(12).count == 1);
  // Sequences of one document each: a sequence's first row begins a document.
  const std::vector<int32_t> zeros(24, 0);
  CHECK(count_documents(zeros.data(), 24, 12).count == 2);
  CHECK(count_documents(zeros.data(), 24, 12).longest == 12);
  CHECK(count_documents(zeros.data(), 24, 24).count == 1);
  CHECK(count_documents(starts.data(), 12, 12).longest == 5);
  std::mt19937 rng(11);
  for (DType dt : kFloatTypes) {
    INFO(dtype_name(dt));
    Attn a(dt, 2, 12, 4, 2, 8);
    randomize(a.qkv, rng);
    randomize(a.dout, rng);
    a.fwd(doc_start);
    a.bwd(doc_start);
    // Each document alone, rows [lo, hi) of sequence b.
    auto alone = [&](int b, int lo, int hi) {
      const int n = hi - lo;
      Attn d(dt, 1, n, 4, 2, 8);
      for (int r = 0; r < n; ++r)
        for (int64_t c = 0; c < a.width(); ++c)
          d.qkv.set(r * a.width() + c, a.qkv.get((b * 12 + lo + r) * a.width() + c));
      for (int r = 0; r < n; ++r)
        for (int64_t c = 0; c < 4 * 8; ++c)
          d.dout.set(r * 32 + c, a.dout.get((b * 12 + lo + r) * 32 + c));
      d.fwd();
      d.bwd();
      std::vector<double> want, got;
      for (int r = 0; r < n; ++r) {
        for (int64_t c = 0; c < 32; ++c) {
          want.push_back(d.out.get(r * 32 + c));
          got.push_back(a.out.get((b * 12 + lo + r) * 32 + c));
        }
        for (int64_t c = 0; c < a.width(); ++c) {
          want.push_back(d.dqkv.get(r * a.width() + c));
          got.push_back(a.dqkv.get((b * 12 + lo + r) * a.width() + c));
        }
        for (int h = 0; h < 4; ++h) {
          want.push_back(d.lse.get(h * n + r));
          got.push_back(a.lse.get((b * 4 + h) * 12 + lo + r));
        }
      }
      CHECK(rel_err(got, want) < (dt == DType::f32 ? kF32Tol : kF64Tol));
    };
    for (const auto& [lo, hi] : docs0) alone(0, lo, hi);
    alone(1, 0, 12);
  }
  // The backward by finite differences, in f64.
  Attn a(DType::f64, 2, 12, 4, 2, 4);
  randomize(a.qkv, rng, -1.5, 1.5);
  randomize(a.dout, rng);
  const std::vector<double> g = a.dout.values();
  auto loss = [&] {
    a.fwd(doc_start);
    return weighted_sum(a.out, g);
  };
  loss();
  a.bwd(doc_start);
  CHECK(rel_err(a.dqkv.values(), numeric_grad(a.qkv, loss)) < kFdTol);
}

// Block-causal attention's ragged batches (kernels/ragged.h): the documents go in parts of a
// power-of-two count, largest first, each at a 16-byte aligned slot; no entry is empty; the
// entries cover every row in order. The host table is the CUDA kernel's oracle.
TEST_CASE("kernels: ragged parts cover the documents without an empty entry", "[kernels]") {
  // 13 documents in one sequence: parts of 8, 4 and 1 at slots 0, 12 and 20.
  std::vector<int32_t> thirteen;  // documents of 1, 2 and 3 rows in turn
  for (int d = 0; d < 13; ++d) {
    const auto first = static_cast<int32_t>(thirteen.size());
    thirteen.insert(thirteen.end(), static_cast<size_t>(1 + d % 3), first);
  }
  const int64_t n13 = static_cast<int64_t>(thirteen.size());
  const RaggedParts p13 = ragged_parts(thirteen.data(), n13, n13);
  REQUIRE(p13.documents == 13);
  REQUIRE(p13.n == 3);
  CHECK(p13.part[0].count == 8);
  CHECK(p13.part[1].count == 4);
  CHECK(p13.part[2].count == 1);
  CHECK(p13.part[0].slot == 0);
  CHECK(p13.part[1].slot == 12);
  CHECK(p13.part[2].slot == 20);
  CHECK(p13.slots == 24);
  // Equal starts across a sequence boundary are two documents.
  const std::vector<int32_t> zeros(24, 0);
  CHECK(ragged_parts(zeros.data(), 24, 12).documents == 2);
  CHECK(ragged_parts(zeros.data(), 24, 24).documents == 1);

  std::mt19937 rng(5);
  for (int64_t longest : {1, 3, 17, 64, 300}) {
    for (int64_t period : {64, 256}) {
      const int64_t rows = 4 * period;
      std::vector<int32_t> start;
      std::uniform_int_distribution<int64_t> len(1, longest);
      for (int64_t b = 0; b < rows / period; ++b)
        for (int64_t at = 0; at < period;) {
          const int64_t n = std::min(len(rng), period - at);
          start.insert(start.end(), static_cast<size_t>(n), static_cast<int32_t>(at));
          at += n;
        }
      INFO("longest " << longest << ", period " << period);
      const RaggedParts p = ragged_parts(start.data(), rows, period);
      CHECK(p.documents == count_documents(start.data(), rows, period).count);
      CHECK(p.slots <= ragged_slots_bound(rows));
      const RaggedTableRows t = ragged_table(p, start.data(), rows, period);
      int64_t next_doc = 0, next_row = 0;
      for (int i = 0; i < p.n; ++i) {
        const RaggedPart& part = p.part[i];
        INFO("part " << i);
        CHECK((part.count & (part.count - 1)) == 0);  // a power of two
        CHECK((i == 0 || part.count < p.part[i - 1].count));
        CHECK(part.first == next_doc);
        CHECK(part.slot % 4 == 0);
        CHECK((i == 0 || part.slot >= p.part[i - 1].slot + p.part[i - 1].count + 1));
        int64_t longest_here = 0;
        for (int64_t e = 0; e < part.count; ++e) {
          const int64_t slot = part.slot + e;
          CHECK(t.len[slot] >= 1);
          CHECK(t.row[slot] == next_row);
          next_row += t.len[slot];
          longest_here = std::max<int64_t>(longest_here, t.len[slot]);
        }
        CHECK(t.row[part.slot + part.count] == next_row);  // the part's end
        CHECK(part.longest == longest_here);
        next_doc += part.count;
      }
      CHECK(next_doc == p.documents);
      CHECK(next_row == rows);
    }
  }
}

// ---------------------------------------------------------------- swiglu

TEST_CASE("kernels: swiglu_fwd is silu of gate times up", "[kernels]") {
  for (DType dt : kFloatTypes) {
    HostTensor gu(dt, {1, 8}), out(dt, {1, 4});
    gu.assign({0, 1, -1, 2, 5, 2, 3, -1});
    swiglu_fwd(ctx, out.t, gu.t);
    auto silu = [](double g) { return g / (1.0 + std::exp(-g)); };
    const std::vector<double> want = {0, 2 * silu(1), 3 * silu(-1), -silu(2)};
    for (int64_t i = 0; i < 4; ++i) CHECK(out.get(i) == Approx(want[i]).epsilon(1e-6));
  }
}

TEST_CASE("kernels: swiglu_bwd matches finite differences and assigns dgateup", "[kernels]") {
  std::mt19937 rng(9);
  HostTensor gu(DType::f64, {3, 10}), out(DType::f64, {3, 5}), dgu(DType::f64, {3, 10}),
      dout(DType::f64, {3, 5});
  randomize(gu, rng, -3.0, 3.0);
  randomize(dout, rng);
  const std::vector<double> g = dout.values();
  auto loss = [&] {
    swiglu_fwd(ctx, out.t, gu.t);
    return weighted_sum(out, g);
  };
  check_grad_rule([&] { swiglu_bwd(ctx, dgu.t, dout.t, gu.t); }, {}, {&dgu});
  CHECK(rel_err(dgu.values(), numeric_grad(gu, loss)) < kFdTol);
}

// ---------------------------------------------------------------- mixture of experts

// The router's tensors in one dtype (its statistics too: f32 or f64).
struct Router {
  HostTensor logits, probs, experts, weights, prob_sums, routed;
  Router(DType dt, int64_t T, int64_t E, int64_t k)
      : logits(dt, {T, E}),
        probs(dt, {T, E}),
        experts(DType::i32, {T, k}),
        weights(dt, {T, k}),
        prob_sums(dt, {E}),
        routed(dt, {E}) {}
  void fwd(bool normalize) {
    moe_router_fwd(ctx, probs.t, experts.t, weights.t, prob_sums.t, routed.t, logits.t, normalize);
  }
};

// Expert-major row offsets: the rows of experts before each.
std::vector<int64_t> offsets_of(const HostTensor& counts) {
  std::vector<int64_t> off(static_cast<size_t>(counts.size()) + 1, 0);
  for (int64_t e = 0; e < counts.size(); ++e) off[e + 1] = off[e] + std::llround(counts.get(e));
  return off;
}

TEST_CASE("kernels: moe_router_fwd picks the k most probable, the lower expert on ties",
          "[kernels][moe]") {
  const std::vector<double> z = {1, 2, 2, 0, 0, 0, 0, 0, -1, 3, 0, 5};
  for (DType dt : kFloatTypes) {
    Router r(dt, 3, 4, 2);
    r.logits.assign(z);
    r.fwd(true);
    CHECK(r.experts.values() == std::vector<double>{1, 2, 0, 1, 3, 1});
    CHECK(r.routed.values() == std::vector<double>{1, 3, 1, 1});
    std::vector<double> p(12), sums(4, 0.0);
    for (int t = 0; t < 3; ++t) {
      double total = 0;
      for (int e = 0; e < 4; ++e) total += std::exp(z[t * 4 + e]);
      for (int e = 0; e < 4; ++e) {
        p[t * 4 + e] = std::exp(z[t * 4 + e]) / total;
        sums[e] += p[t * 4 + e];
      }
    }
    const double tol = dt == DType::f32 ? 1e-6 : 1e-14;
    CHECK(rel_err(r.probs.values(), p) < tol);
    CHECK(rel_err(r.prob_sums.values(), sums) < tol);
    const double w2 = p[11] / (p[11] + p[9]);
    CHECK(rel_err(r.weights.values(), std::vector<double>{0.5, 0.5, 0.5, 0.5, w2, 1 - w2}) < tol);
    r.fwd(false);  // the chosen probabilities themselves
    CHECK(rel_err(r.weights.values(), std::vector<double>{p[1], p[2], p[4], p[5], p[11], p[9]}) <
          tol);
  }
}

TEST_CASE("kernels: moe_router_bwd matches finite differences of the weights and the aux loss",
          "[kernels][moe]") {
  std::mt19937 rng(21);
  const int64_t T = 5, E = 6, k = 3;
  const double aux_scale = 0.3;
  for (bool normalize : {true, false}) {
    Router r(DType::f64, T, E, k);
    randomize(r.logits, rng, -2.0, 2.0);
    HostTensor dweights(DType::f64, {T, k}), dlogits(DType::f64, {T, E}), aux(DType::f64, {E});
    const std::vector<double> g = random_values(T * k, rng), a = random_values(E, rng, 0.0, 2.0);
    dweights.assign(g);
    aux.assign(a);
    r.fwd(normalize);
    const std::vector<double> chosen = r.experts.values();
    // sum(g * weights) + aux_scale * sum(aux * prob_sums): the aux term is the load-balancing
    // loss with aux as the (constant) token counts.
    auto loss = [&] {
      r.fwd(normalize);
      REQUIRE(r.experts.values() == chosen);  // the steps keep the choice
      return weighted_sum(r.weights, g) + aux_scale * weighted_sum(r.prob_sums, a);
    };
    check_grad_rule(
        [&] {
          moe_router_bwd(ctx, dlogits.t, dweights.t, r.probs.t, r.experts.t, normalize, aux.t,
                         aux_scale);
        },
        {}, {&dlogits});
    const std::vector<double> analytic = dlogits.values();
    CHECK(rel_err(analytic, numeric_grad(r.logits, loss)) < kFdTol);
    // Without aux counts: the weights' gradient alone, as with aux_scale 0.
    HostTensor without(DType::f64, {T, E});
    moe_router_bwd(ctx, without.t, dweights.t, r.probs.t, r.experts.t, normalize, Tensor(), 0.0);
    moe_router_bwd(ctx, dlogits.t, dweights.t, r.probs.t, r.experts.t, normalize, aux.t, 0.0);
    CHECK(without.values() == dlogits.values());
  }
}

TEST_CASE("kernels: moe_dispatch without a capacity places every choice once, expert-major",
          "[kernels][moe]") {
  std::mt19937 rng(22);
  const int64_t T = 37, E = 7, k = 3, R = T * k;
  Router r(DType::f64, T, E, k);
  randomize(r.logits, rng, -2.0, 2.0);
  for (int64_t t = 0; t < T; ++t) r.logits.set(t * E + E - 1, -50.0);  // no token for the last
  r.fwd(true);
  HostTensor counts(DType::i32, {E}), rows(DType::i32, {T, k});
  rows.fill(-7);
  moe_dispatch(ctx, counts.t, rows.t, r.experts.t, r.weights.t, 0);
  CHECK(counts.values() == r.routed.values());
  CHECK(counts.get(E - 1) == 0);
  const std::vector<int64_t> off = offsets_of(counts);
  CHECK(off[E] == R);
  std::vector<int> used(static_cast<size_t>(R), 0);
  std::vector<int64_t> last(static_cast<size_t>(E), -1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = std::llround(rows.get(t * k + j));
      const int64_t e = std::llround(r.experts.get(t * k + j));
      REQUIRE(row >= off[e]);
      REQUIRE(row < off[e + 1]);
      CHECK(row > last[e]);  // token order within the expert
      last[e] = row;
      ++used[row];
    }
  CHECK(std::all_of(used.begin(), used.end(), [](int n) { return n == 1; }));
  // A capacity no expert reaches drops nothing.
  HostTensor counts2(DType::i32, {E}), rows2(DType::i32, {T, k});
  moe_dispatch(ctx, counts2.t, rows2.t, r.experts.t, r.weights.t, T);
  CHECK(counts2.values() == counts.values());
  CHECK(rows2.values() == rows.values());
}

TEST_CASE("kernels: moe_dispatch's capacity keeps the heaviest, the earlier token on ties",
          "[kernels][moe]") {
  // Expert 0: tokens 0 (0.5), 1 (0.3), 2 (0.5), 3 (0.5): keeps 0 and 2 (ties: earlier tokens).
  // Expert 1: tokens 0 (0.5), 2 (0.5), 3 (0.6): keeps 3, the heaviest, and 0. Expert 2: token 1.
  for (DType dt : kFloatTypes) {
    HostTensor experts(DType::i32, {4, 2}, {0, 1, 0, 2, 0, 1, 1, 0}),
        weights(dt, {4, 2}, {0.5, 0.5, 0.3, 0.7, 0.5, 0.5, 0.6, 0.5}), counts(DType::i32, {3}),
        rows(DType::i32, {4, 2});
    moe_dispatch(ctx, counts.t, rows.t, experts.t, weights.t, 2);
    CHECK(counts.values() == std::vector<double>{2, 2, 1});
    CHECK(rows.values() == std::vector<double>{0, 2, -1, 4, 1, -1, 3, -1});
  }
}

TEST_CASE(
    "kernels: moe permute and unpermute round trip and unpermute_bwd matches finite differences",
    "[kernels][moe]") {
  std::mt19937 rng(23);
  const int64_t T = 6, E = 4, k = 2, H = 5, R = T * k;
  Router r(DType::f64, T, E, k);
  randomize(r.logits, rng, -2.0, 2.0);
  r.fwd(true);
  HostTensor counts(DType::i32, {E}), rows(DType::i32, {T, k}), in(DType::f64, {T, H}),
      xs(DType::f64, {R, H}), out(DType::f64, {T, H}), din(DType::f64, {T, H});
  for (int64_t i = 0; i < in.size(); ++i) in.set(i, static_cast<double>((i * 7) % 11) - 5);
  moe_dispatch(ctx, counts.t, rows.t, r.experts.t, r.weights.t, 0);
  moe_permute(ctx, xs.t, in.t, rows.t);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t h = 0; h < H; ++h)
        CHECK(xs.get(std::llround(rows.get(t * k + j)) * H + h) == in.get(t * H + h));
  // Normalised weights sum to 1: the weighted sum of a token's copies is the token.
  moe_unpermute(ctx, out.t, xs.t, r.weights.t, rows.t);
  CHECK(rel_err(out.values(), in.values()) < kF64Tol);
  // The permutation's backward sums the k copies (integers: exact); accumulate adds.
  std::vector<double> twice = in.values(), four = in.values();
  for (double& x : twice) x *= 2;
  for (double& x : four) x *= 4;
  check_grad_rule([&] { moe_permute_bwd(ctx, din.t, xs.t, rows.t, false); }, {}, {&din});
  CHECK(din.values() == twice);
  moe_permute_bwd(ctx, din.t, xs.t, rows.t, true);
  CHECK(din.values() == four);

  // unpermute's backward against finite differences of sum(g * out), dropless.
  HostTensor ys(DType::f64, {R, H}), dys(DType::f64, {R, H}), dout(DType::f64, {T, H}),
      dweights(DType::f64, {T, k});
  randomize(ys, rng);
  randomize(dout, rng);
  const std::vector<double> g = dout.values();
  auto loss = [&] {
    moe_unpermute(ctx, out.t, ys.t, r.weights.t, rows.t);
    return weighted_sum(out, g);
  };
  auto bwd = [&] { moe_unpermute_bwd(ctx, dys.t, dweights.t, dout.t, ys.t, r.weights.t, rows.t); };
  check_grad_rule(bwd, {}, {&dys, &dweights});
  CHECK(rel_err(dys.values(), numeric_grad(ys, loss)) < kFdTol);
  CHECK(rel_err(dweights.values(), numeric_grad(r.weights, loss)) < kFdTol);

  // With a capacity of 2 (at most 8 of the 12 choices kept): a dropped choice adds nothing,
  // has no gradient and leaves the rows past the kept ones untouched.
  moe_dispatch(ctx, counts.t, rows.t, r.experts.t, r.weights.t, 2);
  const int64_t kept = offsets_of(counts)[E];
  REQUIRE(kept < R);
  dys.fill(9.0);
  bwd();
  const std::vector<double> dys_a = dys.values(), dweights_a = dweights.values();
  dys.fill(0.0);
  const std::vector<double> dys_fd = numeric_grad(ys, loss);
  for (int64_t i = 0; i < R * H; ++i) {
    if (i < kept * H) {
      CHECK(dys_a[i] == Approx(dys_fd[i]).margin(kFdTol));
    } else {
      CHECK(dys_a[i] == 9.0);  // untouched
      CHECK(dys_fd[i] == 0.0);
    }
  }
  CHECK(rel_err(dweights_a, numeric_grad(r.weights, loss)) < kFdTol);
  for (int64_t i = 0; i < T * k; ++i)
    if (rows.get(i) < 0) CHECK(dweights_a[i] == 0.0);
}

// moe_row_dots and moe_choice_grads against a direct computation: integer-valued rows make the
// dot products exact in f32 and f64, so each output is the direct f64 value rounded once; a
// dropped choice and a zero weight get 0.
TEST_CASE("kernels: moe_row_dots and moe_choice_grads match a direct computation",
          "[kernels][moe]") {
  std::mt19937 rng(26);
  std::uniform_int_distribution<int> u(-9, 9);
  const int64_t T = 4, k = 3, R = T * k, I = 7;
  for (DType dt : kFloatTypes) {
    INFO(dtype_name(dt));
    HostTensor a(dt, {R, I}), b(dt, {R, I}), dots(dt, {R}), weights(dt, {T, k}),
        rows(DType::i32, {T, k}), dweights(dt, {T, k}), want(dt, {T, k});
    for (int64_t i = 0; i < R * I; ++i) {
      a.set(i, u(rng));
      b.set(i, u(rng));
    }
    dots.fill(7.5);
    moe_row_dots(ctx, dots.t, a.t, b.t);
    for (int64_t r = 0; r < R; ++r) {
      double dot = 0;
      for (int64_t i = 0; i < I; ++i) dot += a.get(r * I + i) * b.get(r * I + i);
      CHECK(dots.get(r) == dot);
    }
    // Each choice's row in reverse order; choice 4 dropped, choice 7 of zero weight.
    for (int64_t c = 0; c < T * k; ++c) {
      rows.set(c, c == 4 ? -1 : R - 1 - c);
      weights.set(c, c == 7 ? 0.0 : 0.1 + 0.07 * static_cast<double>(c));
      want.set(c, c == 4 || c == 7 ? 0.0 : dots.get(R - 1 - c) / weights.get(c));
    }
    dweights.fill(7.5);
    moe_choice_grads(ctx, dweights.t, dots.t, weights.t, rows.t);
    CHECK(dweights.values() == want.values());
  }
}

// The two without the experts' outputs give what moe_unpermute_bwd gives with them: ys = act .
// W^T and dact = dys . W (dys the weighted return's gradient) make act . dact / w = dout . ys; a
// choice that a capacity drops and a zero weight get 0; unpermute_bwd without ys writes dys
// alone.
TEST_CASE("kernels: moe_choice_grads equals the choices' gradient through the outputs",
          "[kernels][moe]") {
  std::mt19937 rng(25);
  const int64_t T = 5, E = 3, k = 2, H = 4, I = 6, R = T * k;
  Router r(DType::f64, T, E, k);
  randomize(r.logits, rng, -2.0, 2.0);
  r.fwd(true);
  HostTensor counts(DType::i32, {E}), rows(DType::i32, {T, k}), act(DType::f64, {R, I}),
      w(DType::f64, {H, I}), ys(DType::f64, {R, H}), dout(DType::f64, {T, H}),
      dys(DType::f64, {R, H}), dys2(DType::f64, {R, H}), dact(DType::f64, {R, I}),
      dots(DType::f64, {R}), want(DType::f64, {T, k}), got(DType::f64, {T, k});
  moe_dispatch(ctx, counts.t, rows.t, r.experts.t, r.weights.t, /*capacity=*/2);
  // A kept choice of zero weight (after the dispatch, which would drop it).
  int64_t zero = 0;
  while (rows.get(zero) < 0) ++zero;
  r.weights.set(zero, 0.0);
  randomize(act, rng);
  randomize(w, rng);
  randomize(dout, rng);
  linear_fwd(ctx, ys.t, act.t, w.t, Tensor());
  moe_unpermute_bwd(ctx, dys.t, want.t, dout.t, ys.t, r.weights.t, rows.t);
  dys2.fill(5.0);
  moe_unpermute_bwd(ctx, dys2.t, Tensor(), dout.t, Tensor(), r.weights.t, rows.t);
  const int64_t kept = offsets_of(counts)[E];
  for (int64_t i = 0; i < kept * H; ++i) CHECK(dys2.get(i) == dys.get(i));
  linear_bwd(ctx, dact.t, Tensor(), Tensor(), dys.t, act.t, w.t);
  moe_row_dots(ctx, dots.t, act.t, dact.t);
  got.fill(7.0);
  moe_choice_grads(ctx, got.t, dots.t, r.weights.t, rows.t);
  int64_t dropped = 0;
  for (int64_t c = 0; c < T * k; ++c) {
    INFO("choice " << c);
    dropped += rows.get(c) < 0;
    if (c == zero || rows.get(c) < 0)
      CHECK(got.get(c) == 0.0);
    else
      CHECK(got.get(c) == Approx(want.get(c)).epsilon(1e-12));
  }
  CHECK(dropped > 0);
}

// The load-balancing loss's value, imbalance and gradient from hand-made statistics: probability
// sums {0.5, 1.5, 1, 1} and routed tokens {1, 3, 2, 2} give sum P C = 0.5 + 4.5 + 2 + 2 = 9, the
// most-routed expert 3 over the mean 2 = 1.5.
TEST_CASE("kernels: moe_aux_loss_fwd's value, imbalance and gradient by hand", "[kernels][moe]") {
  for (DType dt : {DType::f32, DType::f64}) {
    HostTensor stats(dt, {2, 4}), value(dt, {2}), grad(dt, {4});
    const double s[8] = {0.5, 1.5, 1, 1, 1, 3, 2, 2};
    for (int i = 0; i < 8; ++i) stats.set(i, s[i]);
    moe_aux_loss_fwd(ctx, value.t, grad.t, stats.t, 0.25, -2.0);
    CHECK(value.get(0) == 0.25 * 9);
    CHECK(value.get(1) == 1.5);
    for (int e = 0; e < 4; ++e) CHECK(grad.get(e) == -2.0 * s[4 + e]);
    stats.fill(0.0);  // no token routed: no imbalance to speak of
    moe_aux_loss_fwd(ctx, value.t, grad.t, stats.t, 0.25, -2.0);
    CHECK(value.get(1) == 0.0);
  }
}

TEST_CASE(
    "kernels: grouped_linear is a linear per group and assign zeroes an empty group's dweight",
    "[kernels][moe]") {
  std::mt19937 rng(24);
  const int64_t R = 10, K = 6, N = 4, used = 8;  // rows [8, 10) follow the groups: untouched
  const std::vector<int64_t> group_rows = {3, 0, 5};
  HostTensor in(DType::f64, {R, K}), out(DType::f64, {R, N}), dout(DType::f64, {R, N}),
      din(DType::f64, {R, K});
  std::vector<HostTensor> w, dw;
  w.reserve(3);
  dw.reserve(3);
  for (int g = 0; g < 3; ++g) {
    w.emplace_back(DType::f64, std::initializer_list<int64_t>{N, K});
    dw.emplace_back(DType::f64, std::initializer_list<int64_t>{N, K});
    randomize(w.back(), rng);
  }
  const std::vector<Tensor> wt = {w[0].t, w[1].t, w[2].t}, dwt = {dw[0].t, dw[1].t, dw[2].t};
  randomize(in, rng);
  randomize(dout, rng);
  out.fill(77.0);
  grouped_linear_fwd(ctx, out.t, in.t, wt, group_rows);
  for (auto [g, at] : {std::pair<int, int64_t>{0, 0}, {2, 3}}) {
    HostTensor ref(DType::f64, {group_rows[g], N});
    linear_fwd(ctx, ref.t, in.t.slice(at, group_rows[g]), wt[g], Tensor());
    for (int64_t i = 0; i < ref.size(); ++i) CHECK(out.get(at * N + i) == ref.get(i));
  }
  for (int64_t i = used * N; i < R * N; ++i) CHECK(out.get(i) == 77.0);

  const std::vector<double> gout = dout.values();
  auto loss = [&] {
    grouped_linear_fwd(ctx, out.t, in.t, wt, group_rows);
    return weighted_sum(out, gout);
  };
  auto bwd = [&] { grouped_linear_bwd(ctx, Tensor(), dwt, dout.t, in.t, wt, group_rows); };
  check_grad_rule(bwd, {&dw[0], &dw[2]}, {}, [&] {  // the empty group's: below
    grouped_linear_bwd(ctx, Tensor(), dwt, dout.t, in.t, wt, group_rows, GradWrite::assign);
  });
  for (int g = 0; g < 3; ++g) dw[g].fill(0.0);
  din.fill(55.0);
  grouped_linear_bwd(ctx, din.t, dwt, dout.t, in.t, wt, group_rows);
  const std::vector<double> din_a = din.values(), din_fd = numeric_grad(in, loss);
  CHECK(rel_err(std::vector<double>(din_a.begin(), din_a.begin() + used * K),
                std::vector<double>(din_fd.begin(), din_fd.begin() + used * K)) < kFdTol);
  for (int64_t i = used * K; i < R * K; ++i) CHECK(din_a[i] == 55.0);
  CHECK(rel_err(dw[0].values(), numeric_grad(w[0], loss)) < kFdTol);
  CHECK(rel_err(dw[2].values(), numeric_grad(w[2], loss)) < kFdTol);
  // The empty group: add leaves its gradient as it was, assign zeroes it.
  dw[1].fill(3.0);
  grouped_linear_bwd(ctx, Tensor(), dwt, dout.t, in.t, wt, group_rows);
  CHECK(dw[1].values() == std::vector<double>(N * K, 3.0));
  grouped_linear_bwd(ctx, Tensor(), dwt, dout.t, in.t, wt, group_rows, GradWrite::assign);
  CHECK(dw[1].values() == std::vector<double>(N * K, 0.0));
  // din alone (no dweights) is the same din.
  din.fill(55.0);
  grouped_linear_bwd(ctx, din.t, {}, dout.t, in.t, wt, group_rows);
  CHECK(din.values() == din_a);
}

// The bucket a grouped GEMM's varying dimension is planned at (kernels/cuda/gemm.h): never below
// the size nor 25% above it, fixed by itself, nondecreasing, four per octave above 8.
TEST_CASE("kernels: gemm_bucket rounds a size up by less than a quarter, four per octave",
          "[kernels][moe]") {
  const std::vector<std::pair<int64_t, int64_t>> cases = {{1, 1},     {8, 8},       {9, 10},
                                                          {16, 16},   {17, 20},     {100, 112},
                                                          {129, 160}, {4096, 4096}, {4097, 5120}};
  for (auto [n, b] : cases) CHECK(gemm_bucket(n) == b);
  std::set<int64_t> buckets;
  int64_t last = 0, wrong = 0;
  for (int64_t n = 1; n <= int64_t{1} << 16; ++n) {
    const int64_t b = gemm_bucket(n);
    const bool close = n <= 8 ? b == n : 4 * (b - n) < n;
    wrong += b < n || !close || gemm_bucket(b) != b || b < last;
    last = b;
    buckets.insert(b);
  }
  CHECK(wrong == 0);
  CHECK(buckets.size() == 8 + 4 * 13);  // 1..8, then (8, 16] .. (2^15, 2^16]
}

// ---------------------------------------------------------------- elementwise

TEST_CASE("kernels: add and scale_ and zero_ and sum_squares on integers", "[kernels]") {
  for (DType dt : kFloatTypes) {
    HostTensor a(dt, {2, 2}), b(dt, {2, 2}), out(dt, {2, 2});
    a.assign({1, 2, 3, -4});
    b.assign({10, 20, 30, 40});
    add(ctx, out.t, a.t, b.t);
    CHECK(out.values() == std::vector<double>{11, 22, 33, 36});
    add(ctx, a.t, a.t, b.t);  // out aliases a
    CHECK(a.values() == out.values());
    scale_(ctx, a.t, 0.5f);
    CHECK(a.values() == std::vector<double>{5.5, 11, 16.5, 18});
    CHECK(sum_squares(ctx, b.t) == 3000.0);
    zero_(ctx, a.t);
    CHECK(a.values() == std::vector<double>(4, 0.0));
  }
  HostTensor ints(DType::i32, {3});
  ints.assign({1, -2, 3});
  zero_(ctx, ints.t);
  CHECK(ints.values() == std::vector<double>(3, 0.0));
}

// ---------------------------------------------------------------- cross-entropy

TEST_CASE("kernels: cross_entropy by hand with padding columns ignored", "[kernels]") {
  for (DType dt : kFloatTypes) {
    HostTensor logits(dt, {2, 6}), losses(dt, {2}), targets(DType::i32, {2});
    const double pad = 1e30;  // would dominate the softmax if padding were not ignored
    // Row 0 uniform over 4 valid columns; row 1 has softmax {1, 2, 3, 4} / 10.
    logits.assign(
        {0, 0, 0, 0, pad, pad, 0, std::log(2.0), std::log(3.0), std::log(4.0), pad, -pad});
    targets.assign({1, 3});
    const std::vector<double> before = logits.values();
    cross_entropy_fwd_bwd(ctx, losses.t, logits.t, targets.t, 4, 0.5f, false);
    CHECK(logits.values() == before);  // untouched without compute_grad
    CHECK(losses.get(0) == Approx(std::log(4.0)).epsilon(1e-6));
    CHECK(losses.get(1) == Approx(-std::log(0.4)).epsilon(1e-6));
    cross_entropy_fwd_bwd(ctx, losses.t, logits.t, targets.t, 4, 0.5f, true);
    const std::vector<double> want = {0.125, -0.375, 0.125, 0.125, 0, 0,
                                      0.05,  0.1,    0.15,  -0.3,  0, 0};
    for (int64_t i = 0; i < 12; ++i) CHECK(logits.get(i) == Approx(want[i]).margin(1e-7));
    CHECK(losses.get(1) == Approx(-std::log(0.4)).epsilon(1e-6));
  }
}

TEST_CASE("kernels: cross_entropy gradient matches finite differences", "[kernels]") {
  std::mt19937 rng(10);
  const int64_t rows = 3, vl = 7, valid = 5;
  const float scale = 0.25f;
  HostTensor logits(DType::f64, {rows, vl}), work(DType::f64, {rows, vl}),
      losses(DType::f64, {rows}), targets(DType::i32, {rows});
  randomize(logits, rng, -2.0, 2.0);
  targets.assign({4, 0, 2});
  auto loss = [&] {
    work.assign(logits.values());
    cross_entropy_fwd_bwd(ctx, losses.t, work.t, targets.t, valid, scale, false);
    return scale * weighted_sum(losses, std::vector<double>(rows, 1.0));
  };
  const std::vector<double> numeric = numeric_grad(logits, loss);
  work.assign(logits.values());
  cross_entropy_fwd_bwd(ctx, losses.t, work.t, targets.t, valid, scale, true);
  CHECK(rel_err(work.values(), numeric) < kFdTol);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = valid; j < vl; ++j) CHECK(work.get(r * vl + j) == 0.0);
}

// data.eod_mask_loss: a negative target (the loader's kIgnoredTarget) gives loss 0 and a zero
// gradient row in the whole-vocabulary op and in both vocab-parallel forms; the other rows are as
// without it.
TEST_CASE("kernels: an ignored target has loss 0 and no gradient in every cross-entropy form",
          "[kernels]") {
  const int64_t C = 3, V = 16, half = 8, valid = 13;
  std::vector<double> full(C * V);
  for (int64_t i = 0; i < C * V; ++i) full[i] = std::sin(0.7 * i) * 3.0;
  auto t = [](std::vector<double>& v, std::initializer_list<int64_t> shape) {
    return Tensor(v.data(), DType::f64, Device::cpu, shape);
  };
  std::vector<int32_t> kept = {2, 9, 12}, ignored = {2, -1, 12};
  std::vector<double> want = full, want_loss(C), got = full, got_loss(C, 7.0);
  cross_entropy_fwd_bwd(ctx, t(want_loss, {C}), t(want, {C, V}),
                        Tensor(kept.data(), DType::i32, Device::cpu, {C}), valid, 0.5f, true);
  Tensor targets(ignored.data(), DType::i32, Device::cpu, {C});
  cross_entropy_fwd_bwd(ctx, t(got_loss, {C}), t(got, {C, V}), targets, valid, 0.5f, true);
  // Row 1 ignored; rows 0 and 2 unchanged.
  auto check_rows = [&](const std::vector<double>& losses, const std::vector<double>& grad,
                        const char* form) {
    INFO(form);
    CHECK(losses[1] == 0.0);
    for (int64_t r : {0, 2}) {
      CHECK(losses[r] == Approx(want_loss[r]).epsilon(1e-14));
      for (int64_t j = 0; j < V; ++j)
        CHECK(grad[r * V + j] == Approx(want[r * V + j]).margin(1e-15));
    }
    for (int64_t j = 0; j < V; ++j) CHECK(grad[V + j] == 0.0);
  };
  check_rows(got_loss, got, "whole vocabulary");
  // Vocab-parallel, in two shards of 8 columns (valid 8 and 5): the three steps and the two-pass
  // form with gathered statistics.
  for (bool two_pass : {false, true}) {
    std::vector<double> shard[2], losses[2], joined(C * V), stats(2 * C * 3);
    std::vector<double> maxes(C, -1e300), sums(2 * C, 0.0);
    const int64_t shard_valid[2] = {8, 5};
    for (int r = 0; r < 2; ++r) {
      shard[r].resize(C * half);
      losses[r].assign(C, 7.0);
      for (int64_t i = 0; i < C; ++i)
        for (int64_t j = 0; j < half; ++j) shard[r][i * half + j] = full[i * V + r * half + j];
    }
    if (two_pass) {
      for (int r = 0; r < 2; ++r)
        xent_shard_stats(ctx, Tensor(stats.data() + r * C * 3, DType::f64, Device::cpu, {C, 3}),
                         t(shard[r], {C, half}), targets, r * half, shard_valid[r]);
      xent_combine(ctx, t(maxes, {C}), t(sums, {C, 2}), t(stats, {2, C, 3}));
    } else {
      std::vector<double> m[2] = {std::vector<double>(C), std::vector<double>(C)},
                          s[2] = {std::vector<double>(2 * C), std::vector<double>(2 * C)};
      for (int r = 0; r < 2; ++r)
        xent_row_max(ctx, t(m[r], {C}), t(shard[r], {C, half}), shard_valid[r]);
      for (int64_t i = 0; i < C; ++i) maxes[i] = std::max(m[0][i], m[1][i]);
      for (int r = 0; r < 2; ++r)
        xent_sums(ctx, t(s[r], {C, 2}), t(shard[r], {C, half}), targets, t(maxes, {C}), r * half,
                  shard_valid[r]);
      for (int64_t i = 0; i < 2 * C; ++i) sums[i] = s[0][i] + s[1][i];
    }
    for (int r = 0; r < 2; ++r) {
      xent_loss_grad(ctx, t(losses[r], {C}), t(shard[r], {C, half}), targets, t(maxes, {C}),
                     t(sums, {C, 2}), r * half, shard_valid[r], 0.5f, true);
      for (int64_t i = 0; i < C; ++i)
        for (int64_t j = 0; j < half; ++j) joined[i * V + r * half + j] = shard[r][i * half + j];
    }
    check_rows(losses[0], joined, two_pass ? "vocab-parallel, two passes" : "vocab-parallel");
    CHECK(losses[1] == losses[0]);
  }
}

// ---------------------------------------------------------------- AdamW

// Vocabulary of 13 ids padded to 16, split over two "ranks" of 8 columns (valid 8 and 5); the
// statistics are combined by hand as the TP all-reduces would. Loss and gradient must equal
// the one-shard op's.
TEST_CASE("kernels: vocab-parallel cross-entropy equals the one-shard op", "[kernels]") {
  const int64_t C = 3, V = 16, half = 8, valid = 13;
  std::vector<double> full(C * V);
  for (int64_t i = 0; i < C * V; ++i) full[i] = std::sin(0.7 * i) * 3.0;
  std::vector<int32_t> tgt = {2, 9, 12};
  std::vector<double> ref = full, ref_loss(C);
  cross_entropy_fwd_bwd(ctx, Tensor(ref_loss.data(), DType::f64, Device::cpu, {C}),
                        Tensor(ref.data(), DType::f64, Device::cpu, {C, V}),
                        Tensor(tgt.data(), DType::i32, Device::cpu, {C}), valid, 0.5f, true);
  std::vector<double> shard[2], maxes[2], sums[2], losses[2];
  for (int r = 0; r < 2; ++r) {
    shard[r].resize(C * half);
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < half; ++j) shard[r][i * half + j] = full[i * V + r * half + j];
    maxes[r].resize(C), sums[r].resize(2 * C), losses[r].resize(C);
  }
  auto t = [](std::vector<double>& v, std::initializer_list<int64_t> shape) {
    return Tensor(v.data(), DType::f64, Device::cpu, shape);
  };
  Tensor targets(tgt.data(), DType::i32, Device::cpu, {C});
  const int64_t shard_valid[2] = {8, 5};
  for (int r = 0; r < 2; ++r)
    xent_row_max(ctx, t(maxes[r], {C}), t(shard[r], {C, half}), shard_valid[r]);
  for (int64_t i = 0; i < C; ++i) maxes[0][i] = maxes[1][i] = std::max(maxes[0][i], maxes[1][i]);
  for (int r = 0; r < 2; ++r)
    xent_sums(ctx, t(sums[r], {C, 2}), t(shard[r], {C, half}), targets, t(maxes[r], {C}), r * half,
              shard_valid[r]);
  for (int64_t i = 0; i < 2 * C; ++i) sums[0][i] = sums[1][i] = sums[0][i] + sums[1][i];
  for (int r = 0; r < 2; ++r)
    xent_loss_grad(ctx, t(losses[r], {C}), t(shard[r], {C, half}), targets, t(maxes[r], {C}),
                   t(sums[r], {C, 2}), r * half, shard_valid[r], 0.5f, true);
  CHECK(rel_err(losses[0], ref_loss) < 1e-14);
  CHECK(rel_err(losses[1], ref_loss) < 1e-14);
  std::vector<double> joined(C * V);
  for (int64_t i = 0; i < C; ++i)
    for (int r = 0; r < 2; ++r)
      for (int64_t j = 0; j < half; ++j) joined[i * V + r * half + j] = shard[r][i * half + j];
  CHECK(rel_err(joined, ref) < 1e-14);
  CHECK(joined[0 * V + 14] == 0.0);  // padding column: zero gradient
}

// The two-pass form: vocabulary 11 padded to 18 over three "ranks" of 6 columns (valid 6, 5 and
// 0: the last shard is all padding), targets in the first two shards. Each shard's statistics in
// one pass, gathered as the TP all-gather would and combined, give the three steps' row max and
// sums, and then the one-shard op's loss and gradient.
TEST_CASE("kernels: vocab-parallel cross-entropy from gathered shard statistics", "[kernels]") {
  const int64_t C = 4, V = 18, w = 6, valid = 11, ranks = 3;
  std::vector<double> full(C * V);
  for (int64_t i = 0; i < C * V; ++i) full[i] = std::cos(0.37 * i) * 4.0 + (i % 5 == 0 ? 9 : 0);
  std::vector<int32_t> tgt = {0, 7, 10, 5};
  std::vector<double> ref = full, ref_loss(C);
  Tensor targets(tgt.data(), DType::i32, Device::cpu, {C});
  cross_entropy_fwd_bwd(ctx, Tensor(ref_loss.data(), DType::f64, Device::cpu, {C}),
                        Tensor(ref.data(), DType::f64, Device::cpu, {C, V}), targets, valid, 0.25f,
                        true);
  auto t = [](std::vector<double>& v, std::initializer_list<int64_t> shape) {
    return Tensor(v.data(), DType::f64, Device::cpu, shape);
  };
  // The three steps over the whole (padded) vocabulary as one shard: the statistics to match.
  std::vector<double> one = full, want_max(C), want_sums(2 * C);
  xent_row_max(ctx, t(want_max, {C}), t(one, {C, V}), valid);
  xent_sums(ctx, t(want_sums, {C, 2}), t(one, {C, V}), targets, t(want_max, {C}), 0, valid);
  std::vector<double> shard[ranks], gathered(ranks * C * 3);
  const int64_t shard_valid[ranks] = {6, 5, 0};
  for (int64_t r = 0; r < ranks; ++r) {
    shard[r].resize(C * w);
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < w; ++j) shard[r][i * w + j] = full[i * V + r * w + j];
    xent_shard_stats(ctx, Tensor(gathered.data() + r * C * 3, DType::f64, Device::cpu, {C, 3}),
                     t(shard[r], {C, w}), targets, r * w, shard_valid[r]);
  }
  CHECK(gathered[2 * C * 3] == -std::numeric_limits<double>::infinity());  // no valid column
  CHECK(gathered[2 * C * 3 + 1] == 0.0);
  std::vector<double> joined(C * V);
  for (int64_t r = 0; r < ranks; ++r) {
    std::vector<double> row_max(C), sums(2 * C), losses(C);
    xent_combine(ctx, t(row_max, {C}), t(sums, {C, 2}), t(gathered, {ranks, C, 3}));
    CHECK(row_max == want_max);
    CHECK(rel_err(sums, want_sums) < 1e-14);
    xent_loss_grad(ctx, t(losses, {C}), t(shard[r], {C, w}), targets, t(row_max, {C}),
                   t(sums, {C, 2}), r * w, shard_valid[r], 0.25f, true);
    CHECK(rel_err(losses, ref_loss) < 1e-14);
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < w; ++j) joined[i * V + r * w + j] = shard[r][i * w + j];
  }
  CHECK(rel_err(joined, ref) < 1e-14);
}

TEST_CASE("kernels: adamw_update against a hand computation", "[kernels]") {
  const AdamWParams hp{0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1};
  for (DType dt : kFloatTypes) {
    HostTensor p(dt, {3}), g(dt, {3}), m(dt, {3}), v(dt, {3});
    p.assign({1, -2, 0.5});
    g.assign({0.1, -0.3, 0});
    // Step 1: mhat = g, vhat = g^2, so the Adam direction is g / (|g| + eps) ~ sign(g).
    adamw_update(ctx, p.t, g.t, m.t, v.t, hp);
    const double e = static_cast<double>(hp.eps);
    const std::vector<double> want_p = {1 - 0.1 * (0.1 / (0.1 + e) + 0.01),
                                        -2 - 0.1 * (-0.3 / (0.3 + e) - 0.02), 0.5 * (1 - 0.001)};
    // m = 0.1 g and v = 0.001 g^2 up to the rounding of beta1, beta2 to float.
    const double c1 = 1.0 - static_cast<double>(hp.beta1), c2 = 1.0 - static_cast<double>(hp.beta2);
    const std::vector<double> want_m = {0.1 * c1, -0.3 * c1, 0}, want_v = {0.01 * c2, 0.09 * c2, 0};
    for (int i = 0; i < 3; ++i) {
      CHECK(p.get(i) == Approx(want_p[i]).epsilon(1e-6));
      CHECK(m.get(i) == Approx(want_m[i]).epsilon(1e-6));
      CHECK(v.get(i) == Approx(want_v[i]).epsilon(1e-6));
    }
    // Step 3 from a given state, in the order of torch.optim.AdamW.
    AdamWParams hp3 = hp;
    hp3.step = 3;
    p.assign({0.3, -0.7, 2});
    g.assign({0.5, 0.2, -1});
    m.assign({0.1, -0.2, 0.05});
    v.assign({0.01, 0.04, 0.2});
    adamw_update(ctx, p.t, g.t, m.t, v.t, hp3);
    const std::vector<double> p0 = {0.3, -0.7, 2}, g0 = {0.5, 0.2, -1}, m0 = {0.1, -0.2, 0.05},
                              v0 = {0.01, 0.04, 0.2};
    const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, wd = hp.weight_decay;
    for (int i = 0; i < 3; ++i) {
      const double mi = b1 * m0[i] + (1 - b1) * g0[i], vi = b2 * v0[i] + (1 - b2) * g0[i] * g0[i];
      const double mhat = mi / (1 - std::pow(b1, 3)), vhat = vi / (1 - std::pow(b2, 3));
      const double want = p0[i] * (1 - lr * wd) - lr * mhat / (std::sqrt(vhat) + e);
      CHECK(p.get(i) == Approx(want).epsilon(1e-6));
      CHECK(m.get(i) == Approx(mi).epsilon(1e-6));
      CHECK(v.get(i) == Approx(vi).epsilon(1e-6));
    }
  }
}

}  // namespace
}  // namespace tr

namespace tr {

TEST_CASE("kernels: cast rounds to bf16 to nearest even and back exactly", "[kernels]") {
  // 1 + 2^-8 is halfway between two bf16 values (ties to even: 1); 1 + 3 * 2^-8 rounds up.
  std::vector<float> in = {1.0f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -2.5f, 65504.0f, 0x1p-130f};
  std::vector<uint16_t> half(in.size());
  std::vector<float> back(in.size());
  const int64_t n = static_cast<int64_t>(in.size());
  cast(ctx, Tensor(half.data(), DType::bf16, Device::cpu, {n}),
       Tensor(in.data(), DType::f32, Device::cpu, {n}));
  cast(ctx, Tensor(back.data(), DType::f32, Device::cpu, {n}),
       Tensor(half.data(), DType::bf16, Device::cpu, {n}));
  CHECK(half[0] == 0x3f80);
  CHECK(back[1] == 1.0f);
  CHECK(back[2] == 1.0f + 0x4p-8f);
  CHECK(back[3] == -2.5f);
  CHECK(back[4] == 65536.0f);
  CHECK(back[5] == 0x1p-130f);  // subnormal in bf16 too
  for (size_t i = 0; i < in.size(); ++i) CHECK(round_to_bf16(in[i]) == back[i]);
}

TEST_CASE("kernels: adamw_update writes the updated weights' compute copy", "[kernels]") {
  std::vector<float> p = {1.0f, -0.3f, 0.25f}, g = {0.5f, -1.0f, 0.0f}, m(3, 0.0f), v(3, 0.0f);
  std::vector<uint16_t> copy(3, 0xffff);
  auto t = [](std::vector<float>& x) { return Tensor(x.data(), DType::f32, Device::cpu, {3}); };
  adamw_update(ctx, t(p), t(g), t(m), t(v), AdamWParams{0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1},
               Tensor(copy.data(), DType::bf16, Device::cpu, {3}));
  CHECK(p[0] == Approx(0.9f));  // first step: a step of lr against the gradient's sign
  CHECK(p[1] == Approx(-0.2f));
  for (int i = 0; i < 3; ++i) CHECK(bf16_to_f32(copy[i]) == round_to_bf16(p[i]));
}

TEST_CASE("kernels: rmsnorm_bwd accumulating into din adds exactly what it would assign",
          "[kernels]") {
  const int64_t T = 3, H = 8;
  std::mt19937 rng(12);
  for (DType dt : kFloatTypes) {
    HostTensor in(dt, {T, H}), w(dt, {H}), dout(dt, {T, H}), out(dt, {T, H}), rstd(dt, {T});
    HostTensor din(dt, {T, H}), acc(dt, {T, H}), dw(dt, {H});
    randomize(in, rng);
    randomize(w, rng);
    randomize(dout, rng);
    randomize(acc, rng);
    std::vector<double> before(static_cast<size_t>(T * H));
    for (int64_t i = 0; i < T * H; ++i) before[i] = acc.get(i);
    rmsnorm_fwd(ctx, out.t, rstd.t, in.t, w.t, 1e-6f);
    rmsnorm_bwd(ctx, din.t, dw.t, dout.t, in.t, w.t, rstd.t);
    rmsnorm_bwd(ctx, acc.t, dw.t, dout.t, in.t, w.t, rstd.t, true);
    for (int64_t i = 0; i < T * H; ++i) {
      HostTensor one(dt, {1});
      one.set(0, before[i] + din.get(i));  // rounded to dt like the op's own add
      CHECK(acc.get(i) == one.get(0));
    }
  }
}

}  // namespace tr

namespace tr {
namespace {

// The norm's pieces table on integers: counted pieces add their squares; a checked-only piece
// adds 0 while finite and NaN (inf included) when not, so a replicated gradient counted on one
// TP rank is still checked on every other; what no piece covers is ignored.
TEST_CASE("kernels: accumulate_sum_squares_pieces counts some pieces and checks the others",
          "[kernels]") {
  Ctx ctx;
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  // Elements at flat indices 10..17: {10, 3} and {16, 2} counted, {13, 2} checked, 15 left out.
  std::vector<int64_t> pieces = {10, 3, 1, 16, 2, 1, 13, 2, 0};
  Tensor t(x.data(), DType::f32, Device::cpu, {8});
  Tensor p(pieces.data(), DType::i64, Device::cpu, {3, 3});
  auto sum = [&] {
    double acc = 0.5;  // accumulates onto what is there
    accumulate_sum_squares_pieces(ctx, Tensor(&acc, DType::f64, Device::cpu, {1}), t, p, 10);
    return acc;
  };
  CHECK(sum() == 0.5 + 1 + 4 + 9 + 49 + 64);
  x[5] = std::numeric_limits<float>::quiet_NaN();  // index 15: in no piece
  CHECK(sum() == 0.5 + 1 + 4 + 9 + 49 + 64);
  x[4] = std::numeric_limits<float>::infinity();  // index 14: checked only
  CHECK(std::isnan(sum()));
  x[4] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(sum()));
  x[4] = 1e30f;  // finite, however large: its square is not counted
  CHECK(sum() == 0.5 + 1 + 4 + 9 + 49 + 64);
}

// The start-up version check with injected versions: a cuDNN or cuBLASLt built for another CUDA
// major (a wheel made for CUDA 12 beside a CUDA 13 build), a runtime of another major than the
// build's, or a driver older than the runtime are each one line naming both versions.
TEST_CASE("versions: a GPU library built for another CUDA major is refused by name", "[kernels]") {
  LibraryVersions ok;
  ok.cuda_toolkit = 13000, ok.cuda_runtime = 13000, ok.cuda_driver = 13010;
  ok.cublaslt = 130100, ok.cublaslt_cudart = 13000;
  ok.cudnn = 91400, ok.cudnn_cudart = 13000;
  ok.nccl = 22803;
  CHECK(check_versions(ok).ok());
  CHECK(describe(ok) ==
        "CUDA runtime 13.0 (built with 13.0, driver 13.1), cuBLASLt 13.1.0 (CUDA 13.0), cuDNN "
        "9.14.0 (CUDA 13.0), NCCL 2.28.3");
  LibraryVersions newer_minor = ok;  // same major, another minor: fine
  newer_minor.cudnn_cudart = 13020;
  CHECK(check_versions(newer_minor).ok());

  LibraryVersions cudnn12 = ok;
  cudnn12.cudnn_cudart = 12080;
  CHECK(std::string(check_versions(cudnn12).message()) ==
        "cuDNN 9.14.0 was built for CUDA 12.8, not CUDA 13 as the trainer; install the cuDNN for "
        "CUDA 13 (e.g. the cu13 wheel) and put it first on LD_LIBRARY_PATH");
  // Each other mismatch, one field at a time: the line it starts with.
  struct Bad {
    int64_t LibraryVersions::*field;
    int64_t value;
    const char* starts;
  };
  for (const Bad& b :
       {Bad{&LibraryVersions::cublaslt_cudart, 12090, "cuBLASLt 13.1.0 was built for CUDA 12.9"},
        Bad{&LibraryVersions::cuda_runtime, 12080,
            "the CUDA runtime loaded is 12.8 but the trainer was built with CUDA 13.0"},
        Bad{&LibraryVersions::cuda_driver, 12040,
            "the GPU driver supports CUDA up to 12.4, older than the CUDA 13.0"}}) {
    LibraryVersions v = ok;
    v.*b.field = b.value;
    INFO(b.starts);
    CHECK(std::string(check_versions(v).message()).starts_with(b.starts));
  }
  LibraryVersions no_nccl = ok;
  no_nccl.nccl = 0;
  CHECK(describe(no_nccl).find("NCCL") == std::string::npos);
}

// ---------------------------------------------------------------- context-parallel attention

// The rows `pos` of a [S, heads, hd] array, as a tensor [pos.size(), heads, hd].
HostTensor rows_of(const std::vector<double>& x, const std::vector<int64_t>& pos, int64_t heads,
                   int64_t hd) {
  HostTensor t(DType::f64, {static_cast<int64_t>(pos.size()), heads, hd});
  for (size_t i = 0; i < pos.size(); ++i)
    for (int64_t e = 0; e < heads * hd; ++e)
      t.set(static_cast<int64_t>(i) * heads * hd + e, x[pos[i] * heads * hd + e]);
  return t;
}

// One sequence's causal attention as context parallelism computes it: each of `cp` ranks holds
// two chunks of queries (cp_positions) and meets every rank's key/value chunks in `order(r)`,
// merging the partials; the backward sends each rank's dk, dv shares back to the chunk's owner.
struct ChunkedAttention {
  ChunkedAttention(int64_t S_, int64_t nh_, int64_t nkv_, int64_t hd_, int cp_)
      : S(S_), nh(nh_), nkv(nkv_), hd(hd_), cp(cp_) {}
  int64_t S, nh, nkv, hd;
  int cp;
  std::vector<double> q, k, v;               // [S, nh, hd], [S, nkv, hd] x 2, by global position
  std::vector<double> out, lse, dq, dk, dv;  // the same layouts; lse [nh, S]

  void run(const std::vector<double>& dout, const std::function<int(int, int)>& source) {
    out.assign(q.size(), 0), dq.assign(q.size(), 0), lse.assign(nh * S, 0);
    dk.assign(k.size(), 0), dv.assign(v.size(), 0);
    for (int r = 0; r < cp; ++r) {
      const std::vector<int64_t> qp = cp_positions(S, cp, r);
      const int64_t n = static_cast<int64_t>(qp.size());
      HostTensor qr = rows_of(q, qp, nh, hd), o(DType::f64, {n, nh, hd}), l(DType::f64, {nh, n});
      l.fill(-std::numeric_limits<double>::infinity());  // nothing seen yet
      for (int t = 0; t < cp; ++t) {
        const std::vector<int64_t> kp = cp_positions(S, cp, source(r, t));
        HostTensor ks = rows_of(k, kp, nkv, hd), vs = rows_of(v, kp, nkv, hd);
        HostTensor po(DType::f64, {n, nh, hd}), pl(DType::f64, {nh, n});
        cpu::chunk_attention_fwd(po.t, pl.t, qr.t, ks.t, vs.t, qp, kp);
        attention_merge(ctx, o.t, l.t, po.t, pl.t);
      }
      HostTensor dor = rows_of(dout, qp, nh, hd), dqr(DType::f64, {n, nh, hd});
      for (int t = 0; t < cp; ++t) {
        const std::vector<int64_t> kp = cp_positions(S, cp, source(r, t));
        const int64_t m = static_cast<int64_t>(kp.size());
        HostTensor ks = rows_of(k, kp, nkv, hd), vs = rows_of(v, kp, nkv, hd);
        HostTensor dks(DType::f64, {m, nkv, hd}), dvs(DType::f64, {m, nkv, hd});
        cpu::chunk_attention_bwd(dqr.t, dks.t, dvs.t, dor.t, o.t, l.t, qr.t, ks.t, vs.t, qp, kp);
        for (int64_t j = 0; j < m; ++j)  // back to the owner of these keys
          for (int64_t e = 0; e < nkv * hd; ++e) {
            dk[kp[j] * nkv * hd + e] += dks.get(j * nkv * hd + e);
            dv[kp[j] * nkv * hd + e] += dvs.get(j * nkv * hd + e);
          }
      }
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t e = 0; e < nh * hd; ++e) {
          out[qp[i] * nh * hd + e] = o.get(i * nh * hd + e);
          dq[qp[i] * nh * hd + e] = dqr.get(i * nh * hd + e);
        }
        for (int64_t h = 0; h < nh; ++h) lse[h * S + qp[i]] = l.get(h * n + i);
      }
    }
  }
};

TEST_CASE("cp: each rank's two chunks balance the causal work", "[kernels]") {
  CHECK(cp_positions(8, 2, 0) == std::vector<int64_t>{0, 1, 6, 7});
  CHECK(cp_positions(8, 2, 1) == std::vector<int64_t>{2, 3, 4, 5});
  for (int cp : {1, 2, 4}) {
    std::vector<int> seen(16, 0);
    int64_t work0 = -1;
    for (int r = 0; r < cp; ++r) {
      int64_t work = 0;  // keys visible to the rank's queries
      for (int64_t p : cp_positions(16, cp, r)) {
        ++seen[p];
        work += p + 1;
      }
      if (work0 < 0) work0 = work;
      CHECK(work == work0);
    }
    CHECK(std::count(seen.begin(), seen.end(), 1) == 16);
  }
}

// Chunked attention with the log-sum-exp merge is the whole sequence's attention: outputs, lse
// and dq, dk, dv against attention_fwd/bwd over the sequence, for cp 1, 2 and 3 and both
// exchange orders (all-gather: every rank meets the chunks in rank order; ring: rank r meets
// r, r - 1, ..., as a ring passes them), in fp64.
TEST_CASE("cp: chunked attention with the lse merge equals whole-sequence attention", "[kernels]") {
  std::mt19937 rng(30);
  const int64_t S = 12, nh = 4, nkv = 2, hd = 8, row = (nh + 2 * nkv) * hd;
  HostTensor qkv(DType::f64, {S, row}), out(DType::f64, {S, nh * hd}), lse(DType::f64, {1, nh, S});
  HostTensor dout(DType::f64, {S, nh * hd}), dqkv(DType::f64, {S, row});
  randomize(qkv, rng);
  randomize(dout, rng);
  attention_fwd(ctx, out.t, lse.t, qkv.t, 1, S, nh, nkv, hd);
  attention_bwd(ctx, dqkv.t, dout.t, out.t, lse.t, qkv.t, 1, S, nh, nkv, hd);
  // Split qkv (and dqkv) into q [S, nh, hd], k, v [S, nkv, hd].
  auto split = [&](const HostTensor& x, int64_t from, int64_t heads) {
    std::vector<double> y(S * heads * hd);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t e = 0; e < heads * hd; ++e) y[s * heads * hd + e] = x.get(s * row + from + e);
    return y;
  };
  for (int cp : {1, 2, 3}) {
    for (bool ring : {false, true}) {
      INFO("cp " << cp << (ring ? " ring" : " all-gather"));
      ChunkedAttention c(S, nh, nkv, hd, cp);
      c.q = split(qkv, 0, nh), c.k = split(qkv, nh * hd, nkv);
      c.v = split(qkv, (nh + nkv) * hd, nkv);
      c.run(dout.values(), [&](int r, int t) { return ring ? (r - t + cp) % cp : t; });
      CHECK(rel_err(c.out, out.values()) < kF64Tol);
      CHECK(rel_err(c.lse, lse.values()) < kF64Tol);
      CHECK(rel_err(c.dq, split(dqkv, 0, nh)) < 1e-10);
      CHECK(rel_err(c.dk, split(dqkv, nh * hd, nkv)) < 1e-10);
      CHECK(rel_err(c.dv, split(dqkv, (nh + nkv) * hd, nkv)) < 1e-10);
    }
  }
}

// The chunked backward is the gradient of the chunked forward (finite differences, fp64, cp 2,
// ring order), and a merge with a chunk that sees nothing changes nothing.
TEST_CASE("cp: chunked attention's backward matches finite differences", "[kernels]") {
  std::mt19937 rng(31);
  const int64_t S = 8, nh = 2, nkv = 1, hd = 4;
  ChunkedAttention c(S, nh, nkv, hd, 2);
  c.q = random_values(S * nh * hd, rng), c.k = random_values(S * nkv * hd, rng),
  c.v = random_values(S * nkv * hd, rng);
  const std::vector<double> g = random_values(S * nh * hd, rng);
  auto ring = [](int r, int t) { return (r - t + 2) % 2; };
  c.run(g, ring);
  const std::vector<double> dq = c.dq, dk = c.dk, dv = c.dv;
  for (std::vector<double>* x : {&c.q, &c.k, &c.v}) {
    std::vector<double> num(x->size());
    for (size_t i = 0; i < x->size(); ++i) {
      const double x0 = (*x)[i], h = 1e-5;
      double f[2];
      for (int s = 0; s < 2; ++s) {
        (*x)[i] = x0 + (s ? -h : h);
        c.run(g, ring);
        f[s] = 0;
        for (size_t j = 0; j < g.size(); ++j) f[s] += g[j] * c.out[j];
      }
      (*x)[i] = x0;
      num[i] = (f[0] - f[1]) / (2 * h);
    }
    CHECK(rel_err(x == &c.q ? dq : x == &c.k ? dk : dv, num) < kFdTol);
  }
  // Keys all after the queries: lse -inf, out 0, and merging it leaves a result as it was.
  const std::vector<int64_t> early = {0, 1}, late = {5, 6};
  HostTensor q(DType::f64, {2, nh, hd}), k(DType::f64, {2, nkv, hd}), v(DType::f64, {2, nkv, hd});
  randomize(q, rng), randomize(k, rng), randomize(v, rng);
  HostTensor o(DType::f64, {2, nh, hd}), l(DType::f64, {nh, 2}), o2(DType::f64, {2, nh, hd}),
      l2(DType::f64, {nh, 2});
  cpu::chunk_attention_fwd(o.t, l.t, q.t, k.t, v.t, early, early);
  const std::vector<double> o_before = o.values(), l_before = l.values();
  cpu::chunk_attention_fwd(o2.t, l2.t, q.t, k.t, v.t, early, late);
  for (int64_t i = 0; i < l2.size(); ++i) CHECK(std::isinf(l2.get(i)));
  for (int64_t i = 0; i < o2.size(); ++i) CHECK(o2.get(i) == 0.0);
  attention_merge(ctx, o.t, l.t, o2.t, l2.t);
  CHECK(o.values() == o_before);
  CHECK(l.values() == l_before);
}

}  // namespace
}  // namespace tr
