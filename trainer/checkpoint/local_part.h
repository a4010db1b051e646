// The file format and helpers of node-local checkpoints (trainer/checkpoint/local_ckpt.h): a part's
// header, its layout key, file names and the steps a node's directory holds, and chunked
// point-to-point byte transfers. Shared by the save side (local_ckpt.cpp) and the resume side
// (local_resume.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "parallel/comm.h"
#include "trainer/config/config.h"
#include "trainer/layout/run_layout.h"
#include "trainer/optim/optim.h"

namespace tr::local_part {

inline constexpr char kMagic[8] = {'T', 'R', 'L', 'O', 'C', 'A', 'L', '2'};

// A part's header, then its payload: the state as JSON (state_bytes), the masters, Adam's m and
// v (f32). `crc` covers the payload.
struct Header {
  char magic[8];
  int64_t step, rank, world, tp, pp, dp;
  int64_t capacity, masters, states;  // elements: the flat buffer, this rank's masters and moments
  uint64_t run_id;
  uint64_t layout;  // layout_key() of the run that wrote it: the same on every rank
  int64_t state_bytes;
  uint32_t crc, pad;
};

// What every rank's part depends on besides its rank, the same on every rank of a run: the grid,
// ZeRO-1 and whether the masters are sharded, the model's shape and the stages' layers. A part
// whose key differs from this run's is another layout's, whichever rank wrote it.
uint64_t layout_key(const Config& cfg, const RunLayout& layout, bool masters_sharded);
// This rank's header but for the step, the run and the payload's size: the layout, the grid and
// its place in it, and the elements of its buffer (`capacity`), masters and moments.
Header layout_header(const Config& cfg, const RunLayout& layout, int64_t capacity,
                     const DistributedOptimizer& opt);
// What a part must match to be loaded by this run (the layout, not the step or the run): `mine`
// is layout_header()'s.
bool same_layout(const Header& h, const Header& mine);
nlohmann::json state_json(const ckpt::TrainState& st);
ckpt::TrainState state_of(const nlohmann::json& j);
// An f32 tensor's bytes copied to `out` (host memory) at `*at`, which advances.
void put_f32(const Buffer& out, size_t* at, Tensor t);
// The header of the part at `path`, if it reads as one.
bool read_header(const std::string& path, Header* h);

// held()'s list: the newest kListed steps, each as [step, run id, bit set over the ranks].
inline constexpr int kListed = 8;
inline int held_entry(int ranks) {
  return 2 + (ranks + 63) / 64;
}

// A part's file name: rank R's own part, or the replica of rank R's part another rank holds.
std::string file_name(int rank, bool replica);
// Steps whose step_* directory in `dir` holds `name`, newest first.
std::vector<int64_t> steps_with(const std::string& dir, const std::string& name);
// Steps of this rank's own parts in `dir` (with `unfinished`, its unfinished .tmp ones).
std::vector<int64_t> own_steps(const std::string& dir, int rank, bool unfinished = false);

// Point-to-point byte transfers, in rounds of at most 1 GiB per transfer (MPI counts are ints):
// each transfer's `data` holds at least its size rounded up to 8 bytes. Sender and receiver of
// a transfer agree on its size; every round's sends and receives are posted together.
struct Transfer {
  int peer;
  char* data;
  int64_t bytes;
};
void exchange_bytes(Comm& c, const std::vector<Transfer>& sends,
                    const std::vector<Transfer>& recvs);

// Removes `path` and then its directory once that is empty.
void remove_part(const std::string& path);

}  // namespace tr::local_part
