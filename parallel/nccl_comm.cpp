// The NCCL communicator. Non-blocking NCCL communicators (config.blocking = 0): every call may
// return ncclInProgress, after which ncclCommGetAsyncError is polled until the call has been
// queued. Each queued collective records an event on the stream; with a timeout, a watchdog
// thread follows those events and aborts the communicator (ncclCommAbort) and the job when one
// is late or NCCL reports an asynchronous error, instead of leaving every rank hanging.
#include "parallel/nccl_comm.h"

#ifdef TRAINER_HAVE_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/exit_codes.h"

#define NCCL_CHECK(expr, what)                                              \
  TR_CHECK_GEN("NCCL", expr, _v == ncclSuccess || _v == ncclInProgress,     \
               std::string(ncclGetErrorString(_v)) + " (" + (what) + "; " + \
                   ncclGetLastError(nullptr) + ")")
#define CUDA_OK(expr)                           \
  TR_CHECK_GEN("CUDA", expr, _v == cudaSuccess, \
               std::string(cudaGetErrorName(_v)) + ": " + cudaGetErrorString(_v))

namespace tr {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::sum ? ncclSum : ncclMax;
}

class NcclComm final : public Comm {
 public:
  NcclComm(std::unique_ptr<Comm> bootstrap, void* stream, double timeout_s)
      : boot_(std::move(bootstrap)),
        stream_(static_cast<cudaStream_t>(stream)),
        timeout_s_(timeout_s),
        what_("group " + boot_->name()) {
    CUDA_OK(cudaGetDevice(&device_));
    ncclUniqueId id{};
    if (boot_->rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id), what_);
    static_assert(sizeof(id) % sizeof(int32_t) == 0);
    boot_->broadcast(
        Tensor(&id, DType::i32, Device::cpu, {static_cast<int64_t>(sizeof(id) / sizeof(int32_t))}),
        0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    NCCL_CHECK(ncclCommInitRankConfig(&comm_, boot_->size(), id, boot_->rank(), &config),
               what_ + " init");
    settle("init");
    if (timeout_s_ > 0) watchdog_ = std::thread([this] { watch(); });
    // One collective now, so that NCCL's connections and buffers are set up here, not inside
    // the first step's backward (where the DP buckets' stream runs beside the TP/PP traffic).
    void* one = nullptr;
    CUDA_OK(cudaMalloc(&one, sizeof(float)));
    CUDA_OK(cudaMemsetAsync(one, 0, sizeof(float), stream_));
    all_reduce(Tensor(one, DType::f32, Device::cuda, {1}), ReduceOp::sum);
    CUDA_OK(cudaStreamSynchronize(stream_));
    CUDA_OK(cudaFree(one));
  }
  ~NcclComm() override {
    // Drain the streams while the watchdog still watches (a collective stuck at shutdown ends
    // the job instead of hanging it).
    cudaStreamSynchronize(stream_);
    if (side_ != nullptr) cudaStreamSynchronize(side_);
    stop_ = true;
    if (watchdog_.joinable()) watchdog_.join();
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    for (cudaEvent_t e : ticket_events_) cudaEventDestroy(e);
    for (const Pending& p : pending_) cudaEventDestroy(p.event);
    if (side_ != nullptr) {
      cudaStreamSynchronize(side_);
      cudaEventDestroy(ready_);
      cudaEventDestroy(side_done_);
      cudaStreamDestroy(side_);
    }
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  int rank() const override { return boot_->rank(); }
  int size() const override { return boot_->size(); }
  const std::string& name() const override { return boot_->name(); }

  void all_reduce(Tensor buf, ReduceOp op) override {
    if (host(buf)) return boot_->all_reduce(buf, op);
    run("all_reduce", [&] {
      return ncclAllReduce(buf.data, buf.data, buf.numel(), nccl_type(buf.dtype), nccl_op(op),
                           comm_, stream_);
    });
  }
  void all_gather(Tensor out, Tensor in) override {
    if (host(out) && host(in)) return boot_->all_gather(out, in);
    check_gather(out, in);
    run("all_gather", [&] {  // in place when `in` is this rank's block of `out`
      return ncclAllGather(in.data, out.data, in.numel(), nccl_type(in.dtype), comm_, stream_);
    });
  }
  void reduce_scatter(Tensor out, Tensor in, ReduceOp op) override {
    if (host(out) && host(in)) return boot_->reduce_scatter(out, in, op);
    check_scatter(out, in);
    run("reduce_scatter", [&] {
      return ncclReduceScatter(in.data, out.data, out.numel(), nccl_type(in.dtype), nccl_op(op),
                               comm_, stream_);
    });
  }
  void broadcast(Tensor buf, int root) override {
    if (host(buf)) return boot_->broadcast(buf, root);
    run("broadcast", [&] {
      return ncclBroadcast(buf.data, buf.data, buf.numel(), nccl_type(buf.dtype), root, comm_,
                           stream_);
    });
  }
  void send(Tensor buf, int peer) override {
    if (host(buf)) return boot_->send(buf, peer);
    run("send", [&] {
      return ncclSend(buf.data, buf.numel(), nccl_type(buf.dtype), peer, comm_, stream_);
    });
  }
  void recv(Tensor buf, int peer) override {
    if (host(buf)) return boot_->recv(buf, peer);
    run("recv", [&] {
      return ncclRecv(buf.data, buf.numel(), nccl_type(buf.dtype), peer, comm_, stream_);
    });
  }
  void exchange(std::span<const P2P> ops) override {
    if (ops.empty()) return;
    const bool on_host = host(ops[0].buf);
    for (const P2P& p : ops)
      TR_ASSERT(host(p.buf) == on_host, "exchange mixes host and device buffers");
    if (on_host) return boot_->exchange(ops);
    run("exchange", [&] {
      NCCL_CHECK(ncclGroupStart(), what_ + " exchange");
      for (const P2P& p : ops) {
        const ncclResult_t r = p.kind == P2P::send
                                   ? ncclSend(p.buf.data, p.buf.numel(), nccl_type(p.buf.dtype),
                                              p.peer, comm_, stream_)
                                   : ncclRecv(p.buf.data, p.buf.numel(), nccl_type(p.buf.dtype),
                                              p.peer, comm_, stream_);
        NCCL_CHECK(r, what_ + " exchange");
      }
      return ncclGroupEnd();
    });
  }
  void barrier() override {
    CUDA_OK(cudaStreamSynchronize(stream_));
    boot_->barrier();
  }
  // On the side stream, after everything queued on the compute stream so far.
  void all_reduce_start(Tensor buf, ReduceOp op) override {
    if (host(buf)) return boot_->all_reduce_start(buf, op);
    run_side("all_reduce (overlapped)", [&] {
      return ncclAllReduce(buf.data, buf.data, buf.numel(), nccl_type(buf.dtype), nccl_op(op),
                           comm_, side_);
    });
  }
  void reduce_scatter_start(Tensor out, Tensor in, ReduceOp op) override {
    if (host(out) && host(in)) return boot_->reduce_scatter_start(out, in, op);
    check_scatter(out, in);
    run_side("reduce_scatter (overlapped)", [&] {
      return ncclReduceScatter(in.data, out.data, out.numel(), nccl_type(in.dtype), nccl_op(op),
                               comm_, side_);
    });
  }
  // On the side stream too; each ticket's completion is an event recorded after it there.
  int64_t all_gather_start(Tensor out, Tensor in) override {
    if (host(out) && host(in)) {  // complete at once: tickets here are the device's
      boot_->all_gather(out, in);
      return -1;
    }
    check_gather(out, in);
    run_side("all_gather (overlapped)", [&] {
      return ncclAllGather(in.data, out.data, in.numel(), nccl_type(in.dtype), comm_, side_);
    });
    if (ticket_events_.size() == gathers_started_) {
      cudaEvent_t e;
      CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      ticket_events_.push_back(e);
    }
    CUDA_OK(cudaEventRecord(ticket_events_[gathers_started_], side_));
    return gather_base_ + static_cast<int64_t>(gathers_started_++);
  }
  void wait(int64_t ticket) override {
    const int64_t k = ticket - gather_base_;
    if (k < 0 || k >= static_cast<int64_t>(gathers_started_)) return;  // joined by wait_all
    CUDA_OK(cudaStreamWaitEvent(stream_, ticket_events_[static_cast<size_t>(k)], 0));
  }
  void wait_all() override {
    boot_->wait_all();
    gather_base_ += static_cast<int64_t>(gathers_started_);
    gathers_started_ = 0;  // the events are recorded afresh by the next tickets
    if (!side_pending_) return;
    CUDA_OK(cudaEventRecord(side_done_, side_));
    CUDA_OK(cudaStreamWaitEvent(stream_, side_done_, 0));
    side_pending_ = false;
  }

 private:
  struct Pending {
    cudaEvent_t event;
    const char* op;
    Clock::time_point queued;
  };

  static bool host(const Tensor& t) { return t.device == Device::cpu; }
  void check_scatter(const Tensor& out, const Tensor& in) const {
    TR_ASSERT(
        in.numel() == out.numel() * size() && out.dtype == in.dtype && !host(out) && !host(in),
        "reduce_scatter: in " + in.shape_str() + " must be " + std::to_string(size()) + " x out " +
            out.shape_str() + ", both on the device");
  }
  void check_gather(const Tensor& out, const Tensor& in) const {
    TR_ASSERT(
        out.numel() == in.numel() * size() && out.dtype == in.dtype && !host(out) && !host(in),
        "all_gather: out " + out.shape_str() + " must be " + std::to_string(size()) + " x in " +
            in.shape_str() + ", both on the device");
  }

  // Queues `call` on the side stream (made on first use) after everything queued on the
  // compute stream so far; wait_all() joins it back.
  template <class F>
  void run_side(const char* op, F&& call) {
    if (side_ == nullptr) {
      CUDA_OK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
      CUDA_OK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      CUDA_OK(cudaEventCreateWithFlags(&side_done_, cudaEventDisableTiming));
    }
    CUDA_OK(cudaEventRecord(ready_, stream_));
    CUDA_OK(cudaStreamWaitEvent(side_, ready_, 0));
    run(op, side_, std::forward<F>(call));
    side_pending_ = true;
  }

  // Queues one NCCL call (or group), waits until NCCL has accepted it, and hands its
  // completion event to the watchdog.
  template <class F>
  void run(const char* op, F&& call) {
    run(op, stream_, std::forward<F>(call));
  }
  template <class F>
  void run(const char* op, cudaStream_t stream, F&& call) {
    NCCL_CHECK(call(), what_ + " " + op);
    settle(op);
    if (timeout_s_ <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    cudaEvent_t e;
    if (free_events_.empty()) {
      CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } else {
      e = free_events_.back();
      free_events_.pop_back();
    }
    CUDA_OK(cudaEventRecord(e, stream));
    pending_.push_back({e, op, Clock::now()});
  }

  // Non-blocking communicators: poll until the last call left the ncclInProgress state.
  void settle(const char* op) {
    const Clock::time_point start = Clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(comm_, &state), what_ + " " + op);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(op, ncclGetErrorString(state));
      if (timeout_s_ > 0 &&
          std::chrono::duration<double>(Clock::now() - start).count() > timeout_s_)
        fail(op, "not accepted within parallel.timeout_s");
      std::this_thread::yield();
    }
  }

  void watch() {
    cudaSetDevice(device_);
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress)
        fail("(asynchronous)", ncclGetErrorString(state));
      std::lock_guard<std::mutex> lock(mu_);
      while (!pending_.empty()) {
        const Pending& p = pending_.front();
        const cudaError_t q = cudaEventQuery(p.event);
        if (q == cudaSuccess) {
          free_events_.push_back(p.event);
          pending_.pop_front();
          continue;
        }
        if (q != cudaErrorNotReady) fail(p.op, cudaGetErrorString(q));
        const double waited = std::chrono::duration<double>(Clock::now() - p.queued).count();
        if (waited > timeout_s_) {
          char detail[96];
          std::snprintf(detail, sizeof detail, "not finished after %.0f s (parallel.timeout_s)",
                        waited);
          fail(p.op, detail);
        }
        break;
      }
    }
  }

  // Once per process (the main thread and the watchdog may both get here): ncclCommAbort
  // (non-blocking here, so it cannot hang on a dead peer), then one line and the job ends with
  // kExitCommTimeout through end_job's MPI_Abort.
  [[noreturn]] void fail(const char* op, const std::string& why) {
    static std::atomic<bool> failing{false};
    if (failing.exchange(true))
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the other thread ends it
    ncclCommAbort(comm_);
    end_job(kExitCommTimeout,
            std::string("NCCL ") + op + " failed: " + why + " (" + what_ + ", this rank is " +
                std::to_string(rank()) + " of " + std::to_string(size()) +
                "): a rank of the group is hung, stopped, dead or far behind; ending the job with "
                "exit code " +
                std::to_string(kExitCommTimeout));
  }

  std::unique_ptr<Comm> boot_;
  cudaStream_t stream_;
  double timeout_s_;
  std::string what_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  // all_reduce_start's stream and events: made on first use.
  cudaStream_t side_ = nullptr;
  cudaEvent_t ready_ = nullptr, side_done_ = nullptr;
  bool side_pending_ = false;
  // all_gather_start's tickets: ticket gather_base_ + k completes with ticket_events_[k].
  std::vector<cudaEvent_t> ticket_events_;
  size_t gathers_started_ = 0;
  int64_t gather_base_ = 0;
  std::thread watchdog_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
};

}  // namespace

bool nccl_built() {
  return true;
}

int64_t nccl_version() {
  int v = 0;
  NCCL_CHECK(ncclGetVersion(&v), std::string("nccl_version"));
  return v;
}

int64_t nccl_compiled_version() {
  return NCCL_VERSION_CODE;
}

std::unique_ptr<Comm> make_nccl_comm(std::unique_ptr<Comm> bootstrap, void* stream,
                                     double timeout_s) {
  return std::make_unique<NcclComm>(std::move(bootstrap), stream, timeout_s);
}

}  // namespace tr

#else  // no CUDA: no NCCL

namespace tr {

bool nccl_built() {
  return false;
}

int64_t nccl_version() {
  return 0;
}

int64_t nccl_compiled_version() {
  return 0;
}

std::unique_ptr<Comm> make_nccl_comm(std::unique_ptr<Comm>, void*, double) {
  TR_ASSERT(false, "NCCL communicator requested in a build without CUDA");
  return nullptr;
}

}  // namespace tr

#endif
