#include "trainer/checkpoint/ownership.h"

#include <algorithm>
#include <set>

namespace tr {
namespace {

using ckpt::ShardPiece;
using ckpt::TensorRef;
using ckpt::TensorSetId;

// A tensor's columns as a matrix (a vector is one row).
int64_t cols_of(const ParamInfo& p) {
  return p.shape.size() == 2 ? p.shape[1] : p.numel;
}

// Appends the blocks of the global tensor that elements [a, b) of p's local (row-major) slice
// cover: at most a partial row, full rows and a partial row. `data` holds element a (null:
// describe only). Vocabulary padding rows are left out.
void add_range(const ParamInfo& p, TensorSetId set, int64_t a, int64_t b, const float* data,
               std::vector<ShardPiece>& out) {
  const int64_t C = cols_of(p);
  auto rect = [&](int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
    if (nr <= 0 || nc <= 0) return;
    ShardPiece piece;
    piece.set = set;
    piece.ref.name = p.name;
    piece.ref.shape = p.global_shape;
    if (p.shape.size() == 2) {
      const int64_t gr = r0 + (p.split_dim == 0 ? p.split_offset : 0);
      const int64_t gc = c0 + (p.split_dim == 1 ? p.split_offset : 0);
      nr = std::min(nr, p.global_shape[0] - gr);  // padding rows are not part of the tensor
      if (nr <= 0) return;
      piece.ref.start = {gr, gc};
      piece.ref.extent = {nr, nc};
    } else {
      piece.ref.start = {c0 + (p.split_dim == 0 ? p.split_offset : 0)};
      piece.ref.extent = {nc};
    }
    if (data != nullptr) piece.ref.data = const_cast<float*>(data) + (r0 * C + c0 - a);
    out.push_back(std::move(piece));
  };
  if (a >= b) return;
  const int64_t ra = a / C, rb = b / C;
  if (ra == rb) {  // inside one row
    rect(ra, 1, a % C, b - a);
    return;
  }
  int64_t full = ra;
  if (a % C != 0) {
    rect(ra, 1, a % C, C - a % C);
    full = ra + 1;
  }
  rect(full, rb - full, 0, C);
  if (b % C != 0) rect(rb, 1, 0, b % C);
}

// An empty block of p's global tensor: read nothing, but ask for the tensor (so that the
// checkpoint's tensors are checked against the model's).
TensorRef empty_block(const ParamInfo& p) {
  TensorRef empty{p.name, p.global_shape, nullptr};
  empty.start.assign(p.global_shape.size(), 0);
  empty.extent = p.global_shape;
  if (!empty.extent.empty()) empty.extent[0] = 0;
  return empty;
}

// The whole local slice of p as one block of the global tensor (an empty block when the slice
// is all vocabulary padding).
TensorRef local_block(const ParamInfo& p, TensorSetId set, float* data) {
  std::vector<ShardPiece> one;
  add_range(p, set, 0, p.numel, data, one);
  return one.empty() ? empty_block(p) : std::move(one.front().ref);
}

// The runs of the flat buffer [0, total) this rank writes: its ZeRO-1 shard (`shard` indices
// into it), or without ZeRO-1 its contiguous part of each region, the region cut into equal
// parts over the region's replicas (dp x cp for the dense tensors, the experts' replicas for
// theirs; `shard` = flat: the buffers are whole).
std::vector<ShardRun> written_runs(const Config& cfg, const Topology& t, const ParamLayout& l) {
  if (zero1_on(cfg, t)) return dp_shards(cfg, t).runs(0, l.total);
  std::vector<ShardRun> out;
  for (const FlatRegion& r : flat_regions(l, t)) {
    const int64_t size = (r.capacity + r.replicas - 1) / r.replicas;
    const int64_t begin = std::min(r.begin + size * r.rank, l.total);
    const int64_t end = std::min({begin + size, r.begin + r.capacity, l.total});
    if (begin < end) out.push_back(ShardRun{begin, begin, end - begin});
  }
  return out;
}

// The part of run r inside tensor p: [lo, hi) of the flat buffer (empty when lo >= hi).
std::pair<int64_t, int64_t> overlap(const ParamInfo& p, const ShardRun& r) {
  return {std::max(p.offset, r.flat), std::min(p.offset + p.numel, r.flat + r.count)};
}

}  // namespace

std::vector<ShardPiece> owned_pieces(const Config& cfg, const Topology& topo,
                                     const RankBuffers& bufs) {
  const ParamLayout layout = rank_layout(cfg, topo);
  auto owns = [&](const ParamInfo& p) {
    return !p.tied_copy && (p.split_dim >= 0 || topo.tp_rank == 0);
  };
  auto at = [](const float* base, int64_t offset) {
    return base != nullptr ? base + offset : nullptr;
  };
  const std::vector<ShardRun> runs = written_runs(cfg, topo, layout);
  const bool zero1 = zero1_on(cfg, topo);
  std::vector<ShardPiece> out;
  const std::pair<TensorSetId, const float*> sets[] = {{TensorSetId::params, bufs.params},
                                                       {TensorSetId::exp_avg, bufs.exp_avg},
                                                       {TensorSetId::exp_avg_sq, bufs.exp_avg_sq}};
  for (auto [set, base] : sets) {
    // The Adam states of a ZeRO-1 shard are in its order, the masters where the caller says;
    // everything else is whole (flat indices).
    const bool in_shard = set == TensorSetId::params ? bufs.params_sharded : zero1;
    for (const ParamInfo& p : layout.tensors) {
      if (!owns(p)) continue;
      for (const ShardRun& r : runs) {
        const auto [lo, hi] = overlap(p, r);
        if (lo >= hi) continue;
        add_range(p, set, lo - p.offset, hi - p.offset,
                  at(base, in_shard ? r.shard + (lo - r.flat) : lo), out);
      }
    }
  }
  return out;
}

std::vector<TensorRef> rank_param_blocks(const Config& cfg, const Topology& topo, float* params) {
  std::vector<TensorRef> out;
  for (const ParamInfo& p : rank_layout(cfg, topo).tensors)
    out.push_back(local_block(p, TensorSetId::params, params + p.offset));
  return out;
}

std::vector<TensorRef> model_tensors(const Config& cfg, const Topology& topo) {
  std::vector<TensorRef> out;
  for (ParamInfo& p : model_params(cfg, topo))
    out.push_back({std::move(p.name), std::move(p.global_shape), nullptr});
  return out;
}

absl::Status load_rank_part(const std::string& dir, const Config& cfg, const Topology& topo,
                            float* params, float* exp_avg, float* exp_avg_sq,
                            ckpt::TrainState* state, std::string* config_yaml) {
  const ParamLayout layout = rank_layout(cfg, topo);
  const bool zero1 = zero1_on(cfg, topo);
  const std::vector<ShardRun> runs =
      zero1 ? written_runs(cfg, topo, layout) : std::vector<ShardRun>();
  auto in_shard = [&](const ParamInfo& p) {
    for (const ShardRun& r : runs)
      if (const auto [lo, hi] = overlap(p, r); lo < hi) return true;
    return false;
  };
  std::fill(params, params + layout.total, 0.0f);  // vocabulary padding rows stay zero
  std::vector<float> whole_m, whole_v;             // ZeRO-1: the local slices overlapping the shard
  std::vector<int64_t> at;                         // where each one starts in whole_m / whole_v
  std::vector<TensorRef> refs[3] = {rank_param_blocks(cfg, topo, params), {}, {}};
  for (const ParamInfo& p : layout.tensors) {
    if (!zero1) {
      refs[1].push_back(local_block(p, TensorSetId::exp_avg, exp_avg + p.offset));
      refs[2].push_back(local_block(p, TensorSetId::exp_avg_sq, exp_avg_sq + p.offset));
    } else if (in_shard(p)) {
      at.push_back(static_cast<int64_t>(whole_m.size()));
      whole_m.resize(whole_m.size() + static_cast<size_t>(p.numel), 0.0f);
    } else {
      at.push_back(-1);
    }
  }
  if (zero1) {
    whole_v.assign(whole_m.size(), 0.0f);
    for (size_t k = 0; k < layout.tensors.size(); ++k) {
      const ParamInfo& p = layout.tensors[k];
      refs[1].push_back(at[k] < 0 ? empty_block(p)
                                  : local_block(p, TensorSetId::exp_avg, whole_m.data() + at[k]));
      refs[2].push_back(at[k] < 0
                            ? empty_block(p)
                            : local_block(p, TensorSetId::exp_avg_sq, whole_v.data() + at[k]));
    }
  }
  // The other stages' tensors as empty blocks: every rank checks that the checkpoint holds
  // exactly the model's tensors (no layer more or less), while reading only its own.
  std::set<std::string> mine;
  for (const ParamInfo& p : layout.tensors) mine.insert(p.name);
  for (const TensorRef& t : model_tensors(cfg, topo)) {
    if (mine.count(t.name)) continue;
    ParamInfo other;
    other.name = t.name;
    other.global_shape = t.shape;
    for (std::vector<TensorRef>& set : refs) set.push_back(empty_block(other));
  }
  ckpt::LoadTarget dst{refs[0], refs[1], refs[2], /*subset=*/false, /*check_crc=*/false};
  if (absl::Status st = ckpt::load(dir, dst, state, config_yaml); !st.ok()) return st;
  if (!zero1) return absl::OkStatus();
  const int64_t shard = dp_shards(cfg, topo).shard_size();
  std::fill(exp_avg, exp_avg + shard, 0.0f);
  std::fill(exp_avg_sq, exp_avg_sq + shard, 0.0f);
  for (size_t k = 0; k < layout.tensors.size(); ++k) {
    if (at[k] < 0) continue;
    const ParamInfo& p = layout.tensors[k];
    for (const ShardRun& r : runs) {
      const auto [lo, hi] = overlap(p, r);
      if (lo >= hi) continue;
      const int64_t from = at[k] + (lo - p.offset), to = r.shard + (lo - r.flat);
      std::copy(whole_m.begin() + from, whole_m.begin() + from + (hi - lo), exp_avg + to);
      std::copy(whole_v.begin() + from, whole_v.begin() + from + (hi - lo), exp_avg_sq + to);
    }
  }
  return absl::OkStatus();
}

}  // namespace tr
