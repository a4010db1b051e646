#include "trainer/plan/collectives.h"

#include <algorithm>

namespace tr {

const char* algorithm_name(CollectiveAlgorithm a) {
  return a == CollectiveAlgorithm::ring ? "ring" : "tree";
}

GroupSpan group_span(int ranks, int stride, int world, int gpus_per_node) {
  GroupSpan widest{ranks, 1};
  const int64_t block = int64_t{ranks} * stride, g = std::max(gpus_per_node, 1);
  for (int64_t b = 0; b + block <= world; b += block)
    for (int64_t t = 0; t < stride; ++t) {
      int nodes = 0;
      for (int64_t i = 0, last = -1; i < ranks; ++i)
        if (const int64_t node = (b + t + i * stride) / g; node != last) {
          ++nodes;
          last = node;
        }
      widest.nodes = std::max(widest.nodes, nodes);
    }
  return widest;
}

int network_steps(Collective c, CollectiveAlgorithm a, int nodes) {
  if (nodes <= 1) return 0;
  if (c == Collective::send) return 1;
  if (a == CollectiveAlgorithm::tree) {
    int depth = 0;
    for (int k = nodes; k > 1; k /= 2) ++depth;  // floor(log2 nodes)
    return 2 * depth;
  }
  return c == Collective::all_reduce ? 2 * (nodes - 1) : nodes - 1;
}

CollectiveTime collective_time(const GpuSpec& gpu, Collective c, GroupSpan span, double wire_bytes,
                               double calls) {
  if (span.ranks <= 1) return {};
  if (span.nodes <= 1) return {wire_bytes / gpu.nvlink_bw + calls * gpu.nvlink_latency};
  auto cost = [&](CollectiveAlgorithm a, double bandwidth) {
    const double per_call =
        gpu.network_latency + network_steps(c, a, span.nodes) * gpu.network_hop_latency;
    return CollectiveTime{calls * per_call + wire_bytes / bandwidth, a};
  };
  const CollectiveTime ring = cost(CollectiveAlgorithm::ring, gpu.network_bw);
  if (c != Collective::all_reduce) return ring;
  const CollectiveTime tree = cost(CollectiveAlgorithm::tree, gpu.network_bw * kTreeBandwidth);
  return tree.seconds < ring.seconds ? tree : ring;
}

void set_network_latency(GpuSpec& gpu, double smallest_all_reduce_s, int nodes) {
  // A message too small for bandwidth to matter: the algorithm with fewer steps.
  const int steps =
      std::min(network_steps(Collective::all_reduce, CollectiveAlgorithm::ring, nodes),
               network_steps(Collective::all_reduce, CollectiveAlgorithm::tree, nodes));
  if (steps * gpu.network_hop_latency <= smallest_all_reduce_s) {
    gpu.network_latency = smallest_all_reduce_s - steps * gpu.network_hop_latency;
  } else {
    gpu.network_hop_latency = smallest_all_reduce_s / steps;
    gpu.network_latency = 0;
  }
}

}  // namespace tr
