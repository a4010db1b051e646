#include "parallel/mpi_comm.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "core/exit_codes.h"
#include "core/switches.h"

// MPI calls return error codes (MPI_ERRORS_RETURN on every communicator); a failure aborts
// every rank through fatal_error -> MPI_Abort, naming the rank, the call and the group.
#define MPI_CHECK(expr, group)                 \
  TR_CHECK_GEN("MPI", expr, _v == MPI_SUCCESS, \
               ::tr::mpi_error_text(_v) + " (group " + (group) + ")")

namespace tr {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

// One thread per process that watches the blocking MPI call in progress (only the main thread
// makes them). Also sums the time spent blocked, for the straggler report.
class MpiWatchdog {
 public:
  using Clock = std::chrono::steady_clock;

  explicit MpiWatchdog(double timeout_s) : timeout_s_(timeout_s) {
    if (timeout_s_ > 0) thread_ = std::thread([this] { watch(); });
  }
  ~MpiWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void begin(const char* op, const std::string* group, int rank, int size) {
    std::lock_guard<std::mutex> lock(mu_);
    call_ = {op, group, rank, size, Clock::now()};
    busy_ = true;
  }
  void end() {
    std::lock_guard<std::mutex> lock(mu_);
    blocked_s_ += std::chrono::duration<double>(Clock::now() - call_.start).count();
    busy_ = false;
  }
  double blocked_s() {
    std::lock_guard<std::mutex> lock(mu_);
    return blocked_s_;
  }
  std::atomic<double> patience_s{0};

 private:
  struct Call {
    const char* op = "";
    const std::string* group = nullptr;  // the communicator's name; it outlives its calls
    int rank = 0, size = 1;
    Clock::time_point start;
  };

  void watch() {
    const auto period = std::chrono::duration<double>(std::clamp(timeout_s_ / 20, 0.05, 1.0));
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, period, [this] { return stop_; })) {
      if (!busy_) continue;
      const double limit = std::max(timeout_s_, patience_s.load());
      const double waited = std::chrono::duration<double>(Clock::now() - call_.start).count();
      if (waited <= limit) continue;
      char line[512];
      std::snprintf(line, sizeof line,
                    "MPI %s in group %s (this rank is %d of %d) unfinished after %.0f s "
                    "(parallel.timeout_s=%g%s): a rank of the group is hung, stopped, dead or far "
                    "behind; ending the job with exit code %d",
                    call_.op, call_.group->c_str(), call_.rank, call_.size, waited, timeout_s_,
                    limit > timeout_s_ ? ", extended for a checkpoint" : "", kExitCommTimeout);
      end_job(kExitCommTimeout, line);
    }
  }

  const double timeout_s_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, busy_ = false;
  Call call_;
  double blocked_s_ = 0;
};

namespace {

MpiWatchdog* g_watchdog = nullptr;  // the MpiRuntime's, once watch() was called

// Marks one blocking MPI call for the watchdog, for its whole duration.
class Watched {
 public:
  Watched(const char* op, const std::string& group, int rank, int size) {
    if (g_watchdog) g_watchdog->begin(op, &group, rank, size);
  }
  ~Watched() {
    if (g_watchdog) g_watchdog->end();
  }
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;
};

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::bf16:
      return MPI_UINT16_T;  // reduced by the user-defined ops below (MPI has no bf16)
  }
  return MPI_DATATYPE_NULL;
}

// bf16 reductions as MPI user-defined operations over uint16 words: each pair is widened to
// fp32, combined and rounded back to nearest even, as NCCL's bf16 sum does per step.
template <bool kSum>
void bf16_combine(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);
    b[i] = f32_to_bf16(kSum ? x + y : std::max(x, y));
  }
}

MPI_Op bf16_op(ReduceOp op) {
  static const MPI_Op sum = [] {
    MPI_Op o;
    MPI_Op_create(&bf16_combine<true>, /*commute=*/1, &o);
    return o;
  }();
  static const MPI_Op max = [] {
    MPI_Op o;
    MPI_Op_create(&bf16_combine<false>, /*commute=*/1, &o);
    return o;
  }();
  return op == ReduceOp::sum ? sum : max;
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype == DType::bf16) return bf16_op(op);
  return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
}

int count_of(const Tensor& t) {
  TR_ASSERT(t.device == Device::cpu, "MPI communicates host tensors, got a device tensor");
  TR_ASSERT(t.numel() <= INT_MAX,
            "MPI message of " + std::to_string(t.numel()) + " elements; split it");
  return static_cast<int>(t.numel());
}

void abort_all_ranks(int code) {
  int up = 0;
  MPI_Initialized(&up);
  if (up) MPI_Abort(MPI_COMM_WORLD, code);
}

class MpiComm final : public Comm {
 public:
  MpiComm(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), name_);
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_), name_);
    MPI_CHECK(MPI_Comm_size(comm_, &size_), name_);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_WORLD && !finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  MPI_Comm handle() const { return comm_; }

  void all_reduce(Tensor buf, ReduceOp op) override {
    Watched w("all_reduce", name_, rank_, size_);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf.data, count_of(buf), mpi_type(buf.dtype),
                            mpi_op(op, buf.dtype), comm_),
              name_);
  }
  void all_gather(Tensor out, Tensor in) override {
    const bool in_place = gather_in_place(out, in);
    Watched w("all_gather", name_, rank_, size_);
    MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : in.data, count_of(in), mpi_type(in.dtype),
                            out.data, count_of(in), mpi_type(in.dtype), comm_),
              name_);
  }
  void reduce_scatter(Tensor out, Tensor in, ReduceOp op) override {
    check_scatter(out, in);
    Watched w("reduce_scatter", name_, rank_, size_);
    MPI_CHECK(MPI_Reduce_scatter_block(in.data, out.data, count_of(out), mpi_type(in.dtype),
                                       mpi_op(op, in.dtype), comm_),
              name_);
  }
  void broadcast(Tensor buf, int root) override {
    Watched w("broadcast", name_, rank_, size_);
    MPI_CHECK(MPI_Bcast(buf.data, count_of(buf), mpi_type(buf.dtype), root, comm_), name_);
  }
  void send(Tensor buf, int peer) override {
    Watched w("send", name_, rank_, size_);
    MPI_CHECK(MPI_Send(buf.data, count_of(buf), mpi_type(buf.dtype), peer, kTag, comm_), name_);
  }
  void recv(Tensor buf, int peer) override {
    Watched w("recv", name_, rank_, size_);
    MPI_CHECK(MPI_Recv(buf.data, count_of(buf), mpi_type(buf.dtype), peer, kTag, comm_,
                       MPI_STATUS_IGNORE),
              name_);
  }
  void exchange(std::span<const P2P> ops) override {
    std::vector<MPI_Request> reqs(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2P& p = ops[i];
      if (p.kind == P2P::send)
        MPI_CHECK(MPI_Isend(p.buf.data, count_of(p.buf), mpi_type(p.buf.dtype), p.peer, kTag, comm_,
                            &reqs[i]),
                  name_);
      else
        MPI_CHECK(MPI_Irecv(p.buf.data, count_of(p.buf), mpi_type(p.buf.dtype), p.peer, kTag, comm_,
                            &reqs[i]),
                  name_);
    }
    Watched w("exchange", name_, rank_, size_);
    MPI_CHECK(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), name_);
  }
  void barrier() override {
    Watched w("barrier", name_, rank_, size_);
    MPI_CHECK(MPI_Barrier(comm_), name_);
  }
  void all_reduce_start(Tensor buf, ReduceOp op) override {
    MPI_Request req;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf.data, count_of(buf), mpi_type(buf.dtype),
                             mpi_op(op, buf.dtype), comm_, &req),
              name_);
    progress();
    pending_.push_back(req);
  }
  void reduce_scatter_start(Tensor out, Tensor in, ReduceOp op) override {
    check_scatter(out, in);
    MPI_Request req;
    MPI_CHECK(MPI_Ireduce_scatter_block(in.data, out.data, count_of(out), mpi_type(in.dtype),
                                        mpi_op(op, in.dtype), comm_, &req),
              name_);
    progress();
    pending_.push_back(req);
  }
  int64_t all_gather_start(Tensor out, Tensor in) override {
    const bool in_place = gather_in_place(out, in);
    MPI_Request req;
    MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data, count_of(in), mpi_type(in.dtype),
                             out.data, count_of(in), mpi_type(in.dtype), comm_, &req),
              name_);
    progress();
    gathers_.push_back(req);
    return gather_base_ + static_cast<int64_t>(gathers_.size()) - 1;
  }
  void wait(int64_t ticket) override {
    const int64_t k = ticket - gather_base_;
    if (k < 0 || k >= static_cast<int64_t>(gathers_.size())) return;  // completed by wait_all
    Watched w("wait", name_, rank_, size_);
    MPI_CHECK(MPI_Wait(&gathers_[static_cast<size_t>(k)], MPI_STATUS_IGNORE), name_);
  }
  void wait_all() override {
    Watched w("wait_all", name_, rank_, size_);
    MPI_CHECK(MPI_Waitall(static_cast<int>(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE),
              name_);
    MPI_CHECK(MPI_Waitall(static_cast<int>(gathers_.size()), gathers_.data(), MPI_STATUSES_IGNORE),
              name_);
    pending_.clear();
    gather_base_ += static_cast<int64_t>(gathers_.size());
    gathers_.clear();
  }

 private:
  void check_scatter(const Tensor& out, const Tensor& in) const {
    TR_ASSERT(in.numel() == out.numel() * size_ && out.dtype == in.dtype,
              "reduce_scatter: in " + in.shape_str() + " must be " + std::to_string(size_) +
                  " x out " + out.shape_str());
  }
  // Checks an all-gather's shapes; whether `in` is this rank's block of `out` (in place, e.g.
  // ZeRO-1's weight all-gather).
  bool gather_in_place(const Tensor& out, const Tensor& in) const {
    TR_ASSERT(out.numel() == in.numel() * size_ && out.dtype == in.dtype,
              "all_gather: out " + out.shape_str() + " must be " + std::to_string(size_) +
                  " x in " + in.shape_str());
    return in.data == static_cast<char*>(out.data) + rank_ * in.nbytes();
  }

  // Open MPI progresses non-blocking collectives inside MPI calls: a started operation gives
  // the earlier ones a turn. Reductions are completed by wait_all() (kept in pending_),
  // all-gathers by wait(ticket) or wait_all() (kept in gathers_).
  void progress() {
    int done = 0;
    if (!pending_.empty())
      MPI_CHECK(MPI_Testall(static_cast<int>(pending_.size()), pending_.data(), &done,
                            MPI_STATUSES_IGNORE),
                name_);
    if (!gathers_.empty())
      MPI_CHECK(MPI_Testall(static_cast<int>(gathers_.size()), gathers_.data(), &done,
                            MPI_STATUSES_IGNORE),
                name_);
  }

  static constexpr int kTag = 7;
  MPI_Comm comm_;
  std::string name_;
  std::vector<MPI_Request> pending_;  // started by all_reduce_start / reduce_scatter_start
  std::vector<MPI_Request> gathers_;  // started by all_gather_start, ticket gather_base_ + index
  int64_t gather_base_ = 0;
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool launched_by_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (launcher_env(v)) return true;
  return false;
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int provided = 0;
  // MULTIPLE: the NCCL watchdog thread may have to MPI_Abort the job (every other MPI call is
  // made by the main thread).
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), std::string("world"));
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), std::string("world"));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), std::string("world"));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_), std::string("world"));
  set_error_rank(rank_);
  set_abort_hook(abort_all_ranks);
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
            std::string("world"));
  MPI_CHECK(MPI_Comm_rank(node, &local_rank_), std::string("node"));
  MPI_CHECK(MPI_Comm_size(node, &local_size_), std::string("node"));
  MPI_Comm_free(&node);
}

void MpiRuntime::watch(double timeout_s) {
  g_watchdog = nullptr;
  watchdog_ = std::make_unique<MpiWatchdog>(timeout_s);
  g_watchdog = watchdog_.get();
}

MpiRuntime::~MpiRuntime() {
  g_watchdog = nullptr;
  watchdog_.reset();
  set_abort_hook(nullptr);
  MPI_Finalize();
}

MpiPatience::MpiPatience(double seconds) {
  previous_ = g_watchdog ? g_watchdog->patience_s.exchange(seconds) : 0;
}
MpiPatience::~MpiPatience() {
  if (g_watchdog) g_watchdog->patience_s = previous_;
}

double mpi_blocked_seconds() {
  return g_watchdog ? g_watchdog->blocked_s() : 0;
}

std::unique_ptr<Comm> make_mpi_world(const std::string& name) {
  return std::make_unique<MpiComm>(MPI_COMM_WORLD, name);
}

std::unique_ptr<Comm> split_mpi_comm(Comm& parent, int color, int key, const std::string& name) {
  auto* p = dynamic_cast<MpiComm*>(&parent);
  TR_ASSERT(p != nullptr, "split_mpi_comm needs an MPI communicator");
  MPI_Comm child;
  MPI_CHECK(MPI_Comm_split(p->handle(), color, key, &child), parent.name());
  return std::make_unique<MpiComm>(child, name);
}

}  // namespace tr
