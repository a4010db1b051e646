#include "parallel/tp_region.h"

#include "core/check.h"

namespace tr::tp {

void sum(Comm* group, Tensor t) {
  if (group == nullptr || group->size() == 1) return;
  group->all_reduce(t, ReduceOp::sum);
}

void reduce_out(Comm* group, bool sequence_parallel, Tensor partial, Tensor local) {
  if (!sequence_parallel) return sum(group, partial);  // partial is local
  TR_ASSERT(group != nullptr, "sequence parallelism needs the TP group");
  group->reduce_scatter(local, partial, ReduceOp::sum);
}

Comm::Ticket reduce_out_start(Comm* group, bool sequence_parallel, Tensor partial, Tensor local) {
  if (group == nullptr || group->size() == 1) return Comm::kDone;
  if (!sequence_parallel) return group->all_reduce_start(partial, ReduceOp::sum);
  return group->reduce_scatter_start(local, partial, ReduceOp::sum);
}

Tensor gather_in(Comm* group, bool sequence_parallel, Tensor local, Tensor full) {
  if (!sequence_parallel) return local;
  TR_ASSERT(group != nullptr, "sequence parallelism needs the TP group");
  group->all_gather(full, local);
  return full;
}

}  // namespace tr::tp
