// A rank's flat buffers as the layout makes them: the parameter layout of the rank at a grid
// position, what its buffers are padded to, ZeRO-1's shards of them, and the sizes that follow
// (a checkpoint's bytes on disk, a rank's host copy of its training state). Pure functions of
// the config and the rank's place in the grid, so every rank (and the planner) can compute any
// other rank's answer without being told.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/dp_shards.h"
#include "parallel/topology.h"
#include "trainer/config/config.h"
#include "trainer/model/model_layout.h"

namespace tr {

// ZeRO-1 is on: parallel.zero1 with more than one replica of the weights (dp x cp). Then each
// keeps the Adam states (and, with a separate compute copy, the fp32 masters) of its shard of the
// flat buffer, whose capacity is a multiple of DpShards::capacity_multiple(dp x cp).
bool zero1_on(const Config& cfg, const Topology& topo);

// What the rank's flat buffers are padded to a multiple of (DecoderModel's flat_multiple): 1, or
// under ZeRO-1 DpShards::capacity_multiple(dp x cp).
int64_t flat_multiple(const Config& cfg, const Topology& topo);

// The parameter layout of the rank at `topo` under `cfg` (as build_model makes it).
ParamLayout rank_layout(const Config& cfg, const Topology& topo);

// The regions of a rank's flat buffer (ParamLayout) and the replicas each is reduced, sharded
// and written over: the dense tensors' over dp x cp, the experts' (where the rank holds experts)
// over their replicas (Topology::edp).
struct FlatRegion {
  int64_t begin = 0, capacity = 0;  // elements of the flat buffer
  int replicas = 1, rank = 0;       // the replica group's size and this rank's place in it
};
std::vector<FlatRegion> flat_regions(const ParamLayout& layout, const Topology& topo);

// ZeRO-1's shards for the rank at `topo` (parallel/dp_shards.h), one region per part of the flat
// buffer (ParamLayout): the dense region's piece dp_cp_rank of every bucket of
// parallel.dp_bucket_elems (rounded up by DpShards::round_bucket), the experts' piece edp_rank;
// or one rank's whole buffer without ZeRO-1. The model's masters, AdamW's states, the gradient
// reduction and the checkpoint's ownership all follow them.
FlatShards dp_shards(const Config& cfg, const Topology& topo);

// Every tensor of the model once (all pipeline stages, TP rank 0's view; the last stage's copy
// of a tied embedding left out), in stage order: what a checkpoint holds, by global shape.
std::vector<ParamInfo> model_params(const Config& cfg, const Topology& topo);
// The model's parameters: the elements of model_params (real vocabulary, a tied embedding once).
double model_param_count(const Config& cfg, const Topology& topo);

// Bytes of one checkpoint on disk: the fp32 weights and both Adam moments of every tensor (the
// small metadata files aside). The planner shows it; start-up checks checkpoint.dir against it.
double checkpoint_bytes(const Config& cfg, const Topology& topo);
// Bytes of the training state rank `topo.rank` holds in host copies of it (a node-local part,
// an asynchronous save's buffer): its fp32 masters (its ZeRO-1 shard where they are separate
// from the compute weights and sharded, else the whole flat buffer) and its Adam m and v (its
// shard under ZeRO-1, else the whole buffer).
double rank_state_bytes(const Config& cfg, const Topology& topo, bool separate_masters);

}  // namespace tr
