// Reading side: verify() and load(). The writing side (save, find_latest, retention) is in
// commit.cpp; the HDF5 schema in model_file.cpp.
#include "checkpoint/checkpoint.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "checkpoint/manifest.h"
#include "checkpoint/model_file.h"
#include "core/fs_io.h"

namespace tr::ckpt {
namespace {

absl::StatusOr<Manifest> verified_manifest(const std::string& ckpt_dir, int part, int parts) {
  if (!fs::is_directory(ckpt_dir)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", ckpt_dir, " does not exist"));
  }
  absl::StatusOr<Manifest> m = read_manifest(ckpt_dir);
  if (!m.ok()) return m.status();
  if (absl::Status st = check_manifest_files(ckpt_dir, *m, part, parts); !st.ok()) return st;
  return m;
}

}  // namespace

int64_t TensorRef::block_numel() const {
  int64_t n = 1;
  for (int64_t d : whole() ? shape : extent) n *= d;
  return n;
}

absl::Status verify(const std::string& ckpt_dir, int part, int parts) {
  if (parts < 1 || part < 0 || part >= parts)
    return absl::InvalidArgumentError(absl::StrCat("verify part ", part, " of ", parts));
  return verified_manifest(ckpt_dir, part, parts).status();
}

absl::Status load(const std::string& ckpt_dir, const LoadTarget& dst, TrainState* state,
                  std::string* config_yaml, std::string* layout_json) {
  const std::pair<std::span<const TensorRef>, const char*> sets[] = {
      {dst.params, "params"}, {dst.exp_avg, "exp_avg"}, {dst.exp_avg_sq, "exp_avg_sq"}};
  for (auto [tensors, what] : sets) {
    if (absl::Status st = validate_tensors(tensors, what); !st.ok()) return st;
  }
  absl::StatusOr<Manifest> m = verified_manifest(ckpt_dir, 0, dst.check_crc ? 1 : 0);
  if (!m.ok()) return m.status();
  std::set<std::string> files;
  for (const auto& [name, digest] : m->files) files.insert(name);
  TrainState read_state;
  absl::Status st = read_model_file(fs::join(ckpt_dir, kModelFile),
                                    checkpoint_sets(dst.params, dst.exp_avg, dst.exp_avg_sq),
                                    &read_state, config_yaml, layout_json, dst.subset, files);
  if (!st.ok()) return st;
  if (read_state.step != m->step) {
    return absl::DataLossError(absl::StrCat("checkpoint ", ckpt_dir,
                                            " is inconsistent: manifest step ", m->step,
                                            " but /state step ", read_state.step));
  }
  // Every shard file is this checkpoint's own: a file of another step or run (its checksum
  // recomputed into the manifest) would load silently otherwise.
  for (const auto& [name, digest] : m->files) {
    if (!name.starts_with("shard_")) continue;
    if (absl::Status st =
            check_shard_stamp(fs::join(ckpt_dir, name), {read_state.step, read_state.run_id});
        !st.ok())
      return st;
  }
  if (state != nullptr) *state = read_state;
  return absl::OkStatus();
}

}  // namespace tr::ckpt
