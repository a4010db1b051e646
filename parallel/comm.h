// Comm: collectives and point-to-point messages within one group of ranks. One interface,
// two implementations: MPI (host buffers; the CPU backend and bootstrap) here, NCCL (device
// buffers on a stream) with the CUDA backend. Buffers are Tensors; every rank of the group
// must call a collective with the same shapes, dtype and order.
//
// One model for every operation: start(op, lane) returns a ticket, wait(ticket) completes it.
// An operation started in Lane::in_order is complete for the host and for later work on the
// compute stream when start returns (on GPUs: queued on the compute stream itself), so its
// ticket is kDone; one started in Lane::beside overlaps what follows (on GPUs: the
// communicator's side stream, after the work already queued on the compute stream; with MPI:
// a non-blocking call) and its buffers may be neither read nor written until its wait. The
// named forms below (all_reduce, ..., all_gather_start) are this base class's start and wait.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/tensor.h"

namespace tr {

class OpLog;
struct OpKey;

enum class ReduceOp { sum, max };

// One side of a grouped exchange (pipeline boundaries: send activations while receiving
// gradients). `peer` is a rank of this group.
struct P2P {
  enum Kind { send, recv } kind;
  Tensor buf;
  int peer;
};

// One operation, described once for every backend.
struct CommOp {
  enum Kind { all_reduce, all_gather, reduce_scatter, broadcast, send, recv, exchange, barrier };
  explicit CommOp(Kind k, Tensor o = {}, Tensor i = {}, ReduceOp r = ReduceOp::sum, int p = 0,
                  std::span<const P2P> ops = {})
      : kind(k), out(o), in(i), op(r), peer(p), p2p(ops) {}
  Kind kind;
  // all_reduce, broadcast, send, recv: the buffer. all_gather: out [size * n, ...] = the
  // concatenation over ranks (rank order) of in [n, ...]; `in` may be this rank's own block of
  // `out` (in place). reduce_scatter: out [n, ...] = this rank's n-row block of (op over ranks
  // of in [size * n, ...]).
  Tensor out, in;
  ReduceOp op = ReduceOp::sum;
  int peer = 0;              // broadcast: the root; send, recv: the other rank
  std::span<const P2P> p2p;  // exchange: posted together (no send/recv ordering deadlock)
  const char* name() const { return name(kind); }
  static const char* name(Kind k);  // "all_reduce", "all_gather", ...
};

enum class Lane { in_order, beside };

class Comm {
 public:
  using Ticket = int64_t;
  static constexpr Ticket kDone = -1;  // completed when started

  virtual ~Comm() = default;
  virtual int rank() const = 0;  // rank within this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", "tp", "dp", "pp" (for error messages)

  // Starts `op`. Every rank must start the same operations in the same order, whichever lane.
  virtual Ticket start(const CommOp& op, Lane lane) = 0;
  // Completes one started operation: the host and later work on the compute stream see its
  // result (on GPUs the compute stream waits; the host does not). Waiting on kDone, or on a
  // ticket already completed, does nothing.
  virtual void wait(Ticket ticket) = 0;
  // Completes every started operation.
  virtual void wait_all() = 0;

  // buf = op over ranks of buf, in place.
  void all_reduce(Tensor buf, ReduceOp op) { run(CommOp(CommOp::all_reduce, buf, {}, op)); }
  void all_gather(Tensor out, Tensor in) { run(CommOp(CommOp::all_gather, out, in)); }
  void reduce_scatter(Tensor out, Tensor in, ReduceOp op) {
    run(CommOp(CommOp::reduce_scatter, out, in, op));
  }
  // buf on every rank = buf of `root`.
  void broadcast(Tensor buf, int root) { run(CommOp(CommOp::broadcast, buf, {}, {}, root)); }
  void send(Tensor buf, int peer) { run(CommOp(CommOp::send, buf, {}, {}, peer)); }
  void recv(Tensor buf, int peer) { run(CommOp(CommOp::recv, buf, {}, {}, peer)); }
  // All of `ops` posted together, returning when every one has completed.
  void exchange(std::span<const P2P> ops) { run(CommOp(CommOp::exchange, {}, {}, {}, 0, ops)); }
  void barrier() { run(CommOp(CommOp::barrier)); }

  // The overlapped forms the gradient and weight buckets and the CP ring use (Lane::beside).
  Ticket all_reduce_start(Tensor buf, ReduceOp op) {
    return start(CommOp(CommOp::all_reduce, buf, {}, op), Lane::beside);
  }
  Ticket reduce_scatter_start(Tensor out, Tensor in, ReduceOp op) {
    return start(CommOp(CommOp::reduce_scatter, out, in, op), Lane::beside);
  }
  Ticket all_gather_start(Tensor out, Tensor in) {
    return start(CommOp(CommOp::all_gather, out, in), Lane::beside);
  }
  Ticket exchange_start(std::span<const P2P> ops) {
    return start(CommOp(CommOp::exchange, {}, {}, {}, 0, ops), Lane::beside);
  }

 private:
  void run(const CommOp& op) { wait(start(op, Lane::in_order)); }
};

// The group of just this process (size 1): every collective is the identity. Used by a lone
// process without a launcher, and for axes of size 1.
std::unique_ptr<Comm> make_self_comm(const std::string& name);

// How an op log (kernels/op_log.h) keys a collective of group `group`: kernel "<group> <kind>",
// with " beside" on Lane::beside; shape the buffer's rows x the rest of its elements: the
// buffer of an all-reduce, broadcast, send or recv, an all-gather's out and a reduce-scatter's
// in (the whole, not this rank's block), and for an exchange the elements it sends x 1.
std::string collective_kernel(const std::string& group, CommOp::Kind kind, Lane lane);
OpKey collective_key(const std::string& group, const CommOp& op, Lane lane);

// `inner` with every operation started through it noted on `log` (OpLog::note_collective) by
// collective_key under inner's name: what a model's op list (trainer/model/op_list.h) is
// checked against. `inner` and `log` must outlive it.
std::unique_ptr<Comm> logged_comm(Comm& inner, OpLog& log);

// Checks an operation's shapes against a group of `size` ranks (one line naming the operation
// and the shapes when they do not fit); whether an all-gather's `in` is rank `rank`'s own block
// of its `out` (in place).
void check_comm_op(const CommOp& op, int size);
bool gathers_in_place(const CommOp& op, int rank);

}  // namespace tr
