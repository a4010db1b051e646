#include "parallel/comm.h"

#include <cstring>

namespace tr {
namespace {

class SelfComm final : public Comm {
 public:
  explicit SelfComm(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  void all_reduce(Tensor, ReduceOp) override {}
  void all_gather(Tensor out, Tensor in) override { copy(out, in); }
  void reduce_scatter(Tensor out, Tensor in, ReduceOp) override { copy(out, in); }
  void broadcast(Tensor, int root) override { TR_ASSERT(root == 0, "broadcast root out of range"); }
  void send(Tensor, int) override { TR_ASSERT(false, "send within a group of one rank"); }
  void recv(Tensor, int) override { TR_ASSERT(false, "recv within a group of one rank"); }
  void exchange(std::span<const P2P> ops) override {
    TR_ASSERT(ops.empty(), "exchange within a group of one rank");
  }
  void barrier() override {}

 private:
  static void copy(Tensor out, Tensor in) {
    TR_ASSERT(out.nbytes() == in.nbytes(), "self collective: sizes differ");
    if (out.data != in.data) std::memcpy(out.data, in.data, in.nbytes());
  }
  std::string name_;
};

}  // namespace

std::unique_ptr<Comm> make_self_comm(const std::string& name) {
  return std::make_unique<SelfComm>(name);
}

}  // namespace tr
