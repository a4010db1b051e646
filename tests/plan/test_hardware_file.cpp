// The --hardware file against bad input: what is not a readable file, a name that is not UTF-8,
// values out of their ranges, and a few hundred mutated files, each refused in one line naming
// the key or planned with finite numbers and an MFU in (0, 1].
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/model_util.h"
#include "tests/test_util.h"
#include "trainer/plan/plan.h"
#include "trainer/plan/resilience.h"

namespace tr {
namespace {

// Every key at a plausible value: an H100 cluster as preflight and bench_ops would measure it.
const std::vector<std::pair<std::string, std::string>> kSeed = {
    {"peak_bf16_tflops", "989"},    {"memory_gib", "80"},
    {"hbm_tbps", "3.35"},           {"nvlink_gbps", "450"},
    {"network_gbps", "50"},         {"gemm_tflops", "798"},
    {"memory_gbps", "3000"},        {"node_latency_us", "10"},
    {"network_latency_us", "25"},   {"network_hop_latency_us", "5"},
    {"attention_fwd_hd64", "0.38"}, {"attention_bwd_hd64", "0.27"},
    {"attention_fwd_hd128", "0.6"}, {"attention_bwd_hd128", "0.45"},
    {"stream_fraction", "0.85"},    {"gemm_fill", "256"},
    {"host_copy_gbps", "25"},       {"local_disk_gbps", "5"},
    {"storage_gbps", "20"},         {"restart_s", "300"},
    {"network_nodes", "4"}};

std::string yaml_of(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string out;
  for (const auto& [k, v] : kv) absl::StrAppend(&out, k, ": ", v, "\n");
  return out;
}

// tp 2 x pp 2 x dp 4 on 2 nodes of 8: every link and collective of the step model in use.
Config small_config() {
  return test::config_with({"model.preset=", "model.hidden_size=256", "model.intermediate_size=512",
                            "model.num_layers=4", "model.num_heads=4", "model.num_kv_heads=2",
                            "model.head_dim=64", "model.vocab_size=1000", "parallel.tp=2",
                            "parallel.pp=2", "parallel.dp=4", "data.seq_len=128",
                            "train.global_batch=32", "train.micro_batch=2"});
}

// The seed's value of `key` as a number (1 for name).
double seed_value(const std::string& key) {
  for (const auto& [k, v] : kSeed)
    if (k == key) return std::stod(v);
  return 1;
}

bool one_line(const std::string& s) {
  return !s.empty() && s.find('\n') == std::string::npos;
}

// Nulls are what nlohmann writes for NaN and infinities.
bool has_null(const nlohmann::json& j) {
  if (j.is_null()) return true;
  for (const auto& v : j) {
    if (!j.is_structured()) break;
    if (has_null(v)) return true;
  }
  return false;
}

// The file's outcome: refused in one line naming `key` (when given), or a plan whose numbers are
// finite, MFU in (0, 1], and whose JSON and failure plan hold no null.
void check_outcome(const Config& cfg, const std::string& path, const std::string& key) {
  StorageSpec storage;
  absl::StatusOr<GpuSpec> gpu = override_gpu_spec(*gpu_spec("h100"), path, &storage);
  absl::StatusOr<Plan> plan = absl::InternalError("");
  plan = gpu.ok() ? make_plan(cfg, *gpu, 2, 8) : absl::StatusOr<Plan>(gpu.status());
  if (!plan.ok()) {
    const std::string msg(plan.status().message());
    INFO(msg);
    CHECK(one_line(msg));
    CHECK(msg.find("--hardware") != std::string::npos);
    if (!key.empty()) CHECK(msg.find(key) != std::string::npos);
    return;
  }
  const Plan& p = *plan;
  INFO("step_s " << p.step_s << " tokens/s " << p.tokens_per_s_per_gpu << " mfu " << p.mfu);
  CHECK(std::isfinite(p.step_s));
  CHECK(std::isfinite(p.tokens_per_s_per_gpu));
  CHECK(p.mfu > 0);
  CHECK(p.mfu <= 1);
  const nlohmann::json j = nlohmann::json::parse(plan_json(cfg, p));
  CHECK_FALSE(has_null(j));
  CHECK(!format_plan(cfg, p).empty());
  const FailurePlan f = plan_failures(cfg, p, 1000, storage);
  CHECK_FALSE(has_null(nlohmann::json::parse(failures_json(f))));
}

TEST_CASE("plan: --hardware: what is not a regular readable file is one line", "[plan]") {
  const GpuSpec h100 = *gpu_spec("h100");
  test::TempDir dir;
  for (const std::string& path : {dir.path(), dir / "missing.yaml", std::string("/dev/null")}) {
    absl::StatusOr<GpuSpec> g = absl::InternalError("");
    REQUIRE_NOTHROW(g = override_gpu_spec(h100, path));
    INFO(g.status().message());
    REQUIRE_FALSE(g.ok());
    CHECK(one_line(std::string(g.status().message())));
    CHECK(std::string(g.status().message()).starts_with("--hardware " + path + ": "));
  }
  if (::geteuid() != 0) {  // root reads any file
    test::write_file(dir / "locked.yaml", "gemm_tflops: 400\n");
    ::chmod((dir / "locked.yaml").c_str(), 0);
    absl::StatusOr<GpuSpec> g = override_gpu_spec(h100, dir / "locked.yaml");
    REQUIRE_FALSE(g.ok());
    CHECK(one_line(std::string(g.status().message())));
  }
}

TEST_CASE("plan: --hardware: a name must be UTF-8 without control characters", "[plan]") {
  const GpuSpec h100 = *gpu_spec("h100");
  test::TempDir dir;
  // Raw bytes (a quoted "\\xff" is U+00FF, valid), and control characters quoted.
  for (const char* name :
       {"ab\xff\xfe", "h\xc3\x28", "h100 \xe2\x82", "\"h100\\n2\"", "\"\\x01\""}) {
    test::write_file(dir / "name.yaml", absl::StrCat("name: ", name, "\n"));
    absl::StatusOr<GpuSpec> g = override_gpu_spec(h100, dir / "name.yaml");
    INFO(name);
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().message() == "--hardware " + (dir / "name.yaml") +
                                      ": name must be UTF-8 text without control characters");
  }
  test::write_file(dir / "ok.yaml", "name: \"H100 \\u00e9t\\u00e9\"\n");
  absl::StatusOr<GpuSpec> g = override_gpu_spec(h100, dir / "ok.yaml");
  REQUIRE(g.ok());
  CHECK(g->name == "H100 \xc3\xa9t\xc3\xa9");
}

// Keys and values read as the config's are: the nearest key suggested for a misspelt one (all of
// them listed when none is near), a key given twice refused, a value of another type named.
TEST_CASE("plan: --hardware: keys and values are read as the config's", "[plan]") {
  const GpuSpec h100 = *gpu_spec("h100");
  test::TempDir dir;
  const std::string path = dir / "hw.yaml";
  auto error_of = [&](const std::string& text) {
    test::write_file(path, text);
    absl::StatusOr<GpuSpec> g = override_gpu_spec(h100, path);
    REQUIRE_FALSE(g.ok());
    return std::string(g.status().message());
  };
  CHECK(error_of("gemm_tflop: 700\n") ==
        "--hardware " + path + ": unknown key 'gemm_tflop'; did you mean 'gemm_tflops'?");
  CHECK(
      error_of("bogus: 1\n")
          .starts_with("--hardware " + path + ": unknown key 'bogus'; known: name, measured_by, "));
  CHECK(error_of("gemm_tflops: 700\ngemm_tflops: 600\n") ==
        "--hardware " + path + ": key 'gemm_tflops' appears twice");
  CHECK(error_of("gemm_tflops: fast\n") ==
        "--hardware " + path + ": gemm_tflops: expected a number, got 'fast'");
  CHECK(error_of("gemm_tflops: [1, 2]\n") ==
        "--hardware " + path + ": gemm_tflops: expected a number, got a list");
  CHECK(error_of("nvlink_gbps: 400\nnode_busbw_gbps: 300\n") ==
        "--hardware " + path +
            ": nvlink_gbps and node_busbw_gbps set the same number; give one of them");
  CHECK(error_of("memory_gib: 0\n") ==
        "--hardware " + path + ": memory_gib must be in [0.001, 1e+06] (got 0)");
}

// The cases: each refused, naming its key.
TEST_CASE("plan: --hardware: values out of their ranges are refused, naming the key", "[plan]") {
  const Config cfg = small_config();
  test::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"peak_bf16_tflops", "5e-324"}, {"network_latency_us", ".inf"},
      {"restart_s", ".inf"},          {"gemm_tflops", "1e-300"},
      {"gemm_tflops", "1200"},        {"network_nodes", "1e300"},
      {"hbm_tbps", "1e308"},          {"stream_fraction", ".nan"},
      {"memory_gib", "-.inf"},        {"gemm_fill", "0.5"}};
  for (const auto& [key, value] : cases) {
    std::vector<std::pair<std::string, std::string>> kv = kSeed;
    for (auto& [k, v] : kv)
      if (k == key) v = value;
    test::write_file(dir / "hw.yaml", yaml_of(kv));
    INFO(key << ": " << value);
    StorageSpec storage;
    absl::StatusOr<GpuSpec> g = override_gpu_spec(*gpu_spec("h100"), dir / "hw.yaml", &storage);
    REQUIRE_FALSE(g.ok());
    const std::string msg(g.status().message());
    INFO(msg);
    CHECK(one_line(msg));
    CHECK(msg.find(key) != std::string::npos);
  }
}

// A few hundred files, each the seed with one to three mutations: a value replaced by a hostile
// one or scaled far, a key dropped, repeated or misspelt, the name made invalid, bytes flipped
// or the file cut short.
TEST_CASE("plan: --hardware: mutated files are refused in one line or planned finitely", "[plan]") {
  const Config cfg = small_config();
  test::TempDir dir;
  const std::string path = dir / "hw.yaml";
  test::write_file(path, yaml_of(kSeed));
  check_outcome(cfg, path, "");
  const std::vector<std::string> hostile = {
      ".inf",  "-.inf", ".nan",  "5e-324", "1e-300", "1e308", "1e300", "0",     "-1",  "2.5",
      "1e-12", "1e12",  "abc",   "[1, 2]", "{a: 1}", "~",     "\"\"",  "0x10",  "1e5", "0.999",
      "1",     "2",     "65536", "1e-9",   "1e7",    "8192",  "true",  "1e-06", "3e5", "1.0001"};
  std::mt19937 rng(56);
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  for (int round = 0; round < 300; ++round) {
    std::vector<std::pair<std::string, std::string>> kv = kSeed;
    std::string key;  // the key a lone value mutation must be named by
    const int mutations = 1 + static_cast<int>(pick(3));
    std::string text;
    bool raw = false;
    for (int m = 0; m < mutations; ++m) {
      const size_t at = pick(kv.size());
      switch (pick(6)) {
        case 0:
          kv[at].second = hostile[pick(hostile.size())];
          key = mutations == 1 ? kv[at].first : "";
          break;
        case 1:
          kv[at].second = absl::StrCat(seed_value(kv[at].first) * std::pow(10.0, pick(40)) /
                                       std::pow(10.0, pick(40)));
          key = mutations == 1 ? kv[at].first : "";
          break;
        case 2:
          kv.erase(kv.begin() + static_cast<long>(at));
          break;
        case 3:
          kv.push_back(kv[at]);
          break;
        case 4:
          kv.emplace_back("name", pick(2) ? "h\xc3\x28" : "h\xff\xfe");
          break;
        default:
          raw = true;
      }
    }
    text = yaml_of(kv);
    if (raw) {
      key = "";
      if (pick(2) == 0) {
        text.resize(pick(text.size()));
      } else {
        for (int flips = 1 + static_cast<int>(pick(4)); flips > 0; --flips)
          text[pick(text.size())] = static_cast<char>(pick(256));
      }
    }
    test::write_file(path, text);
    INFO("round " << round << ":\n" << text);
    check_outcome(cfg, path, key);
  }
}

}  // namespace
}  // namespace tr
