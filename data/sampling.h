// Samples, shuffle and blending: pure functions of (seed, global sample index), so a run that
// resumes, or changes its data-parallel size, sees exactly the same order.
//
// Sample i of a source = tokens [i*seq_len, i*seq_len + seq_len + 1) of its stream
// (consecutive samples overlap by one token); num_samples = (num_tokens - 1) / seq_len.
//
// Shuffle: epoch e of source s visits its samples in the order of a keyed bijection
// Permutation(num_samples, key(seed, e, s)); index k of a source is (epoch k / n, slot k % n).
// The bijection is a 6-round Feistel network over the smallest even-bit power of two >= n,
// with cycle walking back into [0, n) (expected < 4 walks). Round functions are splitmix64
// finalisers of (half-block ^ round key): portable, stateless, no O(n) table.
//
// Blending: a balanced binary tree over the sources. A node [lo, hi) sends the j-th sample
// that reaches it to its left half [lo, mid) iff L(j+1) > L(j), where L(j) = floor(a*j + 1/2)
// and a is the left half's share of the node's weight (48-bit fixed point); the sample's index
// in the left half is L(j), in the right half j - L(j) (a Beatty-sequence split). Lookups are
// O(log S) in exact integer arithmetic, with no table and no replay, and every source's count
// after k samples stays within depth/2 (+ k * 2^-48) of weight * k, for all k. Chosen over
// Megatron's greedy rule because that needs O(k) replay or a table for random access.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/hash.h"
#include "data/token_source.h"

namespace tr::data {

// Key of the permutation of (seed, epoch, source): chained mixes, portable across platforms.
uint64_t permutation_key(uint64_t seed, uint64_t epoch, uint64_t source);

// A keyed bijection of [0, n). n == 0 is allowed (no element).
class Permutation {
 public:
  static constexpr int kRounds = 6;
  Permutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;  // i < n
  uint64_t size() const { return n_; }

 private:
  uint64_t feistel(uint64_t x) const;
  uint64_t n_;
  int half_bits_ = 0;
  uint64_t half_mask_ = 0;
  uint64_t round_keys_[kRounds] = {};
};

// Where a global sample index lands.
struct SampleRef {
  int source = 0;      // which source
  int64_t index = 0;   // index within the source (grows past one epoch)
  int64_t sample = 0;  // sample number within the source after shuffling, < num_samples
};

// Global sample index -> (source, index within the source), by weight.
class BlendSchedule {
 public:
  static constexpr int kShareBits = 48;
  // weights: positive and finite, any scale. Errors when one half of a split gets a share
  // below 2^-48 (weights too unequal to represent).
  static absl::StatusOr<BlendSchedule> create(std::span<const double> weights);
  std::pair<int, int64_t> locate(int64_t k) const;
  int num_sources() const { return num_sources_; }
  // Levels of the tree: ceil(log2(num_sources)).
  int depth() const { return depth_; }

 private:
  int num_sources_ = 1;
  int depth_ = 0;
  std::vector<uint64_t> left_share_;  // heap order (root 1, children 2n, 2n+1): a * 2^48
};

struct WeightedSource {
  std::unique_ptr<TokenSource> source;
  double weight = 1.0;
};

// Several sources, their samples, the shuffle and the blend: global sample k -> tokens.
class SampleSpace {
 public:
  // Errors when a weight is not positive and finite or when a source has fewer than
  // seq_len + 1 tokens.
  static absl::StatusOr<SampleSpace> create(std::vector<WeightedSource> sources, int64_t seq_len,
                                            uint64_t seed, bool shuffle);

  int num_sources() const { return static_cast<int>(sources_.size()); }
  const TokenSource& source(int i) const { return *sources_[i]; }
  int64_t num_samples(int i) const { return num_samples_[i]; }
  int64_t seq_len() const { return seq_len_; }
  const BlendSchedule& schedule() const { return schedule_; }

  SampleRef locate(int64_t k) const;
  // out: seq_len + 1 tokens of global sample k; ids checked against [0, vocab_limit)
  // (vocab_limit <= 0: no model limit).
  absl::Status read(int64_t k, std::span<int32_t> out, int64_t vocab_limit = 0) const;

 private:
  SampleSpace(std::vector<std::unique_ptr<TokenSource>> sources, BlendSchedule schedule)
      : sources_(std::move(sources)), schedule_(std::move(schedule)) {}
  std::vector<std::unique_ptr<TokenSource>> sources_;
  std::vector<int64_t> num_samples_;
  BlendSchedule schedule_;
  int64_t seq_len_ = 0;
  uint64_t seed_ = 0;
  bool shuffle_ = true;
};

}  // namespace tr::data
