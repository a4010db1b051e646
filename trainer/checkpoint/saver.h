// Checkpoint saves of the training loop (docs/checkpoints.md). Every rank writes the blocks it
// owns (trainer/checkpoint/ownership.h) into its own shard file; rank 0 prepares the directory
// before and commits after. With checkpoint.async the blocks are first copied into a host buffer
// (kept and reused) and a background thread writes the shard while training goes on; the commit
// follows at the first step boundary where every rank's writer has finished, so a crash before then
// leaves the previous checkpoint as `latest`. Internal to trainer/.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.h"
#include "trainer/session/session.h"

namespace tr {

class Saver {
 public:
  explicit Saver(Session& s);
  ~Saver();  // a background write still running is waited for, and not committed
  Saver(const Saver&) = delete;
  Saver& operator=(const Saver&) = delete;

  // Saves the state at s.state.step (committing a save still in flight first). Synchronous: it
  // is committed on return. Asynchronous: it is staged, and written in the background. Collective.
  // A rank's own failure is its return value; when another rank failed, the others return OK
  // and skip the commit, so that agree_on_exit prints the failing rank's message.
  absl::Status save();
  // Commits the save in flight once every rank's writer has finished (with `wait`: waits for
  // them). Collective: one 4-byte all-reduce while a save is in flight, nothing otherwise.
  absl::Status settle(bool wait);
  bool in_flight() const { return in_flight_; }

 private:
  using Clock = std::chrono::steady_clock;
  // Writes this rank's shard of the save (nothing when it owns no block).
  absl::StatusOr<fs::FileDigest> write() const;
  // Every rank's result to rank 0, which commits.
  absl::Status commit(const absl::StatusOr<fs::FileDigest>& written);
  absl::Status failed(const absl::Status& st) const;  // names the step and what stays

  Session& s_;
  // The save being written: its step, state and pieces (pointing into arena_).
  int64_t step_ = 0;
  ckpt::TrainState state_;
  std::vector<ckpt::ShardPiece> pieces_;
  std::vector<float> arena_;  // async: the staged copy of this rank's blocks, reused
  std::thread writer_;
  std::atomic<bool> written_{false};
  absl::StatusOr<fs::FileDigest> result_ = fs::FileDigest{};
  bool in_flight_ = false;
  Clock::time_point started_;
  double stall_s_ = 0;  // time the training loop spent in save() and settle() for this save
};

}  // namespace tr
