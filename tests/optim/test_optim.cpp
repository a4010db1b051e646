// The optimizer in process: AdamW's decay and clipping, and ZeRO-1's shards aligned for it.
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

namespace tr {
namespace {
using test::Built;
using test::config_with;
using test::small_config;

TEST_CASE("AdamW decays matrices but never norms or biases, and clipping bounds the norm",
          "[model]") {
  Topology topo;
  OptimConfig oc;
  oc.weight_decay = 0.5;
  oc.grad_clip = 1.0;
  Built model(ModelDims::from(small_config(false), topo), {.batch = 1, .seq_len = 8}, oc);
  model.init_weights(9, 0.1);
  DistributedOptimizer& opt = model.opt;
  const std::vector<float> before = opt.weights_to_host();
  // Zero gradients: Adam's update is 0, so only the decoupled decay moves the weights.
  Ctx cpu;
  zero_(cpu, model.params.grads());
  opt.update(0.1, 1);
  for (const ParamInfo& p : model.layout().tensors) {
    INFO(p.name);
    const float* w = opt.master(p).ptr<float>();
    const float factor = p.decay ? 1.0f - 0.1f * 0.5f : 1.0f;
    CHECK(w[1] == Approx(before[p.offset + 1] * factor).epsilon(1e-6));
    CHECK(p.decay ==
          (p.name.find("norm") == std::string::npos && p.name.find("bias") == std::string::npos));
  }
  // Every gradient 1: the norm is sqrt(P); clipping scales it to grad_clip.
  float* g = model.params.grads().ptr<float>();
  std::fill(g, g + model.layout().total, 1.0f);
  CHECK(opt.reduce_and_clip() == Approx(std::sqrt(static_cast<double>(model.layout().total))));
  double sq = 0;
  for (int64_t i = 0; i < model.layout().total; ++i) sq += static_cast<double>(g[i]) * g[i];
  CHECK(std::sqrt(sq) == Approx(1.0).epsilon(1e-5));
}

// ZeRO-1's shards keep the optimizer on its 16-byte path: every run of a tensor in a rank's shard
// (what AdamW's pieces table is cut from) starts at a multiple of 4 elements both in the flat
// buffer (the bf16 compute copy) and in the shard (masters, gradients, moments), and so does every
// run's end but a tensor's last, for the 72B job's ranks and for an odd bucket size.
TEST_CASE("ZeRO-1's shard runs start 16-byte aligned for the optimizer", "[model]") {
  for (const char* bucket :
       {"parallel.dp_bucket_elems=33554432", "parallel.dp_bucket_elems=1001"}) {
    const tr::Config cfg = config_with({"parallel.dp=8", "parallel.zero1=true", bucket});
    const tr::Topology topo = *tr::Topology::make(128, 0, 8, 2, 8);
    for (int rank : {0, 7, 64 + 5 * 8 + 3, 127}) {
      INFO(bucket << ", rank " << rank);
      const tr::Topology t = topo.of_rank(rank);
      const tr::ParamLayout layout = tr::rank_layout(cfg, t);
      const tr::FlatShards shards = tr::dp_shards(cfg, t);
      REQUIRE(shards.regions().size() == 1);
      REQUIRE(shards.regions()[0].shards.dp() == 8);
      CHECK(layout.capacity % tr::DpShards::capacity_multiple(8) == 0);
      int64_t runs = 0, misaligned = 0;
      for (const tr::ParamInfo& p : layout.tensors) {
        for (const tr::ShardRun& r : shards.runs(p.offset, p.offset + p.numel)) {
          ++runs;
          const bool tensor_end = r.flat + r.count == p.offset + p.numel;
          misaligned += r.flat % 4 != 0 || r.shard % 4 != 0 || (!tensor_end && r.count % 4 != 0);
        }
      }
      CHECK(runs > 0);
      CHECK(misaligned == 0);
    }
  }
}

}  // namespace
}  // namespace tr
