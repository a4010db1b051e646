// The resume side of node-local checkpoints (trainer/checkpoint/local_ckpt.h): which step every
// rank can take, fetching parts from their replicas' holders, and loading them.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/fs_io.h"
#include "trainer/checkpoint/local_ckpt.h"
#include "trainer/checkpoint/local_part.h"
#include "trainer/step/agree.h"

namespace tr {

namespace stdfs = std::filesystem;
using namespace local_part;

std::vector<int64_t> LocalCheckpoints::held(int64_t after, uint64_t run_id,
                                            int64_t* other_layout) const {
  const int n = s_.groups.world->size(), me = s_.topo().rank;
  const int entry = held_entry(n);
  std::vector<int64_t> mine(static_cast<size_t>(kListed * entry), 0);
  for (int i = 0; i < kListed; ++i) mine[static_cast<size_t>(i * entry)] = -1;
  const std::vector<int64_t> steps = step_dirs();
  int listed = 0;
  const Header own = own_header();
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
      if (r == me && (run_id == 0 || h.run_id == run_id) &&
          (h.world != n || !same_layout(h, own))) {
        *other_layout = std::max(*other_layout, step);  // this run's, of another layout
        continue;
      }
      if (std::memcmp(h.magic, kMagic, 8) != 0 || h.layout != own.layout || h.rank != r ||
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
    why_not_ = absl::StrCat(
        "the local checkpoint of step ", other_layout,
        " was written by another layout (world, tp, pp, dp, virtual stages or ZeRO-1)");
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
    if (!same_layout(h, own_header()) || h.step != step)
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

}  // namespace tr
