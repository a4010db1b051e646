#include "trainer/layout/flat_buffers.h"

#include <algorithm>
#include <string>

namespace tr {

std::vector<FlatRegion> flat_regions(const ParamLayout& l, const Topology& t) {
  std::vector<FlatRegion> out = {{0, l.expert_begin, t.dp_cp(), t.dp_cp_rank()}};
  if (l.expert_begin < l.capacity)
    out.push_back({l.expert_begin, l.capacity - l.expert_begin, t.edp(), t.edp_rank()});
  return out;
}

FlatShards dp_shards(const Config& cfg, const Topology& topo) {
  const bool zero1 = zero1_on(cfg, topo);
  FlatShards shards;
  for (const FlatRegion& r : flat_regions(rank_layout(cfg, topo), topo)) {
    if (zero1)
      shards.add(r.capacity, cfg.parallel.dp_bucket_elems, r.replicas, r.rank);
    else
      shards.add(r.capacity, r.capacity + 1, 1, 0);
  }
  return shards;
}

bool zero1_on(const Config& cfg, const Topology& t) {
  return cfg.parallel.zero1 && t.dp_cp() > 1;
}

int64_t flat_multiple(const Config& cfg, const Topology& topo) {
  return zero1_on(cfg, topo) ? DpShards::capacity_multiple(topo.dp_cp()) : 1;
}

ParamLayout rank_layout(const Config& cfg, const Topology& topo) {
  return ParamLayout::make(ModelDims::from(cfg, topo), flat_multiple(cfg, topo));
}

std::vector<ParamInfo> model_params(const Config& cfg, const Topology& topo) {
  std::vector<ParamInfo> out;
  // Each stage's tensors, and its experts from every expert-parallel rank (ep_rank j is dp x cp
  // index j).
  for (int stage = 0; stage < topo.pp; ++stage)
    for (int j = 0; j < topo.ep; ++j)
      for (ParamInfo& p :
           rank_layout(cfg, topo.of_rank(topo.rank_at(0, j / topo.cp, stage, j % topo.cp))).tensors)
        if (!p.tied_copy && (j == 0 || p.expert)) out.push_back(std::move(p));
  // The model's order whatever the schedule: under interleaved a rank holds layers of several
  // chunks (a layer's tensors stay in their order).
  const auto rank = [](const std::string& name) -> std::pair<int, int64_t> {
    if (name.starts_with("embed_tokens/")) return {0, 0};
    if (name.starts_with("layers/")) return {1, std::stoll(name.substr(7))};
    return {name.starts_with("norm/") ? 2 : 3, 0};
  };
  std::stable_sort(out.begin(), out.end(), [&](const ParamInfo& a, const ParamInfo& b) {
    return rank(a.name) < rank(b.name);
  });
  return out;
}

double model_param_count(const Config& cfg, const Topology& topo) {
  double elems = 0;
  for (const ParamInfo& p : model_params(cfg, topo)) {
    double n = 1;
    for (int64_t d : p.global_shape) n *= static_cast<double>(d);
    elems += n;
  }
  return elems;
}

double checkpoint_bytes(const Config& cfg, const Topology& topo) {
  return model_param_count(cfg, topo) * 3 * sizeof(float);  // weights, Adam m, Adam v
}

double rank_state_bytes(const Config& cfg, const Topology& topo, bool separate_masters) {
  const FlatShards shards = dp_shards(cfg, topo);
  const auto capacity = static_cast<double>(shards.capacity());
  const auto shard = static_cast<double>(shards.shard_size());
  return sizeof(float) * ((separate_masters ? shard : capacity) + 2 * shard);
}

}  // namespace tr
