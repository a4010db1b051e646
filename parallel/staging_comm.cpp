// The staging communicator (parallel.comm=mpi with the CUDA backend): device tensors are
// copied into host buffers, moved by the MPI group, and copied back. copy_tensor is
// synchronous and ordered after the kernels queued on the compute stream (a blocking stream),
// so no explicit synchronisation is needed. bf16 tensors are reduced in f32 on the host (MPI
// has no bf16 arithmetic) and rounded back once.
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

  void all_reduce(Tensor buf, ReduceOp op) override {
    if (!staged(buf)) return host_->all_reduce(buf, op);
    Tensor h = stage_in(0, buf, /*widen=*/true);
    host_->all_reduce(h, op);
    stage_out(buf, h);
  }
  void all_gather(Tensor out, Tensor in) override {
    if (!staged(out) && !staged(in)) return host_->all_gather(out, in);
    // `in` may be a block of `out` (in place): it is copied before `out` is written.
    Tensor h_in = stage_in(0, in, false);
    Tensor h_out = stage(1, out, false);
    host_->all_gather(h_out, h_in);
    stage_out(out, h_out);
  }
  void reduce_scatter(Tensor out, Tensor in, ReduceOp op) override {
    if (!staged(out) && !staged(in)) return host_->reduce_scatter(out, in, op);
    Tensor h_in = stage_in(0, in, true);
    Tensor h_out = stage(1, out, true);
    host_->reduce_scatter(h_out, h_in, op);
    stage_out(out, h_out);
  }
  void broadcast(Tensor buf, int root) override {
    if (!staged(buf)) return host_->broadcast(buf, root);
    Tensor h = stage_in(0, buf, false);
    host_->broadcast(h, root);
    stage_out(buf, h);
  }
  void send(Tensor buf, int peer) override {
    if (!staged(buf)) return host_->send(buf, peer);
    host_->send(stage_in(0, buf, false), peer);
  }
  void recv(Tensor buf, int peer) override {
    if (!staged(buf)) return host_->recv(buf, peer);
    Tensor h = stage(0, buf, false);
    host_->recv(h, peer);
    stage_out(buf, h);
  }
  void exchange(std::span<const P2P> ops) override {
    std::vector<P2P> host_ops(ops.begin(), ops.end());
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!staged(ops[i].buf)) continue;
      host_ops[i].buf =
          ops[i].kind == P2P::send ? stage_in(i, ops[i].buf, false) : stage(i, ops[i].buf, false);
    }
    host_->exchange(host_ops);
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i].kind == P2P::recv && staged(ops[i].buf)) stage_out(ops[i].buf, host_ops[i].buf);
  }
  void barrier() override { host_->barrier(); }
  void all_reduce_start(Tensor buf, ReduceOp op) override {
    if (!staged(buf)) return host_->all_reduce_start(buf, op);
    all_reduce(buf, op);  // staged: complete at once
  }
  void reduce_scatter_start(Tensor out, Tensor in, ReduceOp op) override {
    if (!staged(out) && !staged(in)) return host_->reduce_scatter_start(out, in, op);
    reduce_scatter(out, in, op);  // staged: complete at once
  }
  void wait_all() override { host_->wait_all(); }

 private:
  bool staged(const Tensor& t) const { return all_ || t.device != Device::cpu; }

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
};

}  // namespace

std::unique_ptr<Comm> make_staging_comm(std::unique_ptr<Comm> host, bool stage_host_tensors) {
  return std::make_unique<StagingComm>(std::move(host), stage_host_tensors);
}

}  // namespace tr
