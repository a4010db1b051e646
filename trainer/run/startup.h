// Everything checked before the model is built, cheapest first: the config and the layout, the
// backend (and the GPU libraries), the checkpoint to resume (its files' sizes and checksums),
// model.init_from, the data's tokenizer, the batch arithmetic, the memory the run needs against
// what this rank has, every data file (and every token id, on rank 0), and last log.dir and
// checkpoint.dir, which rank 0 then locks. No communication happens here; any error is bad input
// (exit 2), a directory held by a live trainer is busy (exit 6).
#pragma once

#include "absl/status/status.h"
#include "core/hardware.h"
#include "trainer/session/session.h"

namespace tr {

absl::Status check_inputs(Session& s);

// trainer --dry-run --world N: the same checks for a job of `world` ranks on GPUs `gpu`, made by
// this one process without a device (a login node): the config and the layout of N ranks, the
// checkpoint to resume (every file), model.init_from, every data file and token id, the batch
// arithmetic, and each pipeline stage's memory by the planner (trainer/plan/plan.h) against the
// GPU's. Prints the plan; takes and writes nothing. Errors are bad input.
absl::Status check_inputs_for_world(Session& s, int world, const GpuSpec& gpu, int gpus_per_node);

// The keys a query attends to on average (`keys`) over the first `samples` samples of
// data.train in the run's order (256, fewer for long sequences: about 4M tokens): the sum of
// their documents' lengths squared per token (the loader's DocumentStats::doc_len_sq). Under
// data.document_mask block_causal, what attention costs per token; seq_len for whole
// sequences. trainer plan and --dry-run ask for it; errors name the data.
struct AttentionSpan {
  double keys = 0;
  int64_t samples = 0;
};
absl::StatusOr<AttentionSpan> measure_attention_span(const Config& cfg);

}  // namespace tr
