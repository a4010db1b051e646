#include "parallel/topology.h"

#include "absl/strings/str_format.h"

namespace tr {

absl::StatusOr<Topology> Topology::make(int world, int rank, int tp, int pp, int dp, int cp,
                                        int ep) {
  if (world < 1 || rank < 0 || rank >= world)
    return absl::InvalidArgumentError(absl::StrFormat("invalid rank %d of world %d", rank, world));
  if (tp < 1) return absl::InvalidArgumentError("parallel.tp must be >= 1");
  if (pp < 1) return absl::InvalidArgumentError("parallel.pp must be >= 1");
  if (cp < 1) return absl::InvalidArgumentError("parallel.cp must be >= 1");
  if (ep < 1) return absl::InvalidArgumentError("parallel.ep must be >= 1");
  // "tp 2 x pp 2" or "tp 2 x cp 2 x pp 2": cp is named where it is used.
  const std::string axes = cp > 1 ? absl::StrFormat("tp %d x cp %d x pp %d", tp, cp, pp)
                                  : absl::StrFormat("tp %d x pp %d", tp, pp);
  const std::string keys = cp > 1 ? "parallel.tp/cp/pp" : "parallel.tp/pp";
  const int fixed = tp * cp * pp;
  if (dp <= 0) {
    if (world % fixed != 0)
      return absl::InvalidArgumentError(
          absl::StrFormat("parallel layout: world size %d is not divisible by %s = %d; launch a "
                          "multiple of %d ranks or change %s",
                          world, axes, fixed, fixed, keys));
    dp = world / fixed;
  }
  if (fixed * dp != world)
    return absl::InvalidArgumentError(absl::StrFormat(
        "parallel layout: %s x dp %d = %d ranks but this run has %d process%s; "
        "launch %d ranks (srun -n %d) or change %s/dp",
        axes, dp, fixed * dp, world, world == 1 ? "" : "es", fixed * dp, fixed * dp, keys));
  if ((dp * cp) % ep != 0)
    return absl::InvalidArgumentError(absl::StrFormat(
        "parallel.ep %d does not divide the %d ranks that share each weight (dp %d x cp %d); "
        "use an ep that divides %d or change the number of ranks",
        ep, dp * cp, dp, cp, dp * cp));
  Topology t;
  t.world = world;
  t.ep = ep;
  t.tp = tp;
  t.cp = cp;
  t.pp = pp;
  t.dp = dp;
  return t.of_rank(rank);
}

std::string Topology::describe() const {
  if (ep > 1)
    return absl::StrFormat(
        "world %d = tp %d x cp %d x dp %d x pp %d, ep %d of dp x cp; rank %d = (tp %d, cp %d, dp "
        "%d, pp %d; ep %d, edp %d)",
        world, tp, cp, dp, pp, ep, rank, tp_rank, cp_rank, dp_rank, pp_rank, ep_rank(), edp_rank());
  if (cp == 1)
    return absl::StrFormat("world %d = tp %d x dp %d x pp %d; rank %d = (tp %d, dp %d, pp %d)",
                           world, tp, dp, pp, rank, tp_rank, dp_rank, pp_rank);
  return absl::StrFormat(
      "world %d = tp %d x cp %d x dp %d x pp %d; rank %d = (tp %d, cp %d, dp %d, pp %d)", world, tp,
      cp, dp, pp, rank, tp_rank, cp_rank, dp_rank, pp_rank);
}

}  // namespace tr
