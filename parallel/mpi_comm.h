// MPI bootstrap and the MPI implementation of Comm (host buffers).
#pragma once

#include <memory>
#include <string>

#include "parallel/comm.h"

namespace tr {

// True when this process was started by a launcher (srun, mpirun): MPI must be initialised.
// A lone process needs no launcher and never touches MPI.
bool launched_by_mpi_launcher();

// Initialises MPI (thread level MULTIPLE, for the NCCL watchdog's abort) on construction and
// finalises it on destruction; installs MPI_Abort as the fatal-error hook so that one failing rank
// ends the whole job.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  // Rank among the processes of this node (from the launcher), for cudaSetDevice.
  int local_rank() const { return local_rank_; }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0;
};

// All ranks of MPI_COMM_WORLD.
std::unique_ptr<Comm> make_mpi_world(const std::string& name = "world");
// Splits `parent` (an MPI comm from this file): ranks with the same color form a group,
// ordered by key. Collective over `parent`.
std::unique_ptr<Comm> split_mpi_comm(Comm& parent, int color, int key, const std::string& name);

}  // namespace tr
