// Communicators for ranks whose tensors live on GPUs:
//  - NCCL (the production path): device tensors reduced by NCCL, stream-ordered on the
//    compute stream; one rank per GPU.
//  - staging (parallel.comm=mpi, a test device): device tensors copied to host memory, moved
//    by MPI and copied back, so that several ranks can share one GPU (NCCL refuses that).
// Both keep the MPI group they were made from and send host tensors (loss sums, flags,
// digests) through it, so callers never ask which kind of tensor a collective may take.
#pragma once

#include <cstdint>
#include <memory>

#include "parallel/comm.h"

namespace tr {

// True when this build has NCCL (the CUDA backend).
bool nccl_built();
// The loaded NCCL's version (major*10000 + minor*100 + patch); 0 without NCCL.
int64_t nccl_version();
// NCCL_VERSION_CODE of the headers this build was compiled with (0 without CUDA).
int64_t nccl_compiled_version();

// A communicator over the same ranks as `bootstrap` (an MPI group: its rank 0 makes the NCCL
// unique id and broadcasts it; collective over it). Device collectives are queued on `stream`
// (a cudaStream_t) and complete in stream order. With timeout_s > 0 a watchdog ends the job
// when a collective has not finished after timeout_s seconds or NCCL reports an asynchronous
// error: it aborts the communicator and stops every rank with a message naming the rank, the
// group and the operation.
std::unique_ptr<Comm> make_nccl_comm(std::unique_ptr<Comm> bootstrap, void* stream,
                                     double timeout_s);

// Device tensors staged through host buffers and moved by `host` (an MPI group). With
// stage_host_tensors, host tensors are staged too (the tests exercise the staging on the CPU).
std::unique_ptr<Comm> make_staging_comm(std::unique_ptr<Comm> host,
                                        bool stage_host_tensors = false);

}  // namespace tr
