// A record of the ops a context dispatched (Ctx::log): each call of a kernels/ops.h entry point
// once, by its kernel and the shape that prices it. Tests compare it with the model's op list
// (trainer/model/op_list.h), so that what the planner and bench_ops charge is what the model
// runs. Off (Ctx::log null) it costs one pointer test per call.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "core/ctx.h"

namespace tr {

// A kernel and its shape: GEMMs M x N x K as the product runs (linear_fwd's out [M, N] = in [M,
// K] . W[N, K]^T; "linear_bwd.din" and "linear_bwd.dweight" the two products of linear_bwd,
// each M x N x K of its own output); attention tokens x (heads x head_dim) x keys of a
// sequence; the rest rows x width (k = 1); collectives their buffer's rows x width
// (parallel/comm.h comm_key).
struct OpKey {
  std::string kernel;
  int64_t m = 0, n = 0, k = 1;
  auto operator<=>(const OpKey&) const = default;
  std::string str() const;  // "linear_fwd 64 x 96 x 32"
};

class OpLog {
 public:
  // A kernel: recorded unless a Compound is open.
  void note(OpKey key);
  // A collective or exchange (parallel/comm.h logged_comm): recorded inside Compounds too, since
  // what a compound op sends is fixed by its shapes where the blocks it launches are not.
  void note_collective(OpKey key) {
    if (routed_ == 0) ++counts_[std::move(key)];
  }
  const std::map<OpKey, int64_t>& counts() const { return counts_; }
  void clear() { counts_.clear(); }

  // A compound op (context-parallel attention, whose blocks depend on the data): recorded once
  // as `key` on ctx's log; the ops dispatched inside it are not recorded. A `routed` one (an op
  // over the rows a mixture of experts' routing sent a rank, which the routing decides)
  // records its collectives under `key` too, not at their own shapes.
  class Compound {
   public:
    Compound(const Ctx& ctx, OpKey key, bool routed = false);
    ~Compound();
    Compound(const Compound&) = delete;
    Compound& operator=(const Compound&) = delete;

   private:
    OpLog* log_;
    bool routed_;
  };

 private:
  std::map<OpKey, int64_t> counts_;
  int inside_ = 0;  // open Compounds
  int routed_ = 0;  // of them routed
};

}  // namespace tr
