#include "core/hardware.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tr {

const std::vector<GpuSpec>& gpu_table() {
  // Dense bf16 peaks and bandwidths of the SXM parts; 400 Gb/s NICs per H100/H200 GPU, 800 Gb/s
  // per B200/B300 GPU and 200 Gb/s per A100 GPU (the usual InfiniBand/RoCE builds). The GEMM
  // and copy ceilings: measured on an H100 (798 TFLOP/s, 3.0 TB/s) and on an H200 by preflight
  // (830 TFLOP/s, 4.23 TB/s, 2026-11-27, docs/PERFORMANCE.md); for the others not yet measured,
  // 0.8 of the peak and 0.85 of the HBM bandwidth, the H100's ratios. Collective latencies:
  // 10 us inside a node and 20 us across two nodes for all (NCCL's small all-reduce; preflight
  // measures a cluster's own), each further step between nodes 5 us. Dense FP8 peaks: twice
  // bf16's on Hopper (1979 TFLOP/s) and Blackwell (4500); the A100 has no FP8 tensor cores.
  static const std::vector<GpuSpec> table = {
      {"h100", "H100", 989.4e12, 80.0 * kGiB, 3.35e12, 450e9, 50e9, 798e12, 3.0e12, 1979e12,
       1596e12},
      {"h200", "H200", 989.4e12, 141.0 * kGiB, 4.8e12, 450e9, 50e9, 830e12, 4.23e12, 1979e12,
       1660e12},
      {"b200", "B200", 2250e12, 180.0 * kGiB, 8.0e12, 900e9, 100e9, 1800e12, 6.8e12, 4500e12,
       3600e12},
      {"b300", "B300", 2250e12, 288.0 * kGiB, 8.0e12, 900e9, 100e9, 1800e12, 6.8e12, 4500e12,
       3600e12},
      {"a100", "A100", 312e12, 80.0 * kGiB, 2.039e12, 300e9, 25e9, 250e12, 1.73e12},
  };
  return table;
}

absl::StatusOr<GpuSpec> gpu_spec(const std::string& name) {
  std::vector<std::string> names;
  for (const GpuSpec& g : gpu_table()) {
    if (absl::AsciiStrToLower(name) == g.name) return g;  // H100 or h100
    names.push_back(g.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--gpu ", name, " is unknown; known: ", absl::StrJoin(names, ", ")));
}

const GpuSpec* gpu_of_device(const std::string& device_name) {
  const GpuSpec* best = nullptr;
  for (const GpuSpec& g : gpu_table())
    if (device_name.find(g.device_key) != std::string::npos &&
        (best == nullptr || g.device_key.size() > best->device_key.size()))
      best = &g;
  return best;
}

}  // namespace tr
