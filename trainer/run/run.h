// The run room, the trainer's top: start-up checks (startup.h), set-up and resume (run.cpp) and
// the training loop (loop.cpp), using every room below.
//
// run(): build everything from the config, resume, train, evaluate, checkpoint.
#pragma once

#include "absl/status/status.h"
#include "parallel/comm.h"
#include "trainer/config/cli.h"
#include "trainer/session/session.h"

namespace tr {

// NCCL needs one GPU per rank: fails, naming two ranks of one host on the same physical GPU
// (PCI bus id), when `gpu` (this rank's CUDA device index) is shared. Collective over `world`
// (host tensors); every rank returns the same status. OK without CUDA or for one rank.
absl::Status check_gpu_binding(Comm& world, int gpu);

// Returns the process exit code (kExitOk, kExitBadInput, kExitFailure).
int run(const CliOptions& opts);
// A rank's session as run() sets it up before its first step, from s.opts on s.groups.world
// (and s.mpi when launched): the inputs checked, the step groups made, the model and the
// optimizer built, a checkpoint or model.init_from loaded. Collective over the world; returns
// the exit code every rank agreed on (kExitOk, or what run() would exit with). Tests step a
// layout in process through it.
int open_session(Session& s);
// `trainer plan`: prints the plan of the config (trainer/plan/plan.h); exit 2 on bad input.
int run_plan(const CliOptions& opts);
// `trainer export-hf`: a checkpoint as a Hugging Face model directory (trainer/checkpoint/hf.h);
// exit 2 on bad input (a missing or damaged checkpoint, an --out that holds files), 1 on a failed
// write.
int run_export_hf(const CliOptions& opts);

}  // namespace tr
