// The --hardware file: YAML keys over the GPU table's row and the cluster's storage, each key
// with the range it must lie in (one table, hardware_keys), so that no file yields an absurd plan.
#pragma once

#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "core/hardware.h"

namespace tr {

// What a file sets: the GPU's and storage's numbers, and preflight's network measurement.
struct HardwareValues {
  GpuSpec gpu;
  StorageSpec storage;
  double network_smallest = 0;  // s: the smallest all-reduce across network_nodes nodes
  double network_nodes = 2;
  double gemm_n = 0;  // the size gemm_tflops was measured at (0: not said)
};

// A key: its value times `unit` is the SI number it sets; the value must lie in [min, max]
// (whole: an integer). `measured`: one of preflight --json's keys beside the table's own.
struct HardwareKey {
  const char* name;
  double unit;
  double min, max;
  bool whole;
  bool measured;
  double& (*at)(HardwareValues&);
};

// Every key but name and measured_by, in the order the docs list them.
std::span<const HardwareKey> hardware_keys();

// `base` with the numbers a YAML file sets: any of name, peak_bf16_tflops, memory_gib,
// hbm_tbps, nvlink_gbps, network_gbps (GB/s per GPU), gemm_tflops and memory_gbps (the
// measured ceilings, as preflight --json writes them), node_latency_us, network_latency_us
// (the smallest all-reduce across network_nodes nodes, 2 unless given, split by
// set_network_latency with the hop latency in effect: the table's, an earlier file's or this
// file's network_hop_latency_us), the step model's efficiencies (attention_{fwd,bwd}_hd{64,128},
// stream_fraction, gemm_fill, as bench_ops --calibration writes them); and, into `storage`
// when given, host_copy_gbps (per GPU), local_disk_gbps (per node), storage_gbps (the job's),
// restart_s. Read as the config's keys are (trainer/config/config_fields.h: a number in the
// key's range, each key once, the nearest known key suggested for an unknown one). Refused, in
// one line naming the file and key: a path that is not a readable regular file, a name that is
// not UTF-8 text, a value that is not a number in its key's range, a GEMM ceiling above the peak.
absl::StatusOr<GpuSpec> override_gpu_spec(GpuSpec base, const std::string& yaml_path,
                                          StorageSpec* storage = nullptr);

}  // namespace tr
