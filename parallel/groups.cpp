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
    g.dp = make_self_comm("dp");
    g.pp = make_self_comm("pp");
    g.embed = make_self_comm("embed");
  } else {
    // color = the coordinates that stay fixed within the group, key = the one that varies.
    g.tp = split_mpi_comm(*world, t.dp_rank + t.dp * t.pp_rank, t.tp_rank, "tp");
    g.dp = split_mpi_comm(*world, t.tp_rank + t.tp * t.pp_rank, t.dp_rank, "dp");
    g.pp = split_mpi_comm(*world, t.tp_rank + t.tp * t.dp_rank, t.pp_rank, "pp");
    const bool ends = t.first_stage() || t.last_stage();
    g.embed = split_mpi_comm(*g.pp, ends ? 0 : 1, t.pp_rank, "embed");
  }
  g.world = std::move(world);
  return g;
}

void use_device_comms(ProcessGroups& g, bool nccl, void* stream, double timeout_s) {
  if (g.world->size() == 1) return;
  // Every rank wraps the groups in the same order, so each NCCL initialisation meets its peers.
  for (std::unique_ptr<Comm>* c : {&g.tp, &g.dp, &g.pp, &g.embed})
    *c = nccl ? make_nccl_comm(std::move(*c), stream, timeout_s) : make_staging_comm(std::move(*c));
}

}  // namespace tr
