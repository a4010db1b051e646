// The GPU table: peaks and bandwidths of the parts we plan for and measure MFU against. The one
// home of these numbers: the planner (`trainer plan --gpu`), preflight's thresholds, the MFU of
// every GPU run (device_info) and, through `trainer plan --json`, the Python tools read it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tr {

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;  // bytes

struct GpuSpec {
  std::string name;        // the planner's --gpu name: "h100"
  std::string device_key;  // found in the CUDA device name of this part: "H100"
  double peak_bf16_flops;  // dense bf16 tensor-core peak, FLOP/s
  double memory_bytes;     // HBM capacity
  double hbm_bw;           // bytes/s
  double nvlink_bw;        // bytes/s per GPU, one direction, inside a node
  double network_bw;       // bytes/s per GPU (its NIC), between nodes
  // The measured ceilings the planner's step model starts from (trainer/plan/step_model.h), as
  // `preflight` measures them: a bf16 8192^3 GEMM's FLOP/s, and a device-to-device copy's
  // bytes/s counting bytes read plus written.
  double gemm_flops;
  double copy_bw;
  // Dense FP8 tensor-core peak (0: none), and the ceiling the step model prices FP8 GEMMs at
  // (train.precision: fp8) until `bench_ops --fp8` measures it: the bf16 GEMM's measured
  // fraction of its peak, applied to the FP8 peak. MFU stays counted against the bf16 peak.
  double peak_fp8_flops = 0;
  double gemm_fp8_flops = 0;
  // A collective's fixed cost, whatever its size. Inside a node: the smallest all-reduce's time.
  // Across nodes: a per-call part, plus a per-step part for each step the algorithm takes
  // between nodes (trainer/plan/collectives.h); the defaults make the smallest all-reduce
  // between two nodes (two steps) 20 us, as NCCL's own model has it (2.7 to 9.6 us per network
  // step by protocol).
  double nvlink_latency = 10e-6;
  double network_latency = 10e-6;
  double network_hop_latency = 5e-6;
  // The step model's efficiencies on this part (trainer/plan/step_model.h): flash attention's
  // forward and backward as fractions of the dense peak at head_dim 64 and at 128 (linear
  // between), the memory-bound kernels' fraction of the copy bandwidth, and the GEMM shape
  // model's fill constant (each of M, N, K costs d / (d + fill)). Leads set against the H200's
  // whole steps (docs/PERFORMANCE.md) until `bench_ops --calibration` measures a cluster's own.
  double attention_fwd_hd64 = 0.38, attention_bwd_hd64 = 0.27;
  double attention_fwd_hd128 = 0.60, attention_bwd_hd128 = 0.45;
  double stream_fraction = 0.85;
  double gemm_fill = 256;
};

// A cluster's numbers for saves and restarts, for `trainer plan --mtbf-hours` (estimates:
// `trainer plan --hardware FILE` sets them beside the GPU's, keys host_copy_gbps,
// local_disk_gbps, storage_gbps, restart_s).
struct StorageSpec {
  double host_copy_bw = 25e9;  // bytes/s per GPU: device to pinned host memory (PCIe)
  double local_disk_bw = 5e9;  // bytes/s per node: node-local NVMe, written and read
  double storage_bw = 20e9;    // bytes/s for the job: the shared filesystem, written and read
  double restart_s = 300;      // from a failure to the start-up's load: requeue, launch, init
};

// Every row, in the order `--gpu` lists them.
const std::vector<GpuSpec>& gpu_table();

// The row named `name` (h100, h200, b200, b300, a100); an error names the known ones.
absl::StatusOr<GpuSpec> gpu_spec(const std::string& name);

// The row whose device_key the CUDA device name contains (the longest such key), or nullptr:
// "NVIDIA H100 80GB HBM3" is h100; "NVIDIA GH200 480GB" is h200's (the same Hopper peak).
const GpuSpec* gpu_of_device(const std::string& device_name);

}  // namespace tr
