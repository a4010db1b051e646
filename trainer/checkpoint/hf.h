// Hugging Face interop for the model families (trainer/family/): start a run from a model
// directory that `save_pretrained` wrote (model.init_from), and write one from a checkpoint
// (trainer export-hf).
//
// Our tensor names are the Hugging Face ones without "model." and with '/' for '.':
// "model.layers.3.mlp.up_proj.weight" is "layers/3/mlp/up_proj/weight", "lm_head.weight" is
// "lm_head/weight". Shapes are the global ones; a tied model has no lm_head tensor.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/safetensors.h"
#include "parallel/topology.h"
#include "trainer/config/config.h"

namespace tr {

// "layers/3/mlp/up_proj/weight" -> "model.layers.3.mlp.up_proj.weight".
std::string hf_name(const std::string& ours);

// A Hugging Face model directory opened for model.init_from, checked against the run's config:
// config.json (a causal LM whose model_type, shape and numerics equal model.*: one line
// naming the first field that differs and both values) and the safetensors (every tensor of the
// model with its global shape, in F32, BF16 or F16; nothing else but rotary caches and the lm_head
// of a tied model). Cheap: headers only.
absl::StatusOr<st::Reader> open_hf_model(const std::string& dir, const Config& cfg,
                                         const Topology& topo);

// Reads this rank's slices of its stage's tensors from `model` into `params` (its flat buffer,
// fp32); vocabulary padding rows are zeroed.
absl::Status load_hf_rank_part(const st::Reader& model, const Config& cfg, const Topology& topo,
                               float* params);

// The config.json in `dir` against model.*: OK when its model_type, shape and numerics are the
// model's; else one line naming the first field that differs, or what the file cannot be.
absl::Status check_hf_config(const std::string& dir, const ModelConfig& m);

// The config.json that export-hf writes for model `m`: the generic keys, then its family's.
// torch_dtype is `dtype`; eos >= 0 is its bos_token_id and eos_token_id.
std::string hf_config_json(const ModelConfig& m, st::ElemType dtype, int64_t eos);

struct ExportOptions {
  std::string checkpoint;  // a committed step directory
  std::string out;         // created; must not exist or be empty
  st::ElemType dtype = st::ElemType::bf16;
  std::string tokenizer;     // tokenizer.json to copy beside the model ("" = none)
  double max_shard_gib = 5;  // model.safetensors above this is split, with an index
};

// trainer export-hf: config.json, generation_config.json, model.safetensors (or shards and
// model.safetensors.index.json) and the tokenizer files, written tensor by tensor into
// OUT.tmp and renamed to OUT when complete.
absl::Status export_hf(const ExportOptions& o);

}  // namespace tr
