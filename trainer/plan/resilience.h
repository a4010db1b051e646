// What failures cost a run, and the checkpoint intervals that minimise it: `trainer plan
// --mtbf-hours H`. A first-order model on the planner's predicted step time and checkpoint size:
//
//   goodput = 1 - sum over kinds of save of stall / (interval + stall) - lost per failure / MTBF
//   lost per failure = restart + load + interval / 2 + write   (the work since the newest
//                                                                 committed checkpoint)
//
// with MTBF the job's (the nodes' MTBF / nodes), `stall` what training waits per save (the copy
// to host memory for asynchronous and local saves, the whole write otherwise) and `write` how
// long a save takes to commit after it starts. The interval minimising it is Young/Daly's,
// sqrt(2 stall MTBF), rounded to whole steps and at least the write time.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "trainer/config/config.h"
#include "trainer/plan/plan.h"

namespace tr {

// What one kind of save costs.
struct SaveCost {
  double bytes_per_rank = 0;
  double stall_s = 0;  // training waits this long per save
  double write_s = 0;  // from the save's start to its commit
  double load_s = 0;   // reading it back at a restart
};

// One choice of interval and what it gives.
struct IntervalChoice {
  int64_t steps = 0;
  double interval_s = 0;
  double lost_per_failure_s = 0;  // restart, load and recomputed steps, on average
  double goodput = 0;             // the fraction of wall time that trains
};

struct FailurePlan {
  double mtbf_hours_per_node = 0, job_mtbf_s = 0;
  StorageSpec storage;
  SaveCost persistent, local;  // to checkpoint.dir; node-local with its replicas on other nodes
  int local_replicas = 0;      // each local part's copies on other nodes
  IntervalChoice persistent_configured;  // checkpoint.interval alone
  IntervalChoice persistent_young;       // Young/Daly's interval for persistent saves alone
  // Local saves at checkpoint.local_interval (steps 0: none configured) and at Young/Daly's
  // interval, beside persistent ones at checkpoint.interval; a failure restarts from the newest
  // local checkpoint.
  IntervalChoice local_configured, local_young;
};

// The failure plan of `cfg` as `plan` lays it out, nodes failing every `mtbf_hours_per_node`.
FailurePlan plan_failures(const Config& cfg, const Plan& plan, double mtbf_hours_per_node,
                          const StorageSpec& storage);

// The report's section, and its JSON object.
std::string format_failures(const FailurePlan& f);
std::string failures_json(const FailurePlan& f);

}  // namespace tr
