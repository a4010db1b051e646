// The step room: one step (here; the pipeline executor in pipeline.h, the ranks' agreement on
// stops and errors in agree.h, fault injection in faults.h), the step guard (guard.h) and the
// Chrome trace of chosen steps (trace.h), over the session.
//
// One training step and one evaluation, as a library: the loop (loop.cpp) calls these between
// its checkpoints, metrics and stop handling.
#pragma once

#include "core/clock.h"
#include "trainer/obs/metrics.h"
#include "trainer/session/session.h"
#include "trainer/step/agree.h"
#include "trainer/step/faults.h"
#include "trainer/step/guard.h"

namespace tr {

// One optimizer step: the batch, micro-batches through the pipeline with gradient
// accumulation, finalize_grads, the step's one host sync (loss and gradient norm), the agreed
// verdict of the step guard, then clip and AdamW (or a skip). Fills `m` and advances s.state.
StepOutcome train_step(Session& s, StepMetrics& m, StepGuard& guard, const FaultInjector& fault);

// Everything that makes this rank's accumulated gradients the ones the optimizer applies:
// the replicated tensors' TP sync, the tied embedding's copies summed (pp > 1), and the
// data-parallel reduction (or its last buckets, when they started during backward).
void finalize_grads(DecoderModel& model, DistributedOptimizer& opt);

// Mean validation loss per token over eval_steps batches read in order from the start, over
// all data-parallel ranks and pipeline stages. Every rank learns of a bad batch on any rank, and
// of a stop signal on any rank before each batch: the evaluation ends there (stop set).
StepOutcome evaluate(Session& s, double* val_loss);

}  // namespace tr
