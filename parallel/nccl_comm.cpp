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
#include "core/cuda_check.h"
#include "core/exit_codes.h"

#define NCCL_CHECK(expr, what)                                              \
  TR_CHECK_GEN("NCCL", expr, _v == ncclSuccess || _v == ncclInProgress,     \
               std::string(ncclGetErrorString(_v)) + " (" + (what) + "; " + \
                   ncclGetLastError(nullptr) + ")")

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
    case DType::f8e4m3:
    case DType::f8e5m2:
      return ncclUint8;  // moved, never reduced
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
    CUDA_CHECK(cudaGetDevice(&device_));
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
    CUDA_CHECK(cudaMalloc(&one, sizeof(float)));
    CUDA_CHECK(cudaMemsetAsync(one, 0, sizeof(float), stream_));
    all_reduce(Tensor(one, DType::f32, Device::cuda, {1}), ReduceOp::sum);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaFree(one));
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

  // Host buffers go to the bootstrap communicator. In order: queued on the compute stream.
  // Beside: on the side stream (made on first use) after everything queued on the compute
  // stream so far; its ticket completes with an event recorded after it there.
  Ticket start(const CommOp& op, Lane lane) override {
    if (on_host(op)) return host_ticket(boot_->start(op, lane));
    check_comm_op(op, size());
    if (op.kind == CommOp::barrier) {
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      boot_->barrier();
      return kDone;
    }
    if (lane == Lane::in_order) {
      run(op.name(), stream_, false, [&] { return enqueue(op, stream_); });
      return kDone;
    }
    cudaStream_t side = side_stream();
    CUDA_CHECK(cudaEventRecord(ready_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(side, ready_, 0));
    run(op.name(), side, true, [&] { return enqueue(op, side); });
    side_pending_ = true;
    if (ticket_events_.size() == device_tickets_) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      ticket_events_.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(ticket_events_[device_tickets_], side));
    tickets_.push_back({ticket_events_[device_tickets_++], kDone});
    return ticket_base_ + static_cast<Ticket>(tickets_.size()) - 1;
  }
  void wait(Ticket ticket) override {
    const Ticket k = ticket - ticket_base_;
    if (k < 0 || k >= static_cast<Ticket>(tickets_.size())) return;  // done, or by wait_all
    const Started& t = tickets_[static_cast<size_t>(k)];
    if (t.event != nullptr)
      CUDA_CHECK(cudaStreamWaitEvent(stream_, t.event, 0));
    else
      boot_->wait(t.host);
  }
  void wait_all() override {
    boot_->wait_all();
    ticket_base_ += static_cast<Ticket>(tickets_.size());
    tickets_.clear();
    device_tickets_ = 0;  // the events are recorded afresh by the next tickets
    if (!side_pending_) return;
    CUDA_CHECK(cudaEventRecord(side_done_, side_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, side_done_, 0));
    side_pending_ = false;
  }

 private:
  struct Pending {
    cudaEvent_t event;
    const char* op;
    bool beside;
    Clock::time_point queued;
  };
  struct Started {
    cudaEvent_t event;  // a device operation's completion on the side stream
    Ticket host;        // otherwise the bootstrap communicator's ticket
  };

  static bool host(const Tensor& t) { return t.device == Device::cpu; }
  // Whether `op` moves host buffers (the bootstrap's); a mix of host and device is an error.
  bool on_host(const CommOp& op) const {
    bool any = false, all = true;
    auto see = [&](const Tensor& t) {
      any = any || host(t);
      all = all && host(t);
    };
    switch (op.kind) {
      case CommOp::barrier:
        return false;
      case CommOp::exchange:
        if (op.p2p.empty()) return true;
        for (const P2P& p : op.p2p) see(p.buf);
        break;
      case CommOp::all_gather:
      case CommOp::reduce_scatter:
        see(op.in);
        [[fallthrough]];
      default:
        see(op.out);
    }
    TR_ASSERT(all || !any,
              std::string(op.name()) + " in group " + name() + " mixes host and device buffers");
    return all;
  }
  Ticket host_ticket(Ticket boot) {
    if (boot == kDone) return kDone;
    tickets_.push_back({nullptr, boot});
    return ticket_base_ + static_cast<Ticket>(tickets_.size()) - 1;
  }
  cudaStream_t side_stream() {
    if (side_ == nullptr) {
      // The highest priority: a collective beside a GEMM gets SMs as the GEMM's blocks retire
      // rather than after all of them (an overlapped reduction that waits for the GEMM is
      // not overlapped).
      int least = 0, greatest = 0;
      CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      CUDA_CHECK(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, greatest));
      CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&side_done_, cudaEventDisableTiming));
    }
    return side_;
  }

  // The NCCL call (or group) of `op` on stream `s`.
  ncclResult_t enqueue(const CommOp& op, cudaStream_t s) {
    const Tensor& b = op.out;
    switch (op.kind) {
      case CommOp::all_reduce:
        return ncclAllReduce(b.data, b.data, b.numel(), nccl_type(b.dtype), nccl_op(op.op), comm_,
                             s);
      case CommOp::all_gather:  // in place when `in` is this rank's block of `out`
        return ncclAllGather(op.in.data, b.data, op.in.numel(), nccl_type(op.in.dtype), comm_, s);
      case CommOp::reduce_scatter:
        return ncclReduceScatter(op.in.data, b.data, b.numel(), nccl_type(op.in.dtype),
                                 nccl_op(op.op), comm_, s);
      case CommOp::broadcast:
        return ncclBroadcast(b.data, b.data, b.numel(), nccl_type(b.dtype), op.peer, comm_, s);
      case CommOp::send:
        return ncclSend(b.data, b.numel(), nccl_type(b.dtype), op.peer, comm_, s);
      case CommOp::recv:
        return ncclRecv(b.data, b.numel(), nccl_type(b.dtype), op.peer, comm_, s);
      case CommOp::exchange:
        NCCL_CHECK(ncclGroupStart(), what_ + " exchange");
        for (const P2P& p : op.p2p) {
          const ncclResult_t r =
              p.kind == P2P::send
                  ? ncclSend(p.buf.data, p.buf.numel(), nccl_type(p.buf.dtype), p.peer, comm_, s)
                  : ncclRecv(p.buf.data, p.buf.numel(), nccl_type(p.buf.dtype), p.peer, comm_, s);
          NCCL_CHECK(r, what_ + " exchange");
        }
        return ncclGroupEnd();
      case CommOp::barrier:
        break;
    }
    return ncclSuccess;
  }

  // Queues one NCCL call (or group), waits until NCCL has accepted it, and hands its
  // completion event to the watchdog.
  template <class F>
  void run(const char* op, cudaStream_t stream, bool beside, F&& call) {
    NCCL_CHECK(call(), what_ + " " + op);
    settle(op);
    if (timeout_s_ <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    cudaEvent_t e;
    if (free_events_.empty()) {
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } else {
      e = free_events_.back();
      free_events_.pop_back();
    }
    CUDA_CHECK(cudaEventRecord(e, stream));
    pending_.push_back({e, op, beside, Clock::now()});
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
          fail(std::string(p.op) + (p.beside ? " (overlapped)" : ""), detail);
        }
        break;
      }
    }
  }

  // Once per process (the main thread and the watchdog may both get here): ncclCommAbort
  // (non-blocking here, so it cannot hang on a dead peer), then one line and the job ends with
  // kExitCommTimeout through end_job's MPI_Abort.
  [[noreturn]] void fail(const std::string& op, const std::string& why) {
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
  // Lane::beside's stream and events: made on first use.
  cudaStream_t side_ = nullptr;
  cudaEvent_t ready_ = nullptr, side_done_ = nullptr;
  bool side_pending_ = false;
  // Ticket ticket_base_ + k is tickets_[k]; device tickets use ticket_events_[0, device_tickets_).
  std::vector<Started> tickets_;
  std::vector<cudaEvent_t> ticket_events_;
  size_t device_tickets_ = 0;
  Ticket ticket_base_ = 0;
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
