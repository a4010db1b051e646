#include "checkpoint/model_file.h"

#include <cmath>
#include <filesystem>
#include <future>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "checkpoint/h5_io.h"
#include "checkpoint/manifest.h"
#include "core/check.h"

namespace tr::ckpt {
namespace {

using h5::Handle;

constexpr char kStateGroup[] = "/state";
constexpr char kConfigDataset[] = "/config";
constexpr char kLayoutDataset[] = "/layout";

std::string dataset_path(const TensorSet& set, const TensorRef& t) {
  return ckpt::dataset_path(set.group, t.name);
}

bool valid_name(const std::string& name) {
  if (name.empty()) return false;
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

absl::Status write_state(hid_t file, const TrainState& s) {
  Handle group(H5Gcreate2(file, kStateGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!group.valid()) return absl::UnavailableError("cannot create group /state");
  h5::write_attr_i64(group.get(), "step", s.step);
  h5::write_attr_i64(group.get(), "consumed_samples", s.consumed_samples);
  h5::write_attr_u64(group.get(), "rng_state", s.rng_state);
  h5::write_attr_f64(group.get(), "lr", s.lr);
  h5::write_attr_i64(group.get(), "tokens_seen", s.tokens_seen);
  h5::write_attr_f64_array(group.get(), "loss_window", s.loss_window);
  h5::write_attr_i64(group.get(), "skipped_in_a_row", s.skipped_in_a_row);
  h5::write_attr_i64(group.get(), "skipped_total", s.skipped_total);
  h5::write_attr_u64(group.get(), "run_id", s.run_id);
  return absl::OkStatus();
}

absl::Status read_state(hid_t file, const std::string& path, TrainState* s) {
  if (!h5::path_exists(file, kStateGroup)) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " has no /state group"));
  }
  Handle group(H5Gopen2(file, kStateGroup, H5P_DEFAULT), H5Gclose);
  if (!group.valid()) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": cannot open /state"));
  }
  auto fail = [&](const absl::Status& st) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " /state: ", st.message()));
  };
  absl::StatusOr<int64_t> step = h5::read_attr_i64(group.get(), "step");
  absl::StatusOr<int64_t> consumed = h5::read_attr_i64(group.get(), "consumed_samples");
  absl::StatusOr<uint64_t> rng = h5::read_attr_u64(group.get(), "rng_state");
  absl::StatusOr<double> lr = h5::read_attr_f64(group.get(), "lr");
  absl::StatusOr<int64_t> tokens = h5::read_attr_i64(group.get(), "tokens_seen");
  for (const absl::Status& st :
       {step.status(), consumed.status(), rng.status(), lr.status(), tokens.status()}) {
    if (!st.ok()) return fail(st);
  }
  *s = TrainState{*step, *consumed, *rng, *lr, *tokens, {}, 0, 0, 0};
  if (h5::has_attr(group.get(), "run_id")) {
    absl::StatusOr<uint64_t> run = h5::read_attr_u64(group.get(), "run_id");
    if (!run.ok()) return fail(run.status());
    s->run_id = *run;
  }
  // The step guard's state (absent from checkpoints written before it was kept: a fresh guard).
  if (h5::has_attr(group.get(), "loss_window")) {
    absl::StatusOr<std::vector<double>> window =
        h5::read_attr_f64_array(group.get(), "loss_window");
    absl::StatusOr<int64_t> in_a_row = h5::read_attr_i64(group.get(), "skipped_in_a_row");
    absl::StatusOr<int64_t> total = h5::read_attr_i64(group.get(), "skipped_total");
    for (const absl::Status& st : {window.status(), in_a_row.status(), total.status()})
      if (!st.ok()) return fail(st);
    s->loss_window = std::move(*window);
    s->skipped_in_a_row = *in_a_row;
    s->skipped_total = *total;
  }
  return absl::OkStatus();
}

// A virtual tensor must map only to files the manifest lists: HDF5 reads a missing source as
// zeros, which would load silently wrong weights.
absl::Status check_sources(hid_t file, const std::string& path, const std::string& ds,
                           const std::set<std::string>& known_files) {
  absl::StatusOr<std::vector<std::string>> sources = h5::virtual_sources(file, ds);
  if (!sources.ok())
    return absl::DataLossError(
        absl::StrCat("checkpoint file ", path, ": ", sources.status().message()));
  for (const std::string& src : *sources) {
    if (src == "." || known_files.count(src)) continue;
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": tensor ", ds,
                                            " maps to file '", src,
                                            "' that the manifest does not list"));
  }
  return absl::OkStatus();
}

// A tensor about to be saved must be finite: a checkpoint is never committed poisoned.
absl::Status check_finite_for_save(const std::string& ds, const TensorRef& t) {
  const std::string bad = non_finite(t);
  if (bad.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("tensor '", t.name, "' (", ds, ") ", bad,
                                                    ": refusing to save a poisoned checkpoint"));
}

// Checks existence, dtype and shape of one expected tensor, then reads it (or its block).
absl::Status read_tensor(hid_t file, const std::string& path, const TensorSet& set,
                         const TensorRef& t, hid_t dapl, const std::set<std::string>& known_files) {
  if (absl::Status st = check_block(t); !st.ok()) return st;
  std::string ds = dataset_path(set, t);
  if (!h5::path_exists(file, ds)) {
    return absl::NotFoundError(absl::StrCat("checkpoint file ", path, " has no tensor '", t.name,
                                            "' (", ds, "): it was written for a different model"));
  }
  absl::StatusOr<h5::DatasetInfo> info = h5::dataset_info(file, ds);
  if (!info.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint file ", path, ": ", info.status().message()));
  }
  if (!info->is_f32) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint file ", path, ": tensor '",
                                                      t.name, "' (", ds, ") is stored as ",
                                                      info->type_desc, ", expected float32"));
  }
  if (info->shape != t.shape) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint file ", path, ": tensor '", t.name, "' (", ds, ") has shape ",
                     h5::shape_str(info->shape), " in the checkpoint but the model expects ",
                     h5::shape_str(t.shape), ": the checkpoint is from a different model shape"));
  }
  if (absl::Status st = check_sources(file, path, ds, known_files); !st.ok()) return st;
  absl::Status st = h5::read_f32(file, ds, t.data, dapl, t.start, t.extent);
  if (!st.ok())
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": ", st.message()));
  if (const std::string bad = non_finite(t); !bad.empty()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint file ", path, ": tensor '", t.name, "' (", ds, ") ", bad,
        ": the checkpoint is poisoned; resume from an earlier one with --resume PATH"));
  }
  return absl::OkStatus();
}

// A non-empty set's group must hold exactly the tensors asked for.
absl::Status check_no_extra(hid_t file, const std::string& path, const TensorSet& set) {
  std::set<std::string> expected;
  for (const TensorRef& t : set.tensors) expected.insert(dataset_path(set, t));
  for (const std::string& ds : h5::list_datasets(file, set.group)) {
    if (expected.count(ds)) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint file ", path, " has tensor '", ds.substr(set.group.size() + 1), "' (", ds,
        ") that the model does not have: it was written for a ", "different model"));
  }
  return absl::OkStatus();
}

// A new checkpoint HDF5 file with the format attributes.
absl::StatusOr<Handle> create_checkpoint_file(const std::string& path, bool page_aligned = false) {
  absl::StatusOr<Handle> file = h5::create_file(path, page_aligned);
  if (!file.ok()) return file;
  h5::write_attr_string(file->get(), "format", kManifestFormat);
  h5::write_attr_i64(file->get(), "version", kManifestVersion);
  return file;
}

// Closing flushes: a failure here is a write failure, with the system's reason when HDF5 has
// one, else a guess.
absl::Status close_checkpoint_file(Handle& file, const std::string& path) {
  absl::Status st = h5::close_written_file(file, path);
  if (st.ok() || st.message().find("(HDF5: ") != absl::string_view::npos) return st;
  return absl::UnavailableError(absl::StrCat(st.message(), " (disk full?)"));
}

}  // namespace

std::string non_finite(const TensorRef& t) {
  const int64_t n = t.block_numel();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(t.data[i])) continue;
    if (bad++ == 0) first = i;
  }
  if (bad == 0) return "";
  return absl::StrCat("holds ", bad, " non-finite value", bad == 1 ? "" : "s",
                      " (NaN or Inf; the first at element ", first,
                      t.whole() ? "" : absl::StrCat(" of the block at ", h5::shape_str(t.start)),
                      ")");
}

absl::Status check_block(const TensorRef& t) {
  if (t.whole()) return absl::OkStatus();
  bool ok = t.start.size() == t.shape.size() && t.extent.size() == t.shape.size();
  for (size_t d = 0; ok && d < t.shape.size(); ++d)
    ok = t.start[d] >= 0 && t.extent[d] >= 0 && t.start[d] + t.extent[d] <= t.shape[d];
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tensor '", t.name, "': block at ", h5::shape_str(t.start), " of ",
                   h5::shape_str(t.extent), " is outside its shape ", h5::shape_str(t.shape)));
}

std::string dataset_path(const std::string& group, const std::string& name) {
  return absl::StrCat(group, "/", name);
}

std::vector<TensorSet> checkpoint_sets(std::span<const TensorRef> params,
                                       std::span<const TensorRef> exp_avg,
                                       std::span<const TensorRef> exp_avg_sq) {
  return {{"/model", params}, {"/optim/exp_avg", exp_avg}, {"/optim/exp_avg_sq", exp_avg_sq}};
}

absl::Status validate_tensors(std::span<const TensorRef> tensors, absl::string_view what,
                              bool need_data) {
  std::set<std::string> names;
  for (const TensorRef& t : tensors) {
    if (!valid_name(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " tensor name '", t.name,
                       "' is not a relative path like \"layers/0/attn/q_proj/weight\""));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, " tensor '", t.name, "' appears twice"));
    }
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " tensor '", t.name, "' has negative shape ", h5::shape_str(t.shape)));
      }
    }
    if (need_data && t.data == nullptr && t.block_numel() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, " tensor '", t.name, "' has no data"));
    }
  }
  // "a" cannot be both a dataset and the group holding "a/b".
  for (const std::string& n : names) {
    auto next = names.lower_bound(n + "/");
    if (next != names.end() && next->starts_with(n + "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " tensor '", n, "' is also a group of '", *next, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status validate_same_layout(std::span<const TensorRef> params,
                                  std::span<const TensorRef> other, absl::string_view what) {
  if (other.size() != params.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", other.size(), " tensors but params has ", params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (other[i].name != params[i].name || other[i].shape != params[i].shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " tensor ", i, " is '", other[i].name, "' ", h5::shape_str(other[i].shape),
          " but params has '", params[i].name, "' ", h5::shape_str(params[i].shape)));
    }
  }
  return absl::OkStatus();
}

absl::Status write_model_file(const std::string& path, const ModelFileContents& contents,
                              const WriteProgress& progress) {
  absl::StatusOr<Handle> file = create_checkpoint_file(path);
  if (!file.ok()) return file.status();
  hid_t f = file->get();
  size_t total = 0, done = 0;
  for (const TensorSet& set : contents.sets) total += set.tensors.size();
  for (const TensorSet& set : contents.sets) {
    for (const TensorRef& t : set.tensors) {
      const std::string ds = dataset_path(set, t);
      auto virt = contents.virtual_tensors.find(ds);
      absl::Status st = virt != contents.virtual_tensors.end()
                            ? h5::write_virtual_f32(f, ds, t.shape, virt->second)
                            : check_finite_for_save(ds, t);
      if (st.ok() && virt == contents.virtual_tensors.end())
        st = h5::write_f32(f, ds, t.shape, t.data);
      if (!st.ok()) return absl::Status(st.code(), absl::StrCat(path, ": ", st.message()));
      if (progress) progress(++done, total);
    }
  }
  for (absl::Status st :
       {write_state(f, contents.state), h5::write_string(f, kConfigDataset, contents.config_yaml),
        h5::write_string(f, kLayoutDataset, contents.layout_json)}) {
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat(path, ": ", st.message()));
  }
  return close_checkpoint_file(*file, path);
}

absl::StatusOr<fs::FileDigest> write_shard_file(const std::string& path,
                                                std::span<const ShardPiece> pieces,
                                                const WriteProgress& progress,
                                                const ShardStamp& stamp) {
  const std::vector<TensorSet> groups = checkpoint_sets({}, {}, {});
  auto tensor_of = [&](const ShardPiece& p) {
    return dataset_path(groups[static_cast<int>(p.set)].group, p.ref.name);
  };
  // Every block is scanned for NaN and Inf beside the writing (a read of every byte, as long as
  // a quarter of the write): a poisoned block fails the save once its file is written, and an
  // unfinished save is never committed.
  std::future<absl::Status> finite = std::async(std::launch::async, [&] {
    for (const ShardPiece& p : pieces)
      if (absl::Status st = check_finite_for_save(tensor_of(p), p.ref); !st.ok()) return st;
    return absl::OkStatus();
  });
  // The scan's verdict first (a poisoned block says more than what it cut short), else `other`.
  auto scanned = [&](absl::Status other) {
    const absl::Status st = finite.get();
    return st.ok() ? other : absl::Status(st.code(), absl::StrCat(path, ": ", st.message()));
  };
  // HDF5 writes the structure (datasets allocated, page-aligned, never filled); the blocks' bytes
  // follow it into their places, directly and checksummed on the way (fs::write_regions_durable).
  std::vector<fs::FileRegion> regions;
  {
    absl::StatusOr<Handle> file = create_checkpoint_file(path, /*page_aligned=*/true);
    if (!file.ok()) return file.status();
    hid_t f = file->get();
    {
      Handle root(H5Gopen2(f, "/", H5P_DEFAULT), H5Gclose);
      H5_CHECK(root.get());
      h5::write_attr_i64(root.get(), "step", stamp.step);
      h5::write_attr_u64(root.get(), "run_id", stamp.run_id);
    }
    std::map<std::string, int> count;  // pieces written per tensor
    for (const ShardPiece& p : pieces) {
      const std::string tensor = tensor_of(p);
      const std::string ds = absl::StrCat(tensor, "/", count[tensor]++);
      absl::StatusOr<uint64_t> at = h5::create_f32_allocated(f, ds, p.ref.extent);
      if (!at.ok())
        return scanned(
            absl::Status(at.status().code(), absl::StrCat(path, ": ", at.status().message())));
      Handle dset(H5Dopen2(f, ds.c_str(), H5P_DEFAULT), H5Dclose);
      H5_CHECK(dset.get());
      h5::write_attr_string(dset.get(), "start", h5::shape_str(p.ref.start));
      const auto bytes = static_cast<uint64_t>(p.ref.block_numel()) * sizeof(float);
      if (bytes > 0) regions.push_back({*at, p.ref.data, bytes});
    }
    if (absl::Status st = close_checkpoint_file(*file, path); !st.ok()) return scanned(st);
  }
  absl::StatusOr<fs::FileDigest> digest =
      fs::write_regions_durable(path, std::move(regions), progress);
  if (absl::Status st = scanned(absl::OkStatus()); !st.ok()) return st;
  return digest;
}

absl::Status check_shard_stamp(const std::string& path, const ShardStamp& want) {
  absl::StatusOr<Handle> file = h5::open_file_readonly(path);
  if (!file.ok()) return file.status();
  Handle root(H5Gopen2(file->get(), "/", H5P_DEFAULT), H5Gclose);
  if (!root.valid() || !h5::has_attr(root.get(), "step")) return absl::OkStatus();  // unstamped
  absl::StatusOr<int64_t> step = h5::read_attr_i64(root.get(), "step");
  absl::StatusOr<uint64_t> run = h5::read_attr_u64(root.get(), "run_id");
  if (!step.ok() || !run.ok())
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": unreadable stamp"));
  const bool run_known = want.run_id != 0 && *run != 0;
  if (*step == want.step && (!run_known || *run == want.run_id)) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "checkpoint file %s was written for step %lld of run %016llx, not for this checkpoint's step "
      "%lld of run %016llx: a file of another checkpoint was put here; restore its own file or "
      "resume another checkpoint with --resume PATH",
      path, static_cast<long long>(*step), static_cast<unsigned long long>(*run),
      static_cast<long long>(want.step), static_cast<unsigned long long>(want.run_id)));
}

absl::Status read_model_file(const std::string& path, const std::vector<TensorSet>& sets,
                             TrainState* state, std::string* config_yaml, std::string* layout_json,
                             bool subset, const std::set<std::string>& known_files) {
  absl::StatusOr<Handle> file = h5::open_file_readonly(path);
  if (!file.ok()) return file.status();
  hid_t f = file->get();
  const std::string dir = std::filesystem::path(path).parent_path().string();
  Handle dapl = h5::vds_access_plist(dir.empty() ? "." : dir);
  for (const TensorSet& set : sets) {
    if (set.tensors.empty()) continue;
    for (const TensorRef& t : set.tensors) {
      if (absl::Status st = read_tensor(f, path, set, t, dapl.get(), known_files); !st.ok())
        return st;
    }
    if (subset) continue;
    if (absl::Status st = check_no_extra(f, path, set); !st.ok()) return st;
  }
  if (state != nullptr) {
    if (absl::Status st = read_state(f, path, state); !st.ok()) return st;
  }
  const std::pair<std::string*, const char*> strings[] = {{config_yaml, kConfigDataset},
                                                          {layout_json, kLayoutDataset}};
  for (auto [out, ds] : strings) {
    if (out == nullptr) continue;
    absl::StatusOr<std::string> s = h5::read_string(f, ds);
    if (!s.ok()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", path, ": ", s.status().message()));
    }
    *out = *std::move(s);
  }
  return absl::OkStatus();
}

}  // namespace tr::ckpt
