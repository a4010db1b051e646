// Whether a run fits the memory this rank has, checked before anything large is allocated: the
// plan's bytes (trainer/plan/plan.h rank_memory, measured from a plan-only model) and the data
// loaders' prefetched steps and the saves' host memory, times the ranks that share the host (or
// the GPU), against what the host (or GPU) has free. A run that does not fit is bad input with the
// numbers and the ways out, instead of an allocation that aborts (or an OOM kill) later.
#pragma once

#include "absl/status/status.h"
#include "core/ctx.h"
#include "parallel/topology.h"
#include "trainer/config/config.h"
#include "trainer/layout/run_layout.h"

namespace tr {

struct MemoryBudget {
  double host_available = 0;    // bytes this host has for new allocations (cgroup included)
  int ranks_on_host = 1;        // processes of the job on this host
  double device_available = 0;  // bytes free on this rank's GPU (cuda)
  int ranks_on_device = 1;      // ranks sharing that GPU (parallel.comm=mpi)
};

// The host's available memory: MemAvailable, lowered to this process's cgroup limit (Slurm's)
// minus its use where one is set; 0 when unknown.
double host_memory_available();

// Host memory a rank's saves hold besides the model: an asynchronous save's buffer (the blocks
// the rank owns, about 1/world of a checkpoint), the local saves' buffer (its part:
// rank_state_bytes) and, when checkpoint.local_dir is a tmpfs (memory), the parts kept there
// (checkpoint.local_keep and one being written) with the replicas of other nodes' parts a job
// of `nodes` nodes keeps there (checkpoint.local_replicas_on).
double save_host_bytes(const Config& cfg, const Topology& topo, bool separate_masters,
                       int nodes = 1);

// OK, or InvalidArgument naming the memory, the parts of the need, and what to change.
absl::Status check_memory(const Config& cfg, const RunLayout& layout, Device device,
                          const MemoryBudget& budget, bool separate_compute_copy = false,
                          int64_t loss_chunk = 0);

}  // namespace tr
