// Node-local checkpoints (checkpoint.local_interval): every few steps each rank copies its own
// part of the training state (its fp32 masters, whole or its ZeRO-1 shard, its Adam moments, and
// the run's state: step, data position, RNG, the step guard) into a host buffer (the only stall)
// and a background thread writes it to checkpoint.local_dir, a node-local directory (tmpfs or
// NVMe), as one file:
//
//   <local_dir>/<key>/<node>/step_NNNNNNNN/rank_RRRRR.bin      this rank's own part
//   <local_dir>/<key>/<node>/step_NNNNNNNN/replica_RRRRR.bin   rank R's part, held for it
//
// where <key> names the run's checkpoint.dir (a run owns its checkpoint.dir) and <node> is the
// node's name (the host name, or TR_NODE_NAME). With two nodes or more each part also goes to its
// holders: the rank at the same place on each of the next checkpoint.local_replicas nodes in the
// ring of nodes (by first rank).
// Parts and replicas are written as *.tmp and renamed at the first step boundary where every rank
// has written its part and every holder its replicas (settle), so a file that exists belongs to
// a checkpoint that is whole. Each file carries the layout and a crc32 of its payload; a load
// checks both on every rank before any state changes.
//
// --resume auto takes the newest local step whose every part is held (by its rank's node, or as
// a replica by its holder) from the same run and the same layout (world, tp, pp, dp, ZeRO-1's
// shards), when it is newer than the newest persistent checkpoint; a rank whose node lost its
// part (a requeue onto another node) receives it from the replica's holder. Otherwise the
// persistent checkpoint stands, with one line saying why. A resumed run is bit-identical to an
// uninterrupted one.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/checkpoint/local_part.h"
#include "trainer/session/session.h"

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

  // Collective: the newest step after `after` whose every rank's part is held whole, by the
  // rank itself or as a replica by another, written by run `run_id` (0: any one run, the same on
  // every rank) with this run's layout; -1 if none, and then why_not() says why a newer local
  // step could not be taken ("" when there was none).
  int64_t newest(int64_t after, uint64_t run_id);
  const std::string& why_not() const { return why_not_; }

  // Collective: loads this rank's part of `step` into the optimizer (masters and Adam moments;
  // the compute weights follow) and s.state, after every rank has read and checked its own. An
  // error (the same on every rank) leaves everything as it was.
  absl::Status load(int64_t step);

  // A fresh start (--resume none, or no checkpoint to continue): this rank's parts of an earlier
  // run in this directory are removed, so that a later --resume auto cannot take them.
  void discard_own();

 private:
  local_part::Header own_header() const;      // local_part::layout_header() of this rank
  std::string part_path(int64_t step) const;  // this rank's own part
  std::string path_of(int64_t step, int rank, bool replica) const;
  // Rank `rank`'s part of `step` in this node's directory: its own file or a replica; "" if none.
  std::string copy_path(int64_t step, int rank) const;
  std::vector<int64_t> step_dirs() const;  // the steps of this node's directory, newest first
  // This rank's newest steps after `after` (of run `run_id` unless 0) with the parts it can
  // provide of each: every part or replica its node's directory holds (whoever wrote it: after
  // a requeue onto other nodes the copies are wherever the old node names put them), as a bit
  // set over the ranks. `other_layout`: raised to the newest own part of another layout.
  std::vector<int64_t> held(int64_t after, uint64_t run_id, int64_t* other_layout) const;
  std::vector<int> sources() const;  // the ranks whose replicas this rank holds
  void commit(bool written);
  // Collective over the writer threads: each part to its holders, written there.
  absl::Status write_replicas();
  // Waits for the writer thread; ends the job when it is not done within
  // checkpoint.save_timeout_s (a hung rank's writer never sends its replicas).
  void await_writer();
  // Collective: this rank's part of `step` from whoever newest() chose to provide it.
  absl::StatusOr<std::string> fetch(int64_t step);
  Session& s_;
  std::string node_;  // this rank's node (TR_NODE_NAME, else the host name)
  std::string dir_;   // <local_dir>/<checkpoint.dir's key>/<node>
  // Per world rank: the ranks holding its replicas (on the next nodes in the ring; none with one
  // node or checkpoint.local_replicas 0); whether there are replicas; and for the step newest()
  // chose, which rank provides each rank's part.
  std::vector<std::vector<int>> holders_;
  int replicas_ = 0;
  std::unique_ptr<Comm> replica_comm_;  // the writer threads' (with replicas)
  bool node_leader_ = false;            // the first rank of this node
  std::vector<int> providers_;
  std::string why_not_;
  // The write in flight: its buffer (header, state, masters, m, v; reused), its step, whether the
  // thread is done and how it went, and the loop's time in save() and settle() for it.
  Buffer buffer_;    // host memory, pinned on a GPU
  size_t used_ = 0;  // bytes of buffer_ the part fills
  char* data() const { return static_cast<char*>(buffer_.data()); }
  void reserve(size_t bytes);  // a buffer of `bytes`, its pages touched
  int64_t step_ = -1;
  std::thread writer_;
  std::atomic<bool> written_{false};
  absl::Status write_status_;
  bool in_flight_ = false;
  double started_ = 0, stall_s_ = 0;
};

}  // namespace tr
