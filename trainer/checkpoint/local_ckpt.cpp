#include "trainer/checkpoint/local_ckpt.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/exit_codes.h"
#include "core/fs_io.h"
#include "core/hash.h"
#include "core/switches.h"
#include "kernels/ops.h"
#include "parallel/mpi_comm.h"
#include "trainer/checkpoint/local_part.h"
#include "trainer/step/agree.h"

namespace tr {
namespace {

namespace stdfs = std::filesystem;
using namespace local_part;

// Room for a part's state as JSON (its loss window is the longest field).
constexpr size_t kStateRoom = size_t{1} << 16;

}  // namespace

std::string node_name() {
  std::string name = setting(Setting::node_name);
  if (name.empty()) name = fs::host_name();
  std::replace(name.begin(), name.end(), '/', '_');
  return name;
}

LocalCheckpoints::LocalCheckpoints(Session& s) : s_(s) {
  std::error_code ec;
  const stdfs::path root = stdfs::absolute(s.cfg.checkpoint.dir, ec).lexically_normal();
  // One directory per checkpoint.dir (its name and a hash of its absolute path), and in it one
  // per node, so that nodes sharing a file system (and tests running several "nodes" on one
  // machine) keep their parts apart.
  node_ = node_name();
  dir_ = fs::join(
      fs::join(s.cfg.checkpoint.local_dir,
               absl::StrFormat("%s-%016x", root.filename().string(), fnv1a64(root.string()))),
      node_);
  if (!enabled()) return;
  // The nodes: every rank's node name, all-gathered; nodes numbered by their first rank.
  Comm& world = *s.groups.world;
  constexpr int kName = 64;
  std::vector<char> names(static_cast<size_t>(kName) * world.size(), '\0');
  std::vector<char> mine(kName, '\0');
  std::memcpy(mine.data(), node_.data(), std::min<size_t>(node_.size(), kName - 1));
  world.all_gather(Tensor(names.data(), DType::i64, Device::cpu, {kName / 8 * world.size()}),
                   Tensor(mine.data(), DType::i64, Device::cpu, {kName / 8}));
  std::vector<std::string> node_of;
  std::vector<std::vector<int>> ranks_of;  // each node's ranks, in rank order
  std::vector<std::string> nodes;
  for (int r = 0; r < world.size(); ++r) {
    node_of.emplace_back(names.data() + static_cast<size_t>(r) * kName);
    const auto at = std::find(nodes.begin(), nodes.end(), node_of.back());
    if (at == nodes.end()) {
      nodes.push_back(node_of.back());
      ranks_of.push_back({r});
    } else {
      ranks_of[static_cast<size_t>(at - nodes.begin())].push_back(r);
    }
  }
  const std::string& here = node_of[static_cast<size_t>(s.topo().rank)];
  node_leader_ = std::find(node_of.begin(), node_of.end(), here) - node_of.begin() ==
                 static_cast<std::ptrdiff_t>(s.topo().rank);
  // Rank r's replica holders: on each of the next checkpoint.local_replicas nodes in the ring,
  // the rank at r's place there (modulo that node's ranks). One node: no replicas.
  holders_.assign(static_cast<size_t>(world.size()), {});
  replicas_ = s.cfg.checkpoint.local_replicas_on(static_cast<int>(nodes.size()));
  if (s.logger() && replicas_ < s.cfg.checkpoint.local_replicas)
    std::printf(
        "note: checkpoint.local_replicas=%lld, but the other nodes of this job are %d: keeping "
        "%d cop%s of each part on them\n",
        static_cast<long long>(s.cfg.checkpoint.local_replicas), static_cast<int>(nodes.size()) - 1,
        replicas_, replicas_ == 1 ? "y" : "ies");
  for (size_t k = 0; k < nodes.size(); ++k)
    for (int j = 1; j <= replicas_; ++j) {
      const std::vector<int>& next = ranks_of[(k + static_cast<size_t>(j)) % nodes.size()];
      for (size_t i = 0; i < ranks_of[k].size(); ++i)
        holders_[static_cast<size_t>(ranks_of[k][i])].push_back(next[i % next.size()]);
    }
  // The writer threads exchange the replicas over a communicator of their own (unwatched: the
  // watchdog follows the main thread), beside the training thread's collectives.
  if (replicas_ > 0)
    replica_comm_ = split_mpi_comm(*make_mpi_world(), 0, s.topo().rank, "local checkpoint",
                                   /*watched=*/false);
}

std::vector<int> LocalCheckpoints::sources() const {
  std::vector<int> out;
  for (size_t r = 0; r < holders_.size(); ++r)
    if (std::find(holders_[r].begin(), holders_[r].end(), s_.topo().rank) != holders_[r].end())
      out.push_back(static_cast<int>(r));
  return out;
}

std::string LocalCheckpoints::path_of(int64_t step, int rank, bool replica) const {
  return fs::join(fs::join(dir_, absl::StrFormat("step_%08d", step)), file_name(rank, replica));
}

std::string LocalCheckpoints::copy_path(int64_t step, int rank) const {
  std::error_code ec;
  for (bool replica : {false, true})
    if (const std::string p = path_of(step, rank, replica); stdfs::exists(p, ec)) return p;
  return "";
}

std::vector<int64_t> LocalCheckpoints::step_dirs() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(dir_, ec)) {
    long long step = -1;
    if (std::sscanf(e.path().filename().string().c_str(), "step_%lld", &step) == 1 && step >= 0)
      steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::string LocalCheckpoints::part_path(int64_t step) const {
  return path_of(step, s_.topo().rank, false);
}

LocalCheckpoints::~LocalCheckpoints() {
  if (writer_.joinable()) await_writer();
  if (in_flight_) remove_part(part_path(step_) + ".tmp");  // never committed
}

void LocalCheckpoints::prepare() {
  if (!enabled() || buffer_.bytes() > 0) return;
  const size_t f32 = sizeof(float);
  reserve(sizeof(Header) + kStateRoom +
          f32 * static_cast<size_t>(s_.opt->masters().numel() + 2 * s_.opt->state_elems()));
}

Header LocalCheckpoints::own_header() const {
  return layout_header(s_.cfg, s_.layout, s_.params->layout().capacity, *s_.opt);
}

void LocalCheckpoints::reserve(size_t bytes) {
  // Page-locked on a GPU, so that the copy from the device runs at the bus's speed; touched
  // here, so that a save does not fault its pages in.
  buffer_ = s_.ctx.device == Device::cuda ? Buffer::pinned(bytes) : Buffer(bytes, Device::cpu);
  std::memset(buffer_.data(), 0, bytes);
}

void LocalCheckpoints::save() {
  const auto t0 = Clock::now();
  if (in_flight_) settle(true);
  const int64_t step = s_.state.step;
  // Whole masters that are the compute weights may still be receiving ZeRO-1's all-gather.
  if (!s_.opt->masters_sharded()) s_.opt->finish_weights();
  const std::string state = state_json(s_.state).dump();
  Header h = own_header();
  h.step = step;
  h.run_id = s_.state.run_id;
  h.state_bytes = static_cast<int64_t>(state.size());
  prepare();
  const size_t need =
      sizeof(Header) + state.size() + sizeof(float) * static_cast<size_t>(h.masters + 2 * h.states);
  if (buffer_.bytes() < need) reserve(need);  // a longer state than planned for
  std::memcpy(data(), &h, sizeof(Header));
  std::memcpy(data() + sizeof(Header), state.data(), state.size());
  used_ = sizeof(Header) + state.size();
  put_f32(buffer_, &used_, s_.opt->masters());
  put_f32(buffer_, &used_, s_.opt->exp_avg());
  put_f32(buffer_, &used_, s_.opt->exp_avg_sq());
  step_ = step;
  written_ = false;
  in_flight_ = true;
  started_ = unix_time();
  writer_ = std::thread([this, path = part_path(step)] {
    Header head{};
    std::memcpy(&head, data(), sizeof(Header));
    head.crc = fs::crc32_of(std::string_view(data() + sizeof(Header), used_ - sizeof(Header)));
    std::memcpy(data(), &head, sizeof(Header));
    absl::Status st = fs::make_dirs(stdfs::path(path).parent_path().string());
    if (st.ok()) st = fs::write_file_durable(path + ".tmp", std::string_view(data(), used_));
    if (replicas_ > 0) {  // every writer takes part, whatever its own write did
      const absl::Status sent = write_replicas();
      if (st.ok()) st = sent;
    }
    write_status_ = st;
    written_ = true;
  });
  stall_s_ = seconds_since(t0);
}

void LocalCheckpoints::settle(bool wait) {
  if (!in_flight_) return;
  const auto t0 = Clock::now();
  if (wait) await_writer();
  // Every rank's thread done? (One 4-byte all-reduce per step boundary while in flight.)
  if (!all_ok(*s_.groups.world, written_.load())) {
    stall_s_ += seconds_since(t0);
    return;
  }
  if (writer_.joinable()) writer_.join();
  commit(write_status_.ok());
  in_flight_ = false;
}

void LocalCheckpoints::await_writer() {
  // A writer exchanging replicas waits for the other ranks' writers: a rank that hangs would
  // hold this one here, out of the MPI watchdog's sight, so the wait has a limit.
  const double limit = std::max(s_.cfg.checkpoint.save_timeout_s, s_.cfg.parallel.timeout_s);
  const auto t0 = Clock::now();
  while (!written_.load()) {
    if (seconds_since(t0) > limit)
      end_job(kExitCommTimeout,
              absl::StrFormat("rank %d: the local checkpoint of step %d is unfinished after %.0f "
                              "s (checkpoint.save_timeout_s): a rank of the job is hung, stopped "
                              "or dead; ending the job with exit code %d",
                              s_.topo().rank, step_, limit, kExitCommTimeout));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  writer_.join();
}

absl::Status LocalCheckpoints::write_replicas() {
  Comm& world = *replica_comm_;
  const int me = s_.topo().rank;
  // Every part's size, so that each holder knows what it receives.
  std::vector<int64_t> sizes(static_cast<size_t>(world.size()));
  int64_t mine = static_cast<int64_t>(used_);
  world.all_gather(Tensor(sizes.data(), DType::i64, Device::cpu, {world.size()}),
                   Tensor(&mine, DType::i64, Device::cpu, {1}));
  std::vector<Transfer> sends, recvs;
  for (int h : holders_[static_cast<size_t>(me)]) sends.push_back({h, data(), mine});
  std::vector<std::pair<int, std::vector<char>>> got;
  for (int r : sources())
    got.emplace_back(r, std::vector<char>(static_cast<size_t>((sizes[r] + 7) / 8 * 8)));
  for (auto& [r, bytes] : got) recvs.push_back({r, bytes.data(), sizes[r]});
  exchange_bytes(world, sends, recvs);
  absl::Status st;
  for (const auto& [r, bytes] : got) {
    const std::string path = path_of(step_, r, true) + ".tmp";
    if (st.ok()) st = fs::make_dirs(stdfs::path(path).parent_path().string());
    if (st.ok())
      st = fs::write_file_durable(path,
                                  std::string_view(bytes.data(), static_cast<size_t>(sizes[r])));
  }
  return st;
}

void LocalCheckpoints::commit(bool written) {
  const auto t0 = Clock::now();
  const Topology& t = s_.topo();
  const std::string path = part_path(step_);
  Comm& world = *s_.groups.world;
  // The part counts only once every rank has its own part and every holder its replicas (the
  // writers sent them): then each renames its own files.
  absl::Status st = write_status_;
  const std::vector<int> sources = this->sources();
  const bool replicated = all_ok(world, written);
  if (replicated) {
    st = fs::rename_path(path + ".tmp", path);
    for (int r : sources)
      if (st.ok()) st = fs::rename_path(path_of(step_, r, true) + ".tmp", path_of(step_, r, true));
  }
  if (!all_ok(world, replicated && st.ok())) {
    if (!st.ok())
      std::fprintf(stderr,
                   "warning: rank %d: local checkpoint of step %lld not written (%s); the run "
                   "goes on, its persistent checkpoints stand\n",
                   t.rank, static_cast<long long>(step_), std::string(st.message()).c_str());
    else if (t.rank == 0)
      std::fprintf(stderr,
                   "warning: local checkpoint of step %lld not written on every rank; the run "
                   "goes on, its persistent checkpoints stand\n",
                   static_cast<long long>(step_));
    remove_part(path + ".tmp");
    for (int r : sources) remove_part(path_of(step_, r, true) + ".tmp");
    return;
  }
  stall_s_ += seconds_since(t0);
  if (s_.logger())
    s_.log.note(absl::StrFormat(
        "\"step\": %d, \"event\": \"local_checkpoint\", \"seconds\": %.6f, \"stall_s\": %.6f, "
        "\"bytes\": %d",
        step_, unix_time() - started_, stall_s_, static_cast<int64_t>(used_)));
  // Retention: this rank's newest local_keep parts and replicas, and no unfinished one (a
  // killed writer's).
  for (int r : sources) {
    const std::vector<int64_t> steps = steps_with(dir_, file_name(r, true));
    for (size_t i = static_cast<size_t>(s_.cfg.checkpoint.local_keep); i < steps.size(); ++i)
      remove_part(path_of(steps[i], r, true));
  }
  const std::vector<int64_t> steps = own_steps(dir_, t.rank);
  for (size_t i = static_cast<size_t>(s_.cfg.checkpoint.local_keep); i < steps.size(); ++i)
    remove_part(part_path(steps[i]));
  for (int64_t old : own_steps(dir_, t.rank, true)) remove_part(part_path(old) + ".tmp");
  // The node's first rank also removes older steps' directories whole: copies that ranks of an
  // earlier node list left here (a requeue onto other nodes) belong to no rank's retention.
  if (node_leader_)
    for (int64_t old : step_dirs())
      if (old < step_ - static_cast<int64_t>(s_.cfg.checkpoint.local_keep) *
                            s_.cfg.checkpoint.local_interval) {
        std::error_code ec;
        stdfs::remove_all(stdfs::path(path_of(old, 0, false)).parent_path(), ec);
      }
}

void LocalCheckpoints::discard_own() {
  std::vector<int> mine = sources();
  mine.push_back(s_.topo().rank);
  for (int r : mine) {
    const bool replica = r != s_.topo().rank;
    const std::string name = file_name(r, replica);
    for (int64_t step : steps_with(dir_, name)) remove_part(path_of(step, r, replica));
    for (int64_t step : steps_with(dir_, name + ".tmp"))
      remove_part(path_of(step, r, replica) + ".tmp");
  }
}

}  // namespace tr
