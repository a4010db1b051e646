// Node-local checkpoints (checkpoint.local_interval): every few steps each rank copies its own
// part of the training state (its fp32 masters, whole or its ZeRO-1 shard, its Adam moments, and
// the run's state: step, data position, RNG, the step guard) into a host buffer (the only stall)
// and a background thread writes it to checkpoint.local_dir, a node-local directory (tmpfs or
// NVMe), as one file:
//
//   <local_dir>/<key>/step_NNNNNNNN/rank_RRRRR.bin
//
// where <key> names the run's checkpoint.dir (a run owns its checkpoint.dir). A part is written
// as rank_RRRRR.bin.tmp and renamed at the first step boundary where every rank has written its
// own (settle), so a part that exists belongs to a checkpoint every rank holds (a crash between the
// renames is found at the resume, which takes only a step every rank has). Each file carries the
// layout and a crc32 of its payload; a load checks both on every rank before any state changes.
//
// --resume auto takes the newest local checkpoint every rank has whole when it is newer than the
// newest persistent one, was written by the same run and the same layout (world, tp, pp, dp,
// ZeRO-1's shards); otherwise the persistent checkpoint stands, with one line saying why. A
// resumed run is bit-identical to an uninterrupted one. The parts survive the process (kill -9,
// an exception, a requeue on the same node), not the node: replicas on another node are not
// written yet (docs/checkpoints.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "trainer/session.h"

namespace tr {

class LocalCheckpoints {
 public:
  explicit LocalCheckpoints(Session& s);
  ~LocalCheckpoints();  // waits for a write in flight (it is not committed)
  LocalCheckpoints(const LocalCheckpoints&) = delete;
  LocalCheckpoints& operator=(const LocalCheckpoints&) = delete;

  bool enabled() const { return s_.cfg.checkpoint.local_interval > 0; }
  // Whether step `step` is due for a local save: every local_interval steps, but not the last
  // step nor one a persistent checkpoint was just taken of.
  bool due(int64_t step) const {
    return enabled() && step % s_.cfg.checkpoint.local_interval == 0 && step < s_.cfg.train.steps &&
           step != s_.last_saved_step;
  }
  // This run's directory under checkpoint.local_dir.
  const std::string& dir() const { return dir_; }

  // Allocates and touches the host buffer the saves copy into, once before the first (faulting in
  // a fresh buffer's pages inside a save would stall it for seconds).
  void prepare();
  // Collective over the world: copies this rank's part of s.state.step to the host and starts its
  // write in the background (after settling the one before, waiting for it if need be).
  void save();
  // Collective, at a step boundary while a write is in flight: once every rank has written its
  // part (or at once with `wait`), each renames its own, so the checkpoint counts, and removes its
  // parts beyond checkpoint.local_keep. A failure on any rank is one warning on every rank, and
  // the run goes on (the persistent checkpoints stand).
  void settle(bool wait);
  bool in_flight() const { return in_flight_; }

  // Collective: the newest step after `after` that every rank holds a whole part of, written by
  // run `run_id` (0: any one run, the same on every rank) with this run's layout; -1 if none.
  int64_t newest(int64_t after, uint64_t run_id);

  // Collective: loads this rank's part of `step` into the optimizer (masters and Adam moments;
  // the compute weights follow) and s.state, after every rank has read and checked its own. An
  // error (the same on every rank) leaves everything as it was.
  absl::Status load(int64_t step);

  // A fresh start (--resume none, or no checkpoint to continue): this rank's parts of an earlier
  // run in this directory are removed, so that a later --resume auto cannot take them.
  void discard_own();

 private:
  std::string part_path(int64_t step) const;
  void commit(bool written);
  Session& s_;
  std::string dir_;
  // The write in flight: its buffer (header, state, masters, m, v; reused), its step, whether the
  // thread is done and how it went, and the loop's time in save() and settle() for it.
  std::vector<char> buffer_;
  size_t used_ = 0;  // bytes of buffer_ the part fills
  int64_t step_ = -1;
  std::thread writer_;
  std::atomic<bool> written_{false};
  absl::Status write_status_;
  bool in_flight_ = false;
  double started_ = 0, stall_s_ = 0;
};

}  // namespace tr
