#include "trainer/checkpoint/local_part.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/check.h"
#include "core/hash.h"
#include "kernels/ops.h"

namespace tr::local_part {

namespace stdfs = std::filesystem;

uint64_t layout_key(const Config& cfg, const RunLayout& layout, bool masters_sharded) {
  const Topology& t = layout.topo;
  const ModelConfig& m = cfg.model;
  std::string key = absl::StrCat(t.world, " ", t.tp, " ", t.pp, " ", t.dp, " ", layout.zero1, " ",
                                 masters_sharded, " ", m.hidden_size, " ", m.intermediate_size, " ",
                                 m.num_layers, " ", m.num_heads, " ", m.num_kv_heads, " ",
                                 m.head_dim, " ", m.vocab_size, " ", m.tie_embeddings);
  for (int64_t l : cfg.parallel.pipeline_layers) absl::StrAppend(&key, " ", l);
  if (t.cp > 1) absl::StrAppend(&key, " cp ", t.cp);  // a part's rank means another place
  if (layout.virtual_stages > 1) absl::StrAppend(&key, " v ", layout.virtual_stages);
  if (m.num_experts > 0) {  // which layers hold experts, and their shapes
    absl::StrAppend(&key, " moe ", m.num_experts, " ", m.experts_per_token, " ",
                    m.moe_intermediate_size, " ", m.decoder_sparse_step);
    for (int64_t l : m.mlp_only_layers) absl::StrAppend(&key, " d", l);
  }
  return fnv1a64(key);
}

Header layout_header(const Config& cfg, const RunLayout& layout, int64_t capacity,
                     const DistributedOptimizer& opt) {
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  const Topology& t = layout.topo;
  h.rank = t.rank, h.world = t.world, h.tp = t.tp, h.pp = t.pp, h.dp = t.dp;
  h.capacity = capacity;
  h.masters = opt.masters().numel();
  h.states = opt.state_elems();
  h.layout = layout_key(cfg, layout, opt.masters_sharded());
  return h;
}

bool same_layout(const Header& h, const Header& mine) {
  return std::memcmp(h.magic, kMagic, 8) == 0 && h.layout == mine.layout && h.rank == mine.rank &&
         h.world == mine.world && h.tp == mine.tp && h.pp == mine.pp && h.dp == mine.dp &&
         h.capacity == mine.capacity && h.masters == mine.masters && h.states == mine.states;
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

void put_f32(const Buffer& out, size_t* at, Tensor t) {
  TR_ASSERT(t.dtype == DType::f32, "local checkpoints hold f32 masters and moments");
  TR_ASSERT(*at + t.nbytes() <= out.bytes(), "the local checkpoint's buffer is too small");
  copy_tensor(Tensor(static_cast<char*>(out.data()) + *at, DType::f32, Device::cpu, {t.numel()}),
              t);
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

std::string file_name(int rank, bool replica) {
  return absl::StrFormat("%s_%05d.bin", replica ? "replica" : "rank", rank);
}

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

std::vector<int64_t> own_steps(const std::string& dir, int rank, bool unfinished) {
  return steps_with(dir, file_name(rank, false) + (unfinished ? ".tmp" : ""));
}

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

}  // namespace tr::local_part
