// The session room: one struct, so that the step, the checkpoints and the run share one rank's
// state without including each other.
//
// Session: everything one rank's run holds, shared by the set-up (run.cpp) and the training
// loop (loop.cpp). Internal to trainer/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/lock.h"
#include "checkpoint/safetensors.h"
#include "core/ctx.h"
#include "data/loader.h"
#include "kernels/device.h"
#include "parallel/groups.h"
#include "parallel/mpi_comm.h"
#include "parallel/topology.h"
#include "trainer/config/cli.h"
#include "trainer/config/config.h"
#include "trainer/layout/run_layout.h"
#include "trainer/model/model.h"
#include "trainer/model/step_io.h"
#include "trainer/obs/metrics.h"
#include "trainer/obs/step_timing.h"
#include "trainer/optim/optim.h"

namespace tr {

struct Session {
  std::unique_ptr<MpiRuntime> mpi;  // first member: finalised after every communicator is gone
  CliOptions opts;
  Config cfg;
  RunLayout layout;  // the grid and what follows from it (trainer/layout/run_layout.h)
  // The GPU behind ctx (train.backend=cuda); declared before the groups so that NCCL
  // communicators queued on its stream are destroyed first.
  std::unique_ptr<cuda::DeviceContext> device;
  int gpu = -1;  // its CUDA device index
  // The step's phases as the GPU ran them (null on the CPU); its events are destroyed before the
  // device's stream.
  std::unique_ptr<DevicePhaseTimes> device_phases;
  ProcessGroups groups;
  Ctx ctx;
  // The step's state and math: the parameter buffer (compute weights, gradients), the model over
  // it, and the distributed optimizer (masters, Adam states, the reduction) over it.
  std::unique_ptr<ParamBuffer> params;
  std::unique_ptr<DecoderModel> model;
  std::unique_ptr<DistributedOptimizer> opt;
  std::unique_ptr<StepIO> io;  // the step's staged tokens and its two scalars
  std::unique_ptr<data::DataLoader> train, valid;
  MetricsLog log;  // open on rank 0 only
  ckpt::TrainState state;
  std::string resume_from;                // checkpoint directory to load; "" = fresh start
  std::unique_ptr<st::Reader> init_from;  // model.init_from, opened and checked (fresh starts)
  bool start_over = false;                // --resume none --force over checkpoints: move them aside
  std::unique_ptr<ckpt::DirLock> lock;    // rank 0: this run owns checkpoint.dir
  std::unique_ptr<ckpt::DirLock> log_lock;  // rank 0: and log.dir, when that is another dir
  int64_t last_saved_step = -1;  // the newest committed checkpoint of this run; -1 = none

  const Topology& topo() const { return layout.topo; }
  bool logger() const { return layout.topo.rank == 0; }
  // "step N" or "none", for messages that say what a resume would continue from.
  std::string last_checkpoint() const {
    return last_saved_step >= 0 ? "step " + std::to_string(last_saved_step) : "none";
  }
};

// Trains from s.state.step to train.steps (or a stop), saving checkpoints. Returns the exit
// code, agreed by all ranks.
int train_loop(Session& s);

}  // namespace tr
