// Megatron's paired tensor-parallel primitives: the two ends of a TP region (a column-parallel
// layer's input to a row-parallel layer's output). Without sequence parallelism the whole
// sequence lives on every TP rank: entering the region is nothing and leaving it all-reduces
// the ranks' partial sums in place. With sequence parallelism each rank holds T / tp tokens
// outside the regions: entering all-gathers them, leaving reduce-scatters the partial sums over
// the tokens. Backward pairs them the other way round (the gradient of a gather is a
// reduce-scatter, of a reduction a gather).
#pragma once

#include "core/tensor.h"
#include "parallel/comm.h"

namespace tr::tp {

// The TP group's sum of t, in place; nothing when `group` is null or of size 1.
void sum(Comm* group, Tensor t);
// Leaving a region: `partial` ([T, ...], this rank's partial sums) becomes `local`, this rank's
// share of the sums: the all-reduced `partial` itself (no sequence parallelism: local is
// partial), or its reduce-scattered block of T / tp tokens.
void reduce_out(Comm* group, bool sequence_parallel, Tensor partial, Tensor local);
// reduce_out started on the group's side lane (Comm::Lane::beside), to overlap what follows:
// neither buffer may be touched until group->wait(ticket). kDone when there is nothing to do.
Comm::Ticket reduce_out_start(Comm* group, bool sequence_parallel, Tensor partial, Tensor local);
// Entering a region: this rank's tokens `local` as the whole sequence: all-gathered into `full`
// and returned (sequence parallelism), or `local` itself.
Tensor gather_in(Comm* group, bool sequence_parallel, Tensor local, Tensor full);

}  // namespace tr::tp
