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
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/manifest.h"
#include "checkpoint/model_file.h"
#include "kernels/core/fs_io.h"

namespace tr::ckpt {
namespace {

constexpr char kLatestFile[] = "latest";
constexpr char kLatestTmpFile[] = "latest.tmp";
constexpr char kConfigFile[] = "config.yaml";
constexpr char kLayoutFile[] = "layout.json";
constexpr char kStepPrefix[] = "step_";
constexpr char kTmpSuffix[] = ".tmp";
constexpr char kCrashEnv[] = "TR_TEST_CRASH_POINT";
constexpr size_t kStepDigits = 8;  // step_%08lld

// Test hook: dies by SIGKILL (no cleanup, no flush: like a node failure) when
// TR_TEST_CRASH_POINT names `stage`, or is "stage@N" and this save is of step N.
void crash_point(const char* stage, int64_t step) {
  const char* want = std::getenv(kCrashEnv);
  if (want == nullptr) return;
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

absl::Status validate_request(const SaveRequest& req) {
  if (req.root.empty()) return absl::InvalidArgumentError("checkpoint root directory is empty");
  if (req.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint step ", req.step, " is negative"));
  }
  if (req.state.step != req.step) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint step ", req.step, " differs from state.step ", req.state.step));
  }
  if (req.keep_last < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint keep_last is ", req.keep_last,
        "; it must be >= 2 so the previous checkpoint survives while the next is written"));
  }
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
absl::StatusOr<std::vector<std::string>> write_step_files(const SaveRequest& req,
                                                          const std::string& dir) {
  ModelFileContents contents{checkpoint_sets(req.params, req.exp_avg, req.exp_avg_sq), req.state,
                             req.config_yaml, req.layout_json};
  auto progress = [&req](size_t done, size_t total) {
    if (done == std::max<size_t>(1, total / 2)) crash_point("mid_tensors", req.step);
  };
  std::string h5_path = fs::join(dir, kModelFile);
  if (absl::Status st = write_model_file(h5_path, contents, progress); !st.ok()) return st;
  if (absl::Status st = fs::fsync_path(h5_path); !st.ok()) return st;
  const std::pair<const char*, const std::string*> texts[] = {{kConfigFile, &req.config_yaml},
                                                              {kLayoutFile, &req.layout_json}};
  for (auto [name, text] : texts) {
    if (absl::Status st = fs::write_file_durable(fs::join(dir, name), *text); !st.ok()) return st;
  }
  return std::vector<std::string>{kModelFile, kConfigFile, kLayoutFile};
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
  absl::StatusOr<std::vector<std::string>> files = write_step_files(req, tmp);
  if (!files.ok()) return files.status();
  crash_point("before_manifest", req.step);
  if (absl::Status st = write_manifest(tmp, req.step, *files); !st.ok()) return st;
  if (absl::Status st = fs::fsync_path(tmp); !st.ok()) return st;
  return tmp;
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
  std::string name = step_dir_name(req.step);
  std::string final_dir = fs::join(req.root, name);

  absl::StatusOr<std::string> tmp = prepare_step_tmp(req, name);
  if (!tmp.ok()) return tmp.status();
  crash_point("before_rename", req.step);
  if (absl::Status st = install_step_dir(req.root, *tmp, final_dir, name, *latest_name); !st.ok()) {
    return st;
  }
  if (absl::Status st = fs::fsync_path(req.root); !st.ok()) return st;
  crash_point("before_latest", req.step);
  if (absl::Status st = write_latest(req.root, name); !st.ok()) return st;
  crash_point("before_cleanup", req.step);
  if (absl::Status st = apply_retention(req.root, req.keep_last, name); !st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("checkpoint ", final_dir,
                                     " was committed, but retention failed: ", st.message()));
  }
  return absl::OkStatus();
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

}  // namespace tr::ckpt
