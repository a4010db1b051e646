// Topology: this rank's place in the (tp, cp, dp, pp) grid. Built once from the config and the
// launcher's world, validated, then passed explicitly (never global).
//
// Rank layout (Megatron's order): TP fastest, then CP, then DP, then PP:
//   rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
// so a TP group is tp consecutive ranks (inside one node), a CP group the next-closest ranks,
// and PP/DP cross nodes. The ranks of a CP group hold the same weights and split each sequence,
// so the weights' replicas, which the gradient reduction and ZeRO-1's shards span, are the dp x
// cp ranks of one (tp, pp) position.
//
// Expert parallelism (ep) is carved from those dp x cp ranks (Megatron's order tp, cp, ep, dp,
// pp): consecutive groups of ep of them (by dp_cp_rank) each split a sparse layer's experts, so
// an expert's replicas are the dp x cp / ep ranks of one ep_rank (the expert-data-parallel
// group, edp), over which its gradient is reduced and sharded.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tr {

struct Topology {
  int world = 1, rank = 0;
  int tp = 1, cp = 1, dp = 1, pp = 1;                      // axis sizes
  int ep = 1;                                              // divides dp x cp
  int tp_rank = 0, cp_rank = 0, dp_rank = 0, pp_rank = 0;  // this rank's coordinates

  // dp <= 0 means "auto": world / (tp * cp * pp). Errors name the numbers that do not fit.
  static absl::StatusOr<Topology> make(int world, int rank, int tp, int pp, int dp, int cp = 1,
                                       int ep = 1);

  // The global rank at the given coordinates (the one place rank arithmetic lives).
  int rank_at(int tp_coord, int dp_coord, int pp_coord, int cp_coord = 0) const {
    return tp_coord + tp * (cp_coord + cp * (dp_coord + dp * pp_coord));
  }
  // The same grid seen from global rank `r`.
  Topology of_rank(int r) const {
    Topology t = *this;
    t.rank = r;
    t.tp_rank = r % tp;
    t.cp_rank = r / tp % cp;
    t.dp_rank = r / (tp * cp) % dp;
    t.pp_rank = r / (tp * cp * dp);
    return t;
  }
  // The ranks holding the same weights as this one (same tp and pp coordinates): dp x cp of
  // them, and this rank's index among them. The gradient reduction, ZeRO-1's shards and the
  // checkpoint's writers are theirs.
  int dp_cp() const { return dp * cp; }
  int dp_cp_rank() const { return cp_rank + cp * dp_rank; }
  // Expert parallelism: this rank's place among the ep ranks splitting the experts, and among
  // the edp = dp x cp / ep replicas of its experts.
  int ep_rank() const { return dp_cp_rank() % ep; }
  int edp() const { return dp_cp() / ep; }
  int edp_rank() const { return dp_cp_rank() / ep; }
  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp - 1; }
  // "world 8 = tp 2 x dp 2 x pp 2; rank 5 = (tp 1, dp 0, pp 1)", cp in both when cp > 1, ep
  // (as "ep 2 of dp x cp") when ep > 1
  std::string describe() const;
};

}  // namespace tr
