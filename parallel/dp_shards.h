// ZeRO-1's data-parallel shards of a flat buffer, in Megatron's distributed-optimizer layout.
//
// The buffer's `capacity` elements are cut into buckets of `bucket` elements (the last may be
// shorter) and each bucket into dp equal pieces; rank r owns piece r of every bucket. Its shard
// (the reduced gradients, the Adam moments and, with a separate compute copy, the fp32 masters)
// is its pieces back to back in bucket order: bucket b's piece sits at shard offset lo_b / dp,
// capacity / dp elements in all. One bucket's gradient reduction and weight all-gather then move
// exactly that bucket, so the next forward starts on the first bucket while the later ones are
// still gathering. (With one contiguous 1/dp per rank, every all-gather bucket would complete a
// part of every rank's range, and the forward would need all of them before leaving the first
// rank's range.)
//
// Buckets are a multiple of kAlign * dp elements, so every piece starts at a multiple of kAlign
// both in the flat buffer and in the shard (with a capacity that is a multiple of kAlign * dp, the
// last bucket's too): the optimizer's 16-byte loads then cover whole shards.
//
// With one rank (or without ZeRO-1) the shard is the whole buffer: shard index = flat index.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace tr {

// A run of elements that are contiguous both in the flat buffer and in a rank's shard.
struct ShardRun {
  int64_t flat = 0;   // first element in the flat buffer
  int64_t shard = 0;  // the same element's index in the rank's shard
  int64_t count = 0;
};

class DpShards {
 public:
  static constexpr int64_t kAlign = 4;  // elements: 16 bytes of fp32

  DpShards() = default;  // one rank, no buffer
  // `capacity` must be a multiple of dp (and should be of capacity_multiple(dp));
  // `bucket` is rounded up by round_bucket.
  DpShards(int64_t capacity, int64_t bucket, int dp, int rank);

  // The bucket size a requested one becomes: rounded up to a multiple of kAlign * dp.
  static int64_t round_bucket(int64_t bucket, int dp) {
    const int64_t unit = kAlign * dp;
    return (bucket + unit - 1) / unit * unit;
  }
  // What a flat buffer's capacity is padded to under ZeRO-1 at `dp` ranks.
  static int64_t capacity_multiple(int dp) { return kAlign * dp; }

  int dp() const { return dp_; }
  int rank() const { return rank_; }
  int64_t capacity() const { return capacity_; }
  int64_t bucket_elems() const { return bucket_; }
  int64_t shard_size() const { return capacity_ / dp_; }

  int64_t buckets() const { return (capacity_ + bucket_ - 1) / bucket_; }
  // Bucket b's range [lo, hi) of the flat buffer.
  std::pair<int64_t, int64_t> bucket(int64_t b) const {
    return {b * bucket_, std::min(capacity_, (b + 1) * bucket_)};
  }
  // Elements of each rank's piece of bucket b, and where rank r's piece starts (flat).
  int64_t piece(int64_t b) const;
  int64_t piece_begin(int64_t b, int r) const { return b * bucket_ + r * piece(b); }
  // Where bucket b's piece starts in every rank's shard.
  int64_t shard_offset(int64_t b) const { return b * bucket_ / dp_; }

  // Rank `r`'s pieces within the flat range [begin, end), in order (runs contiguous in both
  // index spaces merged). r defaults to this rank.
  std::vector<ShardRun> runs(int64_t begin, int64_t end) const { return runs(begin, end, rank_); }
  std::vector<ShardRun> runs(int64_t begin, int64_t end, int r) const;

 private:
  int64_t capacity_ = 0, bucket_ = 1;
  int dp_ = 1, rank_ = 0;
};

// A rank's shards of a flat buffer made of regions, each replicated over a group of its own (a
// model's dense tensors over dp x cp, its experts over their expert-parallel replicas): each
// region's DpShards, the regions end to end both in the flat buffer and in the rank's shard. A
// region over one rank (or without ZeRO-1) is its own shard, at the same offsets.
class FlatShards {
 public:
  struct Region {
    int64_t flat = 0;   // where the region starts in the flat buffer
    int64_t shard = 0;  // where its piece starts in the rank's shard
    DpShards shards;    // of the region's capacity, over its group
  };

  FlatShards() = default;  // no region
  // Appends a region of `capacity` elements over `dp` ranks (this one `rank`), buckets of
  // `bucket` (DpShards' rules).
  void add(int64_t capacity, int64_t bucket, int dp, int rank);

  const std::vector<Region>& regions() const { return regions_; }
  int64_t capacity() const { return capacity_; }
  int64_t shard_size() const { return shard_size_; }
  // Some region is split over more than one rank (ZeRO-1 on): the shard is not the buffer.
  bool sharded() const { return shard_size_ < capacity_; }
  // This rank's runs within the flat range [begin, end), in order (flat and shard indices).
  std::vector<ShardRun> runs(int64_t begin, int64_t end) const;

 private:
  std::vector<Region> regions_;
  int64_t capacity_ = 0, shard_size_ = 0;
};

}  // namespace tr
