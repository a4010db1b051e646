// The config room: what the user asks for, the command line (cli.h) and the YAML config, typed
// and validated (here; the field registry in config_fields.h). It uses no other room.
//
// Typed configuration: one struct per YAML section, every field with a default and a doc line
// (the table in docs/config.md is generated from the same registry by `trainer --help-config`).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/rope.h"
#include "trainer/config/rope_scaling.h"

namespace tr {

struct ModelConfig {
  std::string preset;             // "" or a preset name; explicit fields override it
  std::string family = "qwen2";   // a family of trainer/family/: what differs beyond the shape
  int64_t hidden_size = 0;        // H
  int64_t intermediate_size = 0;  // I (MLP)
  int64_t num_layers = 0;
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // key/value heads (GQA)
  int64_t head_dim = 0;
  int64_t vocab_size = 0;  // real vocabulary; padded to a multiple of 128*tp internally
  int64_t max_seq_len = 0;
  double rope_theta = 1e6;
  // Hugging Face's rope_scaling: none, or YaRN's context extension (kernels/rope.h).
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  bool tie_embeddings = false;
  double init_std = 0.02;  // std of the normal init of matrices and the embedding
  // A Hugging Face model directory (config.json + safetensors) whose weights start a fresh run
  // instead of the random init; a resumed run ignores it. See trainer/checkpoint/hf.h.
  std::string init_from;
  // Mixture of experts (model.family qwen3_moe; Hugging Face's names): each sparse layer's MLP
  // is a router choosing experts_per_token of num_experts SwiGLU experts (intermediate size
  // moe_intermediate_size) per token. Layer i is sparse when it is not in mlp_only_layers and
  // (i + 1) is a multiple of decoder_sparse_step; the others keep the dense MLP.
  int64_t num_experts = 0;  // 0: every layer dense
  int64_t experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = true;          // the chosen experts' weights renormalised to sum to 1
  double router_aux_loss_coef = 1e-3;  // the load-balancing loss's weight in the loss
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // Each expert keeps at most ceil(capacity_factor x tokens x experts_per_token / num_experts)
  // tokens of a micro-batch (its highest-weight ones); 0 = dropless.
  double capacity_factor = 0;
  bool sparse_layer(int64_t i) const {
    return num_experts > 0 && (i + 1) % decoder_sparse_step == 0 &&
           std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) == mlp_only_layers.end();
  }
  int64_t sparse_layers() const {
    int64_t n = 0;
    for (int64_t i = 0; i < num_layers; ++i) n += sparse_layer(i) ? 1 : 0;
    return n;
  }
  // The rotary embedding these fields describe.
  Rope rope() const {
    const RopeScaling& y = rope_scaling;
    if (y.type == "llama3")
      return Rope::llama3_of(rope_theta, y.factor, y.low_freq_factor, y.high_freq_factor,
                             static_cast<double>(y.original_max_position_embeddings));
    if (y.type != "yarn") return Rope::plain(rope_theta);
    return Rope::yarn_of(rope_theta, y.factor,
                         static_cast<double>(y.original_max_position_embeddings), y.beta_fast,
                         y.beta_slow, y.attention_factor, y.truncate);
  }
};

struct ParallelConfig {
  int64_t tp = 1, pp = 1;
  int64_t cp = 1;  // context parallel: ranks splitting each sequence
  int64_t ep = 1;  // expert parallel: ranks splitting the experts, inside the dp x cp ranks
  std::string cp_comm = "allgather";     // allgather | ring: how CP attention meets K and V
  int64_t dp = 0;                        // 0 = auto (world / (tp*cp*pp)); written "auto" in YAML
  std::vector<int64_t> pipeline_layers;  // layers per (virtual) stage; empty = an even split
  // 1f1b | interleaved | zero_bubble (parallel/schedule.h); virtual_stages: layer chunks per
  // pipeline rank under interleaved (chunk c of rank r is virtual stage c * pp + r).
  std::string pipeline_schedule = "1f1b";
  int64_t virtual_stages = 1;
  bool sequence_parallel = false;
  bool zero1 = false;
  int64_t dp_bucket_elems = int64_t{1} << 25;  // gradient all-reduce bucket
  bool overlap_dp = true;            // buckets start during the last micro-batch's backward
  bool overlap_param_gather = true;  // ZeRO-1: the next forward completes each weight bucket
  bool overlap_tp = true;  // backward: a column-parallel input gradient's TP reduction beside dW
  std::string grad_reduce_dtype = "fp32";  // fp32 | bf16: the DP gradient reduction's type
  std::string comm = "nccl";               // GPU ranks: nccl, or mpi (staged through host memory)
  double timeout_s = 600;                  // comm watchdog (NCCL and MPI), exit 5; 0 = none
};

struct DataSource {
  std::string path;  // Megatron prefix (PREFIX.bin/.idx) or llm.c shard file
  double weight = 1.0;
};

struct DataConfig {
  std::vector<DataSource> train, valid;
  int64_t seq_len = 0;
  int64_t seed = 1234;
  std::string format = "auto";  // auto | megatron | llmc
  // Byte-tokenized data (prepare_data's default) under a model.preset is refused unless true.
  bool allow_byte_tokenizer = false;
  // none | block_causal: attention within each document of a sample only, documents ending at
  // the end-of-document token `eod_id` (-1: the datasets' metadata's).
  std::string document_mask = "none";
  int64_t eod_id = -1;
  bool reset_position_ids = false;  // RoPE positions restart at 0 in each document
  bool eod_mask_loss = false;       // the loss leaves out the target after each end-of-document
  // Whether documents matter to the step: any of the three options above.
  bool documents() const {
    return document_mask == "block_causal" || reset_position_ids || eod_mask_loss;
  }
  // The arrays of one int per token a micro-batch carries beside its tokens and targets: the
  // document starts (block_causal) and the positions (reset_position_ids).
  int token_doc_arrays() const {
    return (document_mask == "block_causal" ? 1 : 0) + (reset_position_ids ? 1 : 0);
  }
};

struct TrainConfig {
  int64_t steps = 0;
  int64_t global_batch = 0;      // samples per optimizer step, all DP ranks together
  int64_t micro_batch = 1;       // samples per forward/backward on one rank
  std::string backend = "auto";  // auto | cpu | cuda
  // GPU: the same bits run after run (cuDNN's deterministic attention backward), or the faster
  // non-deterministic algorithms (false, the default, as Megatron's).
  bool deterministic = false;
  // The transformer layers' GEMMs: bf16 (the compute dtype) | fp8 (per-tensor current
  // scaling, in fp8_format: hybrid = E4M3 forward, E5M2 output gradients | e4m3).
  std::string precision = "bf16";
  std::string fp8_format = "hybrid";
  // Activation recomputation: none | selective (norm and SwiGLU outputs recomputed in
  // backward) | full (layers keep only their input and run their forward again in backward).
  std::string recompute = "none";
  // full: layers recomputed on each pipeline stage, the first of its layers: [] = all of them;
  // [n] = n on every stage; or one count per stage.
  std::vector<int64_t> recompute_layers;
  int64_t seed = 1234;        // weight init
  int64_t eval_interval = 0;  // 0 = never
  int64_t eval_steps = 10;    // validation batches per evaluation
  int64_t exit_interval = 0;  // save and exit after a step divisible by this; 0 = off
  // Steps skipped in a row (non-finite loss or gradient norm, or a loss spike) after which the
  // run stops with kExitDiverged.
  int64_t max_skipped_steps = 5;
  // Skip a step whose loss exceeds this times the mean of the last kSpikeWindow accepted steps'
  // losses; 0 = off.
  double spike_factor = 10;
};

struct OptimConfig {
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup_steps = 0;
  std::string schedule = "cosine";  // cosine | linear | constant | wsd
  double decay_fraction = 0.2;      // wsd: last fraction of steps spent decaying to min_lr
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;  // global-norm clip; 0 = off
};

struct CheckpointConfig {
  std::string dir = "checkpoints";
  int64_t interval = 0;  // steps between saves; 0 = none before the end
  // Save when the run reaches train.steps. Benchmarks turn it off (their end state is never
  // resumed, and a 1.5B save takes longer than its timed steps); a stop signal still saves.
  bool save_at_end = true;
  int64_t keep_last = 2;
  // Seconds a save (or the load at start-up) may take: ranks waiting for the slowest disk get
  // this long before parallel.timeout_s ends the job, and a slower save is warned about (it
  // may not fit a stop signal's grace period).
  double save_timeout_s = 300;
  // Copy the state to host memory and write it in a background thread while training goes on;
  // committed at the first step boundary after every rank has written its part.
  bool async = false;
  // Node-local checkpoints (trainer/checkpoint/local_ckpt.h): every local_interval steps (0 = off)
  // each rank writes its own part of the training state to local_dir (node-local: tmpfs or NVMe),
  // keeping the newest local_keep; --resume auto takes one when it is newer than the newest
  // persistent checkpoint and every rank has its part. Each part also goes to local_replicas other
  // nodes (the next ones in the ring of nodes), so that a lost node's parts survive.
  int64_t local_interval = 0;
  std::string local_dir = "/dev/shm/trainer-local";
  int64_t local_keep = 2;
  int64_t local_replicas = 1;
  // The replicas of each part a job of `nodes` nodes keeps: local_replicas, at most one on each
  // other node.
  int local_replicas_on(int nodes) const {
    return static_cast<int>(std::clamp<int64_t>(local_replicas, 0, std::max(nodes - 1, 0)));
  }
};

struct LogConfig {
  std::string dir = "runs";
  int64_t interval = 1;  // steps between console lines (metrics.jsonl gets every step)
  // A rank whose own work per step is more than this % over the median rank's is named (every
  // log.interval steps); 0 = never named (the metrics still record the slowest rank).
  double straggler_percent = 20;
  // TensorBoard event files in dir/tb (rank 0): every scalar of metrics.jsonl, the config as text.
  bool tensorboard = true;
  // With tensorboard, every other rank too writes an event file, in dir/tb/rank_<r>: its own
  // step time, breakdown and memory (the per-rank series).
  bool tensorboard_all_ranks = false;
  // [first, last]: the steps whose phases every rank writes as a Chrome trace
  // (trainer/step/trace.h); empty = none.
  std::vector<int64_t> trace_steps;
  // [first, last]: the steps run between cudaProfilerStart and cudaProfilerStop, for a profiler
  // that captures only those (trainer/step/trace.h: ProfileWindow); empty = none.
  std::vector<int64_t> profile_steps;
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  CheckpointConfig checkpoint;
  LogConfig log;
};

// Reads FILE, applies `section.key=value` overrides (values are YAML), fills presets,
// validates. Errors are one line naming the key, the file or the override.
absl::StatusOr<Config> load_config(const std::string& path, const std::vector<std::string>& sets);
// Same from YAML text (for tests); `origin` names the source in messages.
absl::StatusOr<Config> parse_config(const std::string& yaml_text,
                                    const std::vector<std::string>& sets,
                                    const std::string& origin = "config");
// The resolved config as YAML (every key, presets expanded): printed at start-up, stored in
// checkpoints, and parseable again by parse_config.
std::string to_yaml(const Config& cfg);
// "section.key: old -> new" for each key whose value differs between two resolved configs
// (as written by to_yaml), in schema order.
std::vector<std::string> config_differences(const std::string& before_yaml,
                                            const std::string& after_yaml);
// Markdown table of every key: section, key, type, default, doc.
std::string config_docs_markdown();
// Names of the built-in model presets.
std::vector<std::string> preset_names();
// Fills every model field of `m` with preset `name`'s shapes (a family's, trainer/family/).
absl::Status apply_model_preset(const std::string& name, ModelConfig* m);

}  // namespace tr
