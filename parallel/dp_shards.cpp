#include "parallel/dp_shards.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace tr {

DpShards::DpShards(int64_t capacity, int64_t bucket, int dp, int rank)
    : capacity_(capacity), dp_(dp), rank_(rank) {
  TR_ASSERT(dp >= 1 && rank >= 0 && rank < dp && capacity >= 0 && capacity % dp == 0 && bucket > 0,
            "DpShards: capacity " + std::to_string(capacity) + " must be a multiple of dp " +
                std::to_string(dp) + " (rank " + std::to_string(rank) + ", bucket " +
                std::to_string(bucket) + ")");
  bucket_ = round_bucket(bucket, dp);
}

int64_t DpShards::piece(int64_t b) const {
  const auto [lo, hi] = bucket(b);
  return (hi - lo) / dp_;  // the last bucket too: capacity and lo are multiples of dp
}

std::vector<ShardRun> DpShards::runs(int64_t begin, int64_t end, int r) const {
  std::vector<ShardRun> out;
  begin = std::max<int64_t>(begin, 0);
  end = std::min(end, capacity_);
  if (begin >= end) return out;
  for (int64_t b = begin / bucket_; b * bucket_ < end; ++b) {
    const int64_t lo = piece_begin(b, r), hi = lo + piece(b);
    const int64_t a = std::max(lo, begin), c = std::min(hi, end);
    if (a >= c) continue;
    const ShardRun run{a, shard_offset(b) + (a - lo), c - a};
    if (!out.empty() && out.back().flat + out.back().count == run.flat &&
        out.back().shard + out.back().count == run.shard)
      out.back().count += run.count;
    else
      out.push_back(run);
  }
  return out;
}

void FlatShards::add(int64_t capacity, int64_t bucket, int dp, int rank) {
  const DpShards shards(capacity, bucket, dp, rank);
  regions_.push_back({capacity_, shard_size_, shards});
  capacity_ += capacity;
  shard_size_ += shards.shard_size();
}

std::vector<ShardRun> FlatShards::runs(int64_t begin, int64_t end) const {
  std::vector<ShardRun> out;
  for (const Region& r : regions_)
    for (ShardRun run : r.shards.runs(begin - r.flat, end - r.flat)) {
      run.flat += r.flat;
      run.shard += r.shard;
      out.push_back(run);
    }
  return out;
}

}  // namespace tr
