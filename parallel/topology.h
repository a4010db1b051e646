// Topology: this rank's place in the (tp, dp, pp) grid. Built once from the config and the
// launcher's world, validated, then passed explicitly (never global).
//
// Rank layout (Megatron's default order): TP fastest, then DP, then PP:
//   rank = tp_rank + tp * (dp_rank + dp * pp_rank)
// so a TP group is tp consecutive ranks (inside one node), and PP/DP cross nodes.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tr {

struct Topology {
  int world = 1, rank = 0;
  int tp = 1, dp = 1, pp = 1;                 // axis sizes
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;  // this rank's coordinates

  // dp <= 0 means "auto": world / (tp * pp). Errors name the numbers that do not fit.
  static absl::StatusOr<Topology> make(int world, int rank, int tp, int pp, int dp);

  // The global rank at the given coordinates (the one place rank arithmetic lives).
  int rank_at(int tp_coord, int dp_coord, int pp_coord) const {
    return tp_coord + tp * (dp_coord + dp * pp_coord);
  }
  // The same grid seen from global rank `r`.
  Topology of_rank(int r) const {
    Topology t = *this;
    t.rank = r;
    t.tp_rank = r % tp;
    t.dp_rank = r / tp % dp;
    t.pp_rank = r / (tp * dp);
    return t;
  }
  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp - 1; }
  std::string describe() const;  // "world 8 = tp 2 x dp 2 x pp 2; rank 5 = (tp 1, dp 0, pp 1)"
};

}  // namespace tr
