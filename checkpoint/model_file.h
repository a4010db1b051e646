// The HDF5 schema of model.h5: "write these tensors to this file" and "read these tensors
// from this file", apart from the directory commit protocol so that per-rank shard files
// (stitched by rank 0 with virtual datasets) can reuse it. Internal to tr_checkpoint.
//
//   /                    attributes format = "trainer-checkpoint", version = 1
//   /model/<name>        fp32 params, global shape
//   /optim/exp_avg/<name>, /optim/exp_avg_sq/<name>   fp32 Adam moments
//   /state               group; scalar attributes step, consumed_samples, rng_state, lr,
//                        tokens_seen
//   /config, /layout     variable-length UTF-8 string datasets
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/h5_io.h"

namespace tr::ckpt {

inline constexpr char kModelFile[] = "model.h5";

// Tensors stored under one group ("/model", "/optim/exp_avg", "/optim/exp_avg_sq").
struct TensorSet {
  std::string group;
  std::span<const TensorRef> tensors;
};

// The three sets of a checkpoint in file order.
std::vector<TensorSet> checkpoint_sets(std::span<const TensorRef> params,
                                       std::span<const TensorRef> exp_avg,
                                       std::span<const TensorRef> exp_avg_sq);

// Names are non-empty relative paths ("a/b/c": no leading or trailing slash, no empty, "."
// or ".." component), unique, none a group of another; shapes non-negative; data non-null
// when there are elements (unless !need_data). `what` names the set in messages ("params").
absl::Status validate_tensors(std::span<const TensorRef> tensors, absl::string_view what,
                              bool need_data = true);
// `other` has the same names and shapes as `params`, in the same order.
absl::Status validate_same_layout(std::span<const TensorRef> params,
                                  std::span<const TensorRef> other, absl::string_view what);

struct ModelFileContents {
  std::vector<TensorSet> sets;
  TrainState state;
  std::string config_yaml;
  std::string layout_json;
  // Distributed checkpoints: the blocks of each tensor (by dataset path, "/model/<name>") in
  // the shard files. A tensor listed here is written as a virtual dataset over them (its data
  // pointer unused); the others are written from their data.
  std::map<std::string, std::vector<h5::VirtualPiece>> virtual_tensors;
};

// Called after each tensor is written with (tensors written so far, total).
using WriteProgress = std::function<void(size_t, size_t)>;

// Creates `path` (which must not exist) holding everything in `contents`, and closes it.
// The caller fsyncs. `progress` may be empty.
absl::Status write_model_file(const std::string& path, const ModelFileContents& contents,
                              const WriteProgress& progress);

// "/model/layers/0/mlp/up_proj/weight"
std::string dataset_path(const std::string& group, const std::string& name);

// A block (TensorRef::start/extent) lies inside its tensor's shape; whole tensors always do.
absl::Status check_block(const TensorRef& t);

// What a shard file is stamped with (attributes of its root group): the step and run it was
// written for.
struct ShardStamp {
  int64_t step = 0;
  uint64_t run_id = 0;
};

// Writes `pieces` (blocks of the tensors of `sets`, group by group) as datasets
// <group>/<name>/<k> with an attribute `start` into `path` (which must not exist), stamps it,
// fsyncs it and returns its digest (its size and CRC, as fs::digest_file would read them).
absl::StatusOr<fs::FileDigest> write_shard_file(const std::string& path,
                                                std::span<const ShardPiece> pieces,
                                                const WriteProgress& progress,
                                                const ShardStamp& stamp);

// The shard file at `path` was written for `want` (a stamp-less file, or run_id 0 in `want`:
// only what is known is compared); DataLoss naming the file and both stamps otherwise.
absl::Status check_shard_stamp(const std::string& path, const ShardStamp& want);

// Reads every tensor (or block) of every set into its buffer after checking that it exists,
// is fp32 and has the expected shape, that a virtual tensor's source files are all in
// `known_files` (names in the file's directory: the manifest's list), and that a non-empty
// set's group holds no tensor the caller did not ask for (unless `subset`). Null outputs are
// skipped.
absl::Status read_model_file(const std::string& path, const std::vector<TensorSet>& sets,
                             TrainState* state, std::string* config_yaml, std::string* layout_json,
                             bool subset, const std::set<std::string>& known_files);

}  // namespace tr::ckpt
