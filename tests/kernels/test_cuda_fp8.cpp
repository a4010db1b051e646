// FP8 on the GPU against the CPU oracle (label gpu, in test_cuda_ops): fp8_cast bit for bit
// (codes, transposed codes, scale_inv) over f32 and bf16 inputs and their edge cases;
// linear_fp8 exactly on integer-valued codes with power-of-two scales, and within the FP8
// GEMM's accumulation bound on real data through the casts; the FP8 capability query.
#include <catch2/catch.hpp>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/switches.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/fp8.h"
#include "kernels/ops.h"
#include "tests/kernels/cuda_test_util.h"

namespace tr {
namespace {

using namespace cuda_test;  // NOLINT: the shared helpers of the GPU tests

Fp8Format format_of(DType dt) {
  return dt == DType::f8e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
}

// One input of the cast: what it exercises, its shape and values (before bf16 rounding).
struct CastCase {
  std::string name;
  int64_t rows, cols;
  std::vector<float> x;
};

// An amax whose scale, rounded, takes the amax itself past the format's max
// (fl(fl(max / a) * a) > max), so that its code saturates; a bf16 value, for both input dtypes.
float amax_past_max(Fp8Format f) {
  for (uint32_t b = 0x3f80; b < 0x4480; ++b) {
    const float a = bf16_to_f32(static_cast<uint16_t>(b));
    if (a * fp8_scale(a, f) > fp8_info(f).max) return a;
  }
  FAIL("no amax in [1, 1024) rounds past the max");
  return 0;
}

// Values the cast rounds on a tie, into subnormals, to zero and to the max, at scale 1 (the
// format's max is the amax): ties to even in the normal range and below the max, half the least
// subnormal and just above, 1.5 and 2.5 subnormal steps, subnormals, fp32 subnormals, signed
// zeros.
std::vector<float> ties_at_scale_1(Fp8Format f) {
  const Fp8Info fmt = fp8_info(f);
  const float half_ulp_1 = std::ldexp(1.0f, -fmt.mantissa_bits - 1);
  const float least = std::ldexp(1.0f, 1 - fmt.bias - fmt.mantissa_bits);
  const float below_max = fp8_decode(static_cast<uint8_t>(fmt.max_code - 1), f);
  return {fmt.max,
          -fmt.max,
          1 + half_ulp_1,
          1 + 3 * half_ulp_1,
          -(1 + half_ulp_1),
          (fmt.max + below_max) / 2,
          least / 2,
          std::nextafter(least / 2, 1.0f),
          -least / 2,
          1.5f * least,
          2.5f * least,
          least,
          7 * least,
          -3 * least,
          1e-40f,
          -1e-40f,
          0.0f,
          -0.0f};
}

std::vector<CastCase> cast_cases(Fp8Format f, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1), decades(-3, 3), binades(-30, 0);
  const auto fill = [&](int64_t n, auto value) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = value();
    return v;
  };
  const auto wide = [&] { return u(rng) * std::pow(10.0f, decades(rng)); };
  std::vector<CastCase> cases;
  // Odd and tiny (no 16-byte packs, a partial tile), a 0.5B activation, tiles partial both ways,
  // one element, several blocks of a grid.
  for (auto [r, c] : {std::pair<int64_t, int64_t>{5, 7}, {64, 896}, {130, 70}, {1, 1}, {300, 999}})
    cases.push_back({"six decades", r, c, fill(r * c, wide)});
  cases.push_back({"zeros", 7, 33, fill(7 * 33, [&] { return u(rng) < 0 ? -0.0f : 0.0f; })});
  std::vector<float> past = fill(3 * 17, [&] { return u(rng); });
  const float a = amax_past_max(f);
  past[4] = a, past[20] = -a;
  cases.push_back({"an amax the rounded scale takes past the max", 3, 17, past});
  std::vector<float> ties = ties_at_scale_1(f);
  cases.push_back(
      {"ties, subnormals and zeros at scale 1", 1, static_cast<int64_t>(ties.size()), ties});
  cases.push_back({"ties at scale 1, a column", static_cast<int64_t>(ties.size()), 1, ties});
  cases.push_back({"30 binades below the amax: subnormal and zero codes", 97, 45,
                   fill(97 * 45, [&] { return std::copysign(std::exp2(binades(rng)), u(rng)); })});
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  std::vector<float> with_nan = fill(9 * 40, wide);
  with_nan[3] = nan, with_nan[100] = -nan, with_nan[7] = 1e6f, with_nan[8] = -1e6f;
  cases.push_back({"NaN (scale 1, saturating the rest)", 9, 40, with_nan});
  std::vector<float> with_inf = fill(9 * 40, wide);
  with_inf[5] = inf, with_inf[6] = -inf;
  cases.push_back({"Inf (scale 1)", 9, 40, with_inf});
  cases.push_back({"a tiny amax", 11, 13, fill(11 * 13, [&] { return u(rng) * 1e-30f; })});
  cases.push_back(
      {"a subnormal amax (scale FLT_MAX)", 11, 13, fill(11 * 13, [&] { return u(rng) * 1e-39f; })});
  return cases;
}

// in at element offset `in_at` of its buffer, out and out_t at byte offsets `out_at`: views at odd
// offsets of flat buffers, as the packed and the element-wise paths see them.
struct CastRun {
  bool rows, transposed;
  int64_t in_at = 0, out_at = 0;
};

// fp8_cast of `c` on the GPU equals the CPU's: every code of out and out_t, and scale_inv's bits.
void check_cast(GpuCtx& g, const CastCase& c, DType dt, DType fmt, CastRun run) {
  const int64_t R = c.rows, C = c.cols, n = R * C;
  std::vector<float> x = c.x;
  if (dt == DType::bf16)
    for (float& v : x) v = round_to_bf16(v);
  Ctx cpu;
  std::vector<uint8_t> codes(static_cast<size_t>(n)), codes_t(codes.size());
  float scale_inv = 0;
  fp8_cast(cpu, Tensor(codes.data(), fmt, Device::cpu, {R, C}),
           Tensor(codes_t.data(), fmt, Device::cpu, {C, R}),
           Tensor(&scale_inv, DType::f32, Device::cpu, {1}), host(x, {R, C}));
  std::vector<float> padded(static_cast<size_t>(run.in_at), 1.0f);
  padded.insert(padded.end(), x.begin(), x.end());
  Dev d_in(dt, {n + run.in_at}, padded), d_out(fmt, {n + run.out_at}),
      d_out_t(fmt, {n + run.out_at}), d_si(DType::f32, {1});
  fp8_cast(g.ctx, run.rows ? d_out.t.at(run.out_at, {R, C}) : Tensor(),
           run.transposed ? d_out_t.t.at(run.out_at, {C, R}) : Tensor(), d_si.t,
           d_in.t.at(run.in_at, {R, C}));
  const std::string what = c.name + " [" + std::to_string(R) + ", " + std::to_string(C) + "] " +
                           dtype_name(dt) + " -> " + dtype_name(fmt) + (run.rows ? " rows" : "") +
                           (run.transposed ? " transposed" : "") + " at " +
                           std::to_string(run.in_at) + "/" + std::to_string(run.out_at);
  INFO(what);
  CHECK(std::bit_cast<uint32_t>(d_si.download()[0]) == std::bit_cast<uint32_t>(scale_inv));
  const auto compare = [&](const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& want,
                           bool t) {
    int64_t wrong = 0, first = -1;
    for (int64_t i = 0; i < n; ++i)
      if (gpu[static_cast<size_t>(run.out_at + i)] != want[static_cast<size_t>(i)] && wrong++ == 0)
        first = i;
    if (first >= 0) {
      const int64_t at = t ? (first % R) * C + first / R : first;  // the input element
      INFO("first wrong code at " << first << " (input " << x[static_cast<size_t>(at)] << "): gpu "
                                  << int{gpu[static_cast<size_t>(run.out_at + first)]} << ", cpu "
                                  << int{want[static_cast<size_t>(first)]});
      CHECK(wrong == 0);
    }
  };
  if (run.rows) compare(d_out.download_bytes(), codes, false);
  if (run.transposed) compare(d_out_t.download_bytes(), codes_t, true);
}

TEST_CASE("cuda: fp8_cast equals the CPU bit for bit: codes, transposed codes, scale_inv",
          "[gpu]") {
  GpuCtx g;
  std::mt19937 rng(8);
  for (DType fmt : {DType::f8e4m3, DType::f8e5m2})
    for (const CastCase& c : cast_cases(format_of(fmt), rng))
      for (DType dt : {DType::f32, DType::bf16})
        for (CastRun run : {CastRun{true, false}, CastRun{false, true}, CastRun{true, true},
                            CastRun{true, true, 1, 1}, CastRun{true, false, 1, 3}})
          check_cast(g, c, dt, fmt, run);
}

// The GPU's codes are not the identity, nor the CPU's by accident: a known tensor gives known
// codes and scale_inv (amax 2: scale 224 in E4M3, 28672 in E5M2).
TEST_CASE("cuda: fp8_cast of a known tensor gives the known codes", "[gpu]") {
  GpuCtx g;
  std::vector<float> x = {2.0f, -1.0f, 0.5f, 0.0f, -2.0f, 1.0f};
  Dev d_in(DType::f32, {2, 3}, x), d_out(DType::f8e4m3, {2, 3}), d_out_t(DType::f8e4m3, {3, 2}),
      d_si(DType::f32, {1});
  fp8_cast(g.ctx, d_out.t, d_out_t.t, d_si.t, d_in.t);
  // 2 * 224 = 448 (0x7e), 224 = 1.75 * 2^7 (0x76), 112 (0x6e), 0, -448 (0xfe), 224.
  CHECK(d_out.download_bytes() == std::vector<uint8_t>{0x7e, 0xf6, 0x6e, 0x00, 0xfe, 0x76});
  CHECK(d_out_t.download_bytes() == std::vector<uint8_t>{0x7e, 0x00, 0xf6, 0xfe, 0x6e, 0x76});
  CHECK(d_si.download()[0] == 1.0f / 224.0f);
}

struct GemmShape {
  int64_t M, N, K;
};
// M free (odd ones included); N and K multiples of kFp8GemmAlign, as cuBLASLt's FP8 GEMMs need.
const GemmShape kExactShapes[] = {{5, 16, 32}, {37, 48, 80}, {64, 1152, 896}, {130, 256, 2048}};
const std::pair<DType, DType> kOperands[] = {
    {DType::f8e4m3, DType::f8e4m3}, {DType::f8e4m3, DType::f8e5m2}, {DType::f8e5m2, DType::f8e4m3}};

// Codes of integers in [-2, 2] (exact in both formats).
std::vector<uint8_t> integer_codes(int64_t n, DType fmt, std::mt19937& rng) {
  std::uniform_int_distribution<int> v(-2, 2);
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  for (uint8_t& c : codes) c = fp8_encode(static_cast<float>(v(rng)), format_of(fmt));
  return codes;
}

std::vector<float> integers(int64_t n, int lo, int hi, std::mt19937& rng) {
  std::uniform_int_distribution<int> v(lo, hi);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = round_to_bf16(static_cast<float>(v(rng)));
  return out;
}

// Every sum is an integer of magnitude at most 4 K <= 8192, exact in fp32 and in the narrower
// accumulator of FP8 tensor cores; the inverse scales are powers of two, the bias and the
// accumulated values integers: the result is exact on both sides, so the GPU's equals the CPU's
// (rounded to bf16 for a bf16 out, the same rounding of the same value; twice where the bias is
// added apart). A scale dropped or
// swapped for another, an operand read transposed, a bias lost or an accumulation assigned all
// change it.
TEST_CASE("cuda: cuBLASLt linear_fp8 equals the CPU exactly on integer codes", "[gpu]") {
  GpuCtx g;
  Ctx cpu;
  std::mt19937 rng(9);
  float a_si = 0.125f, b_si = 32.0f;
  Dev d_asi(DType::f32, {1}, {a_si}), d_bsi(DType::f32, {1}, {b_si});
  for (auto [fa, fb] : kOperands)
    for (GemmShape s : kExactShapes) {
      const int64_t M = s.M, N = s.N, K = s.K;
      const std::vector<uint8_t> a = integer_codes(M * K, fa, rng),
                                 b = integer_codes(N * K, fb, rng);
      Dev d_a(fa, {M, K}), d_b(fb, {N, K});
      d_a.upload_bytes(a);
      d_b.upload_bytes(b);
      for (DType dt : {DType::f32, DType::bf16})
        // No bias; one at the buffer's start (the epilogue's, on a bf16 out); one an element in
        // (2 or 4 bytes: added apart).
        for (int bias_at : {-1, 0, 1})
          for (bool accumulate : {false, true}) {
            std::vector<float> bv = integers(N + 1, -50, 50, rng),
                               prior = integers(M * N, -300, 300, rng), out = prior;
            const auto bias = [&](Tensor t) { return bias_at < 0 ? Tensor() : t.at(bias_at, {N}); };
            // A bias apart from the epilogue is added to the bf16 out after the GEMM's rounding:
            // the reference rounds twice there too.
            const bool apart = dt == DType::bf16 && bias_at == 1;
            linear_fp8(cpu, host(out, {M, N}),
                       Tensor(const_cast<uint8_t*>(a.data()), fa, Device::cpu, {M, K}),
                       Tensor(&a_si, DType::f32, Device::cpu, {1}),
                       Tensor(const_cast<uint8_t*>(b.data()), fb, Device::cpu, {N, K}),
                       Tensor(&b_si, DType::f32, Device::cpu, {1}),
                       apart ? Tensor() : bias(host(bv, {N + 1})), accumulate);
            Dev d_out(dt, {M, N}, prior), d_bias(dt, {N + 1}, bv);
            linear_fp8(g.ctx, d_out.t, d_a.t, d_asi.t, d_b.t, d_bsi.t, bias(d_bias.t), accumulate);
            const std::vector<float> got = d_out.download();
            int64_t wrong = 0, first = -1;
            for (size_t i = 0; i < got.size(); ++i) {
              float want = dt == DType::bf16 ? round_to_bf16(out[i]) : out[i];
              if (apart) want = round_to_bf16(want + bv[1 + i % static_cast<size_t>(N)]);
              out[i] = want;
              if (got[i] != want && wrong++ == 0) first = static_cast<int64_t>(i);
            }
            INFO(dtype_name(fa) << " x " << dtype_name(fb) << " -> " << dtype_name(dt) << " M=" << M
                                << " N=" << N << " K=" << K << " bias at " << bias_at
                                << (accumulate ? " accumulate" : ""));
            INFO("first wrong at " << first << ": gpu " << (first < 0 ? 0 : got[first]) << ", cpu "
                                   << (first < 0 ? 0 : out[first]));
            CHECK(wrong == 0);
          }
    }
}

// Real data through both casts: the codes and scales are the CPU's bit for bit (the cast's test),
// so the products differ only in how they are summed. The CPU sums in fp32; Hopper's FP8 tensor
// cores add each instruction's products in a narrower accumulator (a 13-bit significand,
// truncated) before cuBLASLt promotes the partial sums to fp32 at intervals (fast accumulation
// off): relative errors of about sqrt(interval) * 2^-14, some 1e-3 at an interval of 128, hence
// 5e-3 for an f32 out; a bf16 out adds its rounding (2^-9 an element): the bf16 bound, 1e-2. A
// wrong scale, a transposed operand, a lost bias (as large as the products) or an assigned
// accumulation all err by more than 0.3.
TEST_CASE("cuda: cuBLASLt linear_fp8 after fp8_cast matches the CPU within the FP8 sum's bound",
          "[gpu]") {
  GpuCtx g;
  Ctx cpu;
  std::mt19937 rng(10);
  // Odd M; the 0.5B QKV projection; the 72B tp 8 down projection (K = 29568 / 8).
  const GemmShape shapes[] = {{5, 16, 32}, {37, 48, 80}, {64, 1152, 896}, {16, 8192, 3696}};
  for (auto [fa, fb] : kOperands)
    for (GemmShape s : shapes) {
      const int64_t M = s.M, N = s.N, K = s.K;
      if (switch_on(Switch::test_small_shapes) && N * K > (int64_t{1} << 20)) continue;
      std::vector<float> a_in = random_values(M * K, rng, DType::bf16),
                         b_in = random_values(N * K, rng, DType::bf16);
      std::vector<uint8_t> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(N * K));
      float a_si = 0, b_si = 0;
      const Tensor ha(a.data(), fa, Device::cpu, {M, K}), hb(b.data(), fb, Device::cpu, {N, K}),
          ha_si(&a_si, DType::f32, Device::cpu, {1}), hb_si(&b_si, DType::f32, Device::cpu, {1});
      fp8_cast(cpu, ha, Tensor(), ha_si, host(a_in, {M, K}));
      fp8_cast(cpu, hb, Tensor(), hb_si, host(b_in, {N, K}));
      Dev d_ain(DType::bf16, {M, K}, a_in), d_bin(DType::bf16, {N, K}, b_in), d_a(fa, {M, K}),
          d_b(fb, {N, K}), d_asi(DType::f32, {1}), d_bsi(DType::f32, {1});
      fp8_cast(g.ctx, d_a.t, Tensor(), d_asi.t, d_ain.t);
      fp8_cast(g.ctx, d_b.t, Tensor(), d_bsi.t, d_bin.t);
      CHECK(d_a.download_bytes() == a);  // the GPU's casts gave the CPU's codes
      CHECK(d_b.download_bytes() == b);
      const float size = std::sqrt(static_cast<float>(K)) / 2;  // of an output element
      for (DType dt : {DType::f32, DType::bf16})
        for (bool bias : {false, true})
          for (bool accumulate : {false, true}) {
            std::vector<float> bv = random_values(N, rng, dt, -size, size),
                               prior = random_values(M * N, rng, dt, -size, size), out = prior;
            linear_fp8(cpu, host(out, {M, N}), ha, ha_si, hb, hb_si,
                       bias ? host(bv, {N}) : Tensor(), accumulate);
            Dev d_out(dt, {M, N}, prior), d_bias(dt, {N}, bv);
            linear_fp8(g.ctx, d_out.t, d_a.t, d_asi.t, d_b.t, d_bsi.t, bias ? d_bias.t : Tensor(),
                       accumulate);
            const double e = test::rel_err(d_out.download(), out);
            const double bound = dt == DType::bf16 ? 1e-2 : 5e-3;
            INFO(dtype_name(fa) << " x " << dtype_name(fb) << " -> " << dtype_name(dt) << " M=" << M
                                << " N=" << N << " K=" << K << (bias ? " bias" : "")
                                << (accumulate ? " accumulate" : "") << ": relative error " << e
                                << " (bound " << bound << ")");
            CHECK(e <= bound);
          }
    }
}

// The start-up check's query: device 0 (the test's) answers with its name and capability, and
// the 8.9 rule; a device that does not exist has no FP8.
TEST_CASE("cuda: fp8_support names the device and applies compute capability 8.9", "[gpu]") {
  const cuda::Fp8Support s = cuda::fp8_support(0);
  CHECK(s.name == cuda::device_name(0));
  CHECK(s.major >= 7);
  CHECK(s.supported == (s.major * 10 + s.minor >= 89));
  const cuda::Fp8Support none = cuda::fp8_support(cuda::device_count());
  CHECK_FALSE(none.supported);
  CHECK(none.name.empty());
}

}  // namespace
}  // namespace tr
