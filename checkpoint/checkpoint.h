// Checkpoints: an HDF5 file of global fp32 tensors per step (written whole by save(), or
// stitched from per-rank shard files by the distributed save below), a manifest with per-file
// checksums, and a crash-safe commit protocol.
//
// On disk, for step 500 under root `ckpt/`:
//   ckpt/latest                      text file holding "step_00000500\n"
//   ckpt/step_00000500/model.h5      /model/<name>              fp32, global shape
//                                    /optim/exp_avg/<name>      fp32, global shape (Adam m)
//                                    /optim/exp_avg_sq/<name>   fp32, global shape (Adam v)
//                                    /state  group, scalar attributes step, consumed_samples,
//                                            rng_state, lr, tokens_seen
//                                    /config resolved config YAML (string dataset)
//                                    /layout parallel layout JSON (string dataset)
//   ckpt/step_00000500/config.yaml   the resolved config, verbatim
//   ckpt/step_00000500/layout.json   the parallel layout, verbatim
//   ckpt/step_00000500/manifest.json {"format": "trainer-checkpoint", "version": 1,
//                                     "step": 500, "files": {"model.h5": {"bytes": N,
//                                     "crc32": C}, ...}}   written last: its presence is
//                                     what makes a directory a committed checkpoint.
//
// Commit protocol (save): write everything into `step_N.tmp/` (a stale one is removed
// first), fsync each file, write the manifest last, fsync it and the directory, rename
// `step_N.tmp` -> `step_N`, fsync root, then replace `latest` by write-temp + fsync + rename
// + fsync root. Then retention runs. A crash at any instant leaves `latest` naming a
// committed checkpoint (the previous one until the final rename of `latest`).
//
// An existing `step_N` (from an earlier run) is replaced, never half-overwritten:
//   * `latest` does not name it (a run that crashed between the directory rename and the
//     `latest` update, or a step past a rollback): it is renamed aside to
//     `step_N.replaced.tmp` (removed with the other stale *.tmp dirs) before the new one is
//     renamed in; `latest` never referenced it, so no instant is unsafe.
//   * `latest` names it: the new and the old directory are swapped atomically with
//     renameat2(RENAME_EXCHANGE); on a filesystem without that, save refuses with
//     FailedPrecondition rather than leave an instant where `latest` names nothing.
//
// Retention (after `latest` is replaced): keeps the `keep_last` committed `step_*`
// directories with the highest steps, plus the one `latest` names if it is not among them;
// removes the rest (each is first renamed to `step_N.deleting.tmp`, so a crash mid-delete
// never leaves a half-deleted `step_N`), and removes stale `step_*.tmp` dirs and
// `latest.tmp`.
//
// Crash-test hook: when the environment variable TR_TEST_CRASH_POINT equals one of these
// stage names (or "stage@N": only while saving step N), save() sends its own process SIGKILL
// at that point:
//   "mid_tensors"     after half of the tensors (params, m, v together) are in model.h5
//                     (distributed: after half of a shard's blocks)
//   "before_manifest" all data files written and fsynced, manifest not yet written
//   "before_rename"   manifest written and fsynced, step_N.tmp not yet renamed
//   "before_latest"   step_N committed, `latest` still names the previous checkpoint
//   "before_cleanup"  `latest` names step_N, retention not yet run
//
// Distributed save (the trainer's path): every rank writes only the blocks of the global
// tensors it owns into its own `shard_RRRRR.h5` (datasets /<set>/<name>/<k>, attribute `start`),
// and a coordinator writes model.h5 whose tensors are HDF5 virtual datasets stitching those
// blocks into global tensors, so model.h5 still reads as one model (h5py, h5dump, load()).
// The shards are listed in the manifest with the crc32 their writers computed. The steps, with
// the caller agreeing on success between them (see begin_save):
//   coordinator  begin_save(root, step)          fresh step_N.tmp
//   every owner  write_shard(tmp, rank, pieces)  shard_RRRRR.h5, fsynced; returns its digest
//   coordinator  commit_save(req)                model.h5, config, layout, manifest, rename,
//                                                `latest`, retention (as save() from there on)
// A load reads only the blocks it asks for (TensorRef::start/extent) through the virtual
// datasets, after checking that every source file a tensor maps to is in the manifest.
#pragma once
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/fs_io.h"

namespace tr::ckpt {

// One fp32 tensor, or a block of it.
struct TensorRef {
  TensorRef() = default;
  TensorRef(std::string name_, std::vector<int64_t> shape_, float* data_ = nullptr)
      : name(std::move(name_)), shape(std::move(shape_)), data(data_) {}

  std::string name;            // readable path, no leading slash: "layers/0/attn/q_proj/weight"
  std::vector<int64_t> shape;  // global shape; empty = scalar
  float* data = nullptr;       // contiguous row-major: the whole tensor, or the block below
  // A block of the global tensor: its first index and size in every dimension (both empty =
  // the whole tensor). Only loads and distributed saves take blocks.
  std::vector<int64_t> start, extent;
  bool whole() const { return extent.empty(); }
  int64_t block_numel() const;  // elements in `data`
};

// "" when every value of `t`'s data (the whole tensor or its block) is finite; otherwise what is
// wrong, to follow the tensor's name in an error: how many values are NaN or infinite and the
// first one's element index.
std::string non_finite(const TensorRef& t);

// Everything besides tensors that a resumed run needs to continue bit-exactly.
struct TrainState {
  int64_t step = 0;              // optimizer steps completed
  int64_t consumed_samples = 0;  // samples drawn from the data stream
  uint64_t rng_state = 0;        // trainer RNG state
  double lr = 0;                 // learning rate of the last step (LR schedule state)
  int64_t tokens_seen = 0;       // training tokens consumed
  // The step guard (trainer/step/guard.h), so that a resumed run judges steps as the uninterrupted
  // one would: the losses of the last applied steps (the spike window, oldest first) and the
  // steps skipped in a row and in all. Checkpoints without them read as empty and 0.
  std::vector<double> loss_window;
  int64_t skipped_in_a_row = 0, skipped_total = 0;
  // The run's identity: random at a fresh start, kept across resumes, and stamped with the step
  // on every shard file, so that a shard of another checkpoint is refused on load. 0: unknown
  // (checkpoints written before it was kept).
  uint64_t run_id = 0;
};

struct SaveRequest {
  std::string root;   // checkpoint.dir; created if missing
  int64_t step = 0;   // >= 0; names the directory step_%08d
  int keep_last = 2;  // >= 2: committed checkpoints kept by retention
  // Same names and shapes in all three (m and v mirror the params).
  std::span<const TensorRef> params, exp_avg, exp_avg_sq;
  TrainState state;         // state.step must equal step
  std::string config_yaml;  // resolved config, stored verbatim
  std::string layout_json;  // parallel layout etc., stored verbatim
};

// Writes and commits checkpoint `req.step` under `req.root`, updates `latest`, applies
// retention. Errors (bad request, I/O failure, refusing to replace) leave the previous
// checkpoint and `latest` untouched.
absl::Status save(const SaveRequest& req);

// ---- Distributed save (see the header comment) ----

// Where the tensors of a checkpoint live in model.h5.
enum class TensorSetId : int { params = 0, exp_avg = 1, exp_avg_sq = 2 };

// One block a rank owns and writes: a TensorRef with start/extent (or whole) in one set.
struct ShardPiece {
  TensorSetId set = TensorSetId::params;
  TensorRef ref;
};

// The coordinator's record of one rank's shard: what it holds (data pointers unused) and the
// digest its writer returned.
struct ShardRecord {
  int rank = 0;
  std::vector<ShardPiece> pieces;
  fs::FileDigest digest;
};

struct CommitRequest {
  std::string root;
  int64_t step = 0;
  int keep_last = 2;
  // Names and global shapes of the model's tensors (data unused); the same for the three sets.
  std::span<const TensorRef> tensors;
  // Every shard written; together they must cover every tensor of every set exactly once.
  std::vector<ShardRecord> shards;
  TrainState state;  // state.step must equal step
  std::string config_yaml, layout_json;
};

// "<root>/step_XXXXXXXX.tmp": where the shards of `step` are written before the commit.
std::string save_tmp_dir(const std::string& root, int64_t step);
// "shard_00005.h5"
std::string shard_file_name(int rank);

// Coordinator: validates `root` and `keep_last` as save() does, removes a stale
// step_N.tmp and creates it empty. Returns its path. Nothing else is touched.
absl::StatusOr<std::string> begin_save(const std::string& root, int64_t step, int keep_last);

// Writes `pieces` (non-empty blocks of fp32 data) into `tmp_dir`/shard_file_name(rank), stamped
// with `step` and `run_id` (TrainState::run_id), fsyncs it and returns its size and crc32. The
// file must not exist. Names are validated as in save(). Crash point "mid_tensors" fires after
// half of them.
absl::StatusOr<fs::FileDigest> write_shard(const std::string& tmp_dir, int rank, int64_t step,
                                           uint64_t run_id, std::span<const ShardPiece> pieces);

// Coordinator, after every shard was written: checks that the shards tile every tensor of the
// three sets exactly (an error names the first tensor that is not), writes model.h5 (virtual
// datasets), config.yaml, layout.json and the manifest into save_tmp_dir(root, step), then
// commits as save() does.
absl::Status commit_save(const CommitRequest& req);

// The committed checkpoint directory `<root>/latest` names, as "<root>/step_XXXXXXXX"; ""
// when root or `latest` does not exist. Errors when `latest` is malformed or names a
// missing directory or one without manifest.json (not committed).
absl::StatusOr<std::string> find_latest(const std::string& root);

// ---- Which checkpoint a run continues from ----

// The committed step directories under `root` (named step_ + digits, holding a manifest) as
// "<root>/step_XXXXXXXX", newest first; empty when root does not exist.
std::vector<std::string> committed_step_dirs(const std::string& root);

struct ResumePoint {
  std::string dir;   // "" = nothing to resume: a fresh start
  std::string note;  // set when `latest` was missing and `dir` was found by scanning root
};
// What --resume auto continues: the checkpoint `latest` names (errors as find_latest); when
// there is no `latest` but committed step directories exist (copied without it, or `latest`
// deleted), the newest whose manifest and file sizes check, with a note saying so. Never a
// fresh start over committed checkpoints: when none checks, an error names the newest.
absl::StatusOr<ResumePoint> find_resume_point(const std::string& root);

// Before a run continues from committed checkpoint `dir` and saves into `root`: points
// root's `latest` at `dir` when `dir` lies in root (first, atomically), then moves every
// committed step directory of root with a higher step into root/abandoned-<stamp>/, where it
// is kept for the user. A crash at any instant leaves `latest` naming `dir` or its previous
// target; retention never counts steps above `latest`. Returns the moved directories' paths.
absl::StatusOr<std::vector<std::string>> adopt_resume_point(const std::string& root,
                                                            const std::string& dir,
                                                            const std::string& stamp);

// Before the first save: creates, and removes again, a path under `root` as long as the longest a
// save, a roll-back or a start-over of steps up to `max_step` by `world` ranks will use (a set-
// aside step directory inside abandoned-<stamp>-<n>/, holding the longest file name), so that a
// root too long for the file system ("File name too long") is found at start-up, not hours in.
absl::Status check_save_paths(const std::string& root, int64_t max_step, int world);

// Starting over in a root that holds checkpoints (--resume none --force): moves `latest`, then
// every committed step directory (oldest first), into root/abandoned-<stamp>/, so that a crash
// at any instant leaves a root --resume auto accepts (no `latest`; the newest step left is
// resumed). Returns the new paths.
absl::StatusOr<std::vector<std::string>> abandon_checkpoints(const std::string& root,
                                                             const std::string& stamp);

// Destination buffers with the expected names and shapes (or blocks of them: TensorRef::start
// and extent). An empty span is not loaded (e.g. params only, for evaluation).
struct LoadTarget {
  std::span<const TensorRef> params, exp_avg, exp_avg_sq;
  // The targets are a subset of the model (one pipeline stage's tensors): tensors in the
  // checkpoint beyond them are not an error.
  bool subset = false;
  // Check every file's crc32 (as verify()). A caller that verified the checkpoint already
  // (e.g. split across ranks with verify(dir, part, parts)) passes false: sizes are still
  // checked.
  bool check_crc = true;
};

// Checks the manifest, then reads every expected tensor (or block) into its buffer; errors
// name the file or tensor at fault (missing, different shape, not fp32, a source file of a
// virtual dataset that the manifest does not list, and, for params, tensors in the checkpoint
// the model does not have). `state`, `config_yaml` and `layout_json` may be null.
absl::Status load(const std::string& ckpt_dir, const LoadTarget& dst, TrainState* state,
                  std::string* config_yaml, std::string* layout_json = nullptr);

// Checks the manifest (present, valid JSON, format and version) and that every file it lists
// exists with the recorded size, and, for part `part` of `parts`'s share of the files
// (check_manifest_files: a shard file is its writer's), the recorded crc32 (so `parts` ranks
// verify a checkpoint together, each reading about 1/parts of it). Does not open the HDF5 files.
absl::Status verify(const std::string& ckpt_dir, int part = 0, int parts = 1);

// "step_00000500": the directory name of a step.
std::string step_dir_name(int64_t step);
// The step of a committed directory's name ("step_" + at least 8 digits); nullopt otherwise
// (e.g. "step_00000500.tmp").
std::optional<int64_t> parse_step_dir_name(std::string_view name);

}  // namespace tr::ckpt
