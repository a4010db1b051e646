// A collective's time on a cluster's links, framed as NCCL's cost model frames it: a latency per
// call that grows with the steps its algorithm takes across nodes (a ring's 2(k - 1) for an
// all-reduce over k nodes, a tree's 2 log2 k), plus the bytes each rank sends over the link's bus
// bandwidth. NCCL picks, per call, the algorithm its model finds faster; so does the planner:
// rings for large buckets, trees for small all-reduces across many nodes.
#pragma once

#include "core/hardware.h"

namespace tr {

enum class Collective { all_reduce, reduce_scatter, all_gather, send };
enum class CollectiveAlgorithm { ring, tree };

const char* algorithm_name(CollectiveAlgorithm a);

// The ranks of a communicator group and the nodes they span.
struct GroupSpan {
  int ranks = 1;
  int nodes = 1;
};

// The widest of a world's groups of `ranks` ranks, neighbours `stride` ranks apart (each block of
// ranks x stride consecutive ranks holds `stride` of them), on nodes of `gpus_per_node` GPUs
// filled in rank order (parallel/topology.h: TP fastest, then CP, DP, PP): a TP group has stride
// 1, a CP or a DP x CP group stride tp. A group that straddles a node boundary spans both.
GroupSpan group_span(int ranks, int stride, int world, int gpus_per_node);

// Steps one call takes across nodes: ring all-reduce 2 (k - 1), ring reduce-scatter or
// all-gather k - 1, tree all-reduce 2 floor(log2 k) (up the tree and down), a send 1.
int network_steps(Collective c, CollectiveAlgorithm a, int nodes);

// A tree's bus bandwidth as a fraction of a ring's (NCCL's model: 0.9).
inline constexpr double kTreeBandwidth = 0.9;

struct CollectiveTime {
  double seconds = 0;
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::ring;
};

// `calls` calls of `c` moving `wire_bytes` in all (what each rank sends, counted as a ring sends
// it: the bus bandwidth's bytes) over a group spanning `span`. Inside a node: wire / nvlink_bw +
// calls x nvlink_latency. Across nodes each call costs network_latency + its steps x
// network_hop_latency + its bytes over network_bw (a tree's at kTreeBandwidth of it); an
// all-reduce takes the faster of ring and tree, the others a ring.
CollectiveTime collective_time(const GpuSpec& gpu, Collective c, GroupSpan span, double wire_bytes,
                               double calls);

// The latency terms from a measured smallest all-reduce across `nodes` nodes (preflight's
// network_latency_us): its steps at the table's network_hop_latency, the rest the per-call
// network_latency; where the steps alone would exceed the measurement, the hop is what the
// measurement gives each step and the per-call part 0.
void set_network_latency(GpuSpec& gpu, double smallest_all_reduce_s, int nodes);

}  // namespace tr
