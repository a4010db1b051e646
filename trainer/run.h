// run(): build everything from the config, resume, train, evaluate, checkpoint.
#pragma once

#include "trainer/cli.h"

namespace tr {

// Returns the process exit code (kExitOk, kExitBadInput, kExitFailure).
int run(const CliOptions& opts);
// `trainer plan`: prints the plan of the config (trainer/plan.h); exit 2 on bad input.
int run_plan(const CliOptions& opts);

}  // namespace tr
