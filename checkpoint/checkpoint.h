// Checkpoints: one HDF5 file of global fp32 tensors per step, a manifest with per-file
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
//   "before_manifest" all data files written and fsynced, manifest not yet written
//   "before_rename"   manifest written and fsynced, step_N.tmp not yet renamed
//   "before_latest"   step_N committed, `latest` still names the previous checkpoint
//   "before_cleanup"  `latest` names step_N, retention not yet run
//
// Single rank for now (a TensorRef's local shape is its global shape). The writer is split
// so that per-rank shard files plus rank-0 virtual datasets can be added later: the HDF5
// schema lives in model_file.h (write_model_file: "these tensors into this file"), the
// directory protocol in commit.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tr::ckpt {

// One fp32 tensor as this rank holds it (single rank for now: local == global).
struct TensorRef {
  std::string name;            // readable path, no leading slash: "layers/0/attn/q_proj/weight"
  std::vector<int64_t> shape;  // global shape; empty = scalar
  float* data = nullptr;       // contiguous row-major, product(shape) floats
};

// Everything besides tensors that a resumed run needs to continue bit-exactly.
struct TrainState {
  int64_t step = 0;              // optimizer steps completed
  int64_t consumed_samples = 0;  // samples drawn from the data stream
  uint64_t rng_state = 0;        // trainer RNG state
  double lr = 0;                 // learning rate of the last step (LR schedule state)
  int64_t tokens_seen = 0;       // training tokens consumed
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

// The committed checkpoint directory `<root>/latest` names, as "<root>/step_XXXXXXXX"; ""
// when root or `latest` does not exist. Errors when `latest` is malformed or names a
// missing directory or one without manifest.json (not committed).
absl::StatusOr<std::string> find_latest(const std::string& root);

// Destination buffers with the expected names and shapes. An empty span is not loaded
// (e.g. params only, for evaluation).
struct LoadTarget {
  std::span<const TensorRef> params, exp_avg, exp_avg_sq;
  // The targets are a subset of the model (one pipeline stage's tensors): tensors in the
  // checkpoint beyond them are not an error.
  bool subset = false;
};

// Verifies `ckpt_dir` (as verify()), then reads every expected tensor into its buffer; errors
// name the file or tensor at fault (missing, different shape, not fp32, and, for params,
// tensors in the checkpoint the model does not have). `state`, `config_yaml` and
// `layout_json` may be null.
absl::Status load(const std::string& ckpt_dir, const LoadTarget& dst, TrainState* state,
                  std::string* config_yaml, std::string* layout_json = nullptr);

// Checks the manifest (present, valid JSON, format and version) and that every file it
// lists exists with the recorded size and crc32. Does not open the HDF5 file.
absl::Status verify(const std::string& ckpt_dir);

// "step_00000500": the directory name of a step.
std::string step_dir_name(int64_t step);
// The step of a committed directory's name ("step_" + at least 8 digits); nullopt otherwise
// (e.g. "step_00000500.tmp").
std::optional<int64_t> parse_step_dir_name(std::string_view name);

}  // namespace tr::ckpt
