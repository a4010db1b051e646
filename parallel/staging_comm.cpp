// The staging communicator (parallel.comm=mpi with the CUDA backend): device tensors are
// copied into host buffers, moved by the MPI group, and copied back. copy_tensor is
// synchronous and ordered after the kernels queued on the compute stream (a blocking stream),
// so no explicit synchronisation is needed. bf16 tensors are reduced in f32 on the host (MPI
// has no bf16 arithmetic) and rounded back once.
//
// An operation that only sends (the pipeline's sends between stages) is copied into buffers of
// its own and left in flight until waited for, as the host group's would be: a stage posts its
// receives while its sends travel, so two neighbouring stages that send to each other at once do
// not both wait for a receiver. Everything that receives completes before start returns.
#include <algorithm>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "parallel/nccl_comm.h"

namespace tr {
namespace {

class StagingComm final : public Comm {
 public:
  StagingComm(std::unique_ptr<Comm> host, bool stage_host_tensors)
      : host_(std::move(host)), all_(stage_host_tensors) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }

  // Operations on staged tensors that receive complete before start returns, in order whichever
  // lane they were started in; those that only send travel until waited for.
  Ticket start(const CommOp& op, Lane lane) override {
    if (!touches_staged(op)) return host_->start(op, lane);
    if (sends_only(op)) return start_sends(op, lane);
    CommOp h = op;
    std::vector<P2P> host_ops;
    switch (op.kind) {
      case CommOp::all_reduce:
        h.out = stage_in(0, op.out, /*widen=*/true);
        break;
      case CommOp::all_gather:
        // `in` may be a block of `out` (in place): it is copied before `out` is written.
        h.in = stage_in(0, op.in, false);
        h.out = stage(1, op.out, false);
        break;
      case CommOp::reduce_scatter:
        h.in = stage_in(0, op.in, true);
        h.out = stage(1, op.out, true);
        break;
      case CommOp::broadcast:
      case CommOp::send:
        h.out = stage_in(0, op.out, false);
        break;
      case CommOp::recv:
        h.out = stage(0, op.out, false);
        break;
      case CommOp::exchange:
        host_ops.assign(op.p2p.begin(), op.p2p.end());
        for (size_t i = 0; i < host_ops.size(); ++i) {
          const P2P& p = op.p2p[i];
          if (!staged(p.buf)) continue;
          host_ops[i].buf =
              p.kind == P2P::send ? stage_in(i, p.buf, false) : stage(i, p.buf, false);
        }
        h.p2p = host_ops;
        break;
      case CommOp::barrier:
        break;
    }
    host_->wait(host_->start(h, Lane::in_order));
    if (op.kind == CommOp::exchange) {
      for (size_t i = 0; i < host_ops.size(); ++i)
        if (host_ops[i].kind == P2P::recv && staged(op.p2p[i].buf))
          stage_out(op.p2p[i].buf, host_ops[i].buf);
    } else if (op.kind != CommOp::send && op.kind != CommOp::barrier) {
      stage_out(op.out, h.out);
    }
    return kDone;
  }
  void wait(Ticket ticket) override {
    host_->wait(ticket);
    const auto it = std::find_if(sending_.begin(), sending_.end(),
                                 [&](const InFlight& f) { return f.ticket == ticket; });
    if (it == sending_.end()) return;
    for (Buffer& b : it->buffers) spare_.push_back(std::move(b));
    sending_.erase(it);
  }
  void wait_all() override {
    host_->wait_all();
    for (InFlight& f : sending_)
      for (Buffer& b : f.buffers) spare_.push_back(std::move(b));
    sending_.clear();
  }

 private:
  // Sends in flight and the host copies they are sent from.
  struct InFlight {
    Ticket ticket;
    std::vector<Buffer> buffers;
  };

  static bool sends_only(const CommOp& op) {
    if (op.kind == CommOp::send) return true;
    return op.kind == CommOp::exchange &&
           std::all_of(op.p2p.begin(), op.p2p.end(),
                       [](const P2P& p) { return p.kind == P2P::send; });
  }

  // The sends from host copies that stay with the ticket; the caller's tensors are free again
  // when this returns.
  Ticket start_sends(const CommOp& op, Lane lane) {
    InFlight f;
    auto copy_out = [&](const Tensor& t) {
      Buffer b = spare_buffer(t.nbytes());
      Tensor h(b.data(), t.dtype, Device::cpu, {t.numel()});
      copy_tensor(h, t.view({t.numel()}));
      f.buffers.push_back(std::move(b));
      return h;
    };
    CommOp h = op;
    std::vector<P2P> host_ops(op.p2p.begin(), op.p2p.end());
    if (op.kind == CommOp::send) {
      h.out = copy_out(op.out);
    } else {
      for (P2P& p : host_ops)
        if (staged(p.buf)) p.buf = copy_out(p.buf);
      h.p2p = host_ops;
    }
    f.ticket = host_->start(h, lane);
    if (f.ticket == kDone) {
      for (Buffer& b : f.buffers) spare_.push_back(std::move(b));
      return kDone;
    }
    sending_.push_back(std::move(f));
    return sending_.back().ticket;
  }
  // A released send buffer of at least `bytes`, else a new one.
  Buffer spare_buffer(size_t bytes) {
    const auto it = std::find_if(spare_.begin(), spare_.end(),
                                 [&](const Buffer& b) { return b.bytes() >= bytes; });
    if (it == spare_.end()) return Buffer(std::max<size_t>(bytes, 1), Device::cpu);
    Buffer b = std::move(*it);
    spare_.erase(it);
    return b;
  }

  bool staged(const Tensor& t) const { return all_ || t.device != Device::cpu; }
  bool touches_staged(const CommOp& op) const {
    switch (op.kind) {
      case CommOp::barrier:
        return false;
      case CommOp::exchange:
        for (const P2P& p : op.p2p)
          if (staged(p.buf)) return true;
        return false;
      case CommOp::all_gather:
      case CommOp::reduce_scatter:
        return staged(op.out) || staged(op.in);
      default:
        return staged(op.out);
    }
  }

  // A flat host tensor in staging slot `slot` for t's elements: f32 for bf16 when `widen`
  // (reductions), t's own dtype otherwise.
  Tensor stage(size_t slot, const Tensor& t, bool widen) {
    if (slots_.size() <= slot) slots_.resize(slot + 1);
    const DType dtype = widen && t.dtype == DType::bf16 ? DType::f32 : t.dtype;
    const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(dtype);
    if (slots_[slot].bytes() < bytes) slots_[slot] = Buffer(bytes, Device::cpu);
    return Tensor(slots_[slot].data(), dtype, Device::cpu, {t.numel()});
  }
  Tensor stage_in(size_t slot, const Tensor& t, bool widen) {
    Tensor h = stage(slot, t, widen);
    if (h.dtype == t.dtype) {
      copy_tensor(h, t.view({t.numel()}));
    } else {  // bf16 -> f32
      Tensor raw = raw_bf16(t);
      copy_tensor(raw, t.view({t.numel()}));
      const uint16_t* src = raw.ptr<uint16_t>();
      float* dst = h.ptr<float>();
      for (int64_t i = 0; i < t.numel(); ++i) dst[i] = bf16_to_f32(src[i]);
    }
    return h;
  }
  // Host bf16 scratch for the conversions (used and released within one call).
  Tensor raw_bf16(const Tensor& t) {
    if (raw_.bytes() < t.nbytes()) raw_ = Buffer(t.nbytes(), Device::cpu);
    return Tensor(raw_.data(), DType::bf16, Device::cpu, {t.numel()});
  }
  void stage_out(Tensor t, const Tensor& h) {
    if (h.dtype == t.dtype) return copy_tensor(t.view({t.numel()}), h);
    Tensor raw = raw_bf16(t);  // f32 -> bf16, rounded once
    uint16_t* dst = raw.ptr<uint16_t>();
    const float* src = h.ptr<float>();
    for (int64_t i = 0; i < t.numel(); ++i) dst[i] = f32_to_bf16(src[i]);
    copy_tensor(t.view({t.numel()}), raw);
  }

  std::unique_ptr<Comm> host_;
  bool all_;
  std::vector<Buffer> slots_;
  Buffer raw_;
  std::vector<InFlight> sending_;
  std::vector<Buffer> spare_;
};

}  // namespace

std::unique_ptr<Comm> make_staging_comm(std::unique_ptr<Comm> host, bool stage_host_tensors) {
  return std::make_unique<StagingComm>(std::move(host), stage_host_tensors);
}

}  // namespace tr
