// The directory commit protocol, `latest`, retention and the crash-test hook. See the
// header comment of checkpoint.h for the protocol and the decisions it makes.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/manifest.h"
#include "checkpoint/model_file.h"
#include "core/fs_io.h"
#include "core/switches.h"

namespace tr::ckpt {
namespace {

constexpr char kLatestFile[] = "latest";
constexpr char kLatestTmpFile[] = "latest.tmp";
constexpr char kConfigFile[] = "config.yaml";
constexpr char kLayoutFile[] = "layout.json";
constexpr char kStepPrefix[] = "step_";
constexpr char kTmpSuffix[] = ".tmp";
constexpr char kAbandonedPrefix[] = "abandoned-";
constexpr size_t kStepDigits = 8;  // step_%08lld

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Test hook: dies by SIGKILL (no cleanup, no flush: like a node failure) when
// TR_TEST_CRASH_POINT names `stage`, or is "stage@N" and this save is of step N.
void crash_point(const char* stage, int64_t step) {
  const std::string want = setting(Setting::test_crash_point);
  if (want.empty()) return;
  std::string_view w = want;
  if (size_t at = w.find('@'); at != std::string_view::npos) {
    if (w.substr(at + 1) != std::to_string(step)) return;
    w = w.substr(0, at);
  }
  if (w == stage) ::kill(::getpid(), SIGKILL);
}

// The step of a committed directory name "step_" + >= 8 digits; nullopt for anything else.
std::optional<int64_t> parse_step_dir_impl(std::string_view name) {
  if (!name.starts_with(kStepPrefix)) return std::nullopt;
  std::string_view digits = name.substr(std::strlen(kStepPrefix));
  if (digits.size() < kStepDigits || digits.size() > 18) return std::nullopt;
  int64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

absl::Status validate_target(const std::string& root, int64_t step, int keep_last) {
  if (root.empty()) return absl::InvalidArgumentError("checkpoint root directory is empty");
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint step ", step, " is negative"));
  }
  if (keep_last < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint keep_last is ", keep_last,
        "; it must be >= 2 so the previous checkpoint survives while the next is written"));
  }
  return absl::OkStatus();
}

absl::Status validate_state_step(int64_t step, const TrainState& state) {
  if (state.step == step) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("checkpoint step ", step, " differs from state.step ", state.step));
}

absl::Status validate_request(const SaveRequest& req) {
  if (absl::Status st = validate_target(req.root, req.step, req.keep_last); !st.ok()) return st;
  if (absl::Status st = validate_state_step(req.step, req.state); !st.ok()) return st;
  const std::pair<std::span<const TensorRef>, const char*> sets[] = {
      {req.params, "params"}, {req.exp_avg, "exp_avg"}, {req.exp_avg_sq, "exp_avg_sq"}};
  for (auto [tensors, what] : sets) {
    if (absl::Status st = validate_tensors(tensors, what); !st.ok()) return st;
  }
  if (absl::Status st = validate_same_layout(req.params, req.exp_avg, "exp_avg"); !st.ok()) {
    return st;
  }
  return validate_same_layout(req.params, req.exp_avg_sq, "exp_avg_sq");
}

// The directory name `latest` holds; "" when there is no `latest` (or no root).
absl::StatusOr<std::string> read_latest_name(const std::string& root) {
  std::string path = fs::join(root, kLatestFile);
  absl::StatusOr<std::string> text = fs::read_file(path);
  if (absl::IsNotFound(text.status())) return std::string();
  if (!text.ok()) return text.status();
  std::string name(absl::StripAsciiWhitespace(*text));
  if (!parse_step_dir_impl(name)) {
    return absl::DataLossError(absl::StrCat(path, " is malformed: it holds '", name.substr(0, 64),
                                            "', expected a directory name like step_00000500"));
  }
  return name;
}

// Writes model.h5, config.yaml and layout.json into `dir` (fsynced); returns their names.
absl::StatusOr<std::vector<std::string>> write_step_files(const ModelFileContents& contents,
                                                          const std::string& dir,
                                                          const WriteProgress& progress) {
  std::string h5_path = fs::join(dir, kModelFile);
  if (absl::Status st = write_model_file(h5_path, contents, progress); !st.ok()) return st;
  if (absl::Status st = fs::fsync_path(h5_path); !st.ok()) return st;
  const std::pair<const char*, const std::string*> texts[] = {{kConfigFile, &contents.config_yaml},
                                                              {kLayoutFile, &contents.layout_json}};
  for (auto [name, text] : texts) {
    if (absl::Status st = fs::write_file_durable(fs::join(dir, name), *text); !st.ok()) return st;
  }
  return std::vector<std::string>{kModelFile, kConfigFile, kLayoutFile};
}

std::vector<int64_t> block_start(const TensorRef& t) {
  return t.whole() ? std::vector<int64_t>(t.shape.size(), 0) : t.start;
}
std::vector<int64_t> block_extent(const TensorRef& t) {
  return t.whole() ? t.shape : t.extent;
}

bool blocks_overlap(const h5::VirtualPiece& a, const h5::VirtualPiece& b) {
  for (size_t d = 0; d < a.start.size(); ++d)
    if (a.start[d] + a.extent[d] <= b.start[d] || b.start[d] + b.extent[d] <= a.start[d])
      return false;
  return true;
}

// The virtual-dataset mappings of every tensor of the three sets (by dataset path), after
// checking that the shards' blocks lie inside their tensors, do not overlap, and cover them.
// Dataset names follow write_shard_file: <group>/<name>/<k>, k counting per tensor per shard.
absl::StatusOr<std::map<std::string, std::vector<h5::VirtualPiece>>> tile_tensors(
    std::span<const TensorRef> tensors, const std::vector<ShardRecord>& shards) {
  const std::vector<TensorSet> groups = checkpoint_sets({}, {}, {});
  std::map<std::string, const TensorRef*> by_name;
  for (const TensorRef& t : tensors) by_name[t.name] = &t;
  std::map<std::string, std::vector<h5::VirtualPiece>> tiles;
  for (const ShardRecord& shard : shards) {
    std::map<std::string, int> count;
    for (const ShardPiece& p : shard.pieces) {
      const int set = static_cast<int>(p.set);
      if (set < 0 || set > 2)
        return absl::InvalidArgumentError(absl::StrCat("shard tensor set ", set, " is invalid"));
      auto t = by_name.find(p.ref.name);
      if (t == by_name.end() || t->second->shape != p.ref.shape)
        return absl::InvalidArgumentError(absl::StrCat("rank ", shard.rank, "'s shard holds '",
                                                       p.ref.name, "' ", h5::shape_str(p.ref.shape),
                                                       ", which is not a tensor of the model"));
      const std::string ds = dataset_path(groups[set].group, p.ref.name);
      h5::VirtualPiece v{block_start(p.ref), block_extent(p.ref), shard_file_name(shard.rank),
                         absl::StrCat(ds, "/", count[ds]++)};
      if (absl::Status st = check_block(p.ref); !st.ok())
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", shard.rank, "'s shard: ", st.message()));
      if (numel(v.extent) > 0) tiles[ds].push_back(std::move(v));
    }
  }
  for (const TensorSet& g : groups) {
    for (const TensorRef& t : tensors) {
      const std::string ds = dataset_path(g.group, t.name);
      const std::vector<h5::VirtualPiece>& pieces = tiles[ds];
      int64_t covered = 0;
      for (size_t i = 0; i < pieces.size(); ++i) {
        covered += numel(pieces[i].extent);
        for (size_t j = 0; j < i; ++j)
          if (blocks_overlap(pieces[i], pieces[j]))
            return absl::InvalidArgumentError(absl::StrCat("checkpoint shards overlap on ", ds,
                                                           " (", pieces[i].file, " and ",
                                                           pieces[j].file, ")"));
      }
      if (covered != numel(t.shape))
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint shards cover ", covered, " of the ", numel(t.shape), " elements of ", ds));
    }
  }
  return tiles;
}

// Renames the finished `tmp` to `final_dir` (named `name`). An existing `final_dir` is moved
// aside when `latest` does not name it, swapped atomically when it does.
absl::Status install_step_dir(const std::string& root, const std::string& tmp,
                              const std::string& final_dir, const std::string& name,
                              const std::string& latest_name) {
  if (fs::exists(final_dir)) {
    if (name == latest_name) return fs::exchange_paths(tmp, final_dir);  // old one -> tmp
    std::string aside = fs::join(root, name + ".replaced" + kTmpSuffix);
    if (absl::Status st = fs::remove_all(aside); !st.ok()) return st;
    if (absl::Status st = fs::rename_path(final_dir, aside); !st.ok()) return st;
  }
  return fs::rename_path(tmp, final_dir);
}

// Points `latest` at `name`: write temp + fsync + rename + fsync root.
absl::Status write_latest(const std::string& root, const std::string& name) {
  std::string tmp = fs::join(root, kLatestTmpFile);
  if (absl::Status st = fs::write_file_durable(tmp, name + "\n"); !st.ok()) return st;
  if (absl::Status st = fs::rename_path(tmp, fs::join(root, kLatestFile)); !st.ok()) return st;
  return fs::fsync_path(root);
}

// Keeps the `keep_last` highest committed steps up to the one `latest_name` names; removes
// the older step_* dirs (renamed to *.deleting.tmp first) and every stale step_*.tmp /
// latest.tmp. Directories of steps above `latest` (left by a run that was rolled back to an
// earlier checkpoint) are neither counted nor deleted: the live run keeps its keep_last, and a
// later save of the same step replaces such a directory.
absl::Status apply_retention(const std::string& root, int keep_last,
                             const std::string& latest_name) {
  std::vector<std::pair<int64_t, std::string>> committed;  // (step, name)
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    std::string name = entry.path().filename().string();
    std::optional<int64_t> step = parse_step_dir_impl(name);
    if (step && entry.is_directory()) committed.emplace_back(*step, name);
  }
  if (ec) return absl::ErrnoToStatus(ec.value(), "cannot list " + root);
  const int64_t latest_step = parse_step_dir_impl(latest_name).value_or(INT64_MAX);
  std::erase_if(committed, [&](const auto& c) { return c.first > latest_step; });
  std::sort(committed.rbegin(), committed.rend());  // newest first
  for (size_t i = static_cast<size_t>(keep_last); i < committed.size(); ++i) {
    const std::string& name = committed[i].second;
    if (name == latest_name) continue;
    std::string doomed = fs::join(root, name + ".deleting" + kTmpSuffix);
    if (absl::Status st = fs::remove_all(doomed); !st.ok()) return st;
    if (absl::Status st = fs::rename_path(fs::join(root, name), doomed); !st.ok()) return st;
  }
  std::vector<std::string> stale;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    std::string name = entry.path().filename().string();
    if ((name.starts_with(kStepPrefix) && name.ends_with(kTmpSuffix)) || name == kLatestTmpFile) {
      stale.push_back(entry.path().string());
    }
  }
  if (ec) return absl::ErrnoToStatus(ec.value(), "cannot list " + root);
  for (const std::string& path : stale) {
    if (absl::Status st = fs::remove_all(path); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// Writes step_N.tmp completely (files, manifest, fsyncs) and returns its path.
absl::StatusOr<std::string> prepare_step_tmp(const SaveRequest& req, const std::string& name) {
  std::string tmp = fs::join(req.root, name + kTmpSuffix);
  if (absl::Status st = fs::remove_all(tmp); !st.ok()) return st;
  if (absl::Status st = fs::make_dirs(tmp); !st.ok()) return st;
  ModelFileContents contents{checkpoint_sets(req.params, req.exp_avg, req.exp_avg_sq),
                             req.state,
                             req.config_yaml,
                             req.layout_json,
                             {}};
  auto progress = [&req](size_t done, size_t total) {
    if (done == std::max<size_t>(1, total / 2)) crash_point("mid_tensors", req.step);
  };
  absl::StatusOr<std::vector<std::string>> files = write_step_files(contents, tmp, progress);
  if (!files.ok()) return files.status();
  crash_point("before_manifest", req.step);
  if (absl::Status st = write_manifest(tmp, req.step, *files); !st.ok()) return st;
  if (absl::Status st = fs::fsync_path(tmp); !st.ok()) return st;
  return tmp;
}

// The commit after step_N.tmp is complete: rename into place, `latest`, retention.
absl::Status publish(const std::string& root, int64_t step, int keep_last, const std::string& tmp,
                     const std::string& latest_name) {
  const std::string name = step_dir_name(step);
  const std::string final_dir = fs::join(root, name);
  crash_point("before_rename", step);
  if (absl::Status st = install_step_dir(root, tmp, final_dir, name, latest_name); !st.ok())
    return st;
  if (absl::Status st = fs::fsync_path(root); !st.ok()) return st;
  crash_point("before_latest", step);
  if (absl::Status st = write_latest(root, name); !st.ok()) return st;
  crash_point("before_cleanup", step);
  if (absl::Status st = apply_retention(root, keep_last, name); !st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("checkpoint ", final_dir,
                                     " was committed, but retention failed: ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<int64_t> parse_step_dir_name(std::string_view name) {
  return parse_step_dir_impl(name);
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return buf;
}

absl::Status save(const SaveRequest& req) {
  if (absl::Status st = validate_request(req); !st.ok()) return st;
  if (absl::Status st = fs::make_dirs(req.root); !st.ok()) return st;
  absl::StatusOr<std::string> latest_name = read_latest_name(req.root);
  if (!latest_name.ok()) return latest_name.status();
  absl::StatusOr<std::string> tmp = prepare_step_tmp(req, step_dir_name(req.step));
  if (!tmp.ok()) return tmp.status();
  return publish(req.root, req.step, req.keep_last, *tmp, *latest_name);
}

std::string save_tmp_dir(const std::string& root, int64_t step) {
  return fs::join(root, step_dir_name(step) + kTmpSuffix);
}

std::string shard_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard_%05d.h5", rank);
  return buf;
}

absl::StatusOr<std::string> begin_save(const std::string& root, int64_t step, int keep_last) {
  if (absl::Status st = validate_target(root, step, keep_last); !st.ok()) return st;
  if (absl::Status st = fs::make_dirs(root); !st.ok()) return st;
  if (absl::StatusOr<std::string> latest = read_latest_name(root); !latest.ok())
    return latest.status();
  std::string tmp = save_tmp_dir(root, step);
  if (absl::Status st = fs::remove_all(tmp); !st.ok()) return st;
  if (absl::Status st = fs::make_dirs(tmp); !st.ok()) return st;
  return tmp;
}

absl::StatusOr<fs::FileDigest> write_shard(const std::string& tmp_dir, int rank, int64_t step,
                                           uint64_t run_id, std::span<const ShardPiece> pieces) {
  for (const ShardPiece& p : pieces) {
    if (absl::Status st = validate_tensors({&p.ref, 1}, "shard"); !st.ok()) return st;
    if (absl::Status st = check_block(p.ref); !st.ok()) return st;
    if (p.ref.shape.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("shard tensor '", p.ref.name, "' is a scalar; shards hold blocks"));
  }
  auto progress = [step](size_t done, size_t total) {
    if (done == std::max<size_t>(1, total / 2)) crash_point("mid_tensors", step);
  };
  const std::string path = fs::join(tmp_dir, shard_file_name(rank));
  return write_shard_file(path, pieces, progress, {step, run_id});
}

absl::Status commit_save(const CommitRequest& req) {
  if (absl::Status st = validate_target(req.root, req.step, req.keep_last); !st.ok()) return st;
  if (absl::Status st = validate_state_step(req.step, req.state); !st.ok()) return st;
  if (absl::Status st = validate_tensors(req.tensors, "checkpoint", /*need_data=*/false); !st.ok())
    return st;
  absl::StatusOr<std::map<std::string, std::vector<h5::VirtualPiece>>> tiles =
      tile_tensors(req.tensors, req.shards);
  if (!tiles.ok()) return tiles.status();
  absl::StatusOr<std::string> latest_name = read_latest_name(req.root);
  if (!latest_name.ok()) return latest_name.status();
  const std::string tmp = save_tmp_dir(req.root, req.step);
  if (!fs::is_directory(tmp))
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint commit: ", tmp, " does not exist (begin_save was not called)"));
  std::map<std::string, fs::FileDigest> shard_digests;
  for (const ShardRecord& r : req.shards) shard_digests[shard_file_name(r.rank)] = r.digest;
  ModelFileContents contents{checkpoint_sets(req.tensors, req.tensors, req.tensors), req.state,
                             req.config_yaml, req.layout_json, *std::move(tiles)};
  absl::StatusOr<std::vector<std::string>> files = write_step_files(contents, tmp, nullptr);
  if (!files.ok()) return files.status();
  crash_point("before_manifest", req.step);
  if (absl::Status st = write_manifest(tmp, req.step, *files, shard_digests); !st.ok()) return st;
  if (absl::Status st = fs::fsync_path(tmp); !st.ok()) return st;
  return publish(req.root, req.step, req.keep_last, tmp, *latest_name);
}

absl::StatusOr<std::string> find_latest(const std::string& root) {
  absl::StatusOr<std::string> name = read_latest_name(root);
  if (!name.ok() || name->empty()) return name;
  std::string dir = fs::join(root, *name);
  if (!fs::is_directory(dir)) {
    return absl::DataLossError(absl::StrCat(fs::join(root, kLatestFile), " names ", *name, " but ",
                                            dir, " does not exist"));
  }
  if (!fs::exists(fs::join(dir, kManifestFile))) {
    return absl::DataLossError(absl::StrCat(fs::join(root, kLatestFile), " names ", *name, " but ",
                                            dir, " has no ", kManifestFile,
                                            ": it is not a committed checkpoint"));
  }
  return dir;
}

std::vector<std::string> committed_step_dirs(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    std::optional<int64_t> step = parse_step_dir_impl(name);
    if (step && entry.is_directory() && fs::exists(fs::join(entry.path().string(), kManifestFile)))
      found.emplace_back(*step, fs::join(root, name));
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> dirs;
  for (auto& [step, dir] : found) dirs.push_back(std::move(dir));
  return dirs;
}

absl::StatusOr<ResumePoint> find_resume_point(const std::string& root) {
  absl::StatusOr<std::string> name = read_latest_name(root);
  if (!name.ok()) return name.status();
  if (!name->empty()) {
    absl::StatusOr<std::string> latest = find_latest(root);
    if (!latest.ok()) return latest.status();
    return ResumePoint{*latest, ""};
  }
  const std::vector<std::string> dirs = committed_step_dirs(root);
  std::vector<std::string> failed;  // newer ones that do not check, and why
  for (const std::string& dir : dirs) {
    absl::StatusOr<Manifest> m = read_manifest(dir);  // manifest and sizes; crc32 comes after
    absl::Status st = m.ok() ? check_manifest_files(dir, *m, 0, 0) : m.status();
    if (st.ok()) {
      return ResumePoint{
          dir,
          absl::StrCat("checkpoint.dir '", root, "' has no '", kLatestFile,
                       "': resuming the newest committed checkpoint that checks, ", dir,
                       failed.empty()
                           ? ""
                           : absl::StrCat(" (passed over: ", absl::StrJoin(failed, "; "), ")"))};
    }
    failed.push_back(std::string(st.message()));
  }
  if (!dirs.empty())
    return absl::DataLossError(
        absl::StrCat("checkpoint.dir '", root, "' has no '", kLatestFile, "' and none of its ",
                     dirs.size(), " committed checkpoints checks (the newest: ", failed.front(),
                     "); resume one with --resume PATH, or start over with --resume none --force"));
  return ResumePoint{};
}

namespace {

// Moves the directories or files `paths` (inside root) into root/abandoned-<stamp>/, creating
// it (a suffix -2, -3, ... when it exists), and fsyncs both directories.
absl::StatusOr<std::vector<std::string>> move_aside(const std::string& root,
                                                    const std::vector<std::string>& paths,
                                                    const std::string& stamp) {
  if (paths.empty()) return std::vector<std::string>{};
  std::string aside = fs::join(root, kAbandonedPrefix + stamp);
  for (int n = 2; fs::exists(aside); ++n)
    aside = fs::join(root, absl::StrCat(kAbandonedPrefix, stamp, "-", n));
  if (absl::Status st = fs::make_dirs(aside); !st.ok()) return st;
  std::vector<std::string> moved;
  for (const std::string& p : paths) {
    const std::string to = fs::join(aside, std::filesystem::path(p).filename().string());
    if (absl::Status st = fs::rename_path(p, to); !st.ok()) return st;
    moved.push_back(to);
    crash_point("move_aside", static_cast<int64_t>(moved.size()));
  }
  if (absl::Status st = fs::fsync_path(aside); !st.ok()) return st;
  if (absl::Status st = fs::fsync_path(root); !st.ok()) return st;
  return moved;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> adopt_resume_point(const std::string& root,
                                                            const std::string& dir,
                                                            const std::string& stamp) {
  const std::filesystem::path d = std::filesystem::path(dir).lexically_normal();
  const std::string name = (d.has_filename() ? d : d.parent_path()).filename().string();
  const std::optional<int64_t> step = parse_step_dir_impl(name);
  if (!step) return absl::InvalidArgumentError(absl::StrCat(dir, " is not a step directory"));
  std::error_code ec;
  const bool in_root = std::filesystem::equivalent(fs::join(root, name), dir, ec);
  if (in_root) {
    absl::StatusOr<std::string> current = read_latest_name(root);
    if (!current.ok() || *current != name) {
      if (absl::Status st = write_latest(root, name); !st.ok()) return st;
    }
  }
  std::vector<std::string> newer;
  for (const std::string& c : committed_step_dirs(root))
    if (parse_step_dir_impl(std::filesystem::path(c).filename().string()).value_or(0) > *step)
      newer.push_back(c);
  return move_aside(root, newer, stamp);
}

absl::Status check_save_paths(const std::string& root, int64_t max_step, int world) {
  // abandoned-<%Y%m%dT%H%M%SZ>-<n> / step_<N>.replaced.tmp / the longest file name.
  const std::string aside = fs::join(root, absl::StrCat(kAbandonedPrefix, "20260101T000000Z-99"));
  const std::string step = fs::join(aside, step_dir_name(max_step) + ".replaced" + kTmpSuffix);
  const std::string manifest = absl::StrCat(kManifestFile, kTmpSuffix);
  const std::string shard = shard_file_name(std::max(world - 1, 0));
  const std::string file = fs::join(step, manifest.size() >= shard.size() ? manifest : shard);
  absl::Status st = fs::make_dirs(step);
  if (st.ok()) st = fs::write_file_durable(file, "probe");
  ::unlink(file.c_str());
  ::rmdir(step.c_str());
  ::rmdir(aside.c_str());
  if (st.ok()) return st;
  return absl::InvalidArgumentError(absl::StrCat(
      "checkpoint.dir '", root, "' cannot hold a checkpoint's paths (", file.size(),
      " characters, e.g. ", file, "): ", st.message(), "; choose a shorter checkpoint.dir"));
}

absl::StatusOr<std::vector<std::string>> abandon_checkpoints(const std::string& root,
                                                             const std::string& stamp) {
  // `latest` first: a crash after any move leaves no `latest` naming a moved directory, and
  // --resume auto continues from the newest step still there (the newest of all until the last
  // move). Then the step directories, oldest first.
  std::vector<std::string> paths;
  if (fs::exists(fs::join(root, kLatestFile))) paths.push_back(fs::join(root, kLatestFile));
  std::vector<std::string> steps = committed_step_dirs(root);
  paths.insert(paths.end(), steps.rbegin(), steps.rend());
  return move_aside(root, paths, stamp);
}

}  // namespace tr::ckpt
