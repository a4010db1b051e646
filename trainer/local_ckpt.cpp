#include "trainer/local_ckpt.h"

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
#include "trainer/agree.h"

namespace tr {
namespace {

namespace stdfs = std::filesystem;

constexpr char kMagic[8] = {'T', 'R', 'L', 'O', 'C', 'A', 'L', '2'};

// A part's header, then its payload: the state as JSON (state_bytes), the masters, Adam's m and
// v (f32). `crc` covers the payload.
struct Header {
  char magic[8];
  int64_t step, rank, world, tp, pp, dp;
  int64_t capacity, masters, states;  // elements: the flat buffer, this rank's masters and moments
  uint64_t run_id;
  uint64_t layout;  // layout_key() of the run that wrote it: the same on every rank
  int64_t state_bytes;
  uint32_t crc, pad;
};

// What every rank's part depends on besides its rank, the same on every rank of a run: the grid,
// ZeRO-1 and whether the masters are sharded, the model's shape and the stages' layers. A part
// whose key differs from this run's is another layout's, whichever rank wrote it.
uint64_t layout_key(const Session& s) {
  const Topology& t = s.topo();
  const ModelConfig& m = s.cfg.model;
  std::string key = absl::StrCat(
      t.world, " ", t.tp, " ", t.pp, " ", t.dp, " ", s.facts.zero1, " ", s.opt->masters_sharded(),
      " ", m.hidden_size, " ", m.intermediate_size, " ", m.num_layers, " ", m.num_heads, " ",
      m.num_kv_heads, " ", m.head_dim, " ", m.vocab_size, " ", m.tie_embeddings);
  for (int64_t l : s.cfg.parallel.pipeline_layers) absl::StrAppend(&key, " ", l);
  return fnv1a64(key);
}

// What a part must match to be loaded by this run (the layout, not the step or the run).
bool same_layout(const Header& h, const Session& s) {
  const Topology& t = s.topo();
  return std::memcmp(h.magic, kMagic, 8) == 0 && h.layout == layout_key(s) && h.rank == t.rank &&
         h.world == t.world && h.tp == t.tp && h.pp == t.pp && h.dp == t.dp &&
         h.capacity == s.params->layout().capacity && h.masters == s.opt->masters().numel() &&
         h.states == s.opt->state_elems();
}

nlohmann::json state_json(const ckpt::TrainState& st) {
  return {{"step", st.step},
          {"consumed_samples", st.consumed_samples},
          {"rng_state", st.rng_state},
          {"lr", st.lr},
          {"tokens_seen", st.tokens_seen},
          {"loss_window", st.loss_window},
          {"skipped_in_a_row", st.skipped_in_a_row},
          {"skipped_total", st.skipped_total},
          {"run_id", st.run_id}};
}

ckpt::TrainState state_of(const nlohmann::json& j) {
  ckpt::TrainState st;
  st.step = j.at("step");
  st.consumed_samples = j.at("consumed_samples");
  st.rng_state = j.at("rng_state");
  st.lr = j.at("lr");
  st.tokens_seen = j.at("tokens_seen");
  st.loss_window = j.at("loss_window").get<std::vector<double>>();
  st.skipped_in_a_row = j.at("skipped_in_a_row");
  st.skipped_total = j.at("skipped_total");
  st.run_id = j.at("run_id");
  return st;
}

// Room for a part's state as JSON (its loss window is the longest field).
constexpr size_t kStateRoom = size_t{1} << 16;

// An f32 tensor's bytes copied to `out` at `*at`, which advances.
void put_f32(std::vector<char>& out, size_t* at, Tensor t) {
  TR_ASSERT(t.dtype == DType::f32, "local checkpoints hold f32 masters and moments");
  TR_ASSERT(*at + t.nbytes() <= out.size(), "the local checkpoint's buffer is too small");
  copy_tensor(Tensor(out.data() + *at, DType::f32, Device::cpu, {t.numel()}), t);
  *at += t.nbytes();
}

// The header of the part at `path`, if it reads as one.
bool read_header(const std::string& path, Header* h) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  const bool ok = std::fread(h, sizeof(Header), 1, f) == 1;
  std::fclose(f);
  return ok;
}

// held()'s list: the newest kListed steps, each as [step, run id, bit set over the ranks].
constexpr int kListed = 8;
int held_entry(int ranks) {
  return 2 + (ranks + 63) / 64;
}

// A part's file name: rank R's own part, or the replica of rank R's part another rank holds.
std::string file_name(int rank, bool replica) {
  return absl::StrFormat("%s_%05d.bin", replica ? "replica" : "rank", rank);
}

// Steps whose step_* directory in `dir` holds `name`, newest first.
std::vector<int64_t> steps_with(const std::string& dir, const std::string& name) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(dir, ec)) {
    long long step = -1;
    if (std::sscanf(e.path().filename().string().c_str(), "step_%lld", &step) != 1 || step < 0)
      continue;
    if (stdfs::exists(e.path() / name, ec)) steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// Steps of this rank's own parts in `dir` (with `unfinished`, its unfinished .tmp ones).
std::vector<int64_t> own_steps(const std::string& dir, int rank, bool unfinished = false) {
  return steps_with(dir, file_name(rank, false) + (unfinished ? ".tmp" : ""));
}

// Point-to-point byte transfers, in rounds of at most 1 GiB per transfer (MPI counts are ints):
// each transfer's `data` holds at least its size rounded up to 8 bytes. Sender and receiver of
// a transfer agree on its size; every round's sends and receives are posted together.
struct Transfer {
  int peer;
  char* data;
  int64_t bytes;
};
void exchange_bytes(Comm& c, const std::vector<Transfer>& sends,
                    const std::vector<Transfer>& recvs) {
  constexpr int64_t kChunk = int64_t{1} << 27;  // i64 elements: 1 GiB
  for (int64_t round = 0;; ++round) {
    std::vector<P2P> ops;
    for (const auto* list : {&sends, &recvs})
      for (const Transfer& t : *list) {
        const int64_t words = (t.bytes + 7) / 8, at = round * kChunk;
        if (at >= words) continue;
        ops.push_back(
            {list == &sends ? P2P::send : P2P::recv,
             Tensor(t.data + at * 8, DType::i64, Device::cpu, {std::min(kChunk, words - at)}),
             t.peer});
      }
    if (ops.empty()) return;
    c.exchange(ops);
  }
}

// Removes `path` and then its directory once that is empty.
void remove_part(const std::string& path) {
  std::error_code ec;
  stdfs::remove(path, ec);
  stdfs::remove(stdfs::path(path).parent_path(), ec);  // fails while other ranks' parts are there
}

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
  if (!enabled() || !buffer_.empty()) return;
  const size_t f32 = sizeof(float);
  buffer_.resize(sizeof(Header) + kStateRoom +
                 f32 * static_cast<size_t>(s_.opt->masters().numel() + 2 * s_.opt->state_elems()));
}

void LocalCheckpoints::save() {
  const auto t0 = Clock::now();
  if (in_flight_) settle(true);
  const int64_t step = s_.state.step;
  // Whole masters that are the compute weights may still be receiving ZeRO-1's all-gather.
  if (!s_.opt->masters_sharded()) s_.opt->reducer().finish_weights();
  const std::string state = state_json(s_.state).dump();
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  const Topology& t = s_.topo();
  h.step = step, h.rank = t.rank, h.world = t.world, h.tp = t.tp, h.pp = t.pp, h.dp = t.dp;
  h.capacity = s_.params->layout().capacity;
  h.masters = s_.opt->masters().numel();
  h.states = s_.opt->state_elems();
  h.run_id = s_.state.run_id;
  h.layout = layout_key(s_);
  h.state_bytes = static_cast<int64_t>(state.size());
  prepare();
  const size_t need =
      sizeof(Header) + state.size() + sizeof(float) * static_cast<size_t>(h.masters + 2 * h.states);
  if (buffer_.size() < need) buffer_.resize(need);  // a longer state than planned for
  std::memcpy(buffer_.data(), &h, sizeof(Header));
  std::memcpy(buffer_.data() + sizeof(Header), state.data(), state.size());
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
    std::memcpy(&head, buffer_.data(), sizeof(Header));
    head.crc =
        fs::crc32_of(std::string_view(buffer_.data() + sizeof(Header), used_ - sizeof(Header)));
    std::memcpy(buffer_.data(), &head, sizeof(Header));
    absl::Status st = fs::make_dirs(stdfs::path(path).parent_path().string());
    if (st.ok())
      st = fs::write_file_durable(path + ".tmp", std::string_view(buffer_.data(), used_));
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
  for (int h : holders_[static_cast<size_t>(me)]) sends.push_back({h, buffer_.data(), mine});
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

std::vector<int64_t> LocalCheckpoints::held(int64_t after, uint64_t run_id,
                                            int64_t* other_layout) const {
  const int n = s_.groups.world->size(), me = s_.topo().rank;
  const int entry = held_entry(n);
  std::vector<int64_t> mine(static_cast<size_t>(kListed * entry), 0);
  for (int i = 0; i < kListed; ++i) mine[static_cast<size_t>(i * entry)] = -1;
  const std::vector<int64_t> steps = step_dirs();
  int listed = 0;
  const uint64_t layout = layout_key(s_);
  for (auto it = steps.begin(); it != steps.end() && listed < kListed; ++it) {
    const int64_t step = *it;
    if (step <= after) break;
    int64_t* e = &mine[static_cast<size_t>(listed * entry)];
    uint64_t id = 0;
    bool any = false;
    for (int r = 0; r < n; ++r) {
      const std::string path = copy_path(step, r);
      Header h{};
      if (path.empty() || !read_header(path, &h) || h.step != step) continue;
      if (r == me && (run_id == 0 || h.run_id == run_id) && (h.world != n || !same_layout(h, s_))) {
        *other_layout = std::max(*other_layout, step);  // this run's, of another layout
        continue;
      }
      if (std::memcmp(h.magic, kMagic, 8) != 0 || h.layout != layout || h.rank != r ||
          h.world != n || (run_id != 0 && h.run_id != run_id) || (any && h.run_id != id))
        continue;
      id = h.run_id;
      any = true;
      e[2 + r / 64] |= static_cast<int64_t>(uint64_t{1} << (r % 64));
    }
    if (!any) continue;
    e[0] = step;
    e[1] = static_cast<int64_t>(id);
    ++listed;
  }
  return mine;
}

int64_t LocalCheckpoints::newest(int64_t after, uint64_t run_id) {
  Comm& world = *s_.groups.world;
  const int n = world.size();
  const int entry = held_entry(n);
  // Every rank picks the same step: the newest one whose every part someone holds, all of one
  // run (and of `run_id` when given).
  int64_t other_layout = -1;  // the newest own part of another layout
  std::vector<int64_t> mine = held(after, run_id, &other_layout);
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(n));
  world.all_gather(
      Tensor(all.data(), DType::i64, Device::cpu, {static_cast<int64_t>(all.size())}),
      Tensor(mine.data(), DType::i64, Device::cpu, {static_cast<int64_t>(mine.size())}));
  std::set<int64_t> candidates;
  for (size_t i = 0; i < all.size(); i += static_cast<size_t>(entry))
    if (all[i] >= 0) candidates.insert(all[i]);
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    // Who provides each part of this step: the rank itself where it can, else the lowest holder.
    std::vector<int> provider(static_cast<size_t>(n), -1);
    bool one_run = true;
    int64_t id = 0;
    for (int p = 0; p < n; ++p)
      for (int i = 0; i < kListed; ++i) {
        const int64_t* e = &all[static_cast<size_t>((p * kListed + i) * entry)];
        if (e[0] != *it) continue;
        if (id == 0) id = e[1];
        one_run = one_run && e[1] == id;
        for (int r = 0; r < n; ++r)
          if ((static_cast<uint64_t>(e[2 + r / 64]) >> (r % 64)) & 1)
            if (provider[static_cast<size_t>(r)] < 0 || p == r)
              provider[static_cast<size_t>(r)] = p;
      }
    if (!one_run || std::count(provider.begin(), provider.end(), -1) > 0) {
      if (why_not_.empty()) {  // the newest local step's reason, for the caller's line
        std::vector<std::string> lost;
        for (int r = 0; r < n; ++r)
          if (provider[static_cast<size_t>(r)] < 0) lost.push_back(std::to_string(r));
        why_not_ =
            !one_run
                ? absl::StrCat("the local checkpoint of step ", *it, " holds parts of two runs")
                : absl::StrCat("the local checkpoint of step ", *it,
                               " has no copy left of the part of rank",
                               lost.size() == 1 ? " " : "s ", absl::StrJoin(lost, ", "),
                               replicas_ == 0   ? " (its node lost it; "
                                                  "checkpoint.local_replicas=0 keeps no "
                                                  "other copy)"
                               : replicas_ == 1 ? " (its node and its replica's holder lost both)"
                                                : " (its node and its replicas' holders lost "
                                                  "them all)");
      }
      continue;
    }
    providers_ = provider;
    return *it;
  }
  if (why_not_.empty() && other_layout >= 0)
    why_not_ = absl::StrCat("the local checkpoint of step ", other_layout,
                            " was written by another layout (world, tp, pp, dp or ZeRO-1)");
  return -1;
}

absl::StatusOr<std::string> LocalCheckpoints::fetch(int64_t step) {
  Comm& world = *s_.groups.world;
  const int n = world.size(), me = s_.topo().rank;
  TR_ASSERT(static_cast<int>(providers_.size()) == n, "fetch: newest() chose no step");
  // The parts this rank provides to others (replicas it holds), read from its node, and their
  // sizes, all-gathered so that each receiver knows its own.
  std::vector<std::string> out;
  std::vector<int> to;
  std::vector<int64_t> sizes(static_cast<size_t>(n), -1);
  absl::Status st;
  for (int r = 0; r < n; ++r) {
    if (providers_[static_cast<size_t>(r)] != me || r == me) continue;
    absl::StatusOr<std::string> bytes = fs::read_file(copy_path(step, r));
    if (!bytes.ok()) {
      st = bytes.status();
      bytes = std::string();
    }
    sizes[static_cast<size_t>(r)] = static_cast<int64_t>(bytes->size());
    out.push_back(std::move(*bytes));
    out.back().resize((out.back().size() + 7) / 8 * 8);
    to.push_back(r);
  }
  std::vector<int64_t> all(static_cast<size_t>(n) * n);
  world.all_gather(Tensor(all.data(), DType::i64, Device::cpu, {static_cast<int64_t>(all.size())}),
                   Tensor(sizes.data(), DType::i64, Device::cpu, {n}));
  std::vector<Transfer> sends, recvs;
  for (size_t i = 0; i < to.size(); ++i)
    sends.push_back({to[i], out[i].data(), sizes[static_cast<size_t>(to[i])]});
  const int from = providers_[static_cast<size_t>(me)];
  std::string mine;
  const int64_t size =
      from == me ? 0 : std::max<int64_t>(all[static_cast<size_t>(from) * n + me], 0);
  if (from != me) {
    mine.resize(static_cast<size_t>(size + 7) / 8 * 8);
    recvs.push_back({from, mine.data(), size});
  }
  exchange_bytes(world, sends, recvs);
  if (!st.ok()) return st;
  if (from != me) {
    mine.resize(static_cast<size_t>(size));
    return mine;
  }
  return fs::read_file(copy_path(step, me));
}

absl::Status LocalCheckpoints::load(int64_t step) {
  Comm& world = *s_.groups.world;
  const std::string path =
      providers_.empty() || providers_[static_cast<size_t>(s_.topo().rank)] == s_.topo().rank
          ? part_path(step)
          : absl::StrCat("the replica from rank ", providers_[static_cast<size_t>(s_.topo().rank)]);
  absl::StatusOr<std::string> bytes = fetch(step);
  std::string why;
  Header h{};
  if (!bytes.ok()) {
    why = std::string(bytes.status().message());
  } else if (bytes->size() < sizeof(Header)) {
    why = "shorter than its header";
  } else {
    std::memcpy(&h, bytes->data(), sizeof(Header));
    const size_t want = sizeof(Header) + static_cast<size_t>(h.state_bytes) +
                        4 * static_cast<size_t>(h.masters + 2 * h.states);
    if (!same_layout(h, s_) || h.step != step)
      why = "written by another layout";
    else if (h.state_bytes < 0 || bytes->size() != want)
      why = absl::StrCat(bytes->size(), " bytes where its header says ", want);
    else if (fs::crc32_of(std::string_view(*bytes).substr(sizeof(Header))) != h.crc)
      why = "its crc32 does not match";
  }
  if (!why.empty())
    std::fprintf(stderr, "rank %d: local checkpoint %s: %s\n", s_.topo().rank, path.c_str(),
                 why.c_str());
  if (!all_ok(world, why.empty()))
    return absl::DataLossError(
        absl::StrCat("the local checkpoint of step ", step, " is damaged on some rank (above)"));
  const char* p = bytes->data() + sizeof(Header);
  ckpt::TrainState state;
  try {
    state =
        state_of(nlohmann::json::parse(std::string_view(p, static_cast<size_t>(h.state_bytes))));
  } catch (const nlohmann::json::exception& e) {
    why = e.what();
  }
  if (!all_ok(world, why.empty()))
    return absl::DataLossError(
        absl::StrCat("the local checkpoint of step ", step, " holds an unreadable state: ", why));
  p += h.state_bytes;
  for (Tensor t : {s_.opt->masters(), s_.opt->exp_avg(), s_.opt->exp_avg_sq()}) {
    copy_tensor(t, Tensor(const_cast<char*>(p), DType::f32, Device::cpu, {t.numel()}));
    p += t.nbytes();
  }
  s_.opt->compute_weights_from_masters();
  s_.state = state;
  return absl::OkStatus();
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
