// The trainer as a job (no hang outlives its timeout, shutdown always saves): a hung
// rank ends the job within parallel.timeout_s, a stop signal is acted on at a micro-batch
// boundary and saves, the exit codes tell finished from stopped, checkpoint.dir problems are
// found at start-up, a full disk is one line, and stragglers are named.
#include <sys/mount.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "tests/cli_util.h"
#include "trainer/config/cli.h"
#include "trainer/layout/flat_buffers.h"

namespace tr {
namespace {

using test::CmdResult;
using test::read_checkpoint;
using test::run_cmd;
using test::RunDir;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The lines of `out` that contain `what`.
int count_lines_with(const std::string& out, const std::string& what) {
  int n = 0;
  for (size_t at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) ++n;
  return n;
}

// No process whose command line names `dir` is left (the hung rank was killed too).
bool no_process_left(const std::string& dir) {
  return run_cmd("pgrep -f '[t]rainer --config " + dir + "'").output.empty();  // not this shell
}

// A tmpfs of `bytes` at `dir` (read-only with ro), unmounted at the end of the test. The tests
// run as root (CI and the GPU machine): a failed mount is a failure, not a skip.
struct Tmpfs {
  std::string dir;
  Tmpfs(const std::string& at, size_t bytes, bool ro = false) : dir(at) {
    std::filesystem::create_directories(dir);
    const std::string opts = "size=" + std::to_string(bytes);
    const int rc = mount("tmpfs", dir.c_str(), "tmpfs",
                         ro ? static_cast<unsigned long>(MS_RDONLY) : 0, opts.c_str());
    INFO("mount tmpfs at " << dir << ": " << std::strerror(errno)
                           << " (these tests need root, as CI has)");
    REQUIRE(rc == 0);
  }
  ~Tmpfs() { umount2(dir.c_str(), MNT_DETACH); }
};

// A rank stopped with SIGSTOP (as `kill -STOP` does) leaves the others waiting in a collective:
// the MPI watchdog ends the job after parallel.timeout_s with one line naming the rank, group
// and operation, and exit code 5; mpirun kills the stopped rank too.
TEST_CASE("jobs: a stopped rank under mpirun ends the job after parallel.timeout_s, exit 5",
          "[cli][mpi]") {
  RunDir run(1000);
  const auto t0 = std::chrono::steady_clock::now();
  CmdResult r = run.mpirun(2, "--set parallel.timeout_s=10", "TR_TEST_FAULT=hang:3:1:1");
  const double took = seconds_since(t0);
  INFO(r.output);
  CHECK(r.exit_code == kExitCommTimeout);
  CHECK(took > 10);
  CHECK(took < 50);
  CHECK(r.output.find("[rank 0 host ") != std::string::npos);
  // Rank 1 stops after the step's first agreement; rank 0 waits in the step's stop poll.
  CHECK(r.output.find("] error: MPI wait_all in group world (this rank is 0 of 2) unfinished "
                      "after 10 s") != std::string::npos);
  CHECK(r.output.find("(parallel.timeout_s=10): a rank of the group is hung") != std::string::npos);
  CHECK(count_lines_with(r.output, "error:") == 1);
  CHECK(no_process_left(run.dir.path()));
}

// A SIGTERM raised inside step 4 (after its start) is seen by the first stop poll: on 2 pipeline
// stages with 8 micro-batches the step is cut after 2 of them, step 3 is saved, the run exits 3;
// resumed, it ends bit-identical to a run never stopped.
TEST_CASE("jobs: a signal within a step stops at a micro-batch boundary, saves, exits 3",
          "[cli][mpi]") {
  const std::string pp = "--set parallel.pp=2 --set train.micro_batch=1";
  RunDir stopped(6), clean(6);
  CmdResult r = stopped.mpirun(2, pp, "TR_TEST_FAULT=sigterm:4:1:1 TR_TRACE_PIPELINE=1");
  INFO(r.output);
  REQUIRE(r.exit_code == kExitStopped);
  CHECK(r.output.find("stopped by signal 15 (Terminated) within step 4 at a micro-batch boundary "
                      "(not applied); last checkpoint: step 3; resume with --resume auto") !=
        std::string::npos);
  // Step 4's trace: each stage ran micro-batches 0 and 1 only (lag = pp = 2).
  CHECK(r.output.find("pipeline stage 0 executed: F0 F1 B0 B1\n") != std::string::npos);
  CHECK(r.output.find("pipeline stage 1 executed: F0 B0 F1 B1\n") != std::string::npos);
  CHECK(stopped.metrics().size() == 3);
  REQUIRE(*ckpt::find_latest(stopped.dir / "ckpt") == stopped.dir / "ckpt/step_00000003");
  CmdResult resumed = stopped.mpirun(2, pp);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == kExitOk);
  REQUIRE(clean.mpirun(2, pp).exit_code == kExitOk);
  test::check_same_checkpoint(stopped.config, stopped.dir / "ckpt/step_00000006", clean.config,
                              clean.dir / "ckpt/step_00000006");
}

// SIGUSR1 to mpirun: mpirun passes it on to every rank and waits (SIGTERM to mpirun kills the
// ranks a second later: README). The ranks save the step they are in and exit 3; so does mpirun.
TEST_CASE("jobs: SIGUSR1 to mpirun saves the last step on every rank and exits 3", "[cli][mpi]") {
  RunDir run(100000);
  CmdResult r = run.signal_when_training(
      std::string(test::kOneThread) + " " + tr::test::mpirun() + " 2", "USR1");
  INFO(r.output);
  REQUIRE(r.exit_code == kExitStopped);
  CHECK(r.output.find("stopped by signal 10 (User defined signal 1) ") != std::string::npos);
  test::check_latest_is_last_logged_step(run);
}

// A stop signal during an evaluation (here one of a million batches, hours long) is acted on
// before the next evaluation batch on every rank, with the same agreement as in training: the
// last applied step is saved and the run exits 3 within seconds; no validation loss is logged.
TEST_CASE("jobs: a stop signal during evaluation saves the last step and exits 3", "[cli][mpi]") {
  RunDir run(20);
  const std::string log = run.dir / "log/metrics.jsonl";
  const auto t0 = std::chrono::steady_clock::now();
  CmdResult r =
      run_cmd("sh -c '" + std::string(test::kOneThread) + " " + tr::test::mpirun() + " 2 " +
              tr::test::trainer_bin() + " --config " + run.config +
              " --set train.eval_interval=5 --set train.eval_steps=1000000 & pid=$!; until grep -q "
              "step.:5, " +
              log + " 2>/dev/null; do sleep 0.05; done; sleep 1; kill -USR1 $pid; wait $pid'");
  INFO(r.output);
  CHECK(seconds_since(t0) < 60);
  REQUIRE(r.exit_code == kExitStopped);
  CHECK(r.output.find("stopped by signal 10 (User defined signal 1) after step 5") !=
        std::string::npos);
  CHECK(run.metrics("val_loss").empty());
  test::check_latest_is_last_logged_step(run);
  CHECK(run.metrics().size() == 5);
}

// "Paths that cannot work are found at the first save (a 4,065-character checkpoint.dir: File
// name too long, hours in)": the longest path a save will use is created at start-up, and a
// checkpoint.dir that cannot hold it is bad input before any training.
TEST_CASE("jobs: a checkpoint.dir too long for a checkpoint's paths is found at start-up",
          "[cli]") {
  RunDir run(10);
  std::string dir = run.dir / "ckpt";
  while (dir.size() < 4000) {  // components of at most 200 characters, 4,000 to 4,200 in all
    dir.push_back('/');
    dir.append(200, 'd');
  }
  std::filesystem::create_directories(dir);  // itself fine: under PATH_MAX
  CmdResult r = run.trainer("--set checkpoint.dir=" + dir);
  test::expect_bad_input(r, "' cannot hold a checkpoint's paths (");
  CHECK(r.output.find("File name too long; choose a shorter checkpoint.dir") != std::string::npos);
  CHECK(run.metrics().empty());
  CHECK(std::filesystem::is_empty(dir));  // the probe is gone
}

// checkpoint.dir is checked at start-up: a read-only one and one without room for a checkpoint
// are bad input (exit 2, one line) before any training.
TEST_CASE("jobs: a read-only or too small checkpoint.dir or local_dir is found at start-up",
          "[cli]") {
  RunDir run(20);
  {
    Tmpfs ro(run.dir / "ro", 1 << 20, true);
    test::expect_bad_input(run.trainer("--set checkpoint.dir=" + ro.dir + "/ckpt"),
                           "checkpoint.dir '" + ro.dir + "/ckpt' cannot be created: Read-only");
    test::expect_bad_input(run.trainer("--set checkpoint.dir=" + ro.dir),
                           "checkpoint.dir '" + ro.dir + "' is not writable (rank 0 on ");
  }
  Tmpfs small(run.dir / "small", 64 << 10);
  CmdResult r = run.trainer("--set checkpoint.dir=" + small.dir);
  test::expect_bad_input(r, "checkpoint.dir '" + small.dir + "' has ");
  CHECK(r.output.find("less than one checkpoint (") != std::string::npos);
  CHECK(run.metrics().empty());
  // checkpoint.local_dir likewise: room for checkpoint.local_keep parts and one being written.
  const std::string local = " --set checkpoint.local_interval=2 --set checkpoint.local_dir=";
  r = run.trainer(local + small.dir);
  test::expect_bad_input(r, "checkpoint.local_dir '" + small.dir + "' on ");
  CHECK(r.output.find("less than the ") != std::string::npos);
  CHECK(r.output.find("(checkpoint.local_keep=2 and one being written") != std::string::npos);
  {
    Tmpfs ro(run.dir / "ro-local", 1 << 20, true);
    test::expect_bad_input(run.trainer(local + ro.dir + "/parts"),
                           "checkpoint.local_dir '" + ro.dir + "/parts' cannot be created on ");
  }
  CHECK(run.metrics().empty());
}

// A disk that fills up during the second save: one error line naming the file, the disk's
// message and the checkpoint that stays; exit 1, no crash in HDF5's clean-up; that checkpoint
// still loads.
TEST_CASE("jobs: a full disk during a save is one line and exit 1, and the last checkpoint stays",
          "[cli]") {
  // Synchronous saves, and asynchronous ones (written by a thread of their own, whose HDF5 error
  // stacks were printed: 141-292 lines).
  const bool async = GENERATE(false, true);
  RunDir run(20, "");
  absl::StatusOr<Config> cfg = load_config(run.config, {});
  REQUIRE(cfg.ok());
  const double one = checkpoint_bytes(*cfg, Topology{});
  Tmpfs disk(run.dir / "disk", static_cast<size_t>(1.5 * one) + (64 << 10));
  CmdResult r = run.trainer("--set checkpoint.dir=" + disk.dir + " --set checkpoint.interval=2" +
                            (async ? " --set checkpoint.async=true" : ""));
  INFO("async " << async << "\n" << r.output);
  CHECK(r.output.find("HDF5-DIAG") == std::string::npos);
  CHECK(r.exit_code == kExitFailure);
  CHECK(r.signal == 0);
  CHECK(r.output.find("warning: checkpoint.dir '" + disk.dir + "' has ") != std::string::npos);
  const size_t at = r.output.find("error: ");
  REQUIRE(at != std::string::npos);
  const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
  CHECK(line.find("error: checkpoint save of step 4 failed (step 2 stays the last committed "
                  "one): ") == 0);
  CHECK(line.find("No space left on device") != std::string::npos);
  CHECK(r.output.find('\n', at) == r.output.size() - 1);  // one line, and the last
  REQUIRE(*ckpt::find_latest(disk.dir) == disk.dir + "/step_00000002");
  CHECK(read_checkpoint(run.config, disk.dir + "/step_00000002").state.step == 2);
}

// A run that cannot fit this host's memory is bad input at start-up, with the numbers (also in a
// dry run, which allocates nothing); an allocation that fails anyway (here under an
// address-space limit the start-up check cannot see) is one line and exit 1, and the run's lock
// is gone with it.
TEST_CASE("jobs: a run too large for memory is refused at start-up, a failed allocation is exit 1",
          "[cli]") {
  RunDir run(6);
  for (const std::string& dry : {std::string(""), std::string(" --dry-run")}) {
    CmdResult r =
        run.trainer("--set train.micro_batch=1048576 --set train.global_batch=1048576" + dry);
    test::expect_bad_input(r, "error: the run needs ");
    CHECK(r.output.find(" of host memory per rank (") != std::string::npos);
    CHECK(r.output.find("activations ") != std::string::npos);
    CHECK(r.output.find("; lower train.micro_batch or data.seq_len") != std::string::npos);
  }
  CmdResult huge = run.trainer("--set train.global_batch=4611686018427387904");
  test::expect_bad_input(huge, "; lower train.global_batch or use more data-parallel ranks");
  CHECK_FALSE(std::filesystem::exists(run.dir / "ckpt"));
  // 2 GB of address space (the CUDA build's libraries need about 1): the start-up check passes
  // (it sees the host's memory), the activations' allocation (a few GB) fails.
  CmdResult r = run_cmd("timeout 120 sh -c 'ulimit -v 2000000; " + std::string(test::kOneThread) +
                        " " + tr::test::trainer_bin() + " --config " + run.config +
                        " --set train.micro_batch=8192 --set train.global_batch=8192'");
  INFO(r.output);
  CHECK(r.exit_code == kExitFailure);
  CHECK(count_lines_with(r.output, "error: out of host memory: cannot allocate ") == 1);
  CHECK_FALSE(std::filesystem::exists(run.dir / "ckpt/trainer.lock"));
  CHECK_FALSE(std::filesystem::exists(run.dir / "log/trainer.lock"));
}

// metrics.jsonl is only ever appended to: a resume keeps every byte of it and adds a resume
// line (readers drop the later steps logged before it); a line a crash cut short stays on a
// line of its own; a fresh run moves the file aside instead of replacing it.
TEST_CASE("jobs: metrics.jsonl is appended to, never rewritten", "[cli]") {
  RunDir run(12);
  REQUIRE(run.trainer("--set train.exit_interval=10").exit_code == kExitStopped);
  const std::string log = run.dir / "log/metrics.jsonl";
  // As if a crash had logged steps 11 and part of a line past the checkpoint at step 10.
  std::string before = test::read_file(log);
  before += "{\"step\": 11, \"loss\": 99.0}\n{\"step\": 12, \"lo";
  test::write_file(log, before);
  CmdResult r = run.trainer();
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string after = test::read_file(log);
  CHECK(after.substr(0, before.size()) == before);  // nothing earlier was touched
  const std::string resume = "\n{\"event\":\"resume\",\"step\":10}\n";
  CHECK(after.substr(before.size(), resume.size()) == resume);
  const std::vector<nlohmann::json> m = run.metrics();
  REQUIRE(m.size() == 12);
  CHECK(m[10]["loss"].get<double>() != 99.0);  // the resumed run's step 11
  // A fresh run: the file is moved aside whole, not overwritten.
  REQUIRE(run.trainer("--resume none --force").exit_code == 0);
  int kept = 0;
  for (const auto& e : std::filesystem::directory_iterator(run.dir / "log"))
    if (e.path().filename().string().starts_with("metrics.jsonl.") &&
        test::read_file(e.path().string()) == after)
      ++kept;
  CHECK(kept == 1);
  CHECK(run.metrics().size() == 12);
}

// A full log.dir: the lost metrics lines are a warning, once; training and checkpoints go on, and
// a run that otherwise finished exits 1.
TEST_CASE("jobs: a full log.dir is a warning once and exit 1 at the end", "[cli]") {
  RunDir run(20);
  // Three pages: the lock, config.yaml and metrics.jsonl's first (its start event and first
  // steps); the later steps' lines do not fit. TensorBoard off: its file would take the room.
  Tmpfs disk(run.dir / "logdisk", 3 * 4096);
  CmdResult r = run.trainer("--set log.dir=" + disk.dir + " --set log.tensorboard=false");
  INFO(r.output);
  CHECK(r.exit_code == kExitFailure);
  CHECK(count_lines_with(r.output, "warning: cannot write " + disk.dir + "/metrics.jsonl") == 1);
  CHECK(r.output.find("error: lines of " + disk.dir +
                      "/metrics.jsonl could not be written (see the warning above); the "
                      "checkpoints are complete") != std::string::npos);
  CHECK(*ckpt::find_latest(run.dir / "ckpt") == run.dir / "ckpt/step_00000020");
}

// A full disk under log.dir/tb: one warning that TensorBoard events are being lost (metrics.jsonl
// has them), and the run goes on to its end.
TEST_CASE("jobs: a full TensorBoard directory is one warning, and training goes on", "[cli]") {
  RunDir run(20);
  std::filesystem::create_directories(run.dir / "log/tb");
  Tmpfs disk(run.dir / "log/tb", 4096);
  CmdResult r = run.trainer("");
  INFO(r.output);
  CHECK(r.exit_code == kExitOk);
  CHECK(count_lines_with(r.output, "TensorBoard events are being lost; metrics.jsonl has them") ==
        1);
  CHECK(run.metrics().size() == 20);
}

// Two runs with their own checkpoint.dir but one log.dir would append to one metrics.jsonl: the
// second is refused (busy) naming the first.
TEST_CASE("jobs: a second trainer on the same log.dir exits 6", "[cli]") {
  RunDir run(100000);
  CmdResult r = run.second_trainer_while_training("--set checkpoint.dir=" + (run.dir / "other"));
  INFO(r.output);
  CHECK(r.output.find("error: log.dir '" + (run.dir / "log") +
                      "' is in use by another trainer: pid ") != std::string::npos);
  CHECK(r.output.find("second=6") != std::string::npos);
  CHECK(std::filesystem::is_empty(run.dir / "other"));  // the second left nothing there
}

// Rank 1 sleeps 0.1 s per step: every log.interval steps the metrics name it as the slowest, and
// the console says so once its work is log.straggler_percent over the median's.
TEST_CASE("jobs: a straggling rank is named in the metrics and on the console", "[cli][mpi]") {
  RunDir run(10);
  CmdResult r = run.mpirun(2, "", "TR_TEST_FAULT=slow:1:100:1");
  INFO(r.output);
  REQUIRE(r.exit_code == kExitOk);
  const std::vector<nlohmann::json> m = run.metrics();
  REQUIRE(m.size() == 10);
  for (int step : {5, 10}) {
    const nlohmann::json& j = m[static_cast<size_t>(step - 1)];
    CHECK(j["slowest_rank"] == 1);
    CHECK(j["slowest_busy_s"].get<double>() > 0.1);
    CHECK(j["median_busy_s"].get<double>() <= j["slowest_busy_s"].get<double>());
  }
  CHECK_FALSE(m[3].contains("slowest_rank"));  // step 4: no report
  CHECK(count_lines_with(r.output, "straggler: rank 1 (tp 0, pp 0, dp 1) worked ") == 2);
}

// checkpoint.async: the blocks are staged in host memory and written by a background thread
// while training goes on; the checkpoints are bit-identical to synchronous ones, and the
// metrics record how long the loop stalled.
TEST_CASE("jobs: asynchronous checkpoints equal synchronous ones", "[cli][mpi]") {
  RunDir sync(20), async(20);
  const std::string args = "--set parallel.tp=2 --set checkpoint.interval=5";
  REQUIRE(sync.mpirun(4, args).exit_code == kExitOk);
  CmdResult r = async.mpirun(4, args + " --set checkpoint.async=true");
  INFO(r.output);
  REQUIRE(r.exit_code == kExitOk);
  CHECK(count_lines_with(r.output, "shard files; async, training stalled ") == 4);
  for (const char* step : {"step_00000015", "step_00000020"}) {
    const std::string at = std::string("ckpt/") + step;
    test::check_same_checkpoint(sync.config, sync.dir / at, async.config, async.dir / at);
    CHECK(read_checkpoint(async.config, async.dir / at).state.consumed_samples ==
          read_checkpoint(sync.config, sync.dir / at).state.consumed_samples);
  }
  int events = 0;
  for (const std::string& l : test::read_lines(async.dir / "log/metrics.jsonl")) {
    const nlohmann::json j = nlohmann::json::parse(l);
    if (!j.contains("event") || j["event"] != "checkpoint") continue;
    ++events;
    CHECK(j["stall_s"].get<double>() >= 0);
    CHECK(j["stall_s"].get<double>() <= j["seconds"].get<double>());
  }
  CHECK(events == 4);
}

// A crash (SIGKILL) while the background thread writes step 10 leaves step 5 as latest; the
// resumed run ends bit-identical to one never interrupted.
TEST_CASE("jobs: a crash during an asynchronous write leaves the previous checkpoint", "[cli]") {
  RunDir crashed(20), clean(20);
  const std::string args = "--set checkpoint.interval=5 --set checkpoint.async=true";
  CmdResult r = crashed.trainer(args, "TR_TEST_CRASH_POINT=mid_tensors@10");
  INFO(r.output);
  REQUIRE(r.signal == 0);  // the shell reports the killed trainer as 128 + 9
  REQUIRE(r.exit_code == 128 + 9);
  REQUIRE(*ckpt::find_latest(crashed.dir / "ckpt") == crashed.dir / "ckpt/step_00000005");
  CHECK(std::filesystem::exists(crashed.dir / "ckpt/step_00000010.tmp"));
  CmdResult resumed = crashed.trainer(args);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == kExitOk);
  CHECK(resumed.output.find("resumed from " + crashed.dir.path() + "/ckpt/step_00000005") !=
        std::string::npos);
  REQUIRE(clean.trainer("--set checkpoint.interval=5").exit_code == kExitOk);
  test::check_same_checkpoint(clean.config, clean.dir / "ckpt/step_00000020", crashed.config,
                              crashed.dir / "ckpt/step_00000020");
}

// Under srun (the suite's local Slurm; hidden cases run by "jobs: under the local Slurm").
TEST_CASE("jobs: a stopped rank under srun ends the job after parallel.timeout_s", "[.slurm]") {
  RunDir run(1000);
  const auto t0 = std::chrono::steady_clock::now();
  CmdResult r = run.srun(2, "--set parallel.timeout_s=10", "TR_TEST_FAULT=hang:3:1:1");
  const double took = seconds_since(t0);
  INFO(r.output);
  CHECK(r.exit_code == kExitCommTimeout);  // srun passes on the aborting task's code
  CHECK(took > 10);
  CHECK(took < 50);
  CHECK(r.output.find("] error: MPI wait_all in group world (this rank is 0 of 2) unfinished "
                      "after 10 s") != std::string::npos);
  CHECK(no_process_left(run.dir.path()));
}

// Waits until train.sbatch's job `job` (output file `out`) has ended for good: its last line
// says finished or not requeued, and it has left the queue. Slurm holds a requeued job for about
// two minutes (its BeginTime); it is released after 2 s instead (slurmd refuses to start a job
// within the second its credential was revoked by the requeue: "Job credential revoked").
void wait_for_requeued_job(const std::string& job, const std::string& out,
                           std::chrono::steady_clock::time_point t0) {
  auto ended = [&] {
    const std::string text = test::read_file(out);
    return text.find("train.sbatch: finished") != std::string::npos ||
           text.find("not requeued") != std::string::npos;
  };
  while (!ended() || !run_cmd("squeue -h -j " + job).output.empty()) {
    REQUIRE(seconds_since(t0) < 150);
    if (run_cmd("squeue -h -o %T:%r -j " + job).output.starts_with("PENDING:BeginTime")) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      run_cmd("scontrol update JobId=" + job + " StartTime=now");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// tools/slurm/train.sbatch: a USR1 to the batch script (what --signal=B:USR1@T sends) reaches
// the trainer through the script and srun; the trainer saves and exits 3; the script requeues
// the job, which resumes with --resume auto and finishes.
TEST_CASE("jobs: train.sbatch stops on USR1, saves, requeues and resumes to the end", "[.slurm]") {
  RunDir run(1500);
  const std::string out = run.dir / "job.out", log = run.dir / "log/metrics.jsonl";
  CmdResult sub =
      run_cmd(std::string("TRAINER=") + tr::test::trainer_bin() + " SRUN_ARGS=--overcommit " +
              test::kOneThread + " sbatch --parsable --requeue -n 2 --overcommit -o " + out + " " +
              tr::test::source_dir() + "/tools/slurm/train.sbatch " + run.config);
  INFO(sub.output);
  REQUIRE(sub.exit_code == 0);
  const std::string job = sub.output.substr(0, sub.output.find_first_of(";\n"));
  const auto t0 = std::chrono::steady_clock::now();
  while (!std::filesystem::exists(log) || std::filesystem::file_size(log) == 0) {
    REQUIRE(seconds_since(t0) < 120);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(run_cmd("scancel --batch --signal=USR1 " + job).exit_code == 0);
  wait_for_requeued_job(job, out, t0);
  const std::string text = test::read_file(out);
  INFO(text);
  CHECK(text.find("train.sbatch: SIGUSR1: asking the trainer to save and stop") !=
        std::string::npos);
  CHECK(text.find("stopped by signal 10 (User defined signal 1) ") != std::string::npos);
  CHECK(text.find("train.sbatch: trainer exit 3; requeueing job " + job) != std::string::npos);
  CHECK(text.find("train.sbatch: job " + job + " start 2 ") != std::string::npos);
  CHECK(text.find("resumed from " + run.dir.path() + "/ckpt/step_") != std::string::npos);
  CHECK(text.find("train.sbatch: finished") != std::string::npos);
  CHECK(*ckpt::find_latest(run.dir / "ckpt") == run.dir / "ckpt/step_00001500");
}

// Node-local checkpoints under Slurm: train.sbatch with node-local checkpoints on 4 tasks as 2
// "nodes", a rank that hangs in the first start (the job ends with exit 5, and the script requeues
// it), and a node list that changed on the requeue: the first start's tasks were on n0 and n1, the
// second's are on n1 and n2 (TR_NODE_NAME from SLURM_PROCID and SLURM_RESTART_COUNT), so n0's parts
// live on only as the replicas n1 holds and n2 starts empty. The second start resumes from the
// local checkpoint, its n2 ranks receiving their parts from n1's replicas, and ends bit-identical
// to an uninterrupted run.
TEST_CASE("jobs: a requeued job on a changed node list resumes from the replicas", "[.slurm]") {
  RunDir run(8), ref(8);
  const std::string out = run.dir / "job.out", wrapper = run.dir / "trainer.sh";
  test::write_file(wrapper, std::string("#!/bin/sh\n") +
                                "restart=${SLURM_RESTART_COUNT:-0}\n"
                                "export TR_NODE_NAME=n$((SLURM_PROCID / 2 + restart))\n"
                                "[ \"$restart\" = 0 ] && export TR_TEST_FAULT=hang:7:1:1\n"
                                "exec " +
                                tr::test::trainer_bin() + " \"$@\"\n");
  std::filesystem::permissions(wrapper, std::filesystem::perms::owner_all);
  auto sets = [](const RunDir& d) {
    return " --set parallel.tp=2 --set checkpoint.interval=0 --set parallel.timeout_s=3"
           " --set checkpoint.local_interval=2 --set checkpoint.local_dir=" +
           (d.dir / "local");
  };
  CmdResult sub =
      run_cmd("TRAINER=" + wrapper + " SRUN_ARGS=--overcommit " + test::kOneThread +
              " sbatch --parsable --requeue -n 4 --overcommit -o " + out + " " +
              tr::test::source_dir() + "/tools/slurm/train.sbatch " + run.config + sets(run));
  INFO(sub.output);
  REQUIRE(sub.exit_code == 0);
  const std::string job = sub.output.substr(0, sub.output.find_first_of(";\n"));
  const auto t0 = std::chrono::steady_clock::now();
  wait_for_requeued_job(job, out, t0);
  const std::string text = test::read_file(out);
  INFO(text);
  CHECK(text.find("train.sbatch: trainer exit 5; requeueing job " + job) != std::string::npos);
  CHECK(text.find("train.sbatch: job " + job + " start 2 ") != std::string::npos);
  CHECK(text.find("resumed from the local checkpoint of step ") != std::string::npos);
  CHECK(text.find("train.sbatch: finished") != std::string::npos);
  REQUIRE(ref.mpirun(4, sets(ref)).exit_code == 0);
  test::check_same_checkpoint(run.config, run.dir / "ckpt/step_00000008", ref.config,
                              ref.dir / "ckpt/step_00000008");
}

// train.sbatch's decision after the job step ends, with stand-ins for srun (exits with the code
// under test) and scontrol (records the requeue): every ending but 0, 2 and 4 requeues, a killed
// rank's 137 included, within the restart budget, and the log says how many restarts.
TEST_CASE("jobs: train.sbatch requeues every ending but finished, bad input and diverged",
          "[cli]") {
  test::TempDir bin;
  test::write_file(bin / "srun", "#!/bin/sh\nexit $FAKE_RC\n");
  test::write_file(bin / "scontrol",
                   "#!/bin/sh\necho \"scontrol $*\" >> " + (bin / "calls") + "\n");
  REQUIRE(run_cmd("chmod +x " + (bin / "srun") + " " + (bin / "scontrol")).exit_code == 0);
  auto sbatch = [&](int rc, int restarts) {
    std::filesystem::remove(bin / "calls");
    return run_cmd("PATH=" + bin.path() + ":$PATH FAKE_RC=" + std::to_string(rc) +
                   " SLURM_JOB_ID=77 SLURM_RESTART_COUNT=" + std::to_string(restarts) +
                   " TRAIN_MAX_REQUEUES=3 bash " + tr::test::source_dir() +
                   "/tools/slurm/train.sbatch cfg.yaml");
  };
  for (int rc : {1, 3, 5, 6, 137, 139}) {
    CmdResult r = sbatch(rc, 1);
    INFO("trainer exit " << rc << "\n" << r.output);
    CHECK(r.output.find("train.sbatch: trainer exit " + std::to_string(rc) +
                        "; requeueing job 77 to resume (restart 2 of at most 3)") !=
          std::string::npos);
    CHECK(test::read_file(bin / "calls") == "scontrol requeue 77\n");
    CHECK(r.exit_code == 0);  // requeued: the next incarnation carries on
  }
  for (int rc : {2, 4}) {
    CmdResult r = sbatch(rc, 0);
    INFO("trainer exit " << rc << "\n" << r.output);
    CHECK(r.output.find("not requeued") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(bin / "calls"));
    CHECK(r.exit_code == rc);
  }
  CmdResult done = sbatch(0, 0);
  CHECK(done.output.find("train.sbatch: finished") != std::string::npos);
  CHECK(done.exit_code == 0);
  // The budget spent: not requeued, and the trainer's code is the job's.
  CmdResult spent = sbatch(137, 3);
  INFO(spent.output);
  CHECK(spent.output.find("trainer exit 137; not requeued (3 restarts of at most 3") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(bin / "calls"));
  CHECK(spent.exit_code == 137);
}

}  // namespace
}  // namespace tr
