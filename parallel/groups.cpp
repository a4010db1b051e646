#include "parallel/groups.h"

#include "parallel/mpi_comm.h"
#include "parallel/nccl_comm.h"

namespace tr {

ProcessGroups make_groups(const Topology& t, std::unique_ptr<Comm> world) {
  TR_ASSERT(world->size() == t.world && world->rank() == t.rank,
            "topology and world communicator disagree");
  ProcessGroups g;
  if (t.world == 1) {
    g.tp = make_self_comm("tp");
    g.cp = make_self_comm("cp");
    g.dp_cp = make_self_comm("dp");
    g.pp = make_self_comm("pp");
    g.embed = make_self_comm("embed");
  } else {
    // color = the coordinates that stay fixed within the group, key = the one that varies.
    const int tp_pp = t.tp_rank + t.tp * t.pp_rank;
    g.tp = split_mpi_comm(*world, t.rank / t.tp, t.tp_rank, "tp");
    g.cp = split_mpi_comm(*world, tp_pp + t.tp * t.pp * t.dp_rank, t.cp_rank, "cp");
    g.dp_cp = split_mpi_comm(*world, tp_pp, t.dp_cp_rank(), t.cp > 1 ? "dp_cp" : "dp");
    g.pp = split_mpi_comm(*world, t.rank % (t.tp * t.cp * t.dp), t.pp_rank, "pp");
    const bool ends = t.first_stage() || t.last_stage();
    g.embed = split_mpi_comm(*g.pp, ends ? 0 : 1, t.pp_rank, "embed");
    if (t.ep > 1) {
      g.ep = split_mpi_comm(*world, tp_pp + t.tp * t.pp * t.edp_rank(), t.ep_rank(), "ep");
      g.edp = split_mpi_comm(*world, tp_pp + t.tp * t.pp * t.ep_rank(), t.edp_rank(), "edp");
    }
  }
  g.world = std::move(world);
  return g;
}

void use_device_comms(ProcessGroups& g, bool nccl, void* stream, double timeout_s) {
  if (g.world->size() == 1) return;
  // Every rank wraps the groups in the same order, so each NCCL initialisation meets its peers.
  for (std::unique_ptr<Comm>* c : {&g.tp, &g.cp, &g.dp_cp, &g.pp, &g.embed, &g.ep, &g.edp}) {
    if (*c == nullptr) continue;  // no expert parallelism: the same on every rank
    *c = nccl ? make_nccl_comm(std::move(*c), stream, timeout_s) : make_staging_comm(std::move(*c));
  }
}

}  // namespace tr
