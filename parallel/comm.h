// Comm: collectives and point-to-point messages within one group of ranks. One interface,
// two implementations: MPI (host buffers; the CPU backend and bootstrap) here, NCCL (device
// buffers on a stream) with the CUDA backend. Buffers are Tensors; every rank of the group
// must call a collective with the same shapes, dtype and order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/tensor.h"

namespace tr {

enum class ReduceOp { sum, max };

// One side of a grouped exchange (pipeline boundaries: send activations while receiving
// gradients). `peer` is a rank of this group.
struct P2P {
  enum Kind { send, recv } kind;
  Tensor buf;
  int peer;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;  // rank within this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", "tp", "dp", "pp" (for error messages)

  // buf = op over ranks of buf, in place.
  virtual void all_reduce(Tensor buf, ReduceOp op) = 0;
  // out [size * n, ...] = concatenation over ranks (rank order) of in [n, ...]. `in` may be
  // this rank's own block of `out` (in place).
  virtual void all_gather(Tensor out, Tensor in) = 0;
  // out [n, ...] = rank's n-row block of (op over ranks of in [size * n, ...]).
  virtual void reduce_scatter(Tensor out, Tensor in, ReduceOp op) = 0;
  // buf on every rank = buf of `root`.
  virtual void broadcast(Tensor buf, int root) = 0;
  virtual void send(Tensor buf, int peer) = 0;
  virtual void recv(Tensor buf, int peer) = 0;
  // All of `ops` posted together, returning when every one has completed (no ordering
  // deadlock between a send and a recv with the same peer).
  virtual void exchange(std::span<const P2P> ops) = 0;
  virtual void barrier() = 0;

  // Asynchronous all-reduce, for gradient buckets that overlap the backward pass: starts
  // buf = op over ranks of buf; `buf` must be neither read nor written until wait_all().
  // Every rank must start the same buffers in the same order. On GPUs it runs on the
  // communicator's own stream, after the work already queued on the compute stream. The
  // default completes at once.
  virtual void all_reduce_start(Tensor buf, ReduceOp op) { all_reduce(buf, op); }
  // Asynchronous reduce-scatter (ZeRO-1's gradient buckets): starts reduce_scatter(out, in, op);
  // neither may be touched until wait_all(). Same ordering rules as all_reduce_start. The
  // default completes at once.
  virtual void reduce_scatter_start(Tensor out, Tensor in, ReduceOp op) {
    reduce_scatter(out, in, op);
  }
  // Asynchronous all-gather (ZeRO-1's weight buckets, overlapping the next forward): starts
  // all_gather(out, in) and returns its ticket. Neither buffer may be touched until wait(ticket)
  // or wait_all(). Same ordering rules as all_reduce_start; on GPUs it runs on the side stream
  // too. A negative ticket means it completed at once (as the default does).
  virtual int64_t all_gather_start(Tensor out, Tensor in) {
    all_gather(out, in);
    return -1;
  }
  // Completes the all_gather_start() of `ticket`: the host and later work on the compute stream
  // see its result (on GPUs the compute stream waits; the host does not).
  virtual void wait(int64_t /*ticket*/) {}
  // Completes every started operation: the host and later work on the compute stream see
  // their results.
  virtual void wait_all() {}
};

// The group of just this process (size 1): every collective is the identity. Used by a lone
// process without a launcher, and for axes of size 1.
std::unique_ptr<Comm> make_self_comm(const std::string& name);

}  // namespace tr
