#include "trainer/local_ckpt.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/clock.h"
#include "core/fs_io.h"
#include "core/hash.h"
#include "kernels/ops.h"
#include "trainer/agree.h"

namespace tr {
namespace {

namespace stdfs = std::filesystem;

constexpr char kMagic[8] = {'T', 'R', 'L', 'O', 'C', 'A', 'L', '1'};

// A part's header, then its payload: the state as JSON (state_bytes), the masters, Adam's m and
// v (f32). `crc` covers the payload.
struct Header {
  char magic[8];
  int64_t step, rank, world, tp, pp, dp;
  int64_t capacity, masters, states;  // elements: the flat buffer, this rank's masters and moments
  uint64_t run_id;
  int64_t state_bytes;
  uint32_t crc, pad;
};

// What a part must match to be loaded by this run (the layout, not the step or the run).
bool same_layout(const Header& h, const Session& s) {
  const Topology& t = s.topo();
  return std::memcmp(h.magic, kMagic, 8) == 0 && h.rank == t.rank && h.world == t.world &&
         h.tp == t.tp && h.pp == t.pp && h.dp == t.dp &&
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

uint32_t crc_of(const char* p, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(p), chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

// The header of the part at `path`, if it reads as one.
bool read_header(const std::string& path, Header* h) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  const bool ok = std::fread(h, sizeof(Header), 1, f) == 1;
  std::fclose(f);
  return ok;
}

// Steps of this rank's parts in `dir` (step_* directories holding its renamed part; with
// `unfinished`, or only its unfinished rank_RRRRR.bin.tmp), newest first.
std::vector<int64_t> own_steps(const std::string& dir, int rank, bool unfinished = false) {
  std::vector<int64_t> steps;
  std::error_code ec;
  const std::string name = absl::StrFormat("rank_%05d.bin%s", rank, unfinished ? ".tmp" : "");
  for (const auto& e : stdfs::directory_iterator(dir, ec)) {
    long long step = -1;
    if (std::sscanf(e.path().filename().string().c_str(), "step_%lld", &step) != 1 || step < 0)
      continue;
    if (stdfs::exists(e.path() / name, ec)) steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// Removes `path` and then its directory once that is empty.
void remove_part(const std::string& path) {
  std::error_code ec;
  stdfs::remove(path, ec);
  stdfs::remove(stdfs::path(path).parent_path(), ec);  // fails while other ranks' parts are there
}

}  // namespace

LocalCheckpoints::LocalCheckpoints(Session& s) : s_(s) {
  std::error_code ec;
  const stdfs::path root = stdfs::absolute(s.cfg.checkpoint.dir, ec).lexically_normal();
  // One directory per checkpoint.dir: its name and a hash of its absolute path.
  dir_ = fs::join(s.cfg.checkpoint.local_dir,
                  absl::StrFormat("%s-%016x", root.filename().string(), fnv1a64(root.string())));
}

std::string LocalCheckpoints::part_path(int64_t step) const {
  return fs::join(fs::join(dir_, absl::StrFormat("step_%08d", step)),
                  absl::StrFormat("rank_%05d.bin", s_.topo().rank));
}

LocalCheckpoints::~LocalCheckpoints() {
  if (writer_.joinable()) writer_.join();
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
    head.crc = crc_of(buffer_.data() + sizeof(Header), used_ - sizeof(Header));
    std::memcpy(buffer_.data(), &head, sizeof(Header));
    absl::Status st = fs::make_dirs(stdfs::path(path).parent_path().string());
    if (st.ok())
      st = fs::write_file_durable(path + ".tmp", std::string_view(buffer_.data(), used_));
    write_status_ = st;
    written_ = true;
  });
  stall_s_ = seconds_since(t0);
}

void LocalCheckpoints::settle(bool wait) {
  if (!in_flight_) return;
  const auto t0 = Clock::now();
  if (wait) writer_.join();
  // Every rank's thread done? (One 4-byte all-reduce per step boundary while in flight.)
  if (!all_ok(*s_.groups.world, written_.load())) {
    stall_s_ += seconds_since(t0);
    return;
  }
  if (writer_.joinable()) writer_.join();
  commit(write_status_.ok());
  in_flight_ = false;
}

void LocalCheckpoints::commit(bool written) {
  const auto t0 = Clock::now();
  const Topology& t = s_.topo();
  const std::string path = part_path(step_);
  Comm& world = *s_.groups.world;
  // Counts only once every rank has its part: then each renames its own.
  absl::Status st = write_status_;
  const bool everywhere = all_ok(world, written);
  if (everywhere) st = fs::rename_path(path + ".tmp", path);
  if (!all_ok(world, everywhere && st.ok())) {
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
    return;
  }
  stall_s_ += seconds_since(t0);
  if (s_.logger())
    s_.log.note(absl::StrFormat(
        "\"step\": %d, \"event\": \"local_checkpoint\", \"seconds\": %.6f, \"stall_s\": %.6f, "
        "\"bytes\": %d",
        step_, unix_time() - started_, stall_s_, static_cast<int64_t>(used_)));
  // Retention: this rank's newest local_keep parts, and no unfinished one (a killed writer's).
  const std::vector<int64_t> steps = own_steps(dir_, t.rank);
  for (size_t i = static_cast<size_t>(s_.cfg.checkpoint.local_keep); i < steps.size(); ++i)
    remove_part(part_path(steps[i]));
  for (int64_t old : own_steps(dir_, t.rank, true)) remove_part(part_path(old) + ".tmp");
}

int64_t LocalCheckpoints::newest(int64_t after, uint64_t run_id) {
  Comm& world = *s_.groups.world;
  // Each rank's newest parts as (step, run id) pairs, all-gathered: every rank then picks the
  // same step, the newest one that every rank holds from the same run.
  constexpr int kListed = 16;
  std::vector<int64_t> mine(2 * kListed, -1);
  int listed = 0;
  for (int64_t step : own_steps(dir_, s_.topo().rank)) {
    Header h{};
    if (listed == kListed || step <= after) break;
    if (!read_header(part_path(step), &h) || !same_layout(h, s_) || h.step != step) continue;
    if (run_id != 0 && h.run_id != run_id) continue;
    mine[2 * listed] = step;
    mine[2 * listed + 1] = static_cast<int64_t>(h.run_id);
    ++listed;
  }
  const int64_t n = 2 * kListed;
  std::vector<int64_t> all(static_cast<size_t>(n * world.size()));
  world.all_gather(Tensor(all.data(), DType::i64, Device::cpu, {n * world.size()}),
                   Tensor(mine.data(), DType::i64, Device::cpu, {n}));
  for (int i = 0; i < kListed; ++i) {  // rank 0's list, newest first
    const int64_t step = all[2 * i], id = all[2 * i + 1];
    if (step < 0) break;
    bool everywhere = true;
    for (int r = 1; r < world.size() && everywhere; ++r) {
      everywhere = false;
      for (int j = 0; j < kListed; ++j)
        everywhere = everywhere || (all[r * n + 2 * j] == step && all[r * n + 2 * j + 1] == id);
    }
    if (everywhere) return step;
  }
  return -1;
}

absl::Status LocalCheckpoints::load(int64_t step) {
  Comm& world = *s_.groups.world;
  const std::string path = part_path(step);
  absl::StatusOr<std::string> bytes = fs::read_file(path);
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
    else if (crc_of(bytes->data() + sizeof(Header), bytes->size() - sizeof(Header)) != h.crc)
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
  for (int64_t step : own_steps(dir_, s_.topo().rank)) remove_part(part_path(step));
  for (int64_t step : own_steps(dir_, s_.topo().rank, true)) remove_part(part_path(step) + ".tmp");
}

}  // namespace tr
