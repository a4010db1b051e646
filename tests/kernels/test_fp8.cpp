// The FP8 formats and the scaled cast (kernels/fp8.h): closed-form values here, and PyTorch's
// casts bit for bit in the hidden [.fp8-torch] case, which tests/tools/test_fp8_torch.py runs
// after writing torch's table.
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <bit>
#include <cfloat>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/fp8.h"
#include "kernels/ops.h"
#include "tests/host_tensor.h"
#include "tests/test_util.h"

namespace tr {
namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::e4m3, Fp8Format::e5m2};

float from_bits(uint32_t u) {
  return std::bit_cast<float>(u);
}
uint32_t to_bits(float f) {
  return std::bit_cast<uint32_t>(f);
}

// Equal as bits, or both NaN with the same sign (a NaN's payload is not part of the contract).
bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b))
    return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
  return to_bits(a) == to_bits(b);
}

std::string hex(uint32_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

TEST_CASE("fp8: each format's max, least subnormal, infinity and NaN codes", "[kernels]") {
  CHECK(fp8_info(Fp8Format::e4m3).max == 448.0f);
  CHECK(fp8_info(Fp8Format::e5m2).max == 57344.0f);
  CHECK(fp8_decode(0x7e, Fp8Format::e4m3) == 448.0f);
  CHECK(fp8_decode(0xfe, Fp8Format::e4m3) == -448.0f);
  CHECK(fp8_decode(0x7b, Fp8Format::e5m2) == 57344.0f);
  CHECK(fp8_decode(0x01, Fp8Format::e4m3) == 0x1p-9f);
  CHECK(fp8_decode(0x08, Fp8Format::e4m3) == 0x1p-6f);  // the least normal
  CHECK(fp8_decode(0x01, Fp8Format::e5m2) == 0x1p-16f);
  CHECK(fp8_decode(0x04, Fp8Format::e5m2) == 0x1p-14f);
  CHECK(fp8_decode(0x38, Fp8Format::e4m3) == 1.0f);
  CHECK(fp8_decode(0x3c, Fp8Format::e5m2) == 1.0f);
  CHECK(std::isnan(fp8_decode(0x7f, Fp8Format::e4m3)));
  CHECK(std::isnan(fp8_decode(0xff, Fp8Format::e4m3)));
  CHECK(fp8_decode(0x7c, Fp8Format::e5m2) == std::numeric_limits<float>::infinity());
  CHECK(fp8_decode(0xfc, Fp8Format::e5m2) == -std::numeric_limits<float>::infinity());
  for (uint8_t c : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff})
    CHECK(std::isnan(fp8_decode(c, Fp8Format::e5m2)));
  CHECK(to_bits(fp8_decode(0x80, Fp8Format::e4m3)) == 0x80000000u);  // -0
}

TEST_CASE("fp8: every finite code round-trips and the codes are in value order", "[kernels]") {
  for (Fp8Format f : kFormats) {
    INFO(fp8_info(f).name);
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_decode(static_cast<uint8_t>(c), f);
      if (std::isnan(v) || std::isinf(v)) continue;
      CHECK(fp8_encode(v, f) == c);
      CHECK(fp8_decode(static_cast<uint8_t>(c ^ 0x80), f) == -v);
      if (c > 0 && c <= fp8_info(f).max_code) CHECK(fp8_decode(static_cast<uint8_t>(c - 1), f) < v);
    }
  }
}

TEST_CASE("fp8: encode rounds to nearest even, saturates and keeps NaN", "[kernels]") {
  const auto e4 = [](float x) { return fp8_encode(x, Fp8Format::e4m3); };
  const auto e5 = [](float x) { return fp8_encode(x, Fp8Format::e5m2); };
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(e4(1.0f + 0x1p-4f) == 0x38);             // halfway between 1 and 1.125: to even 1
  CHECK(e4(1.0f + 0x3p-4f) == 0x3a);             // halfway between 1.125 and 1.25: to even 1.25
  CHECK(e4(1.0f + 0x1p-4f + 0x1p-20f) == 0x39);  // just above halfway: up
  CHECK(e4(0x1p-10f) == 0x00);                   // half the least subnormal: to even 0
  CHECK(e4(std::nextafter(0x1p-10f, 1.0f)) == 0x01);  // just above it: up
  CHECK(e4(0x3p-10f) == 0x02);                        // 1.5 subnormal steps: to even 2
  CHECK(e4(-0x1p-10f) == 0x80);                       // -0
  CHECK(e4(464.0f) == 0x7e);                          // halfway to the next binade: to even 448
  CHECK(e4(470.0f) == 0x7e);                          // would round past the max: saturates
  CHECK(e4(-1e30f) == 0xfe);
  CHECK(e4(inf) == 0x7e);
  CHECK(e4(-inf) == 0xfe);
  CHECK(e5(61440.0f) == 0x7b);  // torch's plain cast gives +Inf from here on
  CHECK(e5(inf) == 0x7b);
  CHECK(e5(-inf) == 0xfb);
  CHECK(e5(0x1p-17f) == 0x00);
  CHECK(e5(FLT_TRUE_MIN) == 0x00);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Fp8Format f : kFormats) {
    CHECK(fp8_encode(nan, f) == 0x7f);
    CHECK(fp8_encode(-nan, f) == 0xff);
    CHECK(fp8_encode(from_bits(0x7f800001u), f) == 0x7f);  // signalling
    CHECK(fp8_encode(-0.0f, f) == 0x80);
  }
}

TEST_CASE("fp8: amax, scale and the scaled cast with its inverse", "[kernels]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(fp8_amax(std::vector<float>{1.0f, -3.0f, 2.0f}) == 3.0f);
  CHECK(fp8_amax(std::vector<float>{}) == 0.0f);
  CHECK(std::isnan(fp8_amax(std::vector<float>{1.0f, nan, 5.0f})));
  CHECK(fp8_scale(2.0f, Fp8Format::e4m3) == 224.0f);
  CHECK(fp8_scale(2.0f, Fp8Format::e5m2) == 28672.0f);
  for (float amax : {0.0f, inf, nan}) CHECK(fp8_scale(amax, Fp8Format::e4m3) == 1.0f);
  CHECK(fp8_scale(1e-40f, Fp8Format::e4m3) == FLT_MAX);  // 448 / 1e-40 overflows fp32

  const std::vector<float> x = {-3.0f, 1.5f, 0.0f, 0.001f, 2.9f};
  std::vector<uint8_t> q(x.size());
  std::vector<float> back(x.size());
  for (Fp8Format f : kFormats) {
    INFO(fp8_info(f).name);
    const Fp8Scaling s = fp8_cast_scaled(q, x, f);
    CHECK(s.amax == 3.0f);
    CHECK(s.scale == fp8_info(f).max / 3.0f);
    CHECK(s.scale_inv == 1.0f / s.scale);
    CHECK(q[0] == (0x80 | fp8_info(f).max_code));  // -amax lands on -max
    CHECK(q[2] == 0x00);
    for (size_t i = 0; i < x.size(); ++i) CHECK(q[i] == fp8_encode(x[i] * s.scale, f));
    fp8_dequantize(back, q, f, s.scale_inv);
    // Within half a step of 2^-mantissa_bits relative (normal range) of the input.
    const double rel = std::ldexp(1.0, -fp8_info(f).mantissa_bits - 1);
    for (size_t i = 0; i < x.size(); ++i) CHECK(std::fabs(back[i] - x[i]) <= rel * std::fabs(x[i]));
  }
  std::vector<uint8_t> zeros(3);
  CHECK(fp8_cast_scaled(zeros, std::vector<float>{0.0f, -0.0f, 0.0f}, Fp8Format::e4m3).scale ==
        1.0f);
  CHECK(zeros == std::vector<uint8_t>{0x00, 0x80, 0x00});
}

// torch's table (tests/tools/test_fp8_torch.py writes it beside the build's tests):
//   decode FORMAT CODE F32BITS
//   encode F32BITS FORMAT PLAIN SATURATED SATURATED_DECODED_F32BITS
//   scaled FORMAT N AMAX SCALE SCALE_INV X*N CODE*N     (the current-scaling recipe)
// PLAIN is x.to(float8); SATURATED is x.clamp(-max, max).to(float8), torchao's cast.
struct TorchTable {
  int decodes = 0, encodes = 0, plain_differs = 0, scaled = 0, wrong = 0;
  std::vector<std::string> first_wrong;  // the first few lines that disagree
  void fail(const std::string& line, const std::string& why) {
    if (wrong++ < 20) first_wrong.push_back(why + ": " + line);
  }
};

Fp8Format format_named(const std::string& name) {
  if (name == "e4m3") return Fp8Format::e4m3;
  REQUIRE(name == "e5m2");
  return Fp8Format::e5m2;
}

void check_decode(std::istringstream& in, const std::string& line, TorchTable& t) {
  std::string fmt;
  unsigned code;
  uint32_t bits;
  REQUIRE(in >> fmt >> std::hex >> code >> bits);
  ++t.decodes;
  const float ours = fp8_decode(static_cast<uint8_t>(code), format_named(fmt));
  if (!same_float(ours, from_bits(bits))) t.fail(line, "decode gives " + hex(to_bits(ours)));
}

// Ours equals torch's saturated cast everywhere; torch's plain cast differs only where E5M2's
// plain cast overflows to ±Inf (the documented difference), which is counted.
void check_encode(std::istringstream& in, const std::string& line, TorchTable& t) {
  std::string fmt_name;
  uint32_t xbits, decoded;
  unsigned plain, saturated;
  REQUIRE(in >> std::hex >> xbits >> fmt_name >> plain >> saturated >> decoded);
  ++t.encodes;
  const Fp8Format f = format_named(fmt_name);
  const float x = from_bits(xbits);
  const uint8_t ours = fp8_encode(x, f);
  if (ours != saturated) t.fail(line, "encode gives " + hex(ours));
  if (ours != plain) {
    const unsigned sign = ours & 0x80;
    const bool overflow = f == Fp8Format::e5m2 && !std::isnan(x) && plain == (sign | 0x7c) &&
                          ours == (sign | fp8_info(f).max_code);
    if (overflow)
      ++t.plain_differs;
    else
      t.fail(line, "plain cast differs beyond E5M2's overflow; ours " + hex(ours));
  }
  if (!same_float(fp8_decode(ours, f), from_bits(decoded))) t.fail(line, "decode(encode(x))");
}

void check_scaled(std::istringstream& in, const std::string& line, TorchTable& t) {
  std::string fmt;
  size_t n;
  uint32_t amax, scale, scale_inv;
  REQUIRE(in >> fmt >> n >> std::hex >> amax >> scale >> scale_inv);
  std::vector<float> x(n);
  std::vector<unsigned> want(n);
  for (float& v : x) {
    uint32_t b;
    REQUIRE(in >> b);
    v = from_bits(b);
  }
  for (unsigned& c : want) REQUIRE(in >> c);
  ++t.scaled;
  std::vector<uint8_t> q(n);
  const Fp8Scaling s = fp8_cast_scaled(q, x, format_named(fmt));
  // A NaN amax is NaN with any sign: torch's abs().max() of a NaN gives 0xffffffff.
  const bool nan_amax = std::isnan(s.amax) && std::isnan(from_bits(amax));
  if (!nan_amax && to_bits(s.amax) != amax) t.fail(line.substr(0, 80), "amax");
  if (to_bits(s.scale) != scale) t.fail(line.substr(0, 80), "scale " + hex(to_bits(s.scale)));
  if (to_bits(s.scale_inv) != scale_inv) t.fail(line.substr(0, 80), "scale_inv");
  for (size_t i = 0; i < n; ++i)
    if (q[i] != want[i]) t.fail(line.substr(0, 80), "element " + std::to_string(i));
}

// The ops (kernels/ops.h) on the CPU backend: fp8_cast writes the scaled cast's codes, their
// transpose and the inverse scale; linear_fp8 is the float64 sum of the codes' values times both
// inverse scales, with its bias, assigned or accumulated.
TEST_CASE("fp8: fp8_cast and linear_fp8 on the CPU backend", "[kernels]") {
  Ctx ctx;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-3.0, 3.0);
  const auto filled = [&](DType dtype, std::initializer_list<int64_t> shape) {
    test::HostTensor t(dtype, shape);
    for (int64_t i = 0; i < t.size(); ++i) t.set(i, u(rng) * std::pow(10.0, u(rng)));
    return t;
  };
  const int64_t M = 5, N = 4, K = 7;
  test::HostTensor a_in = filled(DType::f32, {M, K}), b_in = filled(DType::f64, {N, K});
  const auto codes = [](DType dtype, std::initializer_list<int64_t> shape) {
    test::HostTensor t(DType::i32, shape);  // room for the codes
    t.t.dtype = dtype;
    return t;
  };
  test::HostTensor a = codes(DType::f8e4m3, {M, K}), a_t = codes(DType::f8e4m3, {K, M});
  test::HostTensor b = codes(DType::f8e5m2, {N, K});
  test::HostTensor a_si(DType::f32, {1}), b_si(DType::f32, {1});
  fp8_cast(ctx, a.t, a_t.t, a_si.t, a_in.t);
  fp8_cast(ctx, b.t, Tensor(), b_si.t, b_in.t);
  // The codes and scale the host cast gives, and the transpose.
  std::vector<float> x(static_cast<size_t>(M * K));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(a_in.get(static_cast<int64_t>(i)));
  std::vector<uint8_t> want(x.size());
  const Fp8Scaling s = fp8_cast_scaled(want, x, Fp8Format::e4m3);
  CHECK(a_si.t.ptr<float>()[0] == s.scale_inv);
  const auto* got = static_cast<const uint8_t*>(a.t.data);
  const auto* got_t = static_cast<const uint8_t*>(a_t.t.data);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < K; ++c) {
      CHECK(got[r * K + c] == want[static_cast<size_t>(r * K + c)]);
      CHECK(got_t[c * M + r] == want[static_cast<size_t>(r * K + c)]);
    }
  // The product, its bias, then accumulated onto itself.
  test::HostTensor out(DType::f32, {M, N}), bias = filled(DType::f32, {N});
  linear_fp8(ctx, out.t, a.t, a_si.t, b.t, b_si.t, bias.t);
  const auto* bc = static_cast<const uint8_t*>(b.t.data);
  const double scale = static_cast<double>(a_si.t.ptr<float>()[0] * b_si.t.ptr<float>()[0]);
  std::vector<double> ref(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < K; ++k)
        sum += static_cast<double>(fp8_decode(got[i * K + k], Fp8Format::e4m3)) *
               fp8_decode(bc[j * K + k], Fp8Format::e5m2);
      ref[static_cast<size_t>(i * N + j)] = sum * scale + bias.get(j);
      CHECK(out.get(i * N + j) == Approx(ref[static_cast<size_t>(i * N + j)]).epsilon(1e-6));
    }
  linear_fp8(ctx, out.t, a.t, a_si.t, b.t, b_si.t, bias.t, /*accumulate=*/true);
  for (int64_t i = 0; i < M * N; ++i)
    CHECK(out.get(i) == Approx(2 * ref[static_cast<size_t>(i)]).epsilon(1e-6));
  // The cast is not the identity: the product differs from the unquantized one.
  double apart = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double exact = bias.get(j);
      for (int64_t k = 0; k < K; ++k) exact += a_in.get(i * K + k) * b_in.get(j * K + k);
      apart = std::max(apart, std::abs(exact - ref[static_cast<size_t>(i * N + j)]) /
                                  std::max(1.0, std::abs(exact)));
    }
  CHECK(apart > 1e-4);
}

// What `call` prints to stderr in a child process, which it must end by a signal (a failed check
// aborts); "(not ended by a signal)" appended when it returns.
std::string refusal(const std::function<void()>& call) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    std::signal(SIGABRT, SIG_DFL);  // not Catch's handler, which reports as the parent would
    call();
    _exit(0);
  }
  close(fds[1]);
  std::string said;
  char buf[512];
  for (ssize_t k; (k = read(fds[0], buf, sizeof(buf))) > 0;)
    said.append(buf, static_cast<size_t>(k));
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  return WIFSIGNALED(status) ? said : said + "(not ended by a signal)";
}

// On CUDA the ops refuse, with one line naming the rule, what cuBLASLt's FP8 GEMMs cannot run (K
// or N not a multiple of 16, an operand not 16-byte aligned) and an f64 cast, before any device
// work: the tensors' addresses are never read (none is mapped), so this runs without a GPU.
TEST_CASE("fp8: on CUDA, linear_fp8 refuses unaligned shapes and addresses, fp8_cast f64",
          "[kernels]") {
  const auto fake = [](uintptr_t at, DType dt, std::initializer_list<int64_t> shape) {
    return Tensor(reinterpret_cast<void*>((uintptr_t{1} << 40) + at), dt, Device::cuda, shape);
  };
  struct Case {
    int64_t M, N, K;
    uintptr_t a_at;
    std::string says;
  };
  for (const Case& c :
       {Case{32, 16, 40, 0, "K (40) and N (16) must be multiples of 16"},
        Case{32, 24, 32, 0, "K (32) and N (24) must be multiples of 16"},
        Case{5, 16, 32, 8, "a, b and out must start at 16-byte aligned addresses"}}) {
    const std::string said = refusal([&] {
      Ctx ctx;
      ctx.device = Device::cuda;
      const Tensor si = fake(0, DType::f32, {1});
      linear_fp8(ctx, fake(0, DType::f32, {c.M, c.N}), fake(c.a_at, DType::f8e4m3, {c.M, c.K}), si,
                 fake(0, DType::f8e4m3, {c.N, c.K}), si, Tensor());
    });
    INFO(said);
    CHECK(said.find("linear_fp8(out=") != std::string::npos);
    CHECK(said.find(c.says) != std::string::npos);
  }
  const std::string said = refusal([&] {
    Ctx ctx;
    ctx.device = Device::cuda;
    fp8_cast(ctx, fake(0, DType::f8e4m3, {4, 8}), Tensor(), fake(0, DType::f32, {1}),
             fake(0, DType::f64, {4, 8}));
  });
  INFO(said);
  CHECK(said.find("the CUDA backend casts f32 or bf16, not f64") != std::string::npos);
}

TEST_CASE("fp8: encode, decode and the scaled cast equal torch's float8 casts bit for bit",
          "[.fp8-torch]") {
  const std::string path = (test::build_dir() / "test-fp8-torch/torch_fp8.txt").string();
  std::ifstream file(path);
  INFO("torch's table " << path << " (tests/tools/test_fp8_torch.py writes it)");
  REQUIRE(file);
  TorchTable t;
  std::string line, kind;
  while (std::getline(file, line)) {
    std::istringstream in(line);
    if (!(in >> kind) || kind[0] == '#') continue;
    if (kind == "decode")
      check_decode(in, line, t);
    else if (kind == "encode")
      check_encode(in, line, t);
    else if (kind == "scaled")
      check_scaled(in, line, t);
    else
      FAIL("unknown line: " << line);
  }
  for (const std::string& w : t.first_wrong) UNSCOPED_INFO(w);
  CHECK(t.wrong == 0);
  CHECK(t.decodes == 512);
  CHECK(t.encodes > 10000);
  CHECK(t.plain_differs > 0);  // the table reaches E5M2's overflow
  CHECK(t.scaled > 0);
  std::printf(
      "fp8 vs torch: %d decodes, %d encodes (%d where torch's plain E5M2 cast gives Inf), "
      "%d scaled casts\n",
      t.decodes, t.encodes, t.plain_differs, t.scaled);
}

}  // namespace
}  // namespace tr
