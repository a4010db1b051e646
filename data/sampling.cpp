#include "data/sampling.h"

#include <bit>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tr::data {

uint64_t permutation_key(uint64_t seed, uint64_t epoch, uint64_t source) {
  constexpr uint64_t kGolden = kGolden64;
  uint64_t h = mix64(seed + kGolden);
  h = mix64(h ^ (epoch + 2 * kGolden));
  h = mix64(h ^ (source + 3 * kGolden));
  return h;
}

Permutation::Permutation(uint64_t n, uint64_t key) : n_(n) {
  // Domain 2^(2h) >= n: h = ceil(bits(n - 1) / 2), at least 1.
  const int bits = n > 1 ? 64 - std::countl_zero(n - 1) : 1;
  half_bits_ = (bits + 1) / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t k = key;
  for (int r = 0; r < kRounds; ++r) {
    k += 0x9e3779b97f4a7c15ULL;
    round_keys_[r] = mix64(k);
  }
}

uint64_t Permutation::feistel(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t f = mix64(right ^ round_keys_[r]) & half_mask_;
    const uint64_t next_right = left ^ f;
    left = right;
    right = next_right;
  }
  return (left << half_bits_) | right;
}

uint64_t Permutation::operator()(uint64_t i) const {
  if (n_ <= 1) return 0;
  // Cycle walking: the Feistel network permutes [0, 2^(2h)); following the cycle of i until
  // it re-enters [0, n) restricts it to a permutation of [0, n).
  uint64_t x = feistel(i);
  while (x >= n_) x = feistel(x);
  return x;
}

namespace {

__extension__ typedef unsigned __int128 u128;

// L(j) = floor(share * j / 2^48 + 1/2): samples of the first j that go left.
uint64_t left_count(uint64_t share, uint64_t j) {
  const u128 half = u128{1} << (BlendSchedule::kShareBits - 1);
  return static_cast<uint64_t>((u128{share} * j + half) >> BlendSchedule::kShareBits);
}

}  // namespace

absl::StatusOr<BlendSchedule> BlendSchedule::create(std::span<const double> weights) {
  const int n = static_cast<int>(weights.size());
  if (n < 1) return absl::InvalidArgumentError("blend: no weights given");
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) {
    if (!(weights[i] > 0) || !std::isfinite(weights[i]))
      return absl::InvalidArgumentError(
          absl::StrCat("blend: weight ", i, " is ", weights[i], "; weights must be > 0"));
    prefix[i + 1] = prefix[i] + weights[i];
  }
  BlendSchedule s;
  s.num_sources_ = n;
  while ((1 << s.depth_) < n) ++s.depth_;
  s.left_share_.assign(size_t{2} << s.depth_, 0);
  const double one = std::ldexp(1.0, kShareBits);
  // Visit every internal node [lo, hi) with its heap id; children ranges split at the middle.
  struct Range {
    int lo, hi;
    size_t id;
  };
  std::vector<Range> todo = {{0, n, 1}};
  while (!todo.empty()) {
    const Range r = todo.back();
    todo.pop_back();
    if (r.hi - r.lo < 2) continue;
    const int mid = r.lo + (r.hi - r.lo) / 2;
    const double a = (prefix[mid] - prefix[r.lo]) / (prefix[r.hi] - prefix[r.lo]);
    const double share = std::nearbyint(a * one);
    if (!(share >= 1 && share < one))
      return absl::InvalidArgumentError(absl::StrCat(
          "blend: data sources ", r.lo, "..", r.hi - 1, " have weights too unequal to blend (",
          "a share below 2^-48); drop the negligible source"));
    s.left_share_[r.id] = static_cast<uint64_t>(share);
    todo.push_back({r.lo, mid, 2 * r.id});
    todo.push_back({mid, r.hi, 2 * r.id + 1});
  }
  return s;
}

std::pair<int, int64_t> BlendSchedule::locate(int64_t k) const {
  int lo = 0, hi = num_sources_;
  size_t id = 1;
  uint64_t j = static_cast<uint64_t>(k);
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    const uint64_t share = left_share_[id];
    const uint64_t before = left_count(share, j);
    if (left_count(share, j + 1) > before) {
      hi = mid;
      j = before;
      id = 2 * id;
    } else {
      lo = mid;
      j -= before;
      id = 2 * id + 1;
    }
  }
  return {lo, static_cast<int64_t>(j)};
}

absl::StatusOr<SampleSpace> SampleSpace::create(std::vector<WeightedSource> sources,
                                                int64_t seq_len, uint64_t seed, bool shuffle) {
  if (sources.empty()) return absl::InvalidArgumentError("no data sources given");
  if (seq_len < 1)
    return absl::InvalidArgumentError(absl::StrCat("seq_len is ", seq_len, "; it must be >= 1"));
  std::vector<double> weights;
  std::vector<int64_t> samples;
  std::vector<std::unique_ptr<TokenSource>> owned;
  for (auto& ws : sources) {
    const std::string& path = ws.source->path();
    if (!(ws.weight > 0) || !std::isfinite(ws.weight))
      return absl::InvalidArgumentError(
          absl::StrCat("data source '", path, "' has weight ", ws.weight, "; weights must be > 0"));
    const int64_t tokens = ws.source->num_tokens();
    const int64_t n = (tokens - 1) / seq_len;
    if (n < 1)
      return absl::InvalidArgumentError(absl::StrCat(
          "data source '", path, "' has ", tokens, " tokens, fewer than seq_len+1 = ", seq_len + 1,
          " needed for one sample; use more data or a shorter seq_len"));
    weights.push_back(ws.weight);
    samples.push_back(n);
    owned.push_back(std::move(ws.source));
  }
  auto schedule = BlendSchedule::create(weights);
  if (!schedule.ok()) return schedule.status();
  SampleSpace space(std::move(owned), std::move(*schedule));
  space.num_samples_ = std::move(samples);
  space.seq_len_ = seq_len;
  space.seed_ = seed;
  space.shuffle_ = shuffle;
  return space;
}

SampleRef SampleSpace::locate(int64_t k) const {
  const auto [source, index] = schedule_.locate(k);
  const int64_t n = num_samples_[source];
  const int64_t slot = index % n;
  SampleRef ref{source, index, slot};
  if (shuffle_) {
    const uint64_t epoch = static_cast<uint64_t>(index / n);
    Permutation perm(static_cast<uint64_t>(n), permutation_key(seed_, epoch, source));
    ref.sample = static_cast<int64_t>(perm(static_cast<uint64_t>(slot)));
  }
  return ref;
}

absl::Status SampleSpace::read(int64_t k, std::span<int32_t> out, int64_t vocab_limit) const {
  if (static_cast<int64_t>(out.size()) != seq_len_ + 1)
    return absl::InvalidArgumentError(absl::StrCat("sample buffer holds ", out.size(),
                                                   " tokens; expected seq_len+1 = ", seq_len_ + 1));
  if (k < 0) return absl::OutOfRangeError(absl::StrCat("negative sample index ", k));
  const SampleRef ref = locate(k);
  return sources_[ref.source]->read(ref.sample * seq_len_, out, vocab_limit);
}

}  // namespace tr::data
