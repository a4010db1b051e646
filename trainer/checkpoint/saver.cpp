#include "trainer/checkpoint/saver.h"

#include <cstdio>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/clock.h"
#include "kernels/ops.h"
#include "trainer/checkpoint/ownership.h"
#include "trainer/step/agree.h"

namespace tr {
namespace {

// The grid and the choices a checkpoint's readers check against their own (vocab_padded: the
// model's vocabulary as padded for TP).
std::string layout_json(const Config& cfg, const Topology& t, int64_t vocab_padded) {
  nlohmann::json j = {{"world", t.world},
                      {"tp", t.tp},
                      {"pp", t.pp},
                      {"cp", t.cp},
                      {"dp", t.dp},
                      {"backend", cfg.train.backend},
                      {"zero1", cfg.parallel.zero1},
                      {"sequence_parallel", cfg.parallel.sequence_parallel},
                      {"vocab_padded", vocab_padded}};
  return j.dump();
}

// An f32 tensor's values readable on the host: its own memory on the CPU, a copy otherwise.
struct HostCopy {
  std::vector<float> copy;
  const float* ptr = nullptr;
  explicit HostCopy(Tensor t) {
    if (t.device == Device::cpu) {
      ptr = t.ptr<float>();
      return;
    }
    copy.resize(static_cast<size_t>(t.numel()));
    copy_tensor(Tensor(copy.data(), DType::f32, Device::cpu, {t.numel()}), t);
    ptr = copy.data();
  }
};

int64_t total_elems(const std::vector<ckpt::ShardPiece>& pieces) {
  int64_t n = 0;
  for (const ckpt::ShardPiece& p : pieces) n += p.ref.block_numel();
  return n;
}

}  // namespace

Saver::Saver(Session& s) : s_(s) {
  if (!s_.cfg.checkpoint.async) return;
  // The staging buffer, allocated (and its pages touched) once at start-up rather than in the
  // first save: a fault per page of a many-GiB buffer would stall that save by seconds.
  arena_.resize(static_cast<size_t>(total_elems(owned_pieces(s_.cfg, s_.topo(), {}))));
}

Saver::~Saver() {
  if (writer_.joinable()) writer_.join();
}

absl::Status Saver::failed(const absl::Status& st) const {
  return absl::Status(
      st.code(), absl::StrCat("checkpoint save of step ", step_, " failed (",
                              s_.last_saved_step >= 0 ? absl::StrCat("step ", s_.last_saved_step)
                                                      : std::string("no checkpoint"),
                              " stays the last committed one): ", st.message()));
}

absl::Status Saver::save() {
  if (absl::Status st = settle(true); !st.ok()) return st;
  const auto t0 = Clock::now();
  MpiPatience saving(s_.cfg.checkpoint.save_timeout_s);  // ranks wait for the slowest writer
  const std::string& root = s_.cfg.checkpoint.dir;
  step_ = s_.state.step;
  state_ = s_.state;
  started_ = t0;
  stall_s_ = 0;
  absl::Status st;
  if (s_.logger())
    st = ckpt::begin_save(root, step_, static_cast<int>(s_.cfg.checkpoint.keep_last)).status();
  if (!all_ok(*s_.groups.world, st.ok())) return st;

  TR_ASSERT(rank_layout(s_.cfg, s_.topo()).capacity == s_.params->layout().capacity,
            "checkpoint ownership must see the model's layout");
  // Whole masters that are the compute copy may still be receiving ZeRO-1's weight all-gather.
  if (!s_.opt->masters_sharded()) s_.opt->finish_weights();
  const HostCopy params(s_.opt->masters()), m(s_.opt->exp_avg()), v(s_.opt->exp_avg_sq());
  pieces_ = owned_pieces(s_.cfg, s_.topo(),
                         RankBuffers{params.ptr, s_.opt->masters_sharded(), m.ptr, v.ptr});
  if (!s_.cfg.checkpoint.async) return commit(write());
  // Asynchronous: stage a copy of this rank's blocks, then write it in the background.
  TR_ASSERT(static_cast<int64_t>(arena_.size()) == total_elems(pieces_),
            "the staging buffer must hold this rank's blocks");
  float* at = arena_.data();
  for (ckpt::ShardPiece& p : pieces_) {
    const int64_t n = p.ref.block_numel();
    std::memcpy(at, p.ref.data, static_cast<size_t>(n) * sizeof(float));
    p.ref.data = at;
    at += n;
  }
  written_ = false;
  in_flight_ = true;
  writer_ = std::thread([this] {
    result_ = write();
    written_ = true;
  });
  stall_s_ += seconds_since(t0);
  return absl::OkStatus();
}

absl::Status Saver::settle(bool wait) {
  if (!in_flight_) return absl::OkStatus();
  const auto t0 = Clock::now();
  MpiPatience saving(s_.cfg.checkpoint.save_timeout_s);
  if (wait) {
    writer_.join();
  } else {
    if (!all_ok(*s_.groups.world, written_.load())) {  // someone is still writing
      stall_s_ += seconds_since(t0);
      return absl::OkStatus();
    }
    writer_.join();
  }
  in_flight_ = false;
  stall_s_ += seconds_since(t0);
  return commit(result_);
}

absl::StatusOr<fs::FileDigest> Saver::write() const {
  if (pieces_.empty()) return fs::FileDigest{};
  return ckpt::write_shard(ckpt::save_tmp_dir(s_.cfg.checkpoint.dir, step_), s_.topo().rank, step_,
                           s_.state.run_id, pieces_);
}

// Every rank's (ok, bytes, crc32) to rank 0, which commits: model.h5, manifest, rename, latest.
absl::Status Saver::commit(const absl::StatusOr<fs::FileDigest>& written) {
  const auto t0 = Clock::now();
  const absl::Status own = written.ok() ? absl::OkStatus() : failed(written.status());
  const fs::FileDigest digest = written.ok() ? *written : fs::FileDigest{};
  Comm& world = *s_.groups.world;
  double mine[3] = {own.ok() ? 1.0 : 0.0, static_cast<double>(digest.bytes),
                    static_cast<double>(digest.crc32)};  // doubles hold both exactly
  std::vector<double> all(3 * static_cast<size_t>(world.size()));
  world.all_gather(Tensor(all.data(), DType::f64, Device::cpu, {3 * world.size()}),
                   Tensor(mine, DType::f64, Device::cpu, {3}));
  if (!own.ok()) return own;
  for (int r = 0; r < world.size(); ++r)
    if (all[3 * r] != 1.0) return absl::OkStatus();  // rank r reports its own error
  s_.last_saved_step = step_;  // every rank: the commit below is rank 0's, and its failure ends all
  if (!s_.logger()) return absl::OkStatus();

  const std::string& root = s_.cfg.checkpoint.dir;
  ckpt::CommitRequest req;
  req.root = root;
  req.step = step_;
  req.keep_last = static_cast<int>(s_.cfg.checkpoint.keep_last);
  const std::vector<ckpt::TensorRef> tensors = model_tensors(s_.cfg, s_.topo());
  req.tensors = tensors;  // a span
  for (int r = 0; r < world.size(); ++r) {
    std::vector<ckpt::ShardPiece> theirs = owned_pieces(s_.cfg, s_.topo().of_rank(r), {});
    if (theirs.empty()) continue;
    req.shards.push_back(
        {r,
         std::move(theirs),
         {static_cast<uint64_t>(all[3 * r + 1]), static_cast<uint32_t>(all[3 * r + 2])}});
  }
  req.state = state_;
  req.config_yaml = to_yaml(s_.cfg);
  req.layout_json = layout_json(s_.cfg, s_.topo(), s_.model->dims().vocab_padded);
  if (absl::Status c = ckpt::commit_save(req); !c.ok())
    return absl::InternalError(absl::StrCat("checkpoint save failed: ", c.message()));
  // One end for both, so that the stall (a part of the save) never exceeds the save's time.
  const auto end = Clock::now();
  const double dt = std::chrono::duration<double>(end - started_).count();
  const bool async = s_.cfg.checkpoint.async;
  if (async) stall_s_ += std::chrono::duration<double>(end - t0).count();
  const double stall = async ? stall_s_ : dt;
  std::printf("checkpoint %s/%s saved in %.2fs (%zu shard files%s)\n", root.c_str(),
              ckpt::step_dir_name(step_).c_str(), dt, req.shards.size(),
              async ? absl::StrFormat("; async, training stalled %.3fs", stall).c_str() : "");
  if (dt > s_.cfg.checkpoint.save_timeout_s)
    std::printf(
        "warning: the save took %.0f s, over checkpoint.save_timeout_s=%g: a stop signal's grace "
        "period may end the job before its save is committed; give the save more time (Slurm "
        "--signal=B:USR1@SECONDS, and checkpoint.save_timeout_s) or faster storage\n",
        dt, s_.cfg.checkpoint.save_timeout_s);
  std::fflush(stdout);
  s_.log.note(absl::StrFormat(
      "\"step\": %d, \"event\": \"checkpoint\", \"seconds\": %.6f, \"stall_s\": %.6f", step_, dt,
      stall));
  return absl::OkStatus();
}

}  // namespace tr
