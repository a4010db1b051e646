// MPI bootstrap and the MPI implementation of Comm (host buffers).
#pragma once

#include <memory>
#include <string>

#include "parallel/comm.h"

namespace tr {

// True when this process was started by a launcher (srun, mpirun): MPI must be initialised.
// A lone process needs no launcher and never touches MPI.
bool launched_by_mpi_launcher();

class MpiWatchdog;

// Initialises MPI (thread level MULTIPLE, for the NCCL watchdog's abort) on construction and
// finalises it on destruction; installs MPI_Abort as the fatal-error hook so that one failing rank
// ends the whole job.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  // The watchdog of the MPI path (parallel.timeout_s for CPU ranks, and GPU ranks staged
  // through host memory): a blocking MPI call of this process still unfinished after timeout_s
  // seconds prints one line naming this rank, the group and the operation, and ends the job
  // with kExitCommTimeout (core/exit_codes.h). 0 = no watchdog.
  void watch(double timeout_s);
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  // Rank among the processes of this node (from the launcher), for cudaSetDevice.
  int local_rank() const { return local_rank_; }
  // Processes on this node.
  int local_size() const { return local_size_; }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::unique_ptr<MpiWatchdog> watchdog_;
};

// While alive, the watchdog lets a blocking MPI call take up to max(parallel.timeout_s,
// seconds): around a checkpoint save or load, where the other ranks wait for the slowest disk.
class MpiPatience {
 public:
  explicit MpiPatience(double seconds);
  ~MpiPatience();
  MpiPatience(const MpiPatience&) = delete;
  MpiPatience& operator=(const MpiPatience&) = delete;

 private:
  double previous_;
};

// Seconds this process has spent blocked in MPI calls (collectives, exchanges, waits), for
// the straggler report: a step's time minus this is the rank's own work.
double mpi_blocked_seconds();

// All ranks of MPI_COMM_WORLD.
std::unique_ptr<Comm> make_mpi_world(const std::string& name = "world");
// Splits `parent` (an MPI comm from this file): ranks with the same color form a group,
// ordered by key. Collective over `parent`. The watchdog follows the main thread's blocking
// calls, one at a time: a communicator another thread uses is made unwatched (`watched` false).
std::unique_ptr<Comm> split_mpi_comm(Comm& parent, int color, int key, const std::string& name,
                                     bool watched = true);

}  // namespace tr
