// The model's op list: every kernel a rank's model runs in a training step, block by block, with
// the shape it runs at and the FLOPs and bytes that price it, and every collective it starts on
// its TP and CP groups. The planner's step model
// (trainer/plan/step_model.h) and tools/bench_ops read this list instead of describing the
// forward and backward again, and a test records what the kernels actually dispatched and the
// groups carried (kernels/op_log.h, parallel/comm.h logged_comm) over every family, recomputation
// mode and layout and checks it equals the list, so the planner cannot drift from the model.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainer/model/model.h"
#include "trainer/model/op_lister.h"

namespace tr {

// The ops a model of `dims` built with `options` runs in a training step of `micro_batches`
// micro-batches (each chunk of its layers forward and backward once per micro-batch), bytes at
// options.dtype's size. Identical ops are merged (their counts added).
std::vector<ModelOp> model_ops(const ModelDims& dims, const ModelOptions& options,
                               int64_t micro_batches);

// Each kernel and shape of `ops` with its count per step: what an OpLog of the step holds.
std::map<OpKey, int64_t> op_counts(const std::vector<ModelOp>& ops);

// "" when `logged` equals `listed`, else each kernel and shape whose counts differ, one per line
// ("linear_fwd 64 x 96 x 32: ran 8, listed 4").
std::string op_count_difference(const std::map<OpKey, int64_t>& logged,
                                const std::map<OpKey, int64_t>& listed);

}  // namespace tr
