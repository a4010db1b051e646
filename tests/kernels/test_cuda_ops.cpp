// Every CUDA op against the CPU reference (label gpu): fresh random inputs at several shapes,
// including the 0.5B and the 72B per-rank (tp 8) shapes at small token counts; outputs
// poisoned (NaN bytes) before each run; relative error ||gpu - cpu|| / ||cpu|| within 1e-5 for
// f32 and 1e-2 for bf16 (the CPU runs in f32 on the same bf16-rounded inputs).
//
// Without a CUDA device the binary prints "skipped: no CUDA device" and exits 77, which ctest
// reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/bf16.h"
#include "core/switches.h"
#include "kernels/cuda/attention_docs.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "kernels/ragged.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"

namespace tr {
namespace {

using namespace cuda_test;  // NOLINT: the shared helpers of the GPU tests

Ctx cpu_ctx;

const DType kTypes[] = {DType::f32, DType::bf16};

// TR_TEST_SMALL_SHAPES=1 (compute-sanitizer runs, tools/gpu_check.sh): a shape whose largest
// operand has more than 1M elements is left out.
bool large(int64_t elements) {
  return switch_on(Switch::test_small_shapes) && elements > (int64_t{1} << 20);
}

// (tokens, hidden): tiny and odd (no 16-byte packs), Qwen2.5-0.5B, 72B.
const std::pair<int64_t, int64_t> kRowShapes[] = {{5, 102}, {64, 896}, {16, 8192}};

// The device phase timeline doubles its ring rather than drop marks: 41 marks on a ring of 4 are
// all kept, and every completed interval is charged to its tag (the step breakdown of a 72B
// stage makes about 10^5 marks a step).
TEST_CASE("cuda: the event timeline grows past its capacity and charges every interval", "[gpu]") {
  GpuCtx g;
  cuda::EventTimeline t(g.ctx, 4);
  Buffer buf{size_t{64} << 20, Device::cuda};
  for (int i = 0; i < 40; ++i) {
    t.mark(i % 3);
    CUDA_CHECK(cudaMemsetAsync(buf.data(), i, buf.bytes(), g.stream));  // some device time
  }
  t.mark(3);
  CUDA_CHECK(cudaStreamSynchronize(g.stream));
  CHECK(t.marked() == 41);
  CHECK(t.dropped() == 0);
  double s[4] = {};
  t.collect(s, 4, t.marked());
  for (int tag = 0; tag < 3; ++tag) CHECK(s[tag] > 0);
  CHECK(s[3] == 0);         // the last mark starts no interval
  CHECK(t.marked() == 41);  // collected marks still counted
}

TEST_CASE("cuda: rmsnorm forward and backward match the CPU", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(1);
  for (DType dt : kTypes) {
    for (auto [T, H] : kRowShapes) {
      const std::string what =
          std::string(dtype_name(dt)) + " T=" + std::to_string(T) + " H=" + std::to_string(H);
      std::vector<float> in = random_values(T * H, rng, dt),
                         w = random_values(H, rng, dt, 0.5, 1.5),
                         dout = random_values(T * H, rng, dt);
      std::vector<float> out(T * H), rstd(T), din(T * H), dw = random_values(H, rng, DType::f32);
      std::vector<float> dw0 = dw;
      rmsnorm_fwd(cpu_ctx, host(out, {T, H}), host(rstd, {T}), host(in, {T, H}), host(w, {H}),
                  1e-6f);
      rmsnorm_bwd(cpu_ctx, host(din, {T, H}), host(dw, {H}), host(dout, {T, H}), host(in, {T, H}),
                  host(w, {H}), host(rstd, {T}));
      Dev d_in(dt, {T, H}, in), d_w(dt, {H}, w), d_out(dt, {T, H}), d_rstd(DType::f32, {T}),
          d_dout(dt, {T, H}, dout), d_din(dt, {T, H}), d_dw(DType::f32, {H}, dw0);
      rmsnorm_fwd(g.ctx, d_out.t, d_rstd.t, d_in.t, d_w.t, 1e-6f);
      rmsnorm_bwd(g.ctx, d_din.t, d_dw.t, d_dout.t, d_in.t, d_w.t, d_rstd.t);
      check_close(d_out.download(), out, dt, "out " + what);
      check_close(d_rstd.download(), rstd, DType::f32, "rstd " + what);
      check_close(d_din.download(), din, dt, "din " + what);
      check_close(d_dw.download(), dw, dt, "dweight (accumulated) " + what);
      // A step's first micro-batch assigns dweight over what the buffer held.
      rmsnorm_bwd(cpu_ctx, host(din, {T, H}), host(dw, {H}), host(dout, {T, H}), host(in, {T, H}),
                  host(w, {H}), host(rstd, {T}), false, GradWrite::assign);
      rmsnorm_bwd(g.ctx, d_din.t, d_dw.t, d_dout.t, d_in.t, d_w.t, d_rstd.t, false,
                  GradWrite::assign);
      check_close(d_dw.download(), dw, dt, "dweight (assigned) " + what);
      // The fused residual add + norm, and the backward accumulating into the residual's
      // gradient.
      std::vector<float> b = random_values(T * H, rng, dt), sum(T * H), out2(T * H), rstd2(T);
      add_rmsnorm_fwd(cpu_ctx, host(sum, {T, H}), host(out2, {T, H}), host(rstd2, {T}),
                      host(in, {T, H}), host(b, {T, H}), host(w, {H}), 1e-6f);
      std::vector<float> dres = random_values(T * H, rng, dt), dres0 = dres;
      rmsnorm_bwd(cpu_ctx, host(dres, {T, H}), host(dw, {H}), host(dout, {T, H}), host(in, {T, H}),
                  host(w, {H}), host(rstd, {T}), true);
      Dev d_b(dt, {T, H}, b), d_sum(dt, {T, H}), d_out2(dt, {T, H}), d_rstd2(DType::f32, {T}),
          d_dres(dt, {T, H}, dres0);
      add_rmsnorm_fwd(g.ctx, d_sum.t, d_out2.t, d_rstd2.t, d_in.t, d_b.t, d_w.t, 1e-6f);
      rmsnorm_bwd(g.ctx, d_dres.t, d_dw.t, d_dout.t, d_in.t, d_w.t, d_rstd.t, true);
      check_close(d_sum.download(), sum, dt, "add_rmsnorm sum " + what);
      check_close(d_out2.download(), out2, dt, "add_rmsnorm out " + what);
      check_close(d_dres.download(), dres, dt, "din accumulated " + what);
    }
  }
}

TEST_CASE("cuda: cuBLASLt linear forward and backward match the CPU", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(7);
  struct Shape {
    int64_t T, K, O;
    bool bias;
  };
  // Odd; 0.5B QKV (with bias); 72B tp 8 gate|up and down projections.
  for (DType dt : kTypes) {
    for (Shape s : {Shape{5, 7, 3, true}, Shape{64, 896, 1152, true}, Shape{16, 8192, 7392, false},
                    Shape{16, 3696, 8192, false}}) {
      if (large(s.K * s.O)) continue;
      const int64_t T = s.T, K = s.K, O = s.O;
      std::vector<float> in = random_values(T * K, rng, dt), w = random_values(O * K, rng, dt),
                         b = random_values(O, rng, dt), dout = random_values(T * O, rng, dt);
      std::vector<float> out(T * O), din(T * K), dw = random_values(O * K, rng, DType::f32),
                                                 db = random_values(O, rng, DType::f32);
      const std::vector<float> dw0 = dw, db0 = db;
      Tensor hb = s.bias ? host(b, {O}) : Tensor();
      linear_fwd(cpu_ctx, host(out, {T, O}), host(in, {T, K}), host(w, {O, K}), hb);
      linear_bwd(cpu_ctx, host(din, {T, K}), host(dw, {O, K}), s.bias ? host(db, {O}) : Tensor(),
                 host(dout, {T, O}), host(in, {T, K}), host(w, {O, K}));
      Dev d_in(dt, {T, K}, in), d_w(dt, {O, K}, w), d_b(dt, {O}, b), d_out(dt, {T, O}),
          d_dout(dt, {T, O}, dout), d_din(dt, {T, K}), d_dw(DType::f32, {O, K}, dw0),
          d_db(DType::f32, {O}, db0);
      linear_fwd(g.ctx, d_out.t, d_in.t, d_w.t, s.bias ? d_b.t : Tensor());
      linear_bwd(g.ctx, d_din.t, d_dw.t, s.bias ? d_db.t : Tensor(), d_dout.t, d_in.t, d_w.t);
      const std::string what = std::string(dtype_name(dt)) + " T=" + std::to_string(T) +
                               " K=" + std::to_string(K) + " O=" + std::to_string(O);
      check_close(d_out.download(), out, dt, "out " + what);
      check_close(d_din.download(), din, dt, "din " + what);
      check_close(d_dw.download(), dw, dt, "dweight (accumulated) " + what);
      if (s.bias) check_close(d_db.download(), db, dt, "dbias (accumulated) " + what);
      // A step's first micro-batch assigns (beta 0) over what the buffers held.
      linear_bwd(cpu_ctx, Tensor(), host(dw, {O, K}), s.bias ? host(db, {O}) : Tensor(),
                 host(dout, {T, O}), host(in, {T, K}), host(w, {O, K}), GradWrite::assign);
      linear_bwd(g.ctx, Tensor(), d_dw.t, s.bias ? d_db.t : Tensor(), d_dout.t, d_in.t, d_w.t,
                 GradWrite::assign);
      check_close(d_dw.download(), dw, dt, "dweight (assigned) " + what);
      if (s.bias) check_close(d_db.download(), db, dt, "dbias (assigned) " + what);
      if (!s.bias) continue;
      // A bias at other offsets of a buffer (as a flat buffer's views are): 2 or 4 bytes (added
      // apart from the GEMM), 8 bytes (still apart) and 16 bytes (the epilogue, with a plan of
      // its own for that alignment).
      for (int64_t at : {int64_t{1}, int64_t{4}, static_cast<int64_t>(16 / dtype_size(dt))}) {
        std::vector<float> shifted(static_cast<size_t>(O + at), 0.0f);
        std::copy(b.begin(), b.end(), shifted.begin() + at);
        Dev d_shifted(dt, {O + at}, shifted);
        d_out.poison();
        linear_fwd(g.ctx, d_out.t, d_in.t, d_w.t, d_shifted.t.at(at, {O}));
        check_close(
            d_out.download(), out, dt,
            "out with the bias at byte " + std::to_string(at * dtype_size(dt)) + " " + what);
      }
    }
  }
}

// The whole-vocabulary op's fused kernel (online softmax, 16-byte loads) and the first one.
TEST_CASE("cuda: cross-entropy in place, whole and vocab-parallel, matches the CPU", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(8);
  // (rows, local vocabulary, valid columns): odd; 0.5B (151936 padded to 152064); 72B tp 8.
  for (DType dt : kTypes) {
    for (auto [C, Vl, valid] : {std::tuple<int64_t, int64_t, int64_t>{3, 10, 7},
                                {16, 152064, 151936},
                                {8, 19008, 19008}}) {
      if (large(C * Vl)) continue;
      std::vector<float> logits = random_values(C * Vl, rng, dt, -8, 8);
      std::vector<float> tgt(C);
      for (int64_t r = 0; r < C; ++r) tgt[r] = static_cast<float>((r * 7919) % valid);
      tgt[1] = -1.0f;  // ignored (data.eod_mask_loss): loss 0, gradient row 0
      std::vector<int32_t> tgt_i(tgt.begin(), tgt.end());
      Tensor targets(tgt_i.data(), DType::i32, Device::cpu, {C});
      const float scale = 1.0f / 3.0f;
      // Whole vocabulary in one op.
      std::vector<float> grad = logits, losses(C);
      cross_entropy_fwd_bwd(cpu_ctx, host(losses, {C}), host(grad, {C, Vl}), targets, valid, scale,
                            true);
      Dev d_logits(dt, {C, Vl}, logits), d_losses(DType::f32, {C}), d_tgt(DType::i32, {C}, tgt);
      cross_entropy_fwd_bwd(g.ctx, d_losses.t, d_logits.t, d_tgt.t, valid, scale, true);
      const std::string what = std::string(dtype_name(dt)) + " V=" + std::to_string(Vl);
      check_close(d_losses.download(), losses, DType::f32, "losses " + what);
      check_close(d_logits.download(), grad, dt, "gradient " + what);
      // The three-pass kernel (TR_XENT_3PASS=1): the same results, and it did run.
      {
        const ScopedSwitch three(Switch::xent_3pass, true);
        const int64_t before = taken_count(Switch::xent_3pass);
        d_logits.upload(logits);
        d_losses.poison();
        cross_entropy_fwd_bwd(g.ctx, d_losses.t, d_logits.t, d_tgt.t, valid, scale, true);
        CHECK(taken_count(Switch::xent_3pass) == before + 1);
      }
      check_close(d_losses.download(), losses, DType::f32, "three-pass losses " + what);
      check_close(d_logits.download(), grad, dt, "three-pass gradient " + what);
      // The vocab-parallel steps on the same shard (offset 0, one rank): the same results.
      std::vector<float> rmax(C), sums(2 * C), losses2(C), grad2 = logits;
      xent_row_max(cpu_ctx, host(rmax, {C}), host(grad2, {C, Vl}), valid);
      xent_sums(cpu_ctx, host(sums, {C, 2}), host(grad2, {C, Vl}), targets, host(rmax, {C}), 0,
                valid);
      xent_loss_grad(cpu_ctx, host(losses2, {C}), host(grad2, {C, Vl}), targets, host(rmax, {C}),
                     host(sums, {C, 2}), 0, valid, scale, true);
      Dev e_logits(dt, {C, Vl}, logits), e_max(DType::f32, {C}), e_sums(DType::f32, {C, 2}),
          e_losses(DType::f32, {C});
      xent_row_max(g.ctx, e_max.t, e_logits.t, valid);
      xent_sums(g.ctx, e_sums.t, e_logits.t, d_tgt.t, e_max.t, 0, valid);
      xent_loss_grad(g.ctx, e_losses.t, e_logits.t, d_tgt.t, e_max.t, e_sums.t, 0, valid, scale,
                     true);
      check_close(e_max.download(), rmax, DType::f32, "row max " + what);
      check_close(e_sums.download(), sums, DType::f32, "sums " + what);
      check_close(e_losses.download(), losses2, DType::f32, "vocab-parallel losses " + what);
      check_close(e_logits.download(), grad2, dt, "vocab-parallel gradient " + what);
      // The two-pass form: this shard's statistics in one pass, combined with a second rank's
      // (the second half of the shard's columns as if it were another rank's, vocab offset
      // Vl / 2), then the packed gradient pass.
      const int64_t half = Vl / 2,
                    half_valid[2] = {std::min(valid, half), std::max<int64_t>(0, valid - half)};
      std::vector<float> stats(2 * C * 3);
      for (int r = 0; r < 2; ++r) {
        std::vector<float> part(C * half);
        for (int64_t i = 0; i < C; ++i)
          for (int64_t j = 0; j < half; ++j) part[i * half + j] = logits[i * Vl + r * half + j];
        xent_shard_stats(cpu_ctx, Tensor(stats.data() + r * C * 3, DType::f32, Device::cpu, {C, 3}),
                         host(part, {C, half}), targets, r * half, half_valid[r]);
        Dev d_part(dt, {C, half}, part), d_stats(DType::f32, {C, 3});
        xent_shard_stats(g.ctx, d_stats.t, d_part.t, d_tgt.t, r * half, half_valid[r]);
        check_close(d_stats.download(),
                    std::vector<float>(stats.begin() + r * C * 3, stats.begin() + (r + 1) * C * 3),
                    DType::f32, "shard statistics " + std::to_string(r) + " " + what);
      }
      std::vector<float> cmax(C), csums(2 * C), losses3(C), grad3 = logits;
      xent_combine(cpu_ctx, host(cmax, {C}), host(csums, {C, 2}), host(stats, {2, C, 3}));
      Dev d_all(DType::f32, {2, C, 3}, stats), f_max(DType::f32, {C}), f_sums(DType::f32, {C, 2}),
          f_logits(dt, {C, Vl}, logits), f_losses(DType::f32, {C});
      xent_combine(g.ctx, f_max.t, f_sums.t, d_all.t);
      check_close(f_max.download(), cmax, DType::f32, "combined row max " + what);
      check_close(f_sums.download(), csums, DType::f32, "combined sums " + what);
      check_close(f_max.download(), rmax, DType::f32, "combined row max = three steps' " + what);
      check_close(f_sums.download(), sums, DType::f32, "combined sums = three steps' " + what);
      xent_loss_grad(cpu_ctx, host(losses3, {C}), host(grad3, {C, Vl}), targets, host(cmax, {C}),
                     host(csums, {C, 2}), 0, valid, scale, true);
      xent_loss_grad(g.ctx, f_losses.t, f_logits.t, d_tgt.t, f_max.t, f_sums.t, 0, valid, scale,
                     true);
      check_close(f_losses.download(), losses3, DType::f32, "two-pass losses " + what);
      check_close(f_logits.download(), grad3, dt, "two-pass gradient " + what);
    }
  }
}

TEST_CASE("cuda: cuDNN causal GQA attention, forward and both backwards, matches the CPU",
          "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(9);
  struct Shape {
    int batch, seq, nh, nkv, hd;
  };
  // Small; the end-to-end tests' tiny model (micro-batch 4 of 32 tokens, 4 q / 2 kv heads of 16);
  // odd sequence lengths; Qwen2.5-0.5B (14 q / 2 kv heads, hd 64); 72B at tp 8 (8 q / 1 kv head,
  // hd 128). A shape cuDNN refuses ends the run with one line naming it.
  for (Shape s : {Shape{1, 16, 2, 1, 64}, Shape{4, 32, 4, 2, 16}, Shape{2, 33, 4, 2, 16},
                  Shape{1, 77, 14, 2, 64}, Shape{2, 128, 14, 2, 64}, Shape{1, 256, 8, 1, 128},
                  Shape{1, 4096, 14, 2, 64}}) {
    if (large(int64_t{s.batch} * s.seq * (s.nh + 2 * s.nkv) * s.hd)) continue;
    const DType dt = DType::bf16;
    const int64_t T = int64_t{s.batch} * s.seq, W = int64_t{s.nh + 2 * s.nkv} * s.hd,
                  O = int64_t{s.nh} * s.hd;
    std::vector<float> qkv = random_values(T * W, rng, dt, -2, 2),
                       dout = random_values(T * O, rng, dt);
    std::vector<float> out(T * O), lse(int64_t{s.batch} * s.nh * s.seq), dqkv(T * W);
    attention_fwd(cpu_ctx, host(out, {T, O}), host(lse, {s.batch, s.nh, s.seq}), host(qkv, {T, W}),
                  s.batch, s.seq, s.nh, s.nkv, s.hd);
    Dev d_qkv(dt, {T, W}, qkv), d_out(dt, {T, O}), d_lse(DType::f32, {s.batch, s.nh, s.seq}),
        d_dout(dt, {T, O}, dout), d_dqkv(dt, {T, W});
    attention_fwd(g.ctx, d_out.t, d_lse.t, d_qkv.t, s.batch, s.seq, s.nh, s.nkv, s.hd);
    // The CPU backward from the GPU's (bf16) output, as the model would run it.
    std::vector<float> gpu_out = d_out.download();
    attention_bwd(cpu_ctx, host(dqkv, {T, W}), host(dout, {T, O}), host(gpu_out, {T, O}),
                  host(lse, {s.batch, s.nh, s.seq}), host(qkv, {T, W}), s.batch, s.seq, s.nh, s.nkv,
                  s.hd);
    attention_bwd(g.ctx, d_dqkv.t, d_dout.t, d_out.t, d_lse.t, d_qkv.t, s.batch, s.seq, s.nh, s.nkv,
                  s.hd);
    const std::string what = "nh=" + std::to_string(s.nh) + " nkv=" + std::to_string(s.nkv) +
                             " hd=" + std::to_string(s.hd) + " seq=" + std::to_string(s.seq);
    check_close(gpu_out, out, dt, "out " + what);
    const double lse_err = test::rel_err(d_lse.download(), lse);
    INFO("lse " << what << ": relative error " << lse_err);
    CHECK(lse_err < 1e-3);
    const std::vector<float> first = d_dqkv.download();
    check_close(first, dqkv, dt, "dqkv " + what);
    // The deterministic backward repeats its bits, where cuDNN could build it (else the run fell
    // back to the fast one with a warning, and only the values are checked).
    if (cuda::attention_bwd_deterministic(g.ctx, s.batch, s.seq, s.nh, s.nkv, s.hd)) {
      d_dqkv.poison();
      attention_bwd(g.ctx, d_dqkv.t, d_dout.t, d_out.t, d_lse.t, d_qkv.t, s.batch, s.seq, s.nh,
                    s.nkv, s.hd);
      CHECK(std::memcmp(first.data(), d_dqkv.download().data(), first.size() * 4) == 0);
    } else {
      WARN("deterministic attention backward unavailable for "
           << what << " (cuDNN " << cuda::library_versions().cudnn << ")");
    }
    // train.deterministic: false: cuDNN's fast backward, the same values within bf16 (its bits
    // may differ run to run). The graph that ran is the fast one, not a silent fallback.
    Ctx fast = g.ctx;
    fast.deterministic = false;
    CHECK_FALSE(cuda::attention_bwd_deterministic(fast, s.batch, s.seq, s.nh, s.nkv, s.hd));
    d_dqkv.poison();
    attention_bwd(fast, d_dqkv.t, d_dout.t, d_out.t, d_lse.t, d_qkv.t, s.batch, s.seq, s.nh, s.nkv,
                  s.hd);
    check_close(d_dqkv.download(), dqkv, dt, "fast dqkv " + what);
  }
}

// Context parallelism's ops: cuDNN on blocks (a query block over a key block before it, and the
// causal diagonal), the log-sum-exp merge, and the qkv split and join, against the CPU.
TEST_CASE("cuda: attention blocks, their merge and the qkv split match the CPU", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(30);
  struct Shape {
    int64_t C, nh, nkv, hd;
  };
  // The tiny model's chunks (cp 2 of 32 tokens: 8); 0.5B's heads; 72B's at tp 8, in 1K-token
  // chunks (the CPU reference is quadratic in C: 4K chunks took it minutes).
  for (Shape s : {Shape{8, 4, 2, 16}, Shape{64, 14, 2, 64}, Shape{1024, 8, 1, 128}}) {
    if (large(s.C * s.nh * s.hd)) continue;
    const DType dt = DType::bf16;
    const std::string what = "C=" + std::to_string(s.C) + " nh=" + std::to_string(s.nh) +
                             " nkv=" + std::to_string(s.nkv) + " hd=" + std::to_string(s.hd);
    const int64_t Q = s.C * s.nh * s.hd, K = s.C * s.nkv * s.hd, n = s.nh * s.C;
    std::vector<float> q = random_values(Q, rng, dt, -2, 2), k = random_values(K, rng, dt, -2, 2),
                       v = random_values(K, rng, dt), dout = random_values(Q, rng, dt);
    auto hq = [&](std::vector<float>& x) { return host(x, {s.C, s.nh, s.hd}); };
    auto hk = [&](std::vector<float>& x) { return host(x, {s.C, s.nkv, s.hd}); };
    Dev d_q(dt, {s.C, s.nh, s.hd}, q), d_k(dt, {s.C, s.nkv, s.hd}, k),
        d_v(dt, {s.C, s.nkv, s.hd}, v), d_dout(dt, {s.C, s.nh, s.hd}, dout);
    for (bool causal : {true, false}) {
      INFO(what << (causal ? " causal" : " all visible"));
      std::vector<float> out(Q), lse(n), dq(Q), dk(K), dv(K);
      attention_block_fwd(cpu_ctx, hq(out), host(lse, {s.nh, s.C}), hq(q), hk(k), hk(v), causal);
      Dev d_out(dt, {s.C, s.nh, s.hd}), d_lse(DType::f32, {s.nh, s.C});
      attention_block_fwd(g.ctx, d_out.t, d_lse.t, d_q.t, d_k.t, d_v.t, causal);
      std::vector<float> gpu_out = d_out.download();
      check_close(gpu_out, out, dt, "block out");
      CHECK(test::rel_err(d_lse.download(), lse) < 1e-3);
      attention_block_bwd(cpu_ctx, hq(dq), hk(dk), hk(dv), hq(dout), hq(gpu_out),
                          host(lse, {s.nh, s.C}), hq(q), hk(k), hk(v), causal);
      Dev d_dq(dt, {s.C, s.nh, s.hd}), d_dk(dt, {s.C, s.nkv, s.hd}), d_dv(dt, {s.C, s.nkv, s.hd});
      attention_block_bwd(g.ctx, d_dq.t, d_dk.t, d_dv.t, d_dout.t, d_out.t, d_lse.t, d_q.t, d_k.t,
                          d_v.t, causal);
      check_close(d_dq.download(), dq, dt, "block dq");
      check_close(d_dk.download(), dk, dt, "block dk");
      check_close(d_dv.download(), dv, dt, "block dv");
    }
    // The merge of two partials (the second's lse partly -inf: a row that saw no key).
    std::vector<float> o1 = random_values(Q, rng, dt), o2 = random_values(Q, rng, dt),
                       l1 = random_values(n, rng, DType::f32, -3, 3),
                       l2 = random_values(n, rng, DType::f32, -3, 3);
    for (int64_t i = 0; i < n; i += 7) l2[i] = -std::numeric_limits<float>::infinity();
    Dev d_o1(dt, {s.C, s.nh, s.hd}, o1), d_o2(dt, {s.C, s.nh, s.hd}, o2),
        d_l1(DType::f32, {s.nh, s.C}, l1), d_l2(DType::f32, {s.nh, s.C}, l2);
    attention_merge(cpu_ctx, hq(o1), host(l1, {s.nh, s.C}), hq(o2), host(l2, {s.nh, s.C}));
    attention_merge(g.ctx, d_o1.t, d_l1.t, d_o2.t, d_l2.t);
    check_close(d_o1.download(), o1, dt, "merged out " + what);
    CHECK(test::rel_err(d_l1.download(), l1) < 1e-6);
    // Split then join: the packed rows back, exactly.
    const int64_t W = (s.nh + 2 * s.nkv) * s.hd;
    std::vector<float> rows = random_values(s.C * W, rng, dt);
    Dev d_rows(dt, {s.C, W}, rows), d_back(dt, {s.C, W});
    qkv_split(g.ctx, d_q.t, d_k.t, d_v.t, d_rows.t);
    std::vector<float> cq(Q), ck(K), cv(K);
    qkv_split(cpu_ctx, hq(cq), hk(ck), hk(cv), host(rows, {s.C, W}));
    CHECK(d_q.download() == cq);
    CHECK(d_v.download() == cv);
    qkv_join(g.ctx, d_back.t, d_q.t, d_k.t, d_v.t);
    CHECK(d_back.download() == rows);
  }
}

// Document starts for `batch` sequences of `seq` rows: documents of random lengths from 1 to
// `longest` (one-token documents included), a sequence's first row beginning one.
std::vector<int32_t> random_documents(int64_t batch, int64_t seq, int64_t longest,
                                      std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> len(1, longest);
  std::vector<int32_t> start;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t at = 0; at < seq;) {
      const int64_t n = std::min(len(rng), seq - at);
      for (int64_t i = 0; i < n; ++i) start.push_back(static_cast<int32_t>(at));
      at += n;
    }
  return start;
}

// Statistics with rows that saw no key (-inf): the same rows, and the others close.
void check_lse(const std::vector<float>& gpu, const std::vector<float>& cpu,
               const std::string& what) {
  REQUIRE(gpu.size() == cpu.size());
  std::vector<float> g, c;
  int64_t mismatched = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (std::isinf(cpu[i]) || std::isinf(gpu[i])) {
      mismatched += !(std::isinf(cpu[i]) && std::isinf(gpu[i]) && cpu[i] < 0 && gpu[i] < 0);
      continue;
    }
    g.push_back(gpu[i]);
    c.push_back(cpu[i]);
  }
  INFO(what);
  CHECK(mismatched == 0);
  if (!c.empty()) CHECK(test::rel_err(g, c) < 1e-3);
}

// Outputs whose reference is all zeros (no row saw a key) compare exactly.
void check_close_or_zero(const std::vector<float>& gpu, const std::vector<float>& cpu,
                         const std::string& what) {
  if (std::all_of(cpu.begin(), cpu.end(), [](float x) { return x == 0; })) {
    INFO(what);
    CHECK(gpu == cpu);
  } else {
    check_close(gpu, cpu, DType::bf16, what);
  }
}

// Starts of `batch` sequences of `seq` rows cut into documents of `lengths` in turn (each
// sequence's last one cut at its end).
std::vector<int32_t> documents_of(int64_t batch, int64_t seq, const std::vector<int64_t>& lengths) {
  std::vector<int32_t> start;
  size_t next = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t at = 0; at < seq;) {
      const int64_t n = std::min(lengths[next++ % lengths.size()], seq - at);
      for (int64_t i = 0; i < n; ++i) start.push_back(static_cast<int32_t>(at));
      at += n;
    }
  return start;
}

// A DocStarts over a device copy of `start`, its host copy `start` itself.
struct DevDocs {
  Dev start;
  const std::vector<int32_t>& host;
  explicit DevDocs(const std::vector<int32_t>& s)
      : start(DType::i32, {static_cast<int64_t>(s.size())}, std::vector<float>(s.begin(), s.end())),
        host(s) {}
  DocStarts docs() const { return {start.t, host.data()}; }
};
DocStarts host_docs(std::vector<int32_t>& s) {
  return host_doc_starts(
      Tensor(s.data(), DType::i32, Device::cpu, {static_cast<int64_t>(s.size())}));
}

// Set bits of n: the parts (and launches) of n documents.
int64_t parts_of(int64_t n) {
  int64_t bits = 0;
  for (; n > 0; n >>= 1) bits += n & 1;
  return bits;
}

struct DocShape {
  int batch, seq, nh, nkv, hd;
};

// Block-causal attention over the packed rows' documents `start`: cuDNN's ragged batches against
// the CPU's per-document masks, forward and backward, each part of the documents one launch.
void check_documents(GpuCtx& g, const DocShape& s, std::vector<int32_t>& start, std::mt19937& rng) {
  const DType dt = DType::bf16;
  const int64_t T = int64_t{s.batch} * s.seq, W = int64_t{s.nh + 2 * s.nkv} * s.hd,
                O = int64_t{s.nh} * s.hd;
  const DevDocs dev(start);
  const DocCount found = count_documents(start.data(), T, s.seq);
  const std::string what = "batch=" + std::to_string(s.batch) + " seq=" + std::to_string(s.seq) +
                           " nh=" + std::to_string(s.nh) +
                           " documents=" + std::to_string(found.count) +
                           " longest=" + std::to_string(found.longest);
  INFO(what);
  std::vector<float> qkv = random_values(T * W, rng, dt, -2, 2),
                     dout = random_values(T * O, rng, dt);
  std::vector<float> out(T * O), lse(T * s.nh), dqkv(T * W);
  const DocStarts cpu_docs = host_docs(start);
  attention_fwd(cpu_ctx, host(out, {T, O}), host(lse, {s.batch, s.nh, s.seq}), host(qkv, {T, W}),
                s.batch, s.seq, s.nh, s.nkv, s.hd, cpu_docs);
  Dev d_qkv(dt, {T, W}, qkv), d_out(dt, {T, O}), d_lse(DType::f32, {s.batch, s.nh, s.seq}),
      d_dout(dt, {T, O}, dout), d_dqkv(dt, {T, W});
  const int64_t before = attention_ragged_launches();
  attention_fwd(g.ctx, d_out.t, d_lse.t, d_qkv.t, s.batch, s.seq, s.nh, s.nkv, s.hd, dev.docs());
  CHECK(attention_ragged_launches() - before == parts_of(found.count));
  std::vector<float> gpu_out = d_out.download();
  check_close(gpu_out, out, dt, "out " + what);
  check_lse(d_lse.download(), lse, "lse " + what);
  attention_bwd(cpu_ctx, host(dqkv, {T, W}), host(dout, {T, O}), host(gpu_out, {T, O}),
                host(lse, {s.batch, s.nh, s.seq}), host(qkv, {T, W}), s.batch, s.seq, s.nh, s.nkv,
                s.hd, cpu_docs);
  attention_bwd(g.ctx, d_dqkv.t, d_dout.t, d_out.t, d_lse.t, d_qkv.t, s.batch, s.seq, s.nh, s.nkv,
                s.hd, dev.docs());
  CHECK(attention_ragged_launches() - before == 2 * parts_of(found.count));
  check_close(d_dqkv.download(), dqkv, dt, "dqkv " + what);
}

// The shapes: the tiny model; 0.5B's heads; 72B's at tp 8.
const DocShape kTiny{4, 32, 4, 2, 16}, kHalfB{2, 256, 14, 2, 64}, k72Tp8{1, 1024, 8, 1, 128};

// The device's ragged table (every part at its aligned slot, no entry empty) is the host's
// (kernels/ragged.h ragged_table, checked on the CPU in test_kernels).
TEST_CASE("cuda: block-causal attention's ragged table is the host's", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(41);
  for (int64_t longest : {1, 9, 40, 700}) {
    std::vector<int32_t> start = random_documents(2, 1024, longest, rng);
    const int64_t rows = static_cast<int64_t>(start.size()), period = 1024;
    const RaggedParts parts = ragged_parts(start.data(), rows, period);
    const RaggedTableRows want = ragged_table(parts, start.data(), rows, period);
    INFO("documents=" << parts.documents << " parts=" << parts.n);
    const DevDocs dev(start);
    Buffer lens(2 * parts.slots * sizeof(int32_t), Device::cuda),
        offs(4 * (parts.slots + 1) * sizeof(int64_t), Device::cuda),
        first((parts.documents + 1) * sizeof(int64_t), Device::cuda);
    CUDA_CHECK(cudaMemset(lens.data(), 0xff, lens.bytes()));
    CUDA_CHECK(cudaMemset(offs.data(), 0xff, offs.bytes()));
    auto* len = static_cast<int32_t*>(lens.data());
    auto* off = static_cast<int64_t*>(offs.data());
    const int64_t n = parts.slots + 1;
    const cuda::RaggedTable table{len, len + parts.slots, off, off + n, off + 2 * n, off + 3 * n};
    const cuda::RaggedRows w{7, 5, 3, 2};  // each tensor's row width, distinct
    cuda::ragged_documents(g.ctx, table, parts, static_cast<int64_t*>(first.data()),
                           dev.start.t.ptr<int32_t>(), rows, period, w);
    std::vector<int32_t> got_len(2 * parts.slots);
    std::vector<int64_t> got_off(4 * n);
    copy_tensor(Tensor(got_len.data(), DType::i32, Device::cpu, {2 * parts.slots}),
                Tensor(len, DType::i32, Device::cuda, {2 * parts.slots}));
    copy_tensor(Tensor(got_off.data(), DType::i64, Device::cpu, {4 * n}),
                Tensor(off, DType::i64, Device::cuda, {4 * n}));
    int64_t used = 0;
    for (int64_t slot = 0; slot < parts.slots; ++slot) {
      if (want.len[slot] < 0) continue;
      ++used;
      INFO("slot " << slot);
      CHECK(want.len[slot] > 0);
      CHECK(got_len[slot] == want.len[slot]);
      CHECK(got_len[parts.slots + slot] == want.len[slot]);
    }
    CHECK(used == parts.documents);
    for (int64_t slot = 0; slot <= parts.slots; ++slot) {
      if (want.row[slot] < 0) continue;
      INFO("offset slot " << slot);
      CHECK(got_off[slot] == want.row[slot] * w.q);
      CHECK(got_off[n + slot] == want.row[slot] * w.kv);
      CHECK(got_off[2 * n + slot] == want.row[slot] * w.o);
      CHECK(got_off[3 * n + slot] == want.row[slot] * w.stats);
    }
  }
}

TEST_CASE("cuda: block-causal attention, a power-of-two document count (one launch)", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(43);
  // 8, 8 and 16 documents: each call one launch of one graph.
  for (const auto& [s, lengths] :
       {std::pair<DocShape, std::vector<int64_t>>{kTiny, {16}}, {kHalfB, {64}}, {k72Tp8, {64}}}) {
    if (large(int64_t{s.batch} * s.seq * (s.nh + 2 * s.nkv) * s.hd)) continue;
    std::vector<int32_t> start = documents_of(s.batch, s.seq, lengths);
    check_documents(g, s, start, rng);
  }
}

TEST_CASE("cuda: block-causal attention, other document counts (a launch per part)", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(44);
  // 13 = 8 + 4 + 1 documents of mixed lengths, 7 = 4 + 2 + 1, and random ones (short and long).
  std::vector<int32_t> thirteen = documents_of(1, 256, {3, 40, 1, 17, 9, 30, 2, 50, 5, 11, 8, 20});
  std::vector<int32_t> seven = documents_of(1, 1024, {300, 1, 100, 64, 7, 500});
  REQUIRE(count_documents(thirteen.data(), 256, 256).count == 13);
  REQUIRE(count_documents(seven.data(), 1024, 1024).count == 7);
  check_documents(g, {1, 256, 14, 2, 64}, thirteen, rng);
  if (!large(1024 * 10 * 128)) check_documents(g, {1, 1024, 8, 1, 128}, seven, rng);
  for (const auto& [s, longest] : {std::pair<DocShape, int64_t>{kTiny, 9},
                                   {kHalfB, 40},
                                   {DocShape{1, 1024, 14, 2, 64}, 700},
                                   {k72Tp8, 300}}) {
    if (large(int64_t{s.batch} * s.seq * (s.nh + 2 * s.nkv) * s.hd)) continue;
    std::vector<int32_t> start = random_documents(s.batch, s.seq, longest, rng);
    check_documents(g, s, start, rng);
  }
}

// Context parallelism's blocks: a chunk of C queries at position q_first whose first document
// began at `first_doc`, against the CPU.
struct BlockCase {
  bool causal;
  int64_t k_first, first_doc;
  std::vector<int64_t> lengths;  // the documents' rows in the chunk (the last to its end)
  int64_t launches;              // the ragged launches of the forward (and of the backward)
};
void check_blocks(const std::vector<BlockCase>& cases) {
  GpuCtx g;
  std::mt19937 rng(45);
  const DType dt = DType::bf16;
  const int64_t C = 128, nh = 8, nkv = 2, hd = 64;
  const int64_t Q = C * nh * hd, K = C * nkv * hd;
  std::vector<float> q = random_values(Q, rng, dt, -2, 2), k = random_values(K, rng, dt, -2, 2),
                     v = random_values(K, rng, dt), dout = random_values(Q, rng, dt);
  auto hq = [&](std::vector<float>& x) { return host(x, {C, nh, hd}); };
  auto hk = [&](std::vector<float>& x) { return host(x, {C, nkv, hd}); };
  Dev d_q(dt, {C, nh, hd}, q), d_k(dt, {C, nkv, hd}, k), d_v(dt, {C, nkv, hd}, v),
      d_dout(dt, {C, nh, hd}, dout);
  const int64_t q_first = 3 * C;
  for (const BlockCase& c : cases) {
    std::vector<int32_t> start(C);
    int64_t doc = c.first_doc, i = 0;
    for (int64_t n : c.lengths) {
      for (int64_t r = 0; r < n && i < C; ++r) start[i++] = static_cast<int32_t>(doc);
      doc = q_first + i;
    }
    INFO((c.causal ? "diagonal" : "earlier keys")
         << " k_first=" << c.k_first << " first document at " << c.first_doc << ", "
         << c.lengths.size() << " documents");
    const DocStarts cpu_docs = host_docs(start);
    const DevDocs dev(start);
    std::vector<float> out(Q), lse(nh * C), dq(Q), dk(K), dv(K);
    attention_block_fwd(cpu_ctx, hq(out), host(lse, {nh, C}), hq(q), hk(k), hk(v), c.causal,
                        cpu_docs, c.k_first);
    Dev d_out(dt, {C, nh, hd}), d_lse(DType::f32, {nh, C});
    const int64_t before = attention_ragged_launches();
    attention_block_fwd(g.ctx, d_out.t, d_lse.t, d_q.t, d_k.t, d_v.t, c.causal, dev.docs(),
                        c.k_first);
    CHECK(attention_ragged_launches() - before == c.launches);
    std::vector<float> gpu_out = d_out.download();
    check_close_or_zero(gpu_out, out, "block out");
    check_lse(d_lse.download(), lse, "block lse");
    attention_block_bwd(cpu_ctx, hq(dq), hk(dk), hk(dv), hq(dout), hq(gpu_out), host(lse, {nh, C}),
                        hq(q), hk(k), hk(v), c.causal, cpu_docs, c.k_first);
    Dev d_dq(dt, {C, nh, hd}), d_dk(dt, {C, nkv, hd}), d_dv(dt, {C, nkv, hd});
    attention_block_bwd(g.ctx, d_dq.t, d_dk.t, d_dv.t, d_dout.t, d_out.t, d_lse.t, d_q.t, d_k.t,
                        d_v.t, c.causal, dev.docs(), c.k_first);
    CHECK(attention_ragged_launches() - before == 2 * c.launches);
    check_close_or_zero(d_dq.download(), dq, "block dq");
    check_close_or_zero(d_dk.download(), dk, "block dk");
    check_close_or_zero(d_dv.download(), dv, "block dv");
  }
}

const std::vector<int64_t> kFour = {37, 1, 50, 128}, kFive = {10, 20, 1, 40, 128};

// The diagonal, its first document from before it or at its start: 4 documents (one launch) and
// 5 (4 + 1).
TEST_CASE("cuda: block-causal attention blocks, the causal diagonal", "[gpu]") {
  check_blocks({{true, 3 * 128, 128 + 5, kFour, 1}, {true, 3 * 128, 3 * 128, kFive, 2}});
}

// Keys of the chunk before: the first document from before them, from inside them, and from
// their last 5 keys (37 queries over 5 keys); each one launch, the other rows hidden.
TEST_CASE("cuda: block-causal attention blocks of earlier keys", "[gpu]") {
  check_blocks({{false, 2 * 128, 128 + 5, kFour, 1},
                {false, 2 * 128, 2 * 128 + 77, kFour, 1},
                {false, 2 * 128, 3 * 128 - 5, kFour, 1}});
}

// The first document starts after the key block (inside the next chunk, or with the queries):
// no row sees a key, and cuDNN is not called.
TEST_CASE("cuda: block-causal attention blocks that no query sees", "[gpu]") {
  check_blocks({{false, 128, 2 * 128 + 77, kFive, 0}, {false, 0, 3 * 128, kFour, 0}});
}

// Both kernels: the fp32 table one (the default) and the fp64 one (TR_ROPE_FP64=1), which a
// counter shows ran.
TEST_CASE("cuda: rope forward and backward match the CPU", "[gpu]") {
  GpuCtx g;
  for (const char* fp64 : {"0", "1"}) {
    const ScopedSwitch use_fp64(Switch::rope_fp64, fp64[0] == '1');
    const int64_t taken_before = taken_count(Switch::rope_fp64);
    int64_t launches = 0;  // the rope kernels this test ran on the GPU
    std::mt19937 rng(2);
    struct Shape {
      int64_t tokens;
      int heads, rope_heads, hd, seq_len;
    };
    // 0.5B: 14 q + 2 k heads rotated of 18 (v not), hd 64; 72B tp 8: 8 + 1 of 10, hd 128.
    for (DType dt : kTypes) {
      for (Shape s :
           {Shape{8, 3, 2, 8, 4}, Shape{64, 18, 16, 64, 32}, Shape{4096, 10, 9, 128, 4096}}) {
        if (large(s.tokens * s.heads * s.hd)) continue;
        // Plain, YaRN over a quarter of the sequence (Qwen2.5's 32K -> 128K, scaled down), and
        // Llama 3's rule over the same.
        for (const Rope& rope : {Rope::plain(1e6), Rope::yarn_of(1e6, 4.0, s.seq_len / 4.0),
                                 Rope::llama3_of(1e6, 8.0, 1.0, 4.0, s.seq_len / 4.0)}) {
          std::vector<float> x = random_values(s.tokens * s.heads * s.hd, rng, dt);
          std::vector<float> fwd = x, bwd = x;
          rope_fwd(cpu_ctx, host(fwd, {s.tokens, s.heads, s.hd}), s.rope_heads, s.seq_len, rope);
          rope_bwd(cpu_ctx, host(bwd, {s.tokens, s.heads, s.hd}), s.rope_heads, s.seq_len, rope);
          Dev a(dt, {s.tokens, s.heads, s.hd}, x), b(dt, {s.tokens, s.heads, s.hd}, x);
          rope_fwd(g.ctx, a.t, s.rope_heads, s.seq_len, rope);
          rope_bwd(g.ctx, b.t, s.rope_heads, s.seq_len, rope);
          launches += 2;
          const std::string what = std::string(dtype_name(dt)) + " hd=" + std::to_string(s.hd) +
                                   " TR_ROPE_FP64=" + fp64 +
                                   (rope.yarn     ? " yarn"
                                    : rope.llama3 ? " llama3"
                                                  : "");
          check_close(a.download(), fwd, dt, "rope_fwd " + what);
          check_close(b.download(), bwd, dt, "rope_bwd " + what);
          // With positions (each sequence's tokens in reverse, as a permutation stands for a
          // context-parallel rank's chunks).
          std::vector<int32_t> rev(static_cast<size_t>(s.seq_len));
          for (int i = 0; i < s.seq_len; ++i) rev[i] = s.seq_len - 1 - i;
          const std::vector<float> rev_f(rev.begin(), rev.end());
          std::vector<float> pf = x;
          rope_fwd(cpu_ctx, host(pf, {s.tokens, s.heads, s.hd}), s.rope_heads, s.seq_len, rope,
                   Tensor(rev.data(), DType::i32, Device::cpu, {s.seq_len}));
          Dev p(dt, {s.tokens, s.heads, s.hd}, x), d_rev(DType::i32, {s.seq_len}, rev_f);
          rope_fwd(g.ctx, p.t, s.rope_heads, s.seq_len, rope, d_rev.t);
          ++launches;
          check_close(p.download(), pf, dt, "rope_fwd with positions " + what);
        }
      }
    }
    // Every launch took the fp64 path, or none did.
    REQUIRE(launches > 0);
    CHECK(taken_count(Switch::rope_fp64) - taken_before == (fp64[0] == '1' ? launches : 0));
  }
}

TEST_CASE("cuda: swiglu forward and backward match the CPU", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(3);
  // (tokens, intermediate): odd, 0.5B (4864), 72B tp 8 (3696).
  for (DType dt : kTypes) {
    for (auto [T, I] : {std::pair<int64_t, int64_t>{3, 7}, {32, 4864}, {8, 3696}}) {
      std::vector<float> gu = random_values(T * 2 * I, rng, dt, -4, 4),
                         dout = random_values(T * I, rng, dt);
      std::vector<float> out(T * I), dgu(T * 2 * I);
      swiglu_fwd(cpu_ctx, host(out, {T, I}), host(gu, {T, 2 * I}));
      swiglu_bwd(cpu_ctx, host(dgu, {T, 2 * I}), host(dout, {T, I}), host(gu, {T, 2 * I}));
      Dev d_gu(dt, {T, 2 * I}, gu), d_out(dt, {T, I}), d_dout(dt, {T, I}, dout),
          d_dgu(dt, {T, 2 * I});
      swiglu_fwd(g.ctx, d_out.t, d_gu.t);
      swiglu_bwd(g.ctx, d_dgu.t, d_dout.t, d_gu.t);
      const std::string what = std::string(dtype_name(dt)) + " I=" + std::to_string(I);
      check_close(d_out.download(), out, dt, "swiglu_fwd " + what);
      check_close(d_dgu.download(), dgu, dt, "swiglu_bwd " + what);
    }
  }
}

TEST_CASE("cuda: embedding forward and deterministic backward match the CPU", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(4);
  for (DType dt : kTypes) {
    // A TP shard: rows [offset, offset + Vl) of a 1000-token vocabulary; repeated tokens.
    for (auto [T, Vl, H, offset] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{7, 5, 12, 0},
                                    {256, 250, 896, 500},
                                    {64, 100, 8192, 900}}) {
      std::vector<float> table = random_values(Vl * H, rng, dt),
                         dout = random_values(T * H, rng, dt);
      std::vector<float> tok(T);
      std::uniform_int_distribution<int> pick(0, 999);
      for (float& t : tok) t = static_cast<float>(pick(rng) % 3 == 0 ? offset + 1 : pick(rng));
      std::vector<int32_t> tok_i(tok.begin(), tok.end());
      Tensor tokens(tok_i.data(), DType::i32, Device::cpu, {T});
      std::vector<float> out(T * H), dtable = random_values(Vl * H, rng, DType::f32);
      const std::vector<float> dtable0 = dtable;
      embedding_fwd(cpu_ctx, host(out, {T, H}), tokens, host(table, {Vl, H}), offset);
      embedding_bwd(cpu_ctx, host(dtable, {Vl, H}), host(dout, {T, H}), tokens, offset);
      Dev d_tok(DType::i32, {T}, tok), d_table(dt, {Vl, H}, table), d_out(dt, {T, H}),
          d_dout(dt, {T, H}, dout), d_dtable(DType::f32, {Vl, H}, dtable0);
      embedding_fwd(g.ctx, d_out.t, d_tok.t, d_table.t, offset);
      embedding_bwd(g.ctx, d_dtable.t, d_dout.t, d_tok.t, offset);
      const std::string what = std::string(dtype_name(dt)) + " H=" + std::to_string(H);
      check_close(d_out.download(), out, dt, "embedding_fwd " + what);
      const std::vector<float> first = d_dtable.download();
      check_close(first, dtable, dt, "embedding_bwd " + what);
      // Deterministic: the same accumulation again gives the same bits.
      d_dtable.upload(dtable0);
      embedding_bwd(g.ctx, d_dtable.t, d_dout.t, d_tok.t, offset);
      CHECK(std::memcmp(first.data(), d_dtable.download().data(), first.size() * 4) == 0);
    }
  }
}

TEST_CASE("cuda: add, scale, cast and the deterministic sum of squares match the CPU", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(5);
  for (DType dt : kTypes) {
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{3} << 20}) {
      if (large(n)) continue;
      std::vector<float> a = random_values(n, rng, dt), b = random_values(n, rng, dt);
      std::vector<float> sum(n);
      add(cpu_ctx, host(sum, {n}), host(a, {n}), host(b, {n}));
      std::vector<float> scaled = a;
      scale_(cpu_ctx, host(scaled, {n}), 0.37f);
      const double sq = sum_squares(cpu_ctx, host(a, {n}));
      Dev d_a(dt, {n}, a), d_b(dt, {n}, b), d_sum(dt, {n}), d_scaled(dt, {n}, a),
          d_cast(DType::f32, {n});
      add(g.ctx, d_sum.t, d_a.t, d_b.t);
      scale_(g.ctx, d_scaled.t, 0.37f);
      cast(g.ctx, d_cast.t, d_a.t);
      const double gsq = sum_squares(g.ctx, d_a.t);
      const std::string what = std::string(dtype_name(dt)) + " n=" + std::to_string(n);
      check_close(d_sum.download(), sum, dt, "add " + what);
      check_close(d_scaled.download(), scaled, dt, "scale_ " + what);
      check_close(d_cast.download(), a, DType::f32, "cast " + what);  // exact: a holds dt's values
      CHECK(std::abs(gsq / sq - 1) < 1e-12);
      CHECK(sum_squares(g.ctx, d_a.t) == gsq);  // bit-identical rerun
      zero_(g.ctx, d_a.t);
      CHECK(sum_squares(g.ctx, d_a.t) == 0.0);
    }
  }
}

// The step's scalars on the device (one read per step): sums and sums of squares added into an
// f64 accumulator match the CPU's, repeat bit for bit, and a pinned upload lands.
TEST_CASE("cuda: device-side loss and norm accumulators, and the pinned token upload", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(8);
  for (DType dt : kTypes) {
    const int64_t n = (int64_t{1} << 20) + 7;
    std::vector<float> a = random_values(n, rng, dt);
    double want_sum = 0, want_sq = 0;
    for (float v : a) want_sum += v, want_sq += static_cast<double>(v) * v;
    Dev d_a(dt, {n}, a);
    Buffer acc_buf(2 * sizeof(double), Device::cuda);
    Tensor acc(acc_buf.data(), DType::f64, Device::cuda, {2});
    zero_(g.ctx, acc);
    accumulate_sum(g.ctx, acc.slice(0, 1), d_a.t);
    accumulate_sum_squares(g.ctx, acc.slice(1, 1), d_a.t);
    accumulate_sum_squares(g.ctx, acc.slice(1, 1), d_a.t);  // accumulates
    double got[2];
    const int64_t syncs = host_sync_count();
    read_f64(g.ctx, acc, got);
    CHECK(host_sync_count() == syncs + 1);
    INFO(dtype_name(dt));
    CHECK(std::abs(got[0] - want_sum) <= 1e-9 * want_sq);
    CHECK(std::abs(got[1] / (2 * want_sq) - 1) < 1e-12);
    CHECK(got[1] == 2 * sum_squares(g.ctx, d_a.t));  // the same partials as sum_squares
    // The norm's pieces: two counted ranges of the flat space [100, 100 + n), one checked only
    // (adds 0 while finite), one left out.
    std::vector<int64_t> pieces = {100, 65536, 1, 100 + 70000, n - 70000, 1, 100 + 65536, 100, 0};
    double want_pieces = 0;
    for (int64_t i = 0; i < n; ++i)
      if (i < 65536 || i >= 70000) want_pieces += static_cast<double>(a[i]) * a[i];
    Buffer pb(pieces.size() * sizeof(int64_t), Device::cuda);
    Tensor tp(pb.data(), DType::i64, Device::cuda, {3, 3});
    copy_tensor(tp, Tensor(pieces.data(), DType::i64, Device::cpu, {3, 3}));
    zero_(g.ctx, acc);
    accumulate_sum_squares_pieces(g.ctx, acc.slice(0, 1), d_a.t, tp, 100);
    read_f64(g.ctx, acc, got);
    CHECK(std::abs(got[0] / want_pieces - 1) < 1e-12);
    // A NaN in the checked-only piece makes the sum NaN; one in the left-out range does not.
    float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<uint16_t> nan_bf16 = {f32_to_bf16(nan)};
    const Tensor host_nan = dt == DType::bf16
                                ? Tensor(nan_bf16.data(), DType::bf16, Device::cpu, {1})
                                : Tensor(&nan, DType::f32, Device::cpu, {1});
    copy_tensor(d_a.t.at(68000, {1}), host_nan);
    zero_(g.ctx, acc);
    accumulate_sum_squares_pieces(g.ctx, acc.slice(0, 1), d_a.t, tp, 100);
    read_f64(g.ctx, acc, got);
    CHECK(std::abs(got[0] / want_pieces - 1) < 1e-12);
    copy_tensor(d_a.t.at(65536 + 50, {1}), host_nan);
    zero_(g.ctx, acc);
    accumulate_sum_squares_pieces(g.ctx, acc.slice(0, 1), d_a.t, tp, 100);
    read_f64(g.ctx, acc, got);
    CHECK(std::isnan(got[0]));
  }
  std::vector<int32_t> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 37 % 151936);
  Buffer pinned = Buffer::pinned(ids.size() * 4);
  std::memcpy(pinned.data(), ids.data(), ids.size() * 4);
  Buffer dev(ids.size() * 4, Device::cuda);
  const int64_t m = static_cast<int64_t>(ids.size());
  upload_async(g.ctx, Tensor(dev.data(), DType::i32, Device::cuda, {m}),
               Tensor(pinned.data(), DType::i32, Device::cpu, {m}));
  std::vector<int32_t> back(ids.size());
  synchronize(g.ctx);
  copy_tensor(Tensor(back.data(), DType::i32, Device::cpu, {m}),
              Tensor(dev.data(), DType::i32, Device::cuda, {m}));
  CHECK(back == ids);
}

// The multi-tensor AdamW: pieces with and without decay, at flat offsets that a ZeRO-1 shard
// holds in another order (param, grad, m and v in the shard, the compute copy flat), the
// clipping scale folded in, against the CPU's pieces.
TEST_CASE("cuda: multi-tensor adamw over pieces matches the CPU", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(12);
  const int64_t n = 300000, base = 1000;  // flat indices [base, base + n)
  std::vector<float> p = random_values(n, rng, DType::f32), gr = random_values(n, rng, DType::f32),
                     m = random_values(n, rng, DType::f32, -0.1f, 0.1f),
                     v = random_values(n, rng, DType::f32, 0.0f, 0.01f);
  // {flat, count, decay, shard}: flat [base, base + 65536) is the shard's last 65536 elements.
  std::vector<int64_t> pieces = {base,         65536,     1, n - 65536, base + 65536, 7, 0, 0,
                                 base + 65543, n - 65543, 1, 7};
  const int64_t k = 3;
  const AdamWParams hp{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 7};
  const AdamWIndex index{true, true};
  std::vector<float> cp = p, cg = gr, cm = m, cv = v;
  adamw_update_pieces(cpu_ctx, host(cp, {n}), host(cg, {n}), host(cm, {n}), host(cv, {n}), Tensor(),
                      Tensor(pieces.data(), DType::i64, Device::cpu, {k, 4}), index, hp, 0.37f);
  Dev d_p(DType::f32, {n}, p), d_g(DType::f32, {n}, gr), d_m(DType::f32, {n}, m),
      d_v(DType::f32, {n}, v), d_copy(DType::bf16, {base + n});
  Buffer d_pieces(pieces.size() * sizeof(int64_t), Device::cuda);
  Tensor tp(d_pieces.data(), DType::i64, Device::cuda, {k, 4});
  copy_tensor(tp, Tensor(pieces.data(), DType::i64, Device::cpu, {k, 4}));
  adamw_update_pieces(g.ctx, d_p.t, d_g.t, d_m.t, d_v.t, d_copy.t, tp, index, hp, 0.37f);
  check_close(d_p.download(), cp, DType::f32, "param");
  check_close(d_m.download(), cm, DType::f32, "m");
  check_close(d_v.download(), cv, DType::f32, "v");
  const std::vector<float> copy = d_copy.download(), master = d_p.download();
  int64_t wrong = 0;
  for (int64_t j = 0; j < k; ++j)
    for (int64_t i = 0; i < pieces[4 * j + 1]; ++i)
      wrong += copy[pieces[4 * j] + i] != round_to_bf16(master[pieces[4 * j + 3] + i]);
  CHECK(wrong == 0);
}

TEST_CASE("cuda: adamw matches the CPU and writes the bf16 compute copy", "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(6);
  const int64_t n = (1 << 20) + 3;
  std::vector<float> p = random_values(n, rng, DType::f32), gr = random_values(n, rng, DType::f32),
                     m = random_values(n, rng, DType::f32, -0.1f, 0.1f),
                     v = random_values(n, rng, DType::f32, 0.0f, 0.01f);
  Dev d_p(DType::f32, {n}, p), d_g(DType::f32, {n}, gr), d_m(DType::f32, {n}, m),
      d_v(DType::f32, {n}, v), d_copy(DType::bf16, {n});
  const AdamWParams hp{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 7};
  adamw_update(cpu_ctx, host(p, {n}), host(gr, {n}), host(m, {n}), host(v, {n}), hp);
  adamw_update(g.ctx, d_p.t, d_g.t, d_m.t, d_v.t, hp, d_copy.t);
  check_close(d_p.download(), p, DType::f32, "param");
  check_close(d_m.download(), m, DType::f32, "m");
  check_close(d_v.download(), v, DType::f32, "v");
  const std::vector<float> copy = d_copy.download(), master = d_p.download();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += copy[i] != round_to_bf16(master[i]);
  CHECK(wrong == 0);
}

}  // namespace
}  // namespace tr

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::string(argv[i]).rfind("--list", 0) == 0;
  if (!listing && !tr::cuda::device_available()) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  if (!listing) std::printf("device: %s\n", tr::cuda::device_name(0).c_str());
  return Catch::Session().run(argc, argv);
}
