#include "trainer/run/startup.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/fs_io.h"
#include "core/switches.h"
#include "data/dataset_meta.h"
#include "data/id_check.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "parallel/context_parallel.h"
#include "parallel/nccl_comm.h"
#include "trainer/checkpoint/hf.h"
#include "trainer/layout/flat_buffers.h"
#include "trainer/plan/memory_fit.h"
#include "trainer/plan/plan.h"

namespace tr {
namespace {

namespace fs = std::filesystem;

// `auto` runs on the CPU until the GPU path has been validated on hardware; `cuda` asks for
// the GPU explicitly. GPU ranks use the node's GPUs in node-local rank order; with NCCL each
// needs its own GPU, with parallel.comm=mpi several may share one.
absl::Status resolve_backend(Session& s) {
  std::string& b = s.cfg.train.backend;
  s.ctx = Ctx{};
  if (b != "cuda") {
    b = "cpu";
    return absl::OkStatus();
  }
  if (!cuda_built())
    return absl::InvalidArgumentError(
        "train.backend=cuda but this trainer was built without CUDA (TRAINER_CUDA=OFF or no nvcc); "
        "rebuild with -DTRAINER_CUDA=ON or set train.backend=cpu");
  if (!cuda::device_available())
    return absl::InvalidArgumentError(
        "train.backend=cuda but no CUDA device is visible (no driver, or CUDA_VISIBLE_DEVICES "
        "hides them); set train.backend=cpu");
  // Node-local rank order over the GPUs this process sees (one each when Slurm binds one GPU
  // per task); check_gpu_binding then refuses two NCCL ranks on one GPU.
  // The libraries this process loaded: printed (rank 0), and a cuDNN or cuBLASLt built for
  // another CUDA major refused before it fails inside a kernel.
  LibraryVersions versions = cuda::library_versions();
  versions.nccl = nccl_version();
  std::printf("gpu libraries: %s\n", describe(versions).c_str());
  if (absl::Status st = check_versions(versions); !st.ok()) return st;
  const int local_rank = s.mpi ? s.mpi->local_rank() : 0;
  s.gpu = local_rank % cuda::device_count();
  if (s.cfg.train.precision == "fp8") {
    const cuda::Fp8Support fp8 = cuda::fp8_support(s.gpu);
    if (!fp8.supported)
      return absl::InvalidArgumentError(absl::StrFormat(
          "train.precision=fp8 needs FP8 tensor cores (compute capability 8.9 or newer: H100, "
          "H200, B200, B300), and GPU %d is %s (%d.%d); set train.precision=bf16",
          s.gpu, fp8.name, fp8.major, fp8.minor));
  }
  s.device = std::make_unique<cuda::DeviceContext>(s.gpu, kCudaWorkspaceBytes);
  s.ctx = s.device->ctx();
  s.ctx.deterministic = s.cfg.train.deterministic;
  s.device_phases = DevicePhaseTimes::make(s.ctx);
  return absl::OkStatus();
}

// The end-of-document id that documents end at (data.document_mask, reset_position_ids,
// eod_mask_loss): data.eod_id, else the one prepare_data recorded for the training data.
absl::StatusOr<int32_t> document_eod(const Config& c) {
  if (c.data.eod_id >= 0) return static_cast<int32_t>(c.data.eod_id);
  for (const DataSource& src : c.data.train) {
    absl::StatusOr<std::optional<data::DatasetMeta>> meta = data::read_dataset_meta(src.path);
    if (!meta.ok()) return meta.status();
    if (meta->has_value() && (*meta)->eod_id >= 0) return (*meta)->eod_id;
  }
  return absl::InvalidArgumentError(
      "data.document_mask, reset_position_ids and eod_mask_loss need the end-of-document token "
      "id, and the training data records none (made without prepare_data's metadata); set "
      "data.eod_id");
}

// A loader's options for the rank at `topo` of a run of `cfg`.
absl::StatusOr<data::LoaderOptions> loader_options(const Config& cfg, const Topology& topo,
                                                   const std::vector<DataSource>& srcs,
                                                   bool shuffle) {
  data::LoaderOptions o;
  for (const DataSource& src : srcs) o.paths.push_back({src.path, src.weight});
  absl::StatusOr<data::SourceFormat> fmt = data::parse_source_format(cfg.data.format);
  if (!fmt.ok()) return fmt.status();
  o.format = *fmt;
  o.seq_len = cfg.data.seq_len;
  o.seed = static_cast<uint64_t>(cfg.data.seed);
  o.shuffle = shuffle;
  o.dp_rank = topo.dp_rank;
  o.dp_size = topo.dp;
  if (topo.cp > 1) o.positions = cp_positions(o.seq_len, topo.cp, topo.cp_rank);
  o.global_batch = cfg.train.global_batch;
  o.micro_batch = cfg.train.micro_batch;
  o.consumed_samples = 0;  // the train loader is reset to the checkpoint's count on resume
  o.vocab_size = cfg.model.vocab_size;
  if (cfg.data.documents()) {
    absl::StatusOr<int32_t> eod = document_eod(cfg);
    if (!eod.ok()) return eod.status();
    o.eod_id = *eod;
    o.doc_starts = cfg.data.document_mask == "block_causal";
    o.reset_positions = cfg.data.reset_position_ids;
    o.mask_after_eod = cfg.data.eod_mask_loss;
  }
  return o;
}
absl::StatusOr<data::LoaderOptions> loader_options(const Session& s,
                                                   const std::vector<DataSource>& srcs,
                                                   bool shuffle) {
  return loader_options(s.cfg, s.topo(), srcs, shuffle);
}

absl::StatusOr<std::unique_ptr<data::DataLoader>> make_loader(const Session& s,
                                                              const std::vector<DataSource>& srcs,
                                                              bool shuffle) {
  absl::StatusOr<data::LoaderOptions> o = loader_options(s, srcs, shuffle);
  if (!o.ok()) return o.status();
  return data::DataLoader::create(*o);
}

// The datasets' tokenizer (PREFIX.meta.json, written by prepare_data) against the model: ids
// that do not fit model.vocab_size, byte data under a preset, or datasets from two tokenizers
// are bad input. Datasets made elsewhere carry no metadata and are not checked. With `say`, a
// data.eod_id other than the metadata's end-of-document id is a warning line.
absl::Status check_data_tokenizer(const Config& c, bool say) {
  std::optional<data::DatasetMeta> first;
  std::string first_path;
  for (const std::vector<DataSource>* list : {&c.data.train, &c.data.valid})
    for (const DataSource& src : *list) {
      absl::StatusOr<std::optional<data::DatasetMeta>> meta = data::read_dataset_meta(src.path);
      if (!meta.ok()) return meta.status();
      if (!meta->has_value()) continue;
      const data::DatasetMeta& m = **meta;
      if (m.vocab_size > c.model.vocab_size)
        return absl::InvalidArgumentError(
            absl::StrCat("data ", src.path, " was made by ", m.describe(),
                         ": its ids do not fit model.", "vocab_size ", c.model.vocab_size,
                         "; tokenize with the model's tokenizer, or use a "
                         "model whose vocab_size is at least ",
                         m.vocab_size));
      if (m.tokenizer == "byte" && !c.model.preset.empty() && !c.data.allow_byte_tokenizer)
        return absl::InvalidArgumentError(
            absl::StrCat("data ", src.path, " was made by the byte tokenizer, but model.preset is ",
                         c.model.preset,
                         "; tokenize with prepare_data --tokenizer path/to/tokenizer.json, or "
                         "set data.allow_byte_tokenizer: true if byte tokens are intended"));
      if (first && !first->same_tokenizer(m))
        return absl::InvalidArgumentError(absl::StrCat("data ", src.path, " was made by ",
                                                       m.describe(), " but ", first_path, " by ",
                                                       first->describe(),
                                                       "; every dataset of a run must come from "
                                                       "one tokenizer"));
      if (say && !first && c.data.documents() && c.data.eod_id >= 0 && m.eod_id >= 0 &&
          m.eod_id != c.data.eod_id)
        std::printf(
            "warning: data.eod_id %lld is not the end-of-document id %d that %s records; "
            "documents end at data.eod_id (set it to -1 to use the metadata's)\n",
            static_cast<long long>(c.data.eod_id), m.eod_id,
            data::dataset_meta_path(src.path).c_str());
      if (!first) {
        first = m;
        first_path = src.path;
      }
    }
  return absl::OkStatus();
}

// The checkpoint to resume from: "" = start fresh. Never a fresh start over committed
// checkpoints unless asked for with --resume none --force (then s.start_over is set).
absl::StatusOr<std::string> resume_path(Session& s) {
  const std::string& how = s.opts.resume;
  const std::string& root = s.cfg.checkpoint.dir;
  // A directory, or nothing yet (it is created once every input has checked out).
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(root, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    return absl::InvalidArgumentError(absl::StrCat("checkpoint.dir '", root,
                                                   "' cannot be used: ", ec.message(),
                                                   "; choose another checkpoint.dir"));
  if (std::filesystem::exists(st) && !std::filesystem::is_directory(st))
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint.dir '", root, "' is a file, not a directory; choose another checkpoint.dir"));
  if (how == "auto") {
    absl::StatusOr<ckpt::ResumePoint> p = ckpt::find_resume_point(root);
    if (!p.ok()) return p.status();
    if (!p->note.empty()) std::printf("note: %s\n", p->note.c_str());
    return p->dir;
  }
  if (how == "none") {
    const std::vector<std::string> held = ckpt::committed_step_dirs(root);
    const absl::StatusOr<std::string> latest = ckpt::find_latest(root);  // also a dangling one
    if (held.empty() && latest.ok() && latest->empty()) return std::string();
    if (s.opts.force) {
      s.start_over = true;
      return std::string();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "--resume none but checkpoint.dir '", root, "' already holds checkpoints",
        held.empty() ? "" : absl::StrCat(" (newest ", held.front(), ")"),
        "; pass --resume auto to continue them, --force to start over (they are moved to ", root,
        "/abandoned-TIME/), or choose another checkpoint.dir"));
  }
  if (!fs::is_directory(how))
    return absl::InvalidArgumentError(
        absl::StrCat("--resume ", how, ": no such checkpoint directory"));
  fs::path dir = fs::path(how).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "x/step_00000010/"
  if (!ckpt::parse_step_dir_name(dir.filename().string()))
    return absl::InvalidArgumentError(absl::StrCat(
        "--resume ", how,
        ": not a committed checkpoint directory (expected CHECKPOINT_DIR/step_NNNNNNNN)"));
  return how;
}

// log.dir on rank 0 (it writes metrics.jsonl and config.yaml there): created and writable,
// before checkpoint.dir is touched, so that a bad log.dir leaves nothing behind it.
absl::Status check_log_dir(const Session& s) {
  if (s.topo().rank != 0) return absl::OkStatus();
  const std::string& dir = s.cfg.log.dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec && !std::filesystem::is_directory(dir, ec))
    ec = std::make_error_code(std::errc::not_a_directory);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat(
        "log.dir '", dir, "' cannot be created: ", ec.message(), "; choose another log.dir"));
  const std::string probe = absl::StrCat(dir, "/.write-test-", static_cast<long>(getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int err = errno;
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  if (fd < 0)
    return absl::InvalidArgumentError(absl::StrCat("log.dir '", dir,
                                                   "' is not writable: ", std::strerror(err),
                                                   "; fix its permissions or choose another "
                                                   "log.dir"));
  return absl::OkStatus();
}

// checkpoint.dir is writable by this rank and, seen from rank 0, has room for a checkpoint:
// found at start-up, not at the first save hours into the run.
absl::Status check_checkpoint_dir(const Session& s) {
  const std::string& dir = s.cfg.checkpoint.dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("checkpoint.dir '", dir,
                                                   "' cannot be created: ", ec.message(),
                                                   "; choose another checkpoint.dir"));
  const std::string probe =
      absl::StrCat(dir, "/.write-test-", s.topo().rank, "-", static_cast<long>(getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  bool ok = fd >= 0 && ::write(fd, "x", 1) == 1 && ::fsync(fd) == 0;
  const int err = errno;
  if (fd >= 0) ok = (::close(fd) == 0) && ok;
  ::unlink(probe.c_str());
  if (!ok)
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint.dir '", dir, "' is not writable (rank ", s.topo().rank, " on ",
                     tr::fs::host_name(), "): ", std::strerror(err),
                     "; fix its permissions or choose another checkpoint.dir"));
  if (s.topo().rank != 0) return absl::OkStatus();
  if (absl::Status st = ckpt::check_save_paths(dir, s.cfg.train.steps, s.topo().world); !st.ok())
    return st;
  struct statvfs fsinfo {};
  if (statvfs(dir.c_str(), &fsinfo) != 0) return absl::OkStatus();  // unknown: not an error
  const double free_bytes =
      static_cast<double>(fsinfo.f_bavail) * static_cast<double>(fsinfo.f_frsize);
  const double need = checkpoint_bytes(s.cfg, s.topo());
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (free_bytes < need)
    return absl::InvalidArgumentError(absl::StrFormat(
        "checkpoint.dir '%s' has %.3g GiB free, less than one checkpoint (%.3g GiB); free some "
        "space or choose another checkpoint.dir",
        dir, free_bytes / gib, need / gib));
  const double keep = static_cast<double>(s.cfg.checkpoint.keep_last + 1);
  if (free_bytes < keep * need)
    std::printf(
        "warning: checkpoint.dir '%s' has %.3g GiB free, room for %d checkpoints of %.3g GiB; "
        "checkpoint.keep_last=%lld needs %.0f during a save\n",
        dir.c_str(), free_bytes / gib, static_cast<int>(free_bytes / need), need / gib,
        static_cast<long long>(s.cfg.checkpoint.keep_last), keep);
  return absl::OkStatus();
}

// With node-local checkpoints, checkpoint.local_dir can be made on this rank's node and has room
// for the parts its ranks keep there: checkpoint.local_keep of them and one being written
// (rank_state_bytes each; GPU ranks keep separate masters), and checkpoint.local_replicas times
// as many replicas of other nodes' parts when the job spans nodes.
absl::Status check_local_dir(const Session& s) {
  if (s.cfg.checkpoint.local_interval <= 0) return absl::OkStatus();
  const std::string& dir = s.cfg.checkpoint.local_dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint.local_dir '", dir, "' cannot be created on ", tr::fs::host_name(), ": ",
        ec.message(), "; choose another checkpoint.local_dir or set checkpoint.local_interval=0"));
  struct statvfs fsinfo {};
  if (statvfs(dir.c_str(), &fsinfo) != 0) return absl::OkStatus();  // unknown: not an error
  const double free_bytes =
      static_cast<double>(fsinfo.f_bavail) * static_cast<double>(fsinfo.f_frsize);
  const int ranks_here = s.mpi ? s.mpi->local_size() : 1;
  const double part = rank_state_bytes(s.cfg, s.topo(), s.ctx.device == Device::cuda);
  // A job over several nodes holds replicas of other nodes' parts too.
  const int nodes = (s.topo().world + ranks_here - 1) / ranks_here;
  const double copies = 1 + s.cfg.checkpoint.local_replicas_on(nodes);
  const double need =
      static_cast<double>(s.cfg.checkpoint.local_keep + 1) * part * ranks_here * copies;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (free_bytes < need)
    return absl::InvalidArgumentError(absl::StrFormat(
        "checkpoint.local_dir '%s' on %s has %.3g GiB free, less than the %.3g GiB its %d "
        "rank%s keep there (checkpoint.local_keep=%lld and one being written, %.3g GiB each%s); "
        "free some space, lower checkpoint.local_keep or choose another checkpoint.local_dir",
        dir, tr::fs::host_name(), free_bytes / gib, need / gib, ranks_here,
        ranks_here == 1 ? "" : "s", static_cast<long long>(s.cfg.checkpoint.local_keep), part / gib,
        copies > 1
            ? absl::StrFormat(", and %g times as many replicas of other nodes' parts", copies - 1)
            : ""));
  return absl::OkStatus();
}

// What this rank may allocate: the host's available memory shared by the job's ranks there, and
// its GPU's free memory shared by the ranks on it (several only with parallel.comm=mpi).
MemoryBudget memory_budget(const Session& s) {
  MemoryBudget b;
  b.host_available = host_memory_available();
  b.ranks_on_host = s.mpi ? s.mpi->local_size() : 1;
  if (s.ctx.device == Device::cuda) {
    b.device_available = device_info(s.ctx).memory_free_mib * 1024.0 * 1024.0;
    const int gpus = std::max(1, cuda::device_count());
    b.ranks_on_device = (b.ranks_on_host + gpus - 1) / gpus;
  }
  return b;
}

// Where a run remembers the data files whose ids it checked (data/id_check.h).
constexpr char kIdCacheFile[] = "data-ids-checked.json";

// With data.eod_mask_loss a target is kept only after a token other than the end-of-document
// one: training data of nothing else (`ranges`: the train files' first, from the id scan) gives
// no step anything to learn, and is refused.
absl::Status check_some_target(const Config& c, const std::vector<data::IdRange>& ranges) {
  if (!c.data.eod_mask_loss) return absl::OkStatus();
  absl::StatusOr<int32_t> eod = document_eod(c);
  if (!eod.ok()) return eod.status();
  std::vector<std::string> paths;
  for (size_t i = 0; i < c.data.train.size(); ++i) {
    if (i >= ranges.size() || !ranges[i].only(*eod)) return absl::OkStatus();
    paths.push_back(c.data.train[i].path);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "data.train (", absl::StrJoin(paths, ", "), ") holds no token but the end-of-document ", *eod,
      ", so with data.eod_mask_loss every target is masked and no step has anything to "
      "learn; train on other data, or check data.eod_id"));
}

// Rank 0 checks every token id of the training (and, with evaluation, validation) files against
// model.vocab_size before any training; the other ranks learn of a bad file in the agreement
// after check_inputs. Returns the cache to store in checkpoint.dir ("" on other ranks).
absl::StatusOr<std::string> check_all_token_ids(const Session& s) {
  if (s.groups.world->rank() != 0) return std::string();
  std::vector<std::string> paths;
  for (const DataSource& src : s.cfg.data.train) paths.push_back(src.path);
  if (s.cfg.train.eval_interval > 0)
    for (const DataSource& src : s.cfg.data.valid) paths.push_back(src.path);
  absl::StatusOr<data::SourceFormat> fmt = data::parse_source_format(s.cfg.data.format);
  if (!fmt.ok()) return fmt.status();
  absl::StatusOr<std::string> cache =
      tr::fs::read_file(tr::fs::join(s.cfg.checkpoint.dir, kIdCacheFile));
  absl::StatusOr<data::IdCheck> ids =
      data::check_token_ids(paths, *fmt, s.cfg.model.vocab_size, cache.ok() ? *cache : "");
  if (!ids.ok()) return ids.status();
  if (absl::Status st = check_some_target(s.cfg, ids->ranges); !st.ok()) return st;
  const bool gb = ids->bytes_scanned >= 1e9;
  if (ids->scanned > 0)
    std::printf(
        "data: every token id of %d file(s) is below vocab_size %lld (%.1f %s read in %.1f s; "
        "%d more checked before)\n",
        ids->scanned, static_cast<long long>(s.cfg.model.vocab_size),
        ids->bytes_scanned / (gb ? 1e9 : 1e6), gb ? "GB" : "MB", ids->seconds, ids->cached);
  std::fflush(stdout);  // ahead of any error line on stderr
  return ids->cache_json;
}

// The datasets' tokenizer against the model, and the batch arithmetic of the layout.
absl::Status check_tokenizer_and_batch(const Session& s) {
  if (absl::Status st = check_data_tokenizer(s.cfg, s.topo().rank == 0); !st.ok()) return st;
  absl::StatusOr<data::LoaderOptions> batch = loader_options(s, s.cfg.data.train, true);
  if (!batch.ok()) return batch.status();
  return data::validate_loader_options(*batch);
}

// The run's loaders (every data file opened and validated; validation's only when evaluating),
// then every token id (rank 0); returns the id check's record for checkpoint.dir.
absl::StatusOr<std::string> open_data(Session& s) {
  absl::StatusOr<std::unique_ptr<data::DataLoader>> train = make_loader(s, s.cfg.data.train, true);
  if (!train.ok()) return train.status();
  s.train = std::move(*train);
  if (s.cfg.train.eval_interval > 0) {
    absl::StatusOr<std::unique_ptr<data::DataLoader>> valid =
        make_loader(s, s.cfg.data.valid, false);
    if (!valid.ok()) return valid.status();
    s.valid = std::move(*valid);
  }
  return check_all_token_ids(s);
}

// Rank 0 takes checkpoint.dir (and log.dir, when that is another directory) for this run, and
// stores which data files' ids it checked. A directory in use by a live trainer is busy.
absl::Status lock_run_dirs(Session& s, const std::string& ids_checked) {
  std::string note;
  absl::StatusOr<std::unique_ptr<ckpt::DirLock>> lock =
      ckpt::DirLock::acquire(s.cfg.checkpoint.dir, ckpt::LockOptions{}, &note);
  if (!lock.ok()) return lock.status();
  s.lock = std::move(*lock);
  if (!note.empty()) std::printf("note: %s\n", note.c_str());
  // Two runs must not append to one metrics.jsonl either.
  std::error_code ec;
  if (!std::filesystem::equivalent(s.cfg.log.dir, s.cfg.checkpoint.dir, ec)) {
    ckpt::LockOptions o;
    o.what = "log.dir";
    std::string log_note;
    absl::StatusOr<std::unique_ptr<ckpt::DirLock>> log_lock =
        ckpt::DirLock::acquire(s.cfg.log.dir, o, &log_note);
    if (!log_lock.ok()) return log_lock.status();
    s.log_lock = std::move(*log_lock);
    if (!log_note.empty()) std::printf("note: %s\n", log_note.c_str());
  }
  // What was checked, for the next start (a failure to write it costs a re-scan, no more).
  if (!ids_checked.empty() &&
      !tr::fs::write_file_atomic(tr::fs::join(s.cfg.checkpoint.dir, kIdCacheFile), ids_checked)
           .ok())
    std::printf("warning: cannot write %s/%s: the data's ids are scanned again next time\n",
                s.cfg.checkpoint.dir.c_str(), kIdCacheFile);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AttentionSpan> measure_attention_span(const Config& cfg) {
  absl::StatusOr<data::LoaderOptions> o = loader_options(cfg, Topology{}, cfg.data.train, true);
  if (!o.ok()) return o.status();
  const int64_t samples = std::clamp<int64_t>((int64_t{4} << 20) / cfg.data.seq_len, 8, 256);
  o->global_batch = o->micro_batch = samples;
  absl::StatusOr<data::SampleSpace> space = data::open_sample_space(*o);
  if (!space.ok()) return space.status();
  absl::StatusOr<data::StepBatch> step = data::make_step_batch(*space, *o, 0);  // no thread
  if (!step.ok()) return step.status();
  double sq = 0, tokens = 0;
  for (const data::MicroBatch& mb : step->micro_batches) {
    sq += mb.docs.doc_len_sq;
    tokens += static_cast<double>(mb.inputs.size());
  }
  return AttentionSpan{tokens > 0 ? sq / tokens : static_cast<double>(cfg.data.seq_len), samples};
}

// See trainer/run/startup.h.
absl::Status check_inputs(Session& s) {
  absl::StatusOr<Config> cfg = load_config(s.opts.config, s.opts.sets);
  if (!cfg.ok()) return cfg.status();
  s.cfg = *cfg;
  const Comm& world = *s.groups.world;
  absl::StatusOr<RunLayout> layout = run_layout(s.cfg, world.size(), world.rank());
  if (!layout.ok()) return layout.status();
  s.layout = *layout;
  if (absl::Status st = resolve_backend(s); !st.ok()) return st;
  absl::StatusOr<std::string> resume = resume_path(s);
  if (!resume.ok()) return resume.status();
  s.resume_from = *resume;
  // Sizes of every file on every rank; each file's crc32 on one rank (a shard file on the rank
  // that wrote it, which under the same layout reads its blocks next), so a 128-rank job reads
  // the checkpoint once, not 128 times.
  if (!s.resume_from.empty()) {
    if (absl::Status st = ckpt::verify(s.resume_from, world.rank(), world.size()); !st.ok())
      return st;
  }
  if (!s.cfg.model.init_from.empty()) {
    if (!s.resume_from.empty()) {
      if (world.rank() == 0)
        std::printf("note: model.init_from %s is ignored: resuming from %s\n",
                    s.cfg.model.init_from.c_str(), s.resume_from.c_str());
    } else {
      absl::StatusOr<st::Reader> hf = open_hf_model(s.cfg.model.init_from, s.cfg, s.topo());
      if (!hf.ok()) return hf.status();
      s.init_from = std::make_unique<st::Reader>(std::move(*hf));
    }
  }
  // Before the loaders prefetch and the model allocates: the data's tokenizer and the batch
  // arithmetic, then whether the run fits this rank's memory.
  if (absl::Status st = check_tokenizer_and_batch(s); !st.ok()) return st;
  if (absl::Status st = check_memory(s.cfg, s.layout, s.ctx.device, memory_budget(s),
                                     switch_on(Switch::test_compute_copy),
                                     setting_int(Setting::loss_chunk_tokens));
      !st.ok())
    return st;
  absl::StatusOr<std::string> ids_checked = open_data(s);
  if (!ids_checked.ok()) return ids_checked.status();
  // Last, once everything else checked out: rank 0 takes log.dir and checkpoint.dir (a dry run
  // writes nothing). A directory in use by a live trainer is busy (exit 6).
  if (!s.opts.dry_run) {
    if (absl::Status st = check_log_dir(s); !st.ok()) return st;
    if (absl::Status st = check_checkpoint_dir(s); !st.ok()) return st;
    if (absl::Status st = check_local_dir(s); !st.ok()) return st;
  }
  if (world.rank() == 0 && !s.opts.dry_run) return lock_run_dirs(s, *ids_checked);
  return absl::OkStatus();
}

absl::Status check_inputs_for_world(Session& s, int world, const GpuSpec& gpu, int gpus_per_node) {
  absl::StatusOr<Config> cfg = load_config(s.opts.config, s.opts.sets);
  if (!cfg.ok()) return cfg.status();
  s.cfg = *cfg;
  if (world % gpus_per_node != 0 && world > gpus_per_node)
    return absl::InvalidArgumentError(absl::StrCat("--world ", world,
                                                   " is not a whole number of nodes of "
                                                   "--gpus-per-node ",
                                                   gpus_per_node));
  const int per_node = std::min(world, gpus_per_node);
  absl::StatusOr<RunLayout> layout = run_layout(s.cfg, world, 0);  // world rank 0's view
  if (!layout.ok()) return layout.status();
  s.layout = *layout;
  absl::StatusOr<std::string> resume = resume_path(s);
  if (!resume.ok()) return resume.status();
  s.resume_from = *resume;
  if (!s.resume_from.empty())
    if (absl::Status st = ckpt::verify(s.resume_from); !st.ok()) return st;
  if (!s.cfg.model.init_from.empty() && s.resume_from.empty())
    if (absl::StatusOr<st::Reader> hf = open_hf_model(s.cfg.model.init_from, s.cfg, s.topo());
        !hf.ok())
      return hf.status();
  if (absl::Status st = check_tokenizer_and_batch(s); !st.ok()) return st;
  if (absl::StatusOr<std::string> ids = open_data(s); !ids.ok()) return ids.status();
  // Block-causal attention planned over the data's documents, as trainer plan does.
  double span = 0;
  if (s.cfg.data.document_mask == "block_causal")
    if (absl::StatusOr<AttentionSpan> m = measure_attention_span(s.cfg); m.ok()) span = m->keys;
  absl::StatusOr<Plan> plan = make_plan(s.cfg, gpu, world / per_node, per_node, {}, span);
  if (!plan.ok()) return plan.status();
  const std::string text = format_plan(s.cfg, *plan);
  if (!plan->fits) {
    const size_t at = text.find("verdict: does not fit: ");
    const std::string verdict =
        at == std::string::npos ? "" : text.substr(at + 23, text.find('\n', at) - at - 23);
    return absl::InvalidArgumentError(absl::StrCat(
        world, " ranks of ", gpu.name, ": the run does not fit: ", verdict,
        plan->cp_needed > 0 ? absl::StrCat("; parallel.cp=", plan->cp_needed, " would fit") : "",
        "; trainer plan --config ", s.opts.config, " --gpu ", gpu.name, " --nodes ",
        world / per_node, " shows each stage"));
  }
  std::printf("%sdry run for %d ranks of %s: config, layout, data and memory check out\n",
              text.c_str(), world, gpu.name.c_str());
  return absl::OkStatus();
}

}  // namespace tr
