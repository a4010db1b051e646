// What the in-process tests of the model, the optimizer, the planner and the checkpoint
// ownership share: a rank's model on the CPU as the trainer builds it, a small config, and the
// 72B preset with --set overrides.
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "trainer/config/config.h"
#include "trainer/model/init.h"
#include "trainer/model/model.h"
#include "trainer/optim/optim.h"

namespace tr::test {

// A rank's model on the CPU as the trainer builds it: the parameter buffer, the model over it and
// the optimizer (which holds the masters) over that.
struct Built {
  ParamBuffer params;
  DecoderModel model;
  DistributedOptimizer opt;
  Built(const ModelDims& d, const ModelOptions& o, const OptimConfig& oc = OptimConfig())
      : params(make_param_buffer(d, o, Device::cpu)),
        model(d, o, params, Ctx{}),
        opt(oc, params, Ctx{}, {}, false, FlatShards(), o.separate_compute_copy) {}
  void init_weights(uint64_t seed, double std) {
    opt.weights_from_host(initial_weights(params.layout(), model.dims(), seed, std));
  }
  const ParamLayout& layout() const { return params.layout(); }
};

// A tiny Qwen2 (2 layers, GQA 4:2, 50 tokens), tied or not.
inline ModelConfig small_config(bool tied) {
  ModelConfig mc;
  mc.hidden_size = 32, mc.intermediate_size = 64, mc.num_layers = 2, mc.num_heads = 4,
  mc.num_kv_heads = 2, mc.head_dim = 8, mc.vocab_size = 50, mc.tie_embeddings = tied;
  return mc;
}

inline double rel_diff(Tensor a, Tensor b) {
  return test::rel_err(a.ptr<float>(), b.ptr<float>(), a.numel());
}

// configs/qwen2.5-72b.yaml with `sets` (section.key=value).
inline Config config_with(const std::vector<std::string>& sets) {
  absl::StatusOr<Config> cfg = load_config(test::source_dir() + "/configs/qwen2.5-72b.yaml", sets);
  INFO(cfg.status().message());
  REQUIRE(cfg.ok());
  return *cfg;
}

}  // namespace tr::test
