// Mixture of experts on the GPU against the CPU reference (label gpu, in test_cuda_ops): the
// router's choices and the dispatch's counts and rows exactly (ties to the lower expert and the
// earlier token, an expert without tokens, a capacity that drops), the rest within the f32 and
// bf16 bounds; at E=128 k=8 T=512 H=64 and at an awkward E=5 k=3 T=7 H=13 (no 16-byte packs).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/ops.h"
#include "tests/kernels/cuda_test_util.h"

namespace tr {
namespace {

using namespace cuda_test;  // NOLINT: the shared helpers of the GPU tests

Ctx host_ctx;

const DType kTypes[] = {DType::f32, DType::bf16};

struct Moe {
  int64_t T, E, k, H;
};
const Moe kMoeShapes[] = {{7, 5, 3, 13}, {512, 128, 8, 64}};

std::string describe(DType dt, Moe s) {
  return std::string(dtype_name(dt)) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E) +
         " k=" + std::to_string(s.k) + " H=" + std::to_string(s.H);
}

Tensor host_i32(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), DType::i32, Device::cpu, shape);
}

std::vector<int32_t> download_i32(const Dev& d) {
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> v(static_cast<size_t>(d.t.numel()));
  copy_tensor(Tensor(v.data(), DType::i32, Device::cpu, {d.t.numel()}), d.t);
  return v;
}

std::vector<float> as_floats(const std::vector<int32_t>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// Router logits of dt's values with ties: every fifth token's all equal (its experts 0..k-1,
// equal weights across those tokens), token 1's in three levels (equal pairs around the k-th
// place); the last expert far below the rest, so that it receives no token.
std::vector<float> router_logits(Moe s, std::mt19937& rng, DType dt) {
  std::vector<float> z = random_values(s.T * s.E, rng, dt, -4, 4);
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t e = 0; e < s.E; ++e) {
      if (t % 5 == 0) z[t * s.E + e] = 0.5f;
      if (t == 1) z[t * s.E + e] = static_cast<float>(e % 3);
      if (e == s.E - 1) z[t * s.E + e] = -30.0f;
    }
  return z;
}

// The CPU's routing of fresh logits: experts, and weights rounded to dt.
struct Routing {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};
Routing route(Moe s, std::mt19937& rng, DType dt) {
  std::vector<float> z = router_logits(s, rng, DType::f32), probs(s.T * s.E), sums(s.E),
                     routed(s.E);
  Routing r{std::vector<int32_t>(s.T * s.k), std::vector<float>(s.T * s.k)};
  moe_router_fwd(host_ctx, host(probs, {s.T, s.E}), host_i32(r.experts, {s.T, s.k}),
                 host(r.weights, {s.T, s.k}), host(sums, {s.E}), host(routed, {s.E}),
                 host(z, {s.T, s.E}), true);
  if (dt == DType::bf16)
    for (float& w : r.weights) w = round_to_bf16(w);
  return r;
}

// The CPU's dispatch of a routing: counts [E] and rows [T, k].
std::pair<std::vector<int32_t>, std::vector<int32_t>> dispatch_cpu(Moe s, Routing& r,
                                                                   int64_t capacity) {
  std::vector<int32_t> counts(s.E), rows(s.T * s.k);
  moe_dispatch(host_ctx, host_i32(counts, {s.E}), host_i32(rows, {s.T, s.k}),
               host_i32(r.experts, {s.T, s.k}), host(r.weights, {s.T, s.k}), capacity);
  return {counts, rows};
}

TEST_CASE("cuda: moe router forward and backward match the CPU, ties to the lower expert",
          "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(31);
  for (DType dt : kTypes)
    for (Moe s : kMoeShapes)
      for (bool normalize : {true, false}) {
        const int64_t T = s.T, E = s.E, k = s.k;
        const std::string what = describe(dt, s) + (normalize ? " normalized" : "");
        std::vector<float> z = router_logits(s, rng, dt), probs(T * E), weights(T * k), sums(E),
                           routed(E), dlogits(T * E);
        std::vector<int32_t> experts(T * k);
        moe_router_fwd(host_ctx, host(probs, {T, E}), host_i32(experts, {T, k}),
                       host(weights, {T, k}), host(sums, {E}), host(routed, {E}), host(z, {T, E}),
                       normalize);
        Dev d_z(dt, {T, E}, z), d_probs(DType::f32, {T, E}), d_experts(DType::i32, {T, k}),
            d_weights(dt, {T, k}), d_sums(DType::f32, {E}), d_routed(DType::f32, {E});
        moe_router_fwd(g.ctx, d_probs.t, d_experts.t, d_weights.t, d_sums.t, d_routed.t, d_z.t,
                       normalize);
        INFO(what);
        const std::vector<int32_t> gpu_experts = download_i32(d_experts);
        CHECK(gpu_experts == experts);
        for (int64_t j = 0; j < k; ++j) CHECK(gpu_experts[j] == j);  // token 0's equal logits
        CHECK(routed[E - 1] == 0.0f);
        CHECK(d_routed.download() == routed);
        check_close(d_probs.download(), probs, DType::f32, "probs " + what);
        check_close(d_weights.download(), weights, dt, "weights " + what);
        check_close(d_sums.download(), sums, DType::f32, "prob_sums " + what);
        // The backward with the load-balancing term on the routed counts.
        std::vector<float> dweights = random_values(T * k, rng, dt);
        const double aux_scale = 0.01;
        moe_router_bwd(host_ctx, host(dlogits, {T, E}), host(dweights, {T, k}), host(probs, {T, E}),
                       host_i32(experts, {T, k}), normalize, host(routed, {E}), aux_scale);
        Dev d_dweights(dt, {T, k}, dweights), d_dlogits(dt, {T, E});
        moe_router_bwd(g.ctx, d_dlogits.t, d_dweights.t, d_probs.t, d_experts.t, normalize,
                       d_routed.t, aux_scale);
        check_close(d_dlogits.download(), dlogits, dt, "dlogits " + what);
      }
}

TEST_CASE("cuda: moe load-balancing loss and its gradient match the CPU", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(33);
  for (int64_t E : {int64_t{5}, int64_t{128}, int64_t{1000}}) {
    std::vector<float> stats = random_values(2 * E, rng, DType::f32, 0, 50), value(2), grad(E);
    moe_aux_loss_fwd(host_ctx, host(value, {2}), host(grad, {E}), host(stats, {2, E}), 3e-5, 0.25);
    Dev d_stats(DType::f32, {2, E}, stats), d_value(DType::f32, {2}), d_grad(DType::f32, {E});
    moe_aux_loss_fwd(g.ctx, d_value.t, d_grad.t, d_stats.t, 3e-5, 0.25);
    INFO("E=" << E);
    check_close(d_value.download(), value, DType::f32, "value");
    CHECK(d_grad.download() == grad);
  }
}

TEST_CASE("cuda: moe dispatch matches the CPU exactly, dropless and with a capacity", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(32);
  for (DType dt : kTypes) {
    for (Moe s : kMoeShapes) {
      Routing r = route(s, rng, dt);
      const int64_t T = s.T, k = s.k, E = s.E;
      for (int64_t capacity : {int64_t{0}, int64_t{1}, T * k / E}) {
        const std::string what = describe(dt, s) + " capacity " + std::to_string(capacity);
        INFO(what);
        const auto [counts, rows] = dispatch_cpu(s, r, capacity);
        Dev d_experts(DType::i32, {T, k}, as_floats(r.experts)), d_weights(dt, {T, k}, r.weights),
            d_counts(DType::i32, {E}), d_rows(DType::i32, {T, k});
        moe_dispatch(g.ctx, d_counts.t, d_rows.t, d_experts.t, d_weights.t, capacity);
        CHECK(download_i32(d_counts) == counts);
        CHECK(download_i32(d_rows) == rows);
        CHECK(counts[E - 1] == 0);
        if (capacity > 0) CHECK(std::count(rows.begin(), rows.end(), -1) > 0);  // drops
      }
    }
    // The hand-made capacity case of the CPU tests: heaviest first, earlier token on ties.
    std::vector<float> weights = {0.5, 0.5, 0.3, 0.7, 0.5, 0.5, 0.6, 0.5};
    Dev d_experts(DType::i32, {4, 2}, {0, 1, 0, 2, 0, 1, 1, 0}), d_weights(dt, {4, 2}, weights),
        d_counts(DType::i32, {3}), d_rows(DType::i32, {4, 2});
    moe_dispatch(g.ctx, d_counts.t, d_rows.t, d_experts.t, d_weights.t, 2);
    CHECK(download_i32(d_counts) == std::vector<int32_t>{2, 2, 1});
    CHECK(download_i32(d_rows) == std::vector<int32_t>{0, 2, -1, 4, 1, -1, 3, -1});
  }
}

// moe_row_dots over act and dact [R, I] (I = H + 3: 16 with 16-byte packs, 67 without), then
// moe_choice_grads from the CPU's dots (f32) with a choice of zero weight.
void check_choice_grads(GpuCtx& g, Moe s, std::mt19937& rng, DType dt, std::vector<float> weights,
                        std::vector<int32_t>& rows, const std::string& what) {
  const int64_t T = s.T, k = s.k, R = T * k, I = s.H + 3;
  weights[1] = 0.0f;
  std::vector<float> act = random_values(R * I, rng, dt), dact = random_values(R * I, rng, dt),
                     dots(R), choice(T * k);
  Dev d_act(dt, {R, I}, act), d_dact(dt, {R, I}, dact), d_dots(DType::f32, {R}),
      d_weights(dt, {T, k}, weights), d_rows(DType::i32, {T, k}, as_floats(rows)),
      d_choice(dt, {T, k});
  moe_row_dots(host_ctx, host(dots, {R}), host(act, {R, I}), host(dact, {R, I}));
  moe_row_dots(g.ctx, d_dots.t, d_act.t, d_dact.t);
  check_close(d_dots.download(), dots, dt, "row_dots " + what);
  moe_choice_grads(host_ctx, host(choice, {T, k}), host(dots, {R}), host(weights, {T, k}),
                   host_i32(rows, {T, k}));
  Dev d_host_dots(DType::f32, {R}, dots);
  moe_choice_grads(g.ctx, d_choice.t, d_host_dots.t, d_weights.t, d_rows.t);
  const std::vector<float> got = d_choice.download();
  check_close(got, choice, dt, "choice_grads " + what);
  CHECK(got[1] == 0.0f);
}

TEST_CASE("cuda: moe permute and unpermute forward and backward match the CPU", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(33);
  for (DType dt : kTypes)
    for (Moe s : kMoeShapes) {
      Routing r = route(s, rng, dt);
      const int64_t T = s.T, k = s.k, H = s.H, R = T * k;
      for (int64_t capacity : {int64_t{0}, T * k / s.E}) {
        const std::string what = describe(dt, s) + " capacity " + std::to_string(capacity);
        auto [counts, rows] = dispatch_cpu(s, r, capacity);
        Dev d_rows(DType::i32, {T, k}, as_floats(rows)), d_weights(dt, {T, k}, r.weights);
        Tensor h_rows = host_i32(rows, {T, k}), h_weights = host(r.weights, {T, k});
        // Rows no choice lands on keep what they held (zeros here) on both.
        std::vector<float> in = random_values(T * H, rng, dt), xs(R * H, 0.0f);
        Dev d_in(dt, {T, H}, in), d_xs(dt, {R, H}, xs);
        moe_permute(host_ctx, host(xs, {R, H}), host(in, {T, H}), h_rows);
        moe_permute(g.ctx, d_xs.t, d_in.t, d_rows.t);
        CHECK(d_xs.download() == xs);  // copies: exact
        std::vector<float> dxs = random_values(R * H, rng, dt), din(T * H),
                           din_acc = random_values(T * H, rng, dt);
        Dev d_dxs(dt, {R, H}, dxs), d_din(dt, {T, H}), d_din_acc(dt, {T, H}, din_acc);
        moe_permute_bwd(host_ctx, host(din, {T, H}), host(dxs, {R, H}), h_rows, false);
        moe_permute_bwd(host_ctx, host(din_acc, {T, H}), host(dxs, {R, H}), h_rows, true);
        moe_permute_bwd(g.ctx, d_din.t, d_dxs.t, d_rows.t, false);
        moe_permute_bwd(g.ctx, d_din_acc.t, d_dxs.t, d_rows.t, true);
        check_close(d_din.download(), din, dt, "permute_bwd din " + what);
        check_close(d_din_acc.download(), din_acc, dt, "permute_bwd din accumulated " + what);
        std::vector<float> ys = random_values(R * H, rng, dt), out(T * H),
                           dout = random_values(T * H, rng, dt), dys(R * H, 0.0f), dweights(T * k);
        Dev d_ys(dt, {R, H}, ys), d_out(dt, {T, H}), d_dout(dt, {T, H}, dout),
            d_dys(dt, {R, H}, dys), d_dweights(dt, {T, k});
        moe_unpermute(host_ctx, host(out, {T, H}), host(ys, {R, H}), h_weights, h_rows);
        moe_unpermute_bwd(host_ctx, host(dys, {R, H}), host(dweights, {T, k}), host(dout, {T, H}),
                          host(ys, {R, H}), h_weights, h_rows);
        moe_unpermute(g.ctx, d_out.t, d_ys.t, d_weights.t, d_rows.t);
        moe_unpermute_bwd(g.ctx, d_dys.t, d_dweights.t, d_dout.t, d_ys.t, d_weights.t, d_rows.t);
        check_close(d_out.download(), out, dt, "unpermute out " + what);
        check_close(d_dys.download(), dys, dt, "unpermute_bwd dys " + what);
        check_close(d_dweights.download(), dweights, dt, "unpermute_bwd dweights " + what);
        // Without ys: dys alone, and the choices' gradients from an act and its gradient.
        Dev d_dys2(dt, {R, H}, std::vector<float>(static_cast<size_t>(R * H), 0.0f));
        moe_unpermute_bwd(g.ctx, d_dys2.t, Tensor(), d_dout.t, Tensor(), d_weights.t, d_rows.t);
        CHECK(d_dys2.download() == d_dys.download());
        check_choice_grads(g, s, rng, dt, r.weights, rows, what);
      }
    }
}

TEST_CASE("cuda: moe grouped linear forward and backward match the CPU", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(34);
  for (DType dt : kTypes)
    for (Moe s : kMoeShapes) {
      Routing r = route(s, rng, dt);
      const int64_t E = s.E, R = s.T * s.k, K = s.H, N = s.H / 2 + 1;
      // With a capacity the groups end before R: the rows after them stay as they were.
      for (int64_t capacity : {int64_t{0}, R / E}) {
        const std::string what = describe(dt, s) + " capacity " + std::to_string(capacity);
        const std::vector<int32_t> counts = dispatch_cpu(s, r, capacity).first;
        const std::vector<int64_t> group_rows(counts.begin(), counts.end());
        std::vector<float> in = random_values(R * K, rng, dt),
                           w = random_values(E * N * K, rng, dt), out(R * N, 0.25f),
                           dout = random_values(R * N, rng, dt), din(R * K, 0.5f),
                           dw = random_values(E * N * K, rng, DType::f32);
        const std::vector<float> dw0 = dw;
        Dev d_in(dt, {R, K}, in), d_w(dt, {E, N, K}, w), d_out(dt, {R, N}, out),
            d_dout(dt, {R, N}, dout), d_din(dt, {R, K}, din), d_dw(DType::f32, {E, N, K}, dw0);
        std::vector<Tensor> h_w, h_dw, g_w, g_dw;
        for (int64_t e = 0; e < E; ++e) {
          h_w.push_back(host(w, {E * N * K}).at(e * N * K, {N, K}));
          h_dw.push_back(host(dw, {E * N * K}).at(e * N * K, {N, K}));
          g_w.push_back(d_w.t.at(e * N * K, {N, K}));
          g_dw.push_back(d_dw.t.at(e * N * K, {N, K}));
        }
        grouped_linear_fwd(host_ctx, host(out, {R, N}), host(in, {R, K}), h_w, group_rows);
        grouped_linear_bwd(host_ctx, host(din, {R, K}), h_dw, host(dout, {R, N}), host(in, {R, K}),
                           h_w, group_rows);
        grouped_linear_fwd(g.ctx, d_out.t, d_in.t, g_w, group_rows);
        grouped_linear_bwd(g.ctx, d_din.t, g_dw, d_dout.t, d_in.t, g_w, group_rows);
        check_close(d_out.download(), out, dt, "out " + what);
        check_close(d_din.download(), din, dt, "din " + what);
        check_close(d_dw.download(), dw, dt, "dweights (accumulated) " + what);
        // Assigned: an empty group's gradient (the last expert's) becomes zeros.
        grouped_linear_bwd(host_ctx, Tensor(), h_dw, host(dout, {R, N}), host(in, {R, K}), h_w,
                           group_rows, GradWrite::assign);
        grouped_linear_bwd(g.ctx, Tensor(), g_dw, d_dout.t, d_in.t, g_w, group_rows,
                           GradWrite::assign);
        const std::vector<float> assigned = d_dw.download();
        check_close(assigned, dw, dt, "dweights (assigned) " + what);
        CHECK(group_rows[E - 1] == 0);
        CHECK(std::all_of(assigned.end() - N * K, assigned.end(), [](float x) { return x == 0; }));
      }
    }
}

}  // namespace
}  // namespace tr
