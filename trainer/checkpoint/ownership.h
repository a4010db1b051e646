// trainer/checkpoint: the train-side layer of checkpointing, over the HDF5 layer of checkpoint/ and
// a room of the trainer between step/ and run/: block ownership (here), the saver (saver.h),
// node-local checkpoints (local_ckpt.h, local_part.h) and Hugging Face import and export
// (hf.h).
//
// Between this rank's flat buffers and the checkpoint's global tensors. Checkpoints hold every
// tensor (weights, Adam m and v) in its global shape, written as blocks: each block has exactly
// one owning rank, which writes it into its own shard file, and the coordinator stitches the
// blocks into model.h5 (see checkpoint/checkpoint.h). Which rank owns what is a pure function
// of the config and the rank's place in the grid, so the coordinator knows every rank's blocks
// without being told (the layout rules: trainer/layout/flat_buffers.h). Loading reads only the
// blocks a rank needs, under any layout.
//
// Ownership: the (tp, pp) position's slice of each tensor is replicated over dp x cp
// (Topology::dp_cp), so each replica writes its 1/(dp x cp) of the flat buffer's dense region
// (under ZeRO-1 exactly the shard whose Adam states it keeps: its piece of every bucket), and
// each expert's replicas (Topology::edp) their parts of the expert region, for the weights and
// both Adam moments: a 72B checkpoint is
// written by every rank in equal parts. A run cuts a tensor into at most three rectangles
// (partial row, full rows, partial row). Replicated tensors (the norms) are written by TP rank 0
// only, the last stage's copy of a tied embedding by nobody (the first stage has it), vocabulary
// padding rows never.
#pragma once

#include <vector>

#include "checkpoint/checkpoint.h"
#include "parallel/topology.h"
#include "trainer/config/config.h"
#include "trainer/layout/flat_buffers.h"

namespace tr {

// This rank's flat buffers as the checkpoint sees them; null when describing another rank.
struct RankBuffers {
  const float* params = nullptr;   // the fp32 masters: [layout.total], or (params_sharded)
  bool params_sharded = false;     // this rank's ZeRO-1 shard of them
  const float* exp_avg = nullptr;  // Adam m: [layout.total], or this rank's ZeRO-1 shard
  const float* exp_avg_sq = nullptr;
};

// The blocks the rank at `topo` owns and writes, in a fixed order.
std::vector<ckpt::ShardPiece> owned_pieces(const Config& cfg, const Topology& topo,
                                           const RankBuffers& bufs);

// This rank's part of every tensor of its stage as blocks of the global tensors, pointing into
// `params` (its flat buffer): one per tensor, the whole local slice less the vocabulary padding
// rows (an empty block when the slice is all padding). What a load of the weights fills.
std::vector<ckpt::TensorRef> rank_param_blocks(const Config& cfg, const Topology& topo,
                                               float* params);

// Names and global shapes of every tensor of the model (all pipeline stages), for the commit.
std::vector<ckpt::TensorRef> model_tensors(const Config& cfg, const Topology& topo);

// Reads this rank's part of checkpoint `dir` into its buffers: its TP slice of each tensor of
// its stage (vocabulary padding rows zeroed), and its ZeRO-1 range of the Adam states. The
// checkpoint's files must be verified already (sizes are checked again, not checksums).
absl::Status load_rank_part(const std::string& dir, const Config& cfg, const Topology& topo,
                            float* params, float* exp_avg, float* exp_avg_sq,
                            ckpt::TrainState* state, std::string* config_yaml);

}  // namespace tr
