// The cluster tools on CPU ranks: preflight's collectives, checks and exit codes.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace tr {
namespace {

using test::CmdResult;
using test::run_cmd;

CmdResult preflight(int ranks, const std::string& args) {
  return run_cmd(std::string("OMP_NUM_THREADS=1 ") + tr::test::mpirun() + " " +
                 std::to_string(ranks) + " " + tr::test::preflight_bin() + " " + args);
}

struct Table {
  std::string op, group;
  int ranks = 0;
  std::vector<std::vector<double>> rows;  // bytes, count, time_us, algbw, busbw, #wrong
};

// The "# op, ..., group G (N ranks)" sections and their numeric rows.
std::vector<Table> tables(const std::string& out) {
  std::vector<Table> t;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("# ")) {
      Table tab;
      tab.op = line.substr(2, line.find(',') - 2);
      const size_t g = line.find("group ") + 6, open = line.rfind(" (");
      tab.group = line.substr(g, open - g);
      tab.ranks = std::stoi(line.substr(open + 2));
      t.push_back(tab);
      continue;
    }
    std::istringstream fields(line);
    std::vector<double> v;
    for (double x; fields >> x;) v.push_back(x);
    if (!t.empty() && v.size() == 6 && fields.eof()) t.back().rows.push_back(v);
  }
  return t;
}

TEST_CASE("preflight: 4 ranks as 2 nodes measure every collective in both groups, all correct",
          "[tools]") {
  tr::test::TempDir dir;
  CmdResult r = preflight(4,
                          "--ranks-per-node 2 --min-bytes 1K --max-bytes 64K --iters 3 --warmup 1 "
                          "--gemm 64 --mem-bytes 1M --expect node_busbw_gbps=0.0001 "
                          "--expect network_busbw_gbps=0.0001 --json " +
                              (dir / "measured.json"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("preflight: 4 ranks on 2 node(s), backend cpu") != std::string::npos);
  const std::vector<Table> t = tables(r.output);
  REQUIRE(t.size() == 8);  // 4 ops x (node, network)
  for (const Table& tab : t) {
    INFO(tab.op << " on " << tab.group);
    CHECK(tab.ranks == (tab.group == "node" ? 2 : 4));
    REQUIRE(tab.rows.size() == 4);  // 1K, 4K, 16K, 64K
    const double n = tab.ranks;
    const double factor = tab.op == "all_reduce" ? 2 * (n - 1) / n
                          : tab.op == "sendrecv" ? 1
                                                 : (n - 1) / n;
    for (size_t i = 0; i < tab.rows.size(); ++i) {
      const std::vector<double>& row = tab.rows[i];
      CHECK(row[0] == std::pow(4.0, i) * 1024);
      CHECK(row[1] * 4 == row[0]);
      CHECK(row[2] > 0);
      // algbw = bytes / time; busbw = algbw x the collective's factor (printed rounded).
      CHECK(row[3] == Approx(row[0] / row[2] / 1e3).epsilon(0.02).margin(0.002));
      CHECK(row[4] == Approx(row[3] * factor).epsilon(0.02).margin(0.002));
      CHECK(row[5] == 0);
    }
  }
  CHECK(r.output.find("ok   node all_reduce busbw") != std::string::npos);
  CHECK(r.output.find("ok   network (all ranks) all_reduce busbw") != std::string::npos);
  CHECK(r.output.find("gemm f32 64^3:") != std::string::npos);
  CHECK(r.output.find("preflight: passed") != std::string::npos);
  // --json: what was measured, under the --expect keys, for trainer plan --hardware; the
  // network's all-reduce is the last row of its table.
  const nlohmann::json j = nlohmann::json::parse(tr::test::read_file(dir / "measured.json"));
  CHECK(j["measured_by"] == "preflight");
  CHECK(j["name"] == "cpu");
  for (const char* key : {"node_busbw_gbps", "network_busbw_gbps", "gemm_tflops", "memory_gbps"})
    CHECK(j.value(key, 0.0) > 0);
  // The latencies: the first (smallest) all-reduce row's time, in microseconds; the network's
  // with the nodes it spanned.
  CHECK(j["network_nodes"] == 2);
  for (const Table& tab : t) {
    if (tab.op != "all_reduce") continue;
    const bool network = tab.group == "network (all ranks)";
    if (network)
      CHECK(j["network_busbw_gbps"].get<double>() ==
            Approx(tab.rows.back()[4]).epsilon(0.01).margin(0.002));
    CHECK(j[network ? "network_latency_us" : "node_latency_us"].get<double>() ==
          Approx(tab.rows.front()[2]).epsilon(0.01).margin(0.06));
  }
}

TEST_CASE("preflight: a wrong element and a missed threshold fail the run, naming them",
          "[tools]") {
  CmdResult r = preflight(4,
                          "--ranks-per-node 2 --ops all_reduce,all_gather --max-bytes 4K "
                          "--iters 2 --gemm 32 --mem-bytes 0 --corrupt 1 "
                          "--expect gemm_tflops=1000000");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  const std::vector<Table> t = tables(r.output);
  REQUIRE(t.size() == 4);
  // World rank 1 adds 1 to its first element: both ranks of its node see one wrong element in
  // the node group; all 4 ranks see one in the network group.
  for (const Table& tab : t)
    for (const std::vector<double>& row : tab.rows) CHECK(row[5] == (tab.group == "node" ? 2 : 4));
  CHECK(r.output.find("preflight: FAIL all_reduce on group node computed 2 wrong elements at "
                      "1024 bytes") != std::string::npos);
  CHECK(r.output.find("FAIL gemm TFLOP/s") != std::string::npos);
  CHECK(r.output.find("< 1e+06 (--expect)") != std::string::npos);
}

TEST_CASE("preflight: bad flags are one line and exit 2", "[tools]") {
  const std::string bin = tr::test::preflight_bin();
  CmdResult r = run_cmd(bin + " --expect speed=3");
  CHECK(r.exit_code == 2);
  CHECK(r.output ==
        "preflight: --expect: unknown key 'speed'; known: node_busbw_gbps, network_busbw_gbps, "
        "gemm_tflops, memory_gbps\n");
  r = run_cmd(bin + " --gpu v100 --gemm 0 --mem-bytes 0");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "preflight: --gpu v100 is unknown; known: h100, h200, b200, b300, a100\n");
  r = run_cmd(bin + " --max-bytes lots");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "preflight: --max-bytes 'lots' is not a size (e.g. 4096, 64K, 1G)\n");
  // A --hardware path that is a directory (it aborted, exit 134).
  test::TempDir dir;
  r = run_cmd(bin + " --gpu h100 --hardware " + dir.path() + " --gemm 0 --mem-bytes 0");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "preflight: --hardware " + dir.path() + ": not a regular file\n");
}

TEST_CASE("preflight: one process names the GPU table's thresholds", "[tools]") {
  // An H100's table applied to the CPU: the GEMM and memory checks fail against it, by name.
  CmdResult r = run_cmd(tr::test::preflight_bin() + " --gpu h100 --gemm 64 --mem-bytes 1M");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("FAIL gemm TFLOP/s") != std::string::npos);
  CHECK(r.output.find("(0.6 x bf16 peak 989)") != std::string::npos);
  CHECK(r.output.find("(0.75 x HBM 3350 GB/s)") != std::string::npos);
}

// The PyTorch baseline (tools/torch_baseline.py) counts MFU with our FLOPs: its --describe (no
// torch needed) must give the planner's numbers for the same preset and sequence length.
TEST_CASE("tools: the PyTorch baseline's FLOPs per token are the trainer's", "[tools]") {
  for (const std::string preset : {"qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"}) {
    INFO(preset);
    CmdResult torch = run_cmd(
        "python3 " + tr::test::source_dir() + "/tools/torch_baseline.py --describe --trainer " +
        tr::test::trainer_bin() + " --preset " + preset + " --seq-len 4096 2>/dev/null");
    CmdResult plan = run_cmd(tr::test::trainer_bin() + " plan --config " + tr::test::source_dir() +
                             "/configs/" + preset + ".yaml --set data.seq_len=4096 --json");
    REQUIRE(torch.exit_code == 0);
    REQUIRE(plan.exit_code == 0);
    const nlohmann::json t = nlohmann::json::parse(torch.output),
                         p = nlohmann::json::parse(plan.output);
    CHECK(t["flops_per_token_causal"].get<double>() == p["flops_per_token_causal"].get<double>());
    CHECK(t["flops_per_token_full"].get<double>() == p["flops_per_token_full"].get<double>());
    CHECK(t["model"] == p["model"]);  // the trainer's resolution of the preset, not a copy
  }
}

}  // namespace
}  // namespace tr
