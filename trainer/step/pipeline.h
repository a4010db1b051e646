// The pipeline's part of a step: this stage's 1F1B schedule over the step's micro-batches (with
// stop polls), the forward-only pass of evaluation, and the step's tokens staged for the ops.
#pragma once

#include "data/loader.h"
#include "parallel/comm.h"
#include "parallel/topology.h"
#include "trainer/layout/run_layout.h"
#include "trainer/model/model.h"
#include "trainer/model/step_io.h"

namespace tr {

// What the pipeline runs on: this rank's model and staged tokens, its pipeline group and the
// world (the stop polls), and the layout (the micro-batches and the schedule's actions).
struct PipelineRank {
  DecoderModel& model;
  StepIO& io;
  Comm& pp;
  Comm& world;
  const RunLayout& layout;
  const Topology& topo() const { return layout.topo; }
};

// How a step's pipeline ended: run to the end, or cut at a micro-batch boundary by a stop poll.
struct PipelineRun {
  bool cut = false;   // a stop poll cut the step: its gradients are partial, nothing is applied
  bool stop = false;  // a rank asked to stop (the step may still have run to the end)
};

// Runs this stage's 1F1B action list over the step's micro-batches; gradients accumulate. Stop
// polls (parallel/schedule.h) let a signal cut the step at a micro-batch boundary that every
// rank agrees on.
PipelineRun run_pipeline(const PipelineRank& r, const data::StepBatch& batch, float grad_scale);

// Forward only, micro-batch after micro-batch down the pipeline; the loss sum (last stage).
double forward_pipeline(const PipelineRank& r, const data::StepBatch& batch);

// The batch's token ids and targets to where the ops read them (r.io), ahead of its
// micro-batches: one upload per step (or evaluation batch).
void stage_batch(const PipelineRank& r, const data::StepBatch& batch);

}  // namespace tr
