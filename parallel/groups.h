// The communicators of a Topology: one group per parallel axis, made once at start-up.
#pragma once

#include <memory>

#include "parallel/comm.h"
#include "parallel/topology.h"

namespace tr {

struct ProcessGroups {
  std::unique_ptr<Comm> world;
  std::unique_ptr<Comm> tp;  // ranks that differ only in tp_rank, ordered by tp_rank
  std::unique_ptr<Comm> cp;  // ranks that differ only in cp_rank, ordered by cp_rank
  // The replicas of this rank's weights: ranks that differ only in dp_rank or cp_rank (dp x cp
  // of them), ordered by Topology::dp_cp_rank. The gradient reduction, ZeRO-1 and the step's
  // loss sum run over it; with cp 1 it is the data-parallel group.
  std::unique_ptr<Comm> dp_cp;
  std::unique_ptr<Comm> pp;  // ranks that differ only in pp_rank, ordered by pp_rank
  // Expert parallelism (ep > 1; both null otherwise): the ep ranks of this rank's dp x cp group
  // that split the experts (same edp_rank, ordered by ep_rank), and the replicas of this rank's
  // experts (same ep_rank, ordered by edp_rank).
  std::unique_ptr<Comm> ep, edp;
  // The replicas of this rank's experts: edp, or dp_cp without expert parallelism.
  Comm* expert_replicas() const { return edp != nullptr ? edp.get() : dp_cp.get(); }
  // The first and the last pipeline stage of one pp group (for the tied embedding's gradient);
  // the middle stages of that pp group form a second group of this name that nobody uses.
  std::unique_ptr<Comm> embed;
};

// Splits `world` (an MPI world comm of topo.world ranks, or a self comm when topo.world == 1)
// into the tp, cp, dp_cp, pp (and ep, edp) groups of `topo`. Collective over world.
ProcessGroups make_groups(const Topology& topo, std::unique_ptr<Comm> world);

// GPU ranks (train.backend=cuda): the tp, cp, dp_cp, pp, embed (ep, edp) groups become NCCL
// communicators
// over the same ranks, queued on `stream` (nccl), or staging communicators (parallel.comm=mpi);
// world stays MPI (it only carries host tensors). Collective over world; a no-op for one rank.
void use_device_comms(ProcessGroups& g, bool nccl, void* stream, double timeout_s);

}  // namespace tr
