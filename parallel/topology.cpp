#include "parallel/topology.h"

#include "absl/strings/str_format.h"

namespace tr {

absl::StatusOr<Topology> Topology::make(int world, int rank, int tp, int pp, int dp) {
  if (world < 1 || rank < 0 || rank >= world)
    return absl::InvalidArgumentError(absl::StrFormat("invalid rank %d of world %d", rank, world));
  if (tp < 1) return absl::InvalidArgumentError("parallel.tp must be >= 1");
  if (pp < 1) return absl::InvalidArgumentError("parallel.pp must be >= 1");
  if (dp <= 0) {
    if (world % (tp * pp) != 0)
      return absl::InvalidArgumentError(absl::StrFormat(
          "parallel layout: world size %d is not divisible by tp %d x pp %d = %d; launch a "
          "multiple of %d ranks or change parallel.tp/pp",
          world, tp, pp, tp * pp, tp * pp));
    dp = world / (tp * pp);
  }
  if (tp * pp * dp != world)
    return absl::InvalidArgumentError(absl::StrFormat(
        "parallel layout: tp %d x pp %d x dp %d = %d ranks but this run has %d process%s; "
        "launch %d ranks (srun -n %d) or change parallel.tp/pp/dp",
        tp, pp, dp, tp * pp * dp, world, world == 1 ? "" : "es", tp * pp * dp, tp * pp * dp));
  Topology t;
  t.world = world;
  t.rank = rank;
  t.tp = tp;
  t.pp = pp;
  t.dp = dp;
  t.tp_rank = rank % tp;
  t.dp_rank = (rank / tp) % dp;
  t.pp_rank = rank / (tp * dp);
  return t;
}

std::string Topology::describe() const {
  return absl::StrFormat("world %d = tp %d x dp %d x pp %d; rank %d = (tp %d, dp %d, pp %d)", world,
                         tp, dp, pp, rank, tp_rank, dp_rank, pp_rank);
}

}  // namespace tr
