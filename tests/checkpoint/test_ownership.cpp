// Checkpoint ownership in process: which rank writes which block of every tensor.
#include <hdf5.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/switches.h"
#include "kernels/ops.h"
#include "tests/model_util.h"
#include "tests/test_util.h"
#include "trainer/checkpoint/local_part.h"
#include "trainer/checkpoint/ownership.h"
#include "trainer/config/config.h"
#include "trainer/layout/run_layout.h"
#include "trainer/model/init.h"
#include "trainer/model/model.h"
#include "trainer/model/step_io.h"
#include "trainer/obs/step_timing.h"
#include "trainer/optim/optim.h"
#include "trainer/plan/memory_fit.h"
#include "trainer/plan/plan.h"
#include "trainer/plan/resilience.h"
#include "trainer/session/session.h"

using tr::test::config_with;

namespace {

// Checks that the blocks every rank of `topo`'s grid writes tile every tensor of the three
// checkpoint sets exactly once; returns the elements each rank writes.
std::vector<int64_t> check_ownership(const tr::Config& cfg, const tr::Topology& topo) {
  using tr::ckpt::ShardPiece;
  std::map<std::pair<int, std::string>, std::vector<ShardPiece>> by_tensor;
  std::vector<int64_t> per_rank(topo.world, 0);
  for (int r = 0; r < topo.world; ++r) {
    for (ShardPiece& p : tr::owned_pieces(cfg, topo.of_rank(r), {})) {
      per_rank[r] += p.ref.block_numel();
      by_tensor[{static_cast<int>(p.set), p.ref.name}].push_back(std::move(p));
    }
  }
  const std::vector<tr::ckpt::TensorRef> tensors = tr::model_tensors(cfg, topo);
  REQUIRE(by_tensor.size() == 3 * tensors.size());
  for (const tr::ckpt::TensorRef& t : tensors) {
    for (int set = 0; set < 3; ++set) {
      const std::vector<ShardPiece>& pieces = by_tensor[{set, t.name}];
      int64_t covered = 0;
      for (size_t i = 0; i < pieces.size(); ++i) {
        const tr::ckpt::TensorRef& a = pieces[i].ref;
        REQUIRE(a.shape == t.shape);
        for (size_t d = 0; d < a.shape.size(); ++d)
          REQUIRE((a.start[d] >= 0 && a.start[d] + a.extent[d] <= a.shape[d]));
        covered += a.block_numel();
        for (size_t j = 0; j < i; ++j) {
          const tr::ckpt::TensorRef& b = pieces[j].ref;
          bool apart = false;
          for (size_t d = 0; d < a.shape.size(); ++d)
            apart = apart || a.start[d] + a.extent[d] <= b.start[d] ||
                    b.start[d] + b.extent[d] <= a.start[d];
          INFO(t.name << " set " << set);
          REQUIRE(apart);
        }
      }
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      INFO(t.name << " set " << set);
      REQUIRE(covered == n);
    }
  }
  return per_rank;
}

}  // namespace

// Each rank writes only its part of a checkpoint, and the parts tile the model: every element
// of every weight and Adam moment exactly once, vocabulary padding never. For the 72B job
// (tp 8, pp 2, dp 8 = 128 ranks) the ranks write equal shares, so a save takes 1/128 of the
// time one writer would.
TEST_CASE("checkpoint ownership tiles every tensor once, and the 72B job's ranks write equal parts",
          "[model]") {
  for (bool zero1 : {true, false}) {
    const tr::Config cfg =
        config_with({"parallel.dp=8", zero1 ? "parallel.zero1=true" : "parallel.zero1=false"});
    const tr::Topology topo = *tr::Topology::make(128, 0, 8, 2, 8);
    const std::vector<int64_t> per_rank = check_ownership(cfg, topo);
    const auto [lo, hi] = std::minmax_element(per_rank.begin(), per_rank.end());
    int64_t total = 0;
    for (int64_t n : per_rank) total += n;
    // 72.7B parameters (untied, real vocabulary) x 3 sets.
    CHECK(total == 3 * int64_t{72'706'203'648});
    INFO("zero1 " << zero1 << ": " << *lo << " .. " << *hi << " elements per rank");
    CHECK(static_cast<double>(*hi) / static_cast<double>(*lo) < 1.15);
  }
  // Tied embeddings across pipeline stages, vocabulary padding (257 -> 512 rows over tp 4: the
  // last TP rank holds padding only), uneven stages.
  const tr::Config tiny = config_with(
      {"model.preset=", "model.hidden_size=64", "model.intermediate_size=96", "model.num_layers=3",
       "model.num_heads=8", "model.num_kv_heads=4", "model.head_dim=8", "model.vocab_size=257",
       "model.tie_embeddings=true", "parallel.tp=4", "parallel.pp=2", "parallel.dp=3",
       "parallel.sequence_parallel=false", "parallel.pipeline_layers=[1, 2]",
       "train.global_batch=12"});
  check_ownership(tiny, *tr::Topology::make(24, 0, 4, 2, 3));
}

// A node-local part is another model's when its experts differ: the parts' layout key says which
// layers hold experts and their shapes (same capacity or not).
TEST_CASE("local parts: a mixture of experts' shape is in the layout key", "[checkpoint]") {
  const auto key = [](std::vector<std::string> sets) {
    sets.insert(sets.begin(),
                {"model.family=qwen3_moe", "model.num_experts=4", "model.experts_per_token=2",
                 "model.moe_intermediate_size=32", "parallel.tp=1", "parallel.pp=1"});
    const tr::Config cfg = config_with(sets);
    absl::StatusOr<tr::RunLayout> layout = tr::run_layout(cfg, 1, 0);
    REQUIRE(layout.ok());
    return tr::local_part::layout_key(cfg, *layout, false);
  };
  const uint64_t base = key({});
  CHECK(key({}) == base);
  CHECK(key({"model.num_experts=8"}) != base);
  CHECK(key({"model.experts_per_token=1"}) != base);
  CHECK(key({"model.moe_intermediate_size=16"}) != base);
  CHECK(key({"model.mlp_only_layers=[1]"}) != base);
  CHECK(key({"model.decoder_sparse_step=2"}) != base);
}
