// The layout room: what a config on a world makes, here, and a rank's flat buffers
// (flat_buffers.h: its parameter layout, ZeRO-1 shards, checkpoint and state sizes). It uses the
// config and model rooms; the planner, the session and the checkpoint's ownership read it.
//
// A run's layout: what follows from its config and the world it runs on, computed once by
// run_layout(): the trainer's start-up, `trainer plan` (and through it tools/sweep), the memory
// check and the model's construction all read them here, so no two of them can disagree about
// a layout. Rules that need only the config are config.cpp's validate(); the rules that need
// the world size too are here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/ctx.h"
#include "parallel/schedule.h"
#include "parallel/topology.h"
#include "trainer/config/config.h"
#include "trainer/model/model.h"

namespace tr {

struct RunLayout {
  Topology topo;                   // the grid (parallel.dp auto resolved), seen from one rank
  bool zero1 = false;              // parallel.zero1 with dp > 1: grads and Adam state sharded
  bool sequence_parallel = false;  // parallel.sequence_parallel with tp > 1
  int64_t micro_batches = 0;       // micro-batches per step on each DP rank
  int64_t tokens_per_step = 0;     // global_batch x seq_len, over all ranks
  double flops_per_token = 0;      // model FLOPs per trained token (flops_per_token below)
  bool tied_embeddings = false;    // model.tie_embeddings
  PipeScheduleKind schedule = PipeScheduleKind::one_f_one_b;  // parallel.pipeline_schedule
  int virtual_stages = 1;  // layer chunks per pipeline rank (parallel.virtual_stages)

  // "1f1b", "interleaved v 2", "zero_bubble".
  std::string schedule_text() const;
  // Whether the backward runs as two passes (zero_bubble's B and W), and so how many times a
  // fully recomputed layer's forward runs again in a step's backward.
  bool split_backward() const { return schedule == PipeScheduleKind::zero_bubble; }
  int recompute_passes() const { return split_backward() ? 2 : 1; }
  // This rank's pipeline actions in one step (parallel/schedule.h).
  std::vector<PipeAction> pipeline_actions() const;
  // The (chunk, micro-batch) pairs whose activations this rank holds at once under its schedule
  // (1F1B: the warm-up depth pp - stage, or every micro-batch of a step when there are fewer):
  // the model's activation slots, each holding one chunk's layers.
  int in_flight() const;
  // This rank holds one of the tied embedding's two copies (tied, pp > 1, first or last stage):
  // the optimizer sums their gradients and keeps them equal over the embed group.
  bool tied_embedding_copies() const {
    return tied_embeddings && topo.pp > 1 && (topo.first_stage() || topo.last_stage());
  }
  // The same run seen from global rank `rank` (the planner's view of each stage).
  RunLayout of_rank(int rank) const;
};

// The layout of `cfg` on `world` ranks, seen from `rank`; an error is one line naming the keys
// and the fix (world size against tp x pp x dp, the batch against micro_batch x dp, sequence
// parallelism's token split).
absl::StatusOr<RunLayout> run_layout(const Config& cfg, int world, int rank);

// Training FLOPs per token, causal counting (llm.c / Megatron-Core): 6 N_matmul + 6 L s (nh hd),
// N_matmul = parameters in matrix products, LM head included, input embedding excluded; for a
// mixture of experts the parameters a token multiplies by (the router and its chosen experts:
// the active parameters).
double flops_per_token(const Config& c);
// The parameters a token multiplies by in layer `layer`'s projections: attention's (q, k, v, o)
// and the MLP's (a sparse layer's router and experts_per_token experts).
double layer_matmul_params(const ModelConfig& m, int64_t layer);
// The same for a step of `tokens` tokens whose samples' documents' lengths squared sum to
// `doc_len_sq` (data::DocumentStats): block-causal attention computes each document's causal
// triangle alone; otherwise flops_per_token(c).
double flops_per_token(const Config& c, double tokens, double doc_len_sq);

// How the rank of `layout` builds its model on `device` (bf16 compute on cuda, f32 on the CPU):
// the trainer builds it so and the planner measures it so. `separate_compute_copy` gives CPU
// ranks the GPU's layout (TR_TEST_COMPUTE_COPY); `loss_chunk` 0 = loss_chunk_tokens().
ModelOptions model_options(const Config& cfg, const RunLayout& layout, Device device,
                           bool separate_compute_copy = false, int64_t loss_chunk = 0,
                           bool plan_only = false);

}  // namespace tr
