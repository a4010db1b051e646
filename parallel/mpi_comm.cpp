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
#include <optional>
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

// Marks one blocking MPI call for the watchdog `dog` (none: unwatched), for its whole duration.
class Watched {
 public:
  Watched(MpiWatchdog* dog, const char* op, const std::string& group, int rank, int size)
      : dog_(dog) {
    if (dog_) dog_->begin(op, &group, rank, size);
  }
  ~Watched() {
    if (dog_) dog_->end();
  }
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;

 private:
  MpiWatchdog* dog_;
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
    case DType::f8e4m3:
    case DType::f8e5m2:
      return MPI_UINT8_T;  // moved, never reduced
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
  MpiComm(MPI_Comm comm, std::string name, bool watched = true)
      : comm_(comm), name_(std::move(name)), watched_(watched) {
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

  // In order: the blocking MPI call (MPI's own algorithms for each, which the bit-identity
  // tests pin down). Beside: its non-blocking twin, completed by wait or wait_all.
  Ticket start(const CommOp& op, Lane lane) override {
    check_comm_op(op, size_);
    const bool now = lane == Lane::in_order;
    const size_t first = reqs_.size();
    std::optional<Watched> watched;
    if (now && op.kind != CommOp::exchange) watched.emplace(dog(), op.name(), name_, rank_, size_);
    const Tensor& b = op.out;
    // The buffer's elements and type (an all-gather's: its input's).
    const bool buffer = op.kind != CommOp::exchange && op.kind != CommOp::barrier;
    const Tensor& unit = op.kind == CommOp::all_gather ? op.in : b;
    const int n = buffer ? count_of(unit) : 0;
    const MPI_Datatype t = mpi_type(unit.dtype);
    const MPI_Op o = mpi_op(op.op, b.dtype);
    // The blocking call now, or its non-blocking twin with a new request; each checked on its
    // own, so that a failure names the MPI function.
#define TR_MPI_CALL(blocking, non_blocking, ...)              \
  do {                                                        \
    if (now)                                                  \
      MPI_CHECK(blocking(__VA_ARGS__), name_);                \
    else                                                      \
      MPI_CHECK(non_blocking(__VA_ARGS__, request()), name_); \
  } while (0)
    switch (op.kind) {
      case CommOp::all_reduce:
        TR_MPI_CALL(MPI_Allreduce, MPI_Iallreduce, MPI_IN_PLACE, b.data, n, t, o, comm_);
        break;
      case CommOp::all_gather: {
        const void* in = gathers_in_place(op, rank_) ? MPI_IN_PLACE : op.in.data;
        TR_MPI_CALL(MPI_Allgather, MPI_Iallgather, in, n, t, b.data, n, t, comm_);
        break;
      }
      case CommOp::reduce_scatter:
        TR_MPI_CALL(MPI_Reduce_scatter_block, MPI_Ireduce_scatter_block, op.in.data, b.data, n, t,
                    o, comm_);
        break;
      case CommOp::broadcast:
        TR_MPI_CALL(MPI_Bcast, MPI_Ibcast, b.data, n, t, op.peer, comm_);
        break;
      case CommOp::send:
        TR_MPI_CALL(MPI_Send, MPI_Isend, b.data, n, t, op.peer, kTag, comm_);
        break;
      case CommOp::recv:
        if (now)
          MPI_CHECK(MPI_Recv(b.data, n, t, op.peer, kTag, comm_, MPI_STATUS_IGNORE), name_);
        else
          MPI_CHECK(MPI_Irecv(b.data, n, t, op.peer, kTag, comm_, request()), name_);
        break;
      case CommOp::exchange:  // posted together either way; in order waits for them here
        for (const P2P& p : op.p2p) {
          const int k = count_of(p.buf);
          const MPI_Datatype pt = mpi_type(p.buf.dtype);
          if (p.kind == P2P::send)
            MPI_CHECK(MPI_Isend(p.buf.data, k, pt, p.peer, kTag, comm_, request()), name_);
          else
            MPI_CHECK(MPI_Irecv(p.buf.data, k, pt, p.peer, kTag, comm_, request()), name_);
        }
        if (now) {
          Watched w(dog(), "exchange", name_, rank_, size_);
          MPI_CHECK(MPI_Waitall(static_cast<int>(reqs_.size() - first), reqs_.data() + first,
                                MPI_STATUSES_IGNORE),
                    name_);
          reqs_.resize(first);
        }
        break;
      case CommOp::barrier:
        if (now)
          MPI_CHECK(MPI_Barrier(comm_), name_);
        else
          MPI_CHECK(MPI_Ibarrier(comm_, request()), name_);
        break;
    }
#undef TR_MPI_CALL
    if (now) return kDone;
    progress(first);
    tickets_.push_back({first, reqs_.size() - first});
    return ticket_base_ + static_cast<Ticket>(tickets_.size()) - 1;
  }

  void wait(Ticket ticket) override {
    const Ticket k = ticket - ticket_base_;
    if (k < 0 || k >= static_cast<Ticket>(tickets_.size())) return;  // done, or by wait_all
    const Started& t = tickets_[static_cast<size_t>(k)];
    Watched w(dog(), "wait", name_, rank_, size_);
    MPI_CHECK(MPI_Waitall(static_cast<int>(t.count), reqs_.data() + t.first, MPI_STATUSES_IGNORE),
              name_);
  }
  void wait_all() override {
    Watched w(dog(), "wait_all", name_, rank_, size_);
    MPI_CHECK(MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE),
              name_);
    reqs_.clear();
    ticket_base_ += static_cast<Ticket>(tickets_.size());
    tickets_.clear();
  }

 private:
  MpiWatchdog* dog() const {
    return watched_ ? g_watchdog : nullptr;
  }
  struct Started {
    size_t first, count;  // its requests in reqs_
  };

  // A new request slot for a non-blocking call (used at once: the next push may move it).
  MPI_Request* request() {
    reqs_.push_back(MPI_REQUEST_NULL);
    return &reqs_.back();
  }
  // Open MPI progresses non-blocking operations inside MPI calls: a newly started one gives the
  // earlier ones (requests before `first`) a turn.
  void progress(size_t first) {
    int done = 0;
    if (first > 0)
      MPI_CHECK(MPI_Testall(static_cast<int>(first), reqs_.data(), &done, MPI_STATUSES_IGNORE),
                name_);
  }

  static constexpr int kTag = 7;
  MPI_Comm comm_;
  std::string name_;
  std::vector<MPI_Request> reqs_;  // every started operation's, completed ones MPI_REQUEST_NULL
  std::vector<Started> tickets_;   // ticket ticket_base_ + k is tickets_[k]
  Ticket ticket_base_ = 0;
  int rank_ = 0, size_ = 1;
  bool watched_;
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

std::unique_ptr<Comm> split_mpi_comm(Comm& parent, int color, int key, const std::string& name,
                                     bool watched) {
  auto* p = dynamic_cast<MpiComm*>(&parent);
  TR_ASSERT(p != nullptr, "split_mpi_comm needs an MPI communicator");
  MPI_Comm child;
  MPI_CHECK(MPI_Comm_split(p->handle(), color, key, &child), parent.name());
  return std::make_unique<MpiComm>(child, name, watched);
}

}  // namespace tr
