// The planner room: `trainer plan` (here, and its advice in plan_advice.cpp), what failures cost
// (resilience.h) and whether a rank's memory fits (memory_fit.h). It knows nothing of a
// running job: the session and everything above it are out of its reach.
//
// The planner: per-GPU memory, FLOPs, pipeline bubble, communication volume and a predicted
// step time for a config on a cluster, without touching a GPU. Memory comes from the model's
// and optimizer's own arena accounting (a plan-only DecoderModel), so it is what the trainer
// will allocate, not a separate formula.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/ctx.h"
#include "core/hardware.h"
#include "parallel/topology.h"
#include "trainer/config/config.h"
#include "trainer/layout/run_layout.h"
#include "trainer/plan/collectives.h"
#include "trainer/plan/hardware_file.h"
#include "trainer/plan/step_model.h"

namespace tr {

// Bytes per GPU of one pipeline stage (its largest rank).
struct StageMemory {
  int stage = 0;
  double weights = 0, compute_copy = 0, grads = 0, optimizer = 0, optimizer_without_zero1 = 0;
  double activations = 0;  // the micro-batches the schedule keeps in flight here, + scratch
  // cuBLASLt's and the kernels' workspace with the step's staged tokens; cuDNN's (estimated)
  double workspace = 0, attention_workspace = 0;
  int in_flight = 1;              // micro-batches whose activations are held
  int64_t loss_chunk_tokens = 0;  // tokens per LM-head/loss chunk (trainer/model/model.h)
  double loss_chunk_logits = 0;   // bytes of one chunk's bf16 logits on this stage's rank
  double total() const {
    return weights + compute_copy + grads + optimizer + activations + workspace +
           attention_workspace;
  }
};

// The bytes the rank of `layout` allocates for a run of `cfg` on `device` (bf16 compute weights on
// cuda, f32 on the CPU; `separate_compute_copy` as TR_TEST_COMPUTE_COPY gives CPU ranks),
// measured from a plan-only model: what the planner prints per stage and what the trainer checks
// against the memory it has before allocating.
StageMemory rank_memory(const Config& cfg, const RunLayout& layout, Device device,
                        bool separate_compute_copy = false, int64_t loss_chunk = 0);

struct Plan {
  int world = 1, nodes = 1, gpus_per_node = 8;
  RunLayout layout;  // the layout on this many GPUs, seen from rank 0 (micro-batches, zero1, ...)
  GpuSpec gpu;
  std::vector<StageMemory> stages;
  double params_total = 0;  // parameters of the model (real vocabulary)
  // Of them, those a token passes through: all but the experts it is not routed to (a mixture
  // of experts' "active" parameters; params_total for a dense model).
  double params_active = 0;
  double checkpoint_bytes = 0;        // one checkpoint on disk (trainer/layout/flat_buffers.h)
  double flops_per_token_causal = 0;  // 6 N_matmul + 6 L s (nh hd): what our MFU counts
  double flops_per_token_full = 0;    // 6 N_matmul + 12 L s (nh hd): non-causal counting
  // train.recompute: FLOPs per token run again in backward (not model FLOPs: MFU leaves them
  // out, so recomputation lowers MFU by the time it takes), and the layers recomputed in full.
  double recompute_flops_per_token = 0;
  int64_t recompute_full_layers = 0;
  double bubble = 0;  // of each step idle: the schedule's closed form (parallel/schedule.h)
  double tp_bytes = 0, pp_bytes = 0, dp_bytes = 0;  // per GPU per step, sent
  double dp_gather_bytes = 0;  // of dp_bytes, ZeRO-1's all-gather of the updated weights
  // Collective calls per GPU per step, each paying its link's latency: the TP collectives of
  // the slowest stage's op list, PP sends, DP buckets.
  double tp_calls = 0, pp_calls = 0, dp_buckets = 0;
  // Of tp_bytes and tp_calls: the column-parallel input-gradient reductions that run beside the
  // weight-gradient GEMMs (parallel.overlap_tp), and the part of their time those GEMMs hide.
  double tp_beside_bytes = 0, tp_beside_calls = 0, tp_hidden_s = 0;
  // The DP x CP group's ranks and nodes, and the algorithm its gradient reduction takes
  // (collectives.h: a tree only for all-reduces, where it is the faster).
  GroupSpan dp_span;
  CollectiveAlgorithm dp_algorithm = CollectiveAlgorithm::ring;
  // Of dp_bytes, dp_gather_bytes and dp_buckets: the experts' region's, over the experts'
  // replicas (Topology::edp; the dp x cp ranks without expert parallelism), and their group.
  double dp_expert_bytes = 0, dp_expert_gather_bytes = 0, dp_expert_buckets = 0;
  GroupSpan edp_span;
  // Expert parallelism: the routed rows' exchanges per GPU per step (what the busiest rank of
  // the ep group moves: kExpertImbalance times the mean, less what stays on the rank), their
  // calls, their time and the group they cross; the step waits for all of it.
  double ep_bytes = 0, ep_calls = 0, ep_s = 0;
  GroupSpan ep_span;
  // Context parallelism's K/V exchange per GPU per step (parallel.cp_comm), sent, and the part
  // of it that runs beside the attention (the ring's K/V passes).
  double cp_bytes = 0, cp_beside_bytes = 0;
  // Each stage's compute by op class (step_model.h); the slowest one sets the step.
  std::vector<StageCompute> compute;
  int slowest_stage = 0;
  // The slowest stage's compute with the bubble, and the communication the step waits for.
  // dp_s and tp_s are the parts of the data- and tensor-parallel exchanges (dp_comm_s,
  // tp_comm_s) the step waits for.
  double compute_s = 0, tp_s = 0, pp_s = 0, dp_s = 0, dp_comm_s = 0, tp_comm_s = 0, step_s = 0;
  double bubble_s =
      0;  // the part of compute_s the pipeline bubble adds (the schedule's idle slots)
  // The CP exchange's time, and the part of it the step waits for: all of it for the
  // all-gather (attention waits for the gathered K and V); for the ring, its dK/dV passes and
  // what of its K/V passes the attention does not cover.
  double cp_comm_s = 0, cp_s = 0;
  // When the plan does not fit: the smallest parallel.cp (doubling from this one, dp auto on the
  // same GPUs) whose plan fits; 0 = none up to the GPU count.
  int cp_needed = 0;
  // The keys a query attends to on average: seq_len, or under data.document_mask block_causal
  // its documents' (measure_attention_span in trainer/run/startup.h); attention's time and the
  // model FLOPs follow it.
  double attention_span = 0;
  double tokens_per_s_per_gpu = 0, mfu = 0;
  bool fits = true;
};

// What another training system overlaps that this trainer does not, for planning its published
// runs with our step model (the published-runs table of docs/PERFORMANCE.md). A plan of this
// trainer leaves it at its default.
struct OtherSystem {
  // Tensor-parallel collectives run beside the GEMMs they feed (Megatron-LM's
  // --tp-comm-overlap): the step waits only for what the stage's GEMM time does not cover.
  bool tp_overlap = false;
};

// The plan of `cfg` on `nodes` x `gpus_per_node` GPUs of type `gpu`. parallel.dp auto is
// resolved from the GPU count; the layout is validated as the trainer does.
// `attention_span` > 0: Plan::attention_span as measured (else seq_len).
absl::StatusOr<Plan> make_plan(const Config& cfg, const GpuSpec& gpu, int nodes, int gpus_per_node,
                               const OtherSystem& system = {}, double attention_span = 0);

// The human-readable report: memory table, verdict, FLOPs, bubble, communication, prediction.
std::string format_plan(const Config& cfg, const Plan& plan);
// The same as one JSON object (for tools/sweep and scripts): layout, verdict, per-stage memory
// in GiB, FLOPs, bubble, communication bytes and the prediction.
std::string plan_json(const Config& cfg, const Plan& plan);

// trainer plan --explain: the predicted step of the slowest stage by op class (seconds, share,
// the rate each ran at against its ceiling), by where it runs (per layer, the LM head and loss,
// the embedding), each stage's compute, and the bubble and communication added to it.
std::string explain_plan(const Config& cfg, const Plan& plan);

// One line (in format_plan): the largest part of the predicted step (compute, the pipeline
// bubble, or tp, pp, dp or cp communication), its share, what would shrink it, and the next.
std::string plan_bottleneck(const Plan& plan);
// The pipeline schedules `cfg`'s layout could run (pp > 1): 1f1b, interleaved with each v that
// splits the layers evenly (up to 8; micro-batches a multiple of pp), zero_bubble; each planned
// on the same GPUs. `pick` is the fastest predicted step that fits, where it beats those before
// it in this order (1f1b first) by 2% or more.
struct ScheduleOption {
  std::string schedule;                            // "1f1b", "interleaved v 2", "zero_bubble"
  std::string sets;                                // the --set flags that choose it
  double bubble = 0, activations = 0, step_s = 0;  // activations: the largest stage's bytes
  bool fits = false, pick = false;
};
std::vector<ScheduleOption> schedule_options(const Config& cfg, const Plan& plan);
// The options as a table and the pick, for format_plan.
std::string format_schedule_options(const Config& cfg, const Plan& plan);

// trainer plan --suggest: the layouts of `cfg`'s model on these GPUs that fit (every tp and pp
// that divide it, dp auto, ZeRO-1; the config's cp, micro-batch and recompute), the `best`
// fastest by predicted tokens/s/GPU as a Markdown table; an error naming the fix when none fits.
// `attention_span` as make_plan's.
absl::StatusOr<std::string> suggest_layouts(const Config& cfg, const GpuSpec& gpu, int nodes,
                                            int gpus_per_node, int best = 8,
                                            double attention_span = 0);

}  // namespace tr
