#include "parallel/comm.h"

#include <cstring>
#include <utility>

#include "kernels/op_log.h"

namespace tr {

const char* CommOp::name(Kind k) {
  switch (k) {
    case all_reduce:
      return "all_reduce";
    case all_gather:
      return "all_gather";
    case reduce_scatter:
      return "reduce_scatter";
    case broadcast:
      return "broadcast";
    case send:
      return "send";
    case recv:
      return "recv";
    case exchange:
      return "exchange";
    case barrier:
      return "barrier";
  }
  return "?";
}

void check_comm_op(const CommOp& op, int size) {
  if (op.kind == CommOp::all_reduce || op.kind == CommOp::reduce_scatter)
    TR_ASSERT(!is_fp8(op.out.dtype),
              std::string(op.name()) + " over FP8 codes: reduce the values they encode");
  if (op.kind == CommOp::all_gather)
    TR_ASSERT(op.out.numel() == op.in.numel() * size && op.out.dtype == op.in.dtype,
              "all_gather: out " + op.out.shape_str() + " must be " + std::to_string(size) +
                  " x in " + op.in.shape_str());
  if (op.kind == CommOp::reduce_scatter)
    TR_ASSERT(op.in.numel() == op.out.numel() * size && op.out.dtype == op.in.dtype,
              "reduce_scatter: in " + op.in.shape_str() + " must be " + std::to_string(size) +
                  " x out " + op.out.shape_str());
}

std::string collective_kernel(const std::string& group, CommOp::Kind kind, Lane lane) {
  return group + " " + CommOp::name(kind) + (lane == Lane::beside ? " beside" : "");
}

OpKey collective_key(const std::string& group, const CommOp& op, Lane lane) {
  const auto rows_by_rest = [](const Tensor& t) {
    const int64_t rows = t.ndim > 0 ? t.shape[0] : 1;
    return std::pair{rows, rows > 0 ? t.numel() / rows : 0};
  };
  std::pair<int64_t, int64_t> shape{0, 1};
  switch (op.kind) {
    case CommOp::reduce_scatter:
      shape = rows_by_rest(op.in);
      break;
    case CommOp::exchange:
      for (const P2P& p : op.p2p)
        if (p.kind == P2P::send) shape.first += p.buf.numel();
      break;
    case CommOp::barrier:
      break;
    default:
      shape = rows_by_rest(op.out);
  }
  return {collective_kernel(group, op.kind, lane), shape.first, shape.second};
}

bool gathers_in_place(const CommOp& op, int rank) {
  return op.in.data == static_cast<char*>(op.out.data) + rank * op.in.nbytes();
}

namespace {

// Every operation of a group of one completes when started.
class SelfComm final : public Comm {
 public:
  explicit SelfComm(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

  Ticket start(const CommOp& op, Lane) override {
    check_comm_op(op, 1);
    switch (op.kind) {
      case CommOp::all_gather:
      case CommOp::reduce_scatter:
        if (op.out.data != op.in.data) std::memcpy(op.out.data, op.in.data, op.in.nbytes());
        break;
      case CommOp::broadcast:
        TR_ASSERT(op.peer == 0, "broadcast root out of range");
        break;
      case CommOp::send:
      case CommOp::recv:
        TR_ASSERT(false, std::string(op.name()) + " within a group of one rank");
        break;
      case CommOp::exchange:
        TR_ASSERT(op.p2p.empty(), "exchange within a group of one rank");
        break;
      case CommOp::all_reduce:
      case CommOp::barrier:
        break;
    }
    return kDone;
  }
  void wait(Ticket) override {}
  void wait_all() override {}

 private:
  std::string name_;
};

// Forwards every operation to the group it wraps, noting each on the log.
class LoggedComm final : public Comm {
 public:
  LoggedComm(Comm& inner, OpLog& log) : inner_(inner), log_(log) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& name() const override { return inner_.name(); }
  Ticket start(const CommOp& op, Lane lane) override {
    log_.note_collective(collective_key(inner_.name(), op, lane));
    return inner_.start(op, lane);
  }
  void wait(Ticket ticket) override { inner_.wait(ticket); }
  void wait_all() override { inner_.wait_all(); }

 private:
  Comm& inner_;
  OpLog& log_;
};

}  // namespace

std::unique_ptr<Comm> make_self_comm(const std::string& name) {
  return std::make_unique<SelfComm>(name);
}

std::unique_ptr<Comm> logged_comm(Comm& inner, OpLog& log) {
  return std::make_unique<LoggedComm>(inner, log);
}

}  // namespace tr
