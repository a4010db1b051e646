// Checkpoint layer: bit-exact round trip, retention, `latest`, crash safety at every commit
// stage (fork + SIGKILL), corruption and model-mismatch messages, and h5ls readability.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/switches.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using tr::ckpt::LoadTarget;
using tr::ckpt::SaveRequest;
using tr::ckpt::TensorRef;
using tr::ckpt::TrainState;

using tr::test::TempDir;

struct Spec {
  std::string name;
  std::vector<int64_t> shape;
};

const std::vector<Spec> kTinyModel = {
    {"embed/weight", {16, 8}},     {"layers/0/attn/q_proj/weight", {8, 8}},
    {"layers/0/norm/weight", {8}}, {"layers/1/attn/q_proj/weight", {8, 8}},
    {"final/scale", {}},  // scalar
};

// Params, Adam m and v with buffers; values are a deterministic function of (seed, set,
// index) covering many exponents and signs, so a bit-exact check means something.
struct FakeModel {
  std::vector<std::vector<float>> buf[3];
  std::vector<TensorRef> refs[3];

  std::vector<Spec> specs;
  FakeModel(const std::vector<Spec>& specs_, uint32_t seed) : specs(specs_) {
    for (int s = 0; s < 3; ++s) {
      for (const Spec& sp : specs) {
        int64_t n = 1;
        for (int64_t d : sp.shape) n *= d;
        std::vector<float> v(n);
        for (int64_t i = 0; i < n; ++i) v[i] = value(seed, s, i);
        buf[s].push_back(std::move(v));
      }
      for (size_t t = 0; t < specs.size(); ++t) {
        refs[s].push_back({specs[t].name, specs[t].shape, buf[s][t].data()});
      }
    }
  }
  static float value(uint32_t seed, int set, int64_t i) {
    uint32_t h = seed * 2654435761u ^ (set + 1) * 40503u ^ static_cast<uint32_t>(i) * 97u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    float mant = static_cast<float>(h & 0xffff) / 65536.0f - 0.5f;
    return std::ldexp(mant, static_cast<int>((h >> 16) % 40) - 20);
  }
  LoadTarget target() const { return {refs[0], refs[1], refs[2]}; }
  bool same_bits(const FakeModel& o) const {
    for (int s = 0; s < 3; ++s) {
      if (buf[s].size() != o.buf[s].size()) return false;
      for (size_t t = 0; t < buf[s].size(); ++t) {
        if (buf[s][t].size() != o.buf[s][t].size() ||
            std::memcmp(buf[s][t].data(), o.buf[s][t].data(), buf[s][t].size() * 4) != 0) {
          return false;
        }
      }
    }
    return true;
  }
};

TrainState state_for(int64_t step) {
  return {step,
          step * 32,
          0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step),
          3e-4 * static_cast<double>(step) / 7.0,
          step * 4096,
          {5.5, 1.0 / 3.0, static_cast<double>(step)},
          step % 3,
          step + 2,
          0x7e57'0000'0000'0001ull};
}

std::string config_for(int64_t step) {
  return "model:\n  name: tiny  # ünïcode ok\nstep_marker: " + std::to_string(step) + "\n";
}

SaveRequest request(const std::string& root, int64_t step, const FakeModel& m, int keep_last = 2) {
  SaveRequest req;
  req.root = root;
  req.step = step;
  req.keep_last = keep_last;
  req.params = m.refs[0];
  req.exp_avg = m.refs[1];
  req.exp_avg_sq = m.refs[2];
  req.state = state_for(step);
  req.config_yaml = config_for(step);
  req.layout_json = R"({"tp": 1, "pp": 1, "dp": 1})";
  return req;
}

// The model of the distributed tests: shards hold blocks, so no scalars.
const std::vector<Spec> kShardModel = {
    {"embed/weight", {16, 8}},
    {"layers/0/attn/q_proj/weight", {8, 8}},
    {"layers/0/norm/weight", {8}},
    {"layers/1/attn/q_proj/weight", {8, 8}},
};

// A block of tensor `t` of `m` in set `set`: a copy of its elements, kept alive by `store`.
tr::ckpt::ShardPiece block_of(const FakeModel& m, int set, size_t t, std::vector<int64_t> start,
                              std::vector<int64_t> extent, std::vector<std::vector<float>>& store) {
  const Spec& sp = m.specs[t];
  const int64_t cols = sp.shape.size() == 2 ? sp.shape[1] : 1;
  std::vector<float>& data = store.emplace_back();
  const int64_t rows = sp.shape.size() == 2 ? extent[0] : 1, width = extent.back();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < width; ++j) {
      const int64_t r = sp.shape.size() == 2 ? start[0] + i : 0, c = start.back() + j;
      data.push_back(m.buf[set][t][r * cols + c]);
    }
  tr::ckpt::ShardPiece p;
  p.set = static_cast<tr::ckpt::TensorSetId>(set);
  p.ref = TensorRef(sp.name, sp.shape, data.data());
  p.ref.start = std::move(start);
  p.ref.extent = std::move(extent);
  return p;
}

// Rank 0 writes the top half of each matrix (the first 3 elements of a vector); rank 1 the
// rest as a partial row, full rows and a partial row (as a ZeRO-1 range cuts a tensor), and
// rank 2 nothing. `gap` leaves one element out; `overlap` writes one twice.
struct Shards {
  std::vector<std::vector<float>> store;
  std::vector<tr::ckpt::ShardPiece> pieces[3];
  Shards(const FakeModel& m, bool gap = false, bool overlap = false) {
    store.reserve(1000);
    for (int set = 0; set < 3; ++set) {
      for (size_t t = 0; t < m.specs.size(); ++t) {
        const std::vector<int64_t>& shape = m.specs[t].shape;
        if (shape.size() == 1) {
          pieces[0].push_back(block_of(m, set, t, {0}, {3}, store));
          pieces[1].push_back(block_of(m, set, t, {3}, {shape[0] - 3}, store));
          continue;
        }
        const int64_t R = shape[0], C = shape[1], h = R / 2;
        pieces[0].push_back(block_of(m, set, t, {0, 0}, {h, C}, store));
        pieces[1].push_back(block_of(m, set, t, {h, 0}, {1, C - 3}, store));
        pieces[1].push_back(block_of(m, set, t, {h, C - 3}, {1, 3}, store));
        pieces[1].push_back(block_of(m, set, t, {h + 1, 0}, {R - h - 2, C}, store));
        pieces[1].push_back(block_of(m, set, t, {R - 1, 0}, {1, gap ? C - 1 : C}, store));
        if (overlap) pieces[1].push_back(block_of(m, set, t, {0, 0}, {1, 1}, store));
      }
    }
  }
};

std::vector<TensorRef> metadata(const FakeModel& m) {
  std::vector<TensorRef> out;
  for (const Spec& sp : m.specs) out.emplace_back(sp.name, sp.shape);
  return out;
}

// The distributed protocol in one process: begin, a shard per rank, commit.
absl::Status distributed_save(const std::string& root, int64_t step, const FakeModel& m,
                              const Shards& shards) {
  absl::StatusOr<std::string> tmp = tr::ckpt::begin_save(root, step, 2);
  if (!tmp.ok()) return tmp.status();
  const std::vector<TensorRef> tensors = metadata(m);
  tr::ckpt::CommitRequest req;
  req.root = root;
  req.step = step;
  req.tensors = tensors;
  for (int rank = 0; rank < 3; ++rank) {
    if (shards.pieces[rank].empty()) continue;
    absl::StatusOr<tr::fs::FileDigest> d =
        tr::ckpt::write_shard(*tmp, rank, step, state_for(step).run_id, shards.pieces[rank]);
    if (!d.ok()) return d.status();
    req.shards.push_back({rank, shards.pieces[rank], *d});
  }
  req.state = state_for(step);
  req.config_yaml = config_for(step);
  req.layout_json = R"({"tp": 1, "pp": 1, "dp": 1})";
  return tr::ckpt::commit_save(req);
}

absl::Status distributed_save(const std::string& root, int64_t step, const FakeModel& m) {
  return distributed_save(root, step, m, Shards(m));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// Loads `dir` into a zeroed model of `specs` and checks it equals `expected` bit for bit,
// with the state and config of `step`.
void require_loads_as(const std::string& dir, const FakeModel& expected, int64_t step) {
  FakeModel got(expected.specs, 0);
  for (auto& set : got.buf) {
    for (auto& v : set) std::fill(v.begin(), v.end(), 0.0f);
  }
  TrainState st;
  std::string config, layout;
  absl::Status s = tr::ckpt::load(dir, got.target(), &st, &config, &layout);
  INFO(s.message());
  REQUIRE(s.ok());
  CHECK(got.same_bits(expected));
  TrainState want = state_for(step);
  CHECK(st.step == want.step);
  CHECK(st.consumed_samples == want.consumed_samples);
  CHECK(st.rng_state == want.rng_state);
  CHECK(st.lr == want.lr);
  CHECK(st.tokens_seen == want.tokens_seen);
  CHECK(st.loss_window == want.loss_window);  // the step guard's state, bit for bit
  CHECK(st.skipped_in_a_row == want.skipped_in_a_row);
  CHECK(st.skipped_total == want.skipped_total);
  CHECK(st.run_id == want.run_id);
  CHECK(config == config_for(step));
  CHECK(layout == R"({"tp": 1, "pp": 1, "dp": 1})");
}

std::string load_error(const std::string& dir, const LoadTarget& dst) {
  absl::Status s = tr::ckpt::load(dir, dst, nullptr, nullptr);
  REQUIRE_FALSE(s.ok());
  std::string msg(s.message());
  CHECK(msg.find('\n') == std::string::npos);  // one line
  return msg;
}

// h5ls and h5dump (Debian's hdf5-tools, which tools/install_deps.sh installs) are part of what
// the checkpoint format promises; a machine without them fails these checks, never skips them.
void require_tool(const char* tool) {
  INFO(tool << " is not on PATH: install hdf5-tools (tools/install_deps.sh)");
  REQUIRE(std::system((std::string("command -v ") + tool + " >/dev/null 2>&1").c_str()) == 0);
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  REQUIRE(pclose(p) == 0);
  return out;
}

}  // namespace

TEST_CASE("checkpoint: save/load round trip is bit-exact with state and config", "[checkpoint]") {
  TempDir root;
  FakeModel model(kTinyModel, 7);
  REQUIRE(tr::ckpt::save(request(root.path(), 500, model)).ok());

  absl::StatusOr<std::string> latest = tr::ckpt::find_latest(root.path());
  REQUIRE(latest.ok());
  CHECK(*latest == root / "step_00000500");
  CHECK(read_text(root / "latest") == "step_00000500\n");
  CHECK(entries(*latest) ==
        std::set<std::string>{"model.h5", "config.yaml", "layout.json", "manifest.json"});
  CHECK(read_text(*latest + "/config.yaml") == config_for(500));
  CHECK(tr::ckpt::verify(*latest).ok());
  require_loads_as(*latest, model, 500);

  auto manifest = nlohmann::json::parse(read_text(*latest + "/manifest.json"));
  CHECK(manifest["format"] == "trainer-checkpoint");
  CHECK(manifest["version"] == 1);
  CHECK(manifest["step"] == 500);
  CHECK(manifest["files"]["model.h5"]["bytes"] == fs::file_size(*latest + "/model.h5"));
  CHECK(manifest["files"]["config.yaml"]["bytes"] == config_for(500).size());

  SECTION("params only (empty optimizer spans) loads") {
    FakeModel got(kTinyModel, 0);
    REQUIRE(tr::ckpt::load(*latest, {got.refs[0], {}, {}}, nullptr, nullptr).ok());
    CHECK(got.buf[0] == model.buf[0]);
    CHECK(got.buf[1] != model.buf[1]);
  }
}

TEST_CASE("checkpoint: retention keeps the last keep_last", "[checkpoint]") {
  TempDir root;
  // Leftovers of interrupted saves go; files that are not ours stay.
  fs::create_directories(root / "step_00000003.tmp/sub");
  std::ofstream(root / "step_00000003.tmp/sub/model.h5") << "partial";
  std::ofstream(root / "latest.tmp") << "step_000";
  std::ofstream(root / "notes.txt") << "keep me";
  for (int64_t step = 1; step <= 5; ++step) {
    FakeModel model(kTinyModel, static_cast<uint32_t>(step));
    absl::Status s = tr::ckpt::save(request(root.path(), step * 100, model, 2));
    INFO(s.message());
    REQUIRE(s.ok());
  }
  CHECK(entries(root.path()) ==
        std::set<std::string>{"latest", "notes.txt", "step_00000400", "step_00000500"});
  CHECK(read_text(root / "latest") == "step_00000500\n");
  require_loads_as(root / "step_00000400", FakeModel(kTinyModel, 4), 400);
  require_loads_as(root / "step_00000500", FakeModel(kTinyModel, 5), 500);
}

TEST_CASE("checkpoint: after a rollback, retention keeps keep_last of the live run",
          "[checkpoint]") {
  TempDir root;
  auto save = [&](int64_t step) {
    absl::Status s = tr::ckpt::save(
        request(root.path(), step, FakeModel(kTinyModel, static_cast<uint32_t>(step)), 2));
    INFO(s.message());
    REQUIRE(s.ok());
  };
  for (int64_t step : {10, 20, 30}) save(step);
  CHECK(entries(root.path()) == std::set<std::string>{"latest", "step_00000020", "step_00000030"});
  // Resumed from step 20: the abandoned step 30 is neither counted nor deleted.
  save(22);
  CHECK(entries(root.path()) ==
        std::set<std::string>{"latest", "step_00000020", "step_00000022", "step_00000030"});
  save(24);
  CHECK(entries(root.path()) ==
        std::set<std::string>{"latest", "step_00000022", "step_00000024", "step_00000030"});
  CHECK(read_text(root / "latest") == "step_00000024\n");
  save(30);  // the live run reaches step 30: the abandoned directory is replaced
  CHECK(entries(root.path()) == std::set<std::string>{"latest", "step_00000024", "step_00000030"});
  require_loads_as(root / "step_00000030", FakeModel(kTinyModel, 30), 30);
}

TEST_CASE("checkpoint: find_latest on an empty or missing root, and a broken latest",
          "[checkpoint]") {
  TempDir root;
  absl::StatusOr<std::string> none = tr::ckpt::find_latest(root.path());
  REQUIRE(none.ok());
  CHECK(none->empty());
  absl::StatusOr<std::string> missing = tr::ckpt::find_latest(root / "no_such_dir");
  REQUIRE(missing.ok());
  CHECK(missing->empty());

  SECTION("latest names a missing directory") {
    std::ofstream(root / "latest") << "step_00000042\n";
    absl::StatusOr<std::string> r = tr::ckpt::find_latest(root.path());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(std::string(r.status().message()),
               Catch::Contains("step_00000042") && Catch::Contains("does not exist"));
  }
  SECTION("latest names an uncommitted directory") {
    fs::create_directory(root / "step_00000042");
    std::ofstream(root / "latest") << "step_00000042\n";
    absl::StatusOr<std::string> r = tr::ckpt::find_latest(root.path());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(std::string(r.status().message()),
               Catch::Contains("no manifest.json") && Catch::Contains("not a committed"));
  }
  SECTION("latest is malformed") {
    std::ofstream(root / "latest") << "../etc\n";
    absl::StatusOr<std::string> r = tr::ckpt::find_latest(root.path());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(std::string(r.status().message()), Catch::Contains("malformed"));
  }
}

TEST_CASE("checkpoint: a crash at any commit stage leaves a loadable checkpoint", "[checkpoint]") {
  struct Case {
    const char* stage;
    int64_t survivor;  // step `latest` names after the crash
  };
  const Case cases[] = {{"mid_tensors", 1},
                        {"before_manifest", 1},
                        {"before_rename", 1},
                        {"before_latest", 1},
                        {"before_cleanup", 2}};
  for (const Case& c : cases) {
    INFO("crash point " << c.stage);
    TempDir root;
    FakeModel m1(kTinyModel, 1), m2(kTinyModel, 2), m3(kTinyModel, 3);
    REQUIRE(tr::ckpt::save(request(root.path(), 1, m1)).ok());

    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const tr::ScopedSetting crash(tr::Setting::test_crash_point, c.stage);
      absl::Status s = tr::ckpt::save(request(root.path(), 2, m2));
      _exit(s.ok() ? 10 : 11);  // reaching here means the hook did not fire
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGKILL);

    absl::StatusOr<std::string> latest = tr::ckpt::find_latest(root.path());
    REQUIRE(latest.ok());
    CHECK(*latest == root / tr::ckpt::step_dir_name(c.survivor));
    require_loads_as(*latest, c.survivor == 1 ? m1 : m2, c.survivor);

    // The next save of step 2 (new values) recovers: replaces any leftover step_2.
    absl::Status s = tr::ckpt::save(request(root.path(), 2, m3));
    INFO(s.message());
    REQUIRE(s.ok());
    latest = tr::ckpt::find_latest(root.path());
    REQUIRE(latest.ok());
    CHECK(*latest == root / "step_00000002");
    require_loads_as(*latest, m3, 2);
    require_loads_as(root / "step_00000001", m1, 1);
    CHECK(entries(root.path()) ==
          std::set<std::string>{"latest", "step_00000001", "step_00000002"});
  }
}

TEST_CASE("checkpoint: corrupt files are reported by name", "[checkpoint]") {
  TempDir root;
  FakeModel model(kTinyModel, 9);
  REQUIRE(tr::ckpt::save(request(root.path(), 10, model)).ok());
  std::string dir = root / "step_00000010";
  std::string h5 = dir + "/model.h5";
  auto manifest = nlohmann::json::parse(read_text(dir + "/manifest.json"));

  SECTION("truncated model.h5") {
    fs::resize_file(h5, fs::file_size(h5) / 2);
    std::string msg = load_error(dir, model.target());
    CHECK_THAT(msg, Catch::Contains("checkpoint file " + h5 + " is corrupt") &&
                        Catch::Contains("size mismatch") && Catch::Contains("truncated"));
    CHECK(tr::ckpt::verify(dir).message() == msg);
  }
  SECTION("one flipped byte") {
    std::fstream f(h5, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(h5) / 2));
    char b = 0;
    f.read(&b, 1);
    f.seekp(static_cast<std::streamoff>(fs::file_size(h5) / 2));
    b = static_cast<char>(b ^ 0x10);
    f.write(&b, 1);
    f.close();
    std::string msg = load_error(dir, model.target());
    uint32_t crc = manifest["files"]["model.h5"]["crc32"];
    CHECK_THAT(msg,
               Catch::Contains("checkpoint file " + h5 + " is corrupt") &&
                   Catch::Contains("crc32 mismatch (manifest " + std::to_string(crc) + ", file "));
  }
  SECTION("missing manifest") {
    fs::remove(dir + "/manifest.json");
    CHECK_THAT(load_error(dir, model.target()),
               Catch::Contains("no manifest.json") && Catch::Contains("not a committed"));
  }
  SECTION("manifest that is not JSON") {
    std::ofstream(dir + "/manifest.json") << "{\"format\": ";
    CHECK_THAT(load_error(dir, model.target()), Catch::Contains("not valid JSON"));
  }
  SECTION("manifest of another format version") {
    manifest["version"] = 2;
    std::ofstream(dir + "/manifest.json") << manifest.dump();
    CHECK_THAT(load_error(dir, model.target()),
               Catch::Contains("version 2") && Catch::Contains("reads version 1"));
  }
  SECTION("a listed file is missing") {
    fs::remove(dir + "/config.yaml");
    CHECK_THAT(load_error(dir, model.target()),
               Catch::Contains(dir + "/config.yaml listed in the manifest is missing"));
  }
}

TEST_CASE("checkpoint: loading into a different model says what differs", "[checkpoint]") {
  TempDir root;
  FakeModel model(kTinyModel, 11);
  REQUIRE(tr::ckpt::save(request(root.path(), 3, model)).ok());
  std::string dir = root / "step_00000003";

  SECTION("shape mismatch") {
    std::vector<Spec> specs = kTinyModel;
    specs[1].shape = {4, 8};
    FakeModel other(specs, 0);
    CHECK_THAT(load_error(dir, other.target()),
               Catch::Contains("tensor 'layers/0/attn/q_proj/weight' (/model/layers/0/attn/"
                               "q_proj/weight) has shape [8,8] in the checkpoint but the model "
                               "expects [4,8]: the checkpoint is from a different model shape"));
  }
  SECTION("tensor missing from the checkpoint") {
    std::vector<Spec> specs = kTinyModel;
    specs.push_back({"layers/2/attn/q_proj/weight", {8, 8}});
    FakeModel other(specs, 0);
    CHECK_THAT(load_error(dir, other.target()),
               Catch::Contains("has no tensor 'layers/2/attn/q_proj/weight'") &&
                   Catch::Contains("it was written for a different model"));
  }
  SECTION("checkpoint has a tensor the model lacks") {
    std::vector<Spec> specs = kTinyModel;
    specs.erase(specs.begin() + 3);  // layers/1/...
    FakeModel other(specs, 0);
    CHECK_THAT(load_error(dir, other.target()),
               Catch::Contains("has tensor 'layers/1/attn/q_proj/weight'") &&
                   Catch::Contains("that the model does not have"));
  }
}

TEST_CASE("checkpoint: invalid save requests are rejected before touching disk", "[checkpoint]") {
  TempDir root;
  FakeModel model(kTinyModel, 1);
  auto rejects = [&](SaveRequest req, const std::string& needle) {
    absl::Status s = tr::ckpt::save(req);
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains(needle));
  };
  rejects(request(root.path(), 1, model, 1), "keep_last is 1");
  SaveRequest bad_state = request(root.path(), 1, model);
  bad_state.state.step = 2;
  rejects(bad_state, "differs from state.step 2");
  FakeModel small(std::vector<Spec>{{"embed/weight", {4, 8}}}, 1);
  SaveRequest mismatch = request(root.path(), 1, model);
  mismatch.exp_avg = small.refs[1];
  rejects(mismatch, "exp_avg has 1 tensors but params has 5");
  std::vector<TensorRef> bad_names = model.refs[0];
  bad_names[0].name = "/embed/weight";
  SaveRequest bad_name = request(root.path(), 1, model);
  bad_name.params = bad_names;
  rejects(bad_name, "is not a relative path");
  CHECK(entries(root.path()).empty());
}

TEST_CASE("checkpoint: h5ls reads the file as a whole model", "[checkpoint]") {
  require_tool("h5ls");
  TempDir root;
  FakeModel model(kTinyModel, 5);
  REQUIRE(tr::ckpt::save(request(root.path(), 20, model)).ok());
  std::string h5 = root / "step_00000020/model.h5";
  std::string out = run_capture("h5ls -r '" + h5 + "' 2>&1");
  INFO(out);
  for (const Spec& s : kTinyModel) {
    CHECK_THAT(out, Catch::Contains("/model/" + s.name));
    CHECK_THAT(out, Catch::Contains("/optim/exp_avg/" + s.name));
    CHECK_THAT(out, Catch::Contains("/optim/exp_avg_sq/" + s.name));
  }
  CHECK_THAT(out, Catch::Contains("/model/embed/weight") && Catch::Contains("Dataset {16, 8}"));
  CHECK_THAT(out, Catch::Contains("/config") && Catch::Contains("/state"));
  require_tool("h5dump");
  std::string attr = run_capture("h5dump -a /state/step '" + h5 + "' 2>&1");
  CHECK_THAT(attr, Catch::Contains("(0): 20"));
}

TEST_CASE("distributed save: shards read back as whole tensors and as blocks, bit-exact",
          "[checkpoint]") {
  TempDir root;
  FakeModel model(kShardModel, 7);
  absl::Status s = distributed_save(root.path(), 20, model);
  INFO(s.message());
  REQUIRE(s.ok());
  const std::string dir = root / "step_00000020";
  CHECK(entries(dir) == std::set<std::string>{"config.yaml", "layout.json", "manifest.json",
                                              "model.h5", "shard_00000.h5", "shard_00001.h5"});
  CHECK(tr::ckpt::verify(dir).ok());
  require_loads_as(dir, model, 20);

  // A block that crosses both shards: rows 6..11, columns 2..6 of embed/weight, Adam v.
  std::vector<float> got(6 * 5, -1.0f);
  TensorRef block("embed/weight", {16, 8}, got.data());
  block.start = {6, 2};
  block.extent = {6, 5};
  LoadTarget dst;
  dst.exp_avg_sq = {&block, 1};
  dst.subset = true;
  s = tr::ckpt::load(dir, dst, nullptr, nullptr);
  INFO(s.message());
  REQUIRE(s.ok());
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 5; ++j) CHECK(got[i * 5 + j] == model.buf[2][0][(6 + i) * 8 + 2 + j]);

  // A block outside the tensor is the caller's error, named.
  block.start = {12, 0};
  CHECK(load_error(dir, dst) ==
        "tensor 'embed/weight': block at [12,0] of [6,5] is outside its shape [16,8]");

  // Read from another working directory: the shards are found next to model.h5.
  require_tool("h5dump");
  const std::string out =
      run_capture("cd / && h5dump -d /model/embed/weight -s 15,7 -c 1,1 " + dir + "/model.h5");
  char want[64];
  std::snprintf(want, sizeof(want), "%g", model.buf[0][0][15 * 8 + 7]);
  CHECK(out.find(want) != std::string::npos);
}

TEST_CASE("distributed save: a missing or unlisted shard is an error naming it", "[checkpoint]") {
  TempDir root;
  FakeModel model(kShardModel, 3);
  REQUIRE(distributed_save(root.path(), 5, model).ok());
  const std::string dir = root / "step_00000005";
  FakeModel got(kShardModel, 0);
  SECTION("missing shard file") {
    fs::remove(dir + "/shard_00001.h5");
    CHECK(load_error(dir, got.target()) ==
          "checkpoint file " + dir + "/shard_00001.h5 listed in the manifest is missing");
  }
  SECTION("shard file not in the manifest (HDF5 would read it as zeros if it were gone)") {
    nlohmann::json j = nlohmann::json::parse(read_text(dir + "/manifest.json"));
    j["files"].erase("shard_00001.h5");
    std::ofstream(dir + "/manifest.json", std::ios::trunc) << j.dump();
    CHECK(load_error(dir, got.target()) ==
          "checkpoint file " + dir +
              "/model.h5: tensor /model/embed/weight maps to file 'shard_00001.h5' that the "
              "manifest does not list");
  }
}

// "A shard file swapped in from another step (checksums recomputed) loads silently": each shard
// is stamped with its step and run, and a load refuses one of another checkpoint by name.
TEST_CASE("distributed save: a shard of another checkpoint is refused, checksums and all",
          "[checkpoint]") {
  TempDir root;
  FakeModel one(kShardModel, 1), two(kShardModel, 2);
  REQUIRE(distributed_save(root.path(), 1, one).ok());
  REQUIRE(distributed_save(root.path(), 2, two).ok());
  const std::string dir = root / "step_00000002";
  fs::copy_file(root / "step_00000001/shard_00001.h5", dir + "/shard_00001.h5",
                fs::copy_options::overwrite_existing);
  nlohmann::json j = nlohmann::json::parse(read_text(dir + "/manifest.json"));
  const absl::StatusOr<tr::fs::FileDigest> d = tr::fs::digest_file(dir + "/shard_00001.h5");
  REQUIRE(d.ok());
  j["files"]["shard_00001.h5"] = {{"bytes", d->bytes}, {"crc32", d->crc32}};
  std::ofstream(dir + "/manifest.json", std::ios::trunc) << j.dump();
  REQUIRE(tr::ckpt::verify(dir, 0, 1).ok());  // the checksums agree
  FakeModel got(kShardModel, 0);
  CHECK_THAT(load_error(dir, got.target()),
             Catch::StartsWith("checkpoint file " + dir +
                               "/shard_00001.h5 was written for step 1 of run 7e57000000000001, "
                               "not for this checkpoint's step 2 of run 7e57000000000001"));
}

TEST_CASE("distributed save: the commit refuses shards that leave a gap or overlap",
          "[checkpoint]") {
  TempDir root;
  FakeModel model(kShardModel, 3);
  REQUIRE(distributed_save(root.path(), 1, model).ok());
  absl::Status gap = distributed_save(root.path(), 2, model, Shards(model, true, false));
  CHECK(gap.message() == "checkpoint shards cover 127 of the 128 elements of /model/embed/weight");
  absl::Status overlap = distributed_save(root.path(), 2, model, Shards(model, false, true));
  CHECK(overlap.message() ==
        "checkpoint shards overlap on /model/embed/weight (shard_00001.h5 and shard_00000.h5)");
  // Nothing was committed; the earlier checkpoint is still the latest.
  CHECK(*tr::ckpt::find_latest(root.path()) == root / "step_00000001");
  CHECK_FALSE(fs::exists(root / "step_00000002"));
}

TEST_CASE("verify(dir, part, parts): each part checks the sizes of all and the crc32 of its share",
          "[checkpoint]") {
  TempDir root;
  FakeModel model(kShardModel, 4);
  REQUIRE(distributed_save(root.path(), 3, model).ok());
  const std::string dir = root / "step_00000003";
  // Six files: config.yaml layout.json model.h5 shard_00000.h5 shard_00001.h5 (+ manifest,
  // unlisted). Flip one byte of shard_00001.h5, which part 1 checks (the part of its writer).
  {
    std::fstream f(dir + "/shard_00001.h5", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-100, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-100, std::ios::end);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  int failed = 0;
  for (int part = 0; part < 3; ++part) {
    absl::Status s = tr::ckpt::verify(dir, part, 3);
    if (!s.ok()) {
      ++failed;
      CHECK(part == 1);
      CHECK(std::string(s.message()).find("shard_00001.h5 is corrupt: crc32 mismatch") !=
            std::string::npos);
    }
  }
  CHECK(failed == 1);
  // Two parts: still the writer's part (by the manifest's order it would be part 4 % 2 = 0).
  CHECK(tr::ckpt::verify(dir, 0, 2).ok());
  CHECK(std::string(tr::ckpt::verify(dir, 1, 2).message()).find("shard_00001.h5 is corrupt") !=
        std::string::npos);
  fs::resize_file(dir + "/shard_00000.h5", 100);  // a size error: every part sees it
  for (int part = 0; part < 3; ++part)
    CHECK(std::string(tr::ckpt::verify(dir, part, 3).message()).find("size mismatch") !=
          std::string::npos);
}

// Starting over (--resume none --force) killed after any of its moves leaves a root that
// --resume auto accepts: no `latest` naming a moved directory; the newest step still there is
// resumed (the newest of all until the last move), or a fresh start once all are aside.
TEST_CASE("checkpoint: a start-over killed after any move leaves a resumable root",
          "[checkpoint]") {
  for (int moves = 1; moves <= 3; ++moves) {  // latest + the 2 step directories retention keeps
    INFO("killed after move " << moves);
    TempDir root;
    for (int64_t step : {1, 2, 3}) {
      FakeModel m(kTinyModel, step);
      REQUIRE(tr::ckpt::save(request(root.path(), step, m)).ok());
    }
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const tr::ScopedSetting crash(tr::Setting::test_crash_point,
                                    "move_aside@" + std::to_string(moves));
      (void)tr::ckpt::abandon_checkpoints(root.path(), "test");
      _exit(10);  // the hook did not fire
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));
    absl::StatusOr<tr::ckpt::ResumePoint> p = tr::ckpt::find_resume_point(root.path());
    INFO(p.status().message());
    REQUIRE(p.ok());
    if (moves < 3)
      CHECK(std::filesystem::path(p->dir).filename() == "step_00000003");
    else
      CHECK(p->dir.empty());
  }
}

TEST_CASE("distributed save: a crash at any stage leaves a loadable checkpoint", "[checkpoint]") {
  for (const char* stage :
       {"mid_tensors", "before_manifest", "before_rename", "before_latest", "before_cleanup"}) {
    INFO("crash point " << stage);
    TempDir root;
    FakeModel m1(kShardModel, 1), m2(kShardModel, 2), m3(kShardModel, 3);
    REQUIRE(distributed_save(root.path(), 1, m1).ok());
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const tr::ScopedSetting crash(tr::Setting::test_crash_point, stage);
      absl::Status s = distributed_save(root.path(), 2, m2);
      _exit(s.ok() ? 10 : 11);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));
    const int64_t survivor = std::string(stage) == "before_cleanup" ? 2 : 1;
    absl::StatusOr<std::string> latest = tr::ckpt::find_latest(root.path());
    REQUIRE(latest.ok());
    CHECK(*latest == root / tr::ckpt::step_dir_name(survivor));
    require_loads_as(*latest, survivor == 1 ? m1 : m2, survivor);
    REQUIRE(distributed_save(root.path(), 2, m3).ok());
    require_loads_as(root / "step_00000002", m3, 2);
    require_loads_as(root / "step_00000001", m1, 1);
  }
}

// A shard's bytes are placed after HDF5 wrote its structure (direct I/O where the file system
// allows it) and checksummed from memory: the file must hold exactly the bytes, and the digest
// must be the one a re-read computes, on a disk (O_DIRECT) and on tmpfs (no O_DIRECT).
TEST_CASE("checkpoint: regions written into a file give its bytes and its re-read digest",
          "[checkpoint]") {
  for (const std::string& base : {std::string("/tmp"), std::string("/dev/shm")}) {
    if (!fs::is_directory(base)) continue;
    INFO(base);
    std::string tmpl = base + "/trtest-XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    const std::string dir = tmpl;
    const std::string path = dir + "/f.bin";
    // The file as its library leaves it: sized, with bytes of its own around the holes.
    const size_t size = 5 * 4096 + 3 * 4096 + 1000;
    std::string want(size, '\0');
    for (size_t i = 0; i < size; ++i) want[i] = static_cast<char>('a' + i % 23);
    tr::test::write_file(path, want);
    // Regions: page-aligned over three pages and a tail, unaligned and small, and at the end.
    std::vector<std::string> blobs = {std::string(3 * 4096 + 100, 'X'), std::string(777, 'Y'),
                                      std::string(1000, 'Z')};
    const uint64_t offsets[] = {4096, 4 * 4096 + 300, size - 1000};
    std::vector<tr::fs::FileRegion> regions;
    for (size_t k = 0; k < blobs.size(); ++k) {
      for (size_t i = 0; i < blobs[k].size(); ++i)
        blobs[k][i] = static_cast<char>(k * 31 + i % 251);
      regions.push_back({offsets[k], blobs[k].data(), blobs[k].size()});
      want.replace(offsets[k], blobs[k].size(), blobs[k]);
    }
    std::swap(regions[0], regions[2]);  // any order
    size_t calls = 0;
    const absl::StatusOr<tr::fs::FileDigest> d = tr::fs::write_regions_durable(
        path, regions, [&](size_t done, size_t total) { calls += done <= total; });
    REQUIRE(d.ok());
    CHECK(calls == regions.size());
    CHECK(tr::test::read_file(path) == want);
    const absl::StatusOr<tr::fs::FileDigest> reread = tr::fs::digest_file(path);
    REQUIRE(reread.ok());
    CHECK(d->bytes == reread->bytes);
    CHECK(d->crc32 == reread->crc32);
    // Larger than the direct writer's two staging buffers (32 MiB each): regions and the bytes
    // between them stream across three buffers (a buffer is reused after its write), and the
    // last one ends mid-page.
    const size_t big = (70 << 20) + 1234;
    std::string big_want(big, '\0');
    for (size_t i = 0; i < big; ++i) big_want[i] = static_cast<char>(i % 241);
    tr::test::write_file(path, big_want);
    std::string parts[2] = {std::string((20 << 20) + 5, 'P'), std::string(3 << 20, 'Q')};
    const uint64_t at[2] = {8192, (30 << 20) + 17};
    std::vector<tr::fs::FileRegion> spans;
    for (int k = 0; k < 2; ++k) {
      for (size_t i = 0; i < parts[k].size(); ++i) parts[k][i] = static_cast<char>(k + i % 199);
      spans.push_back({at[k], parts[k].data(), parts[k].size()});
      big_want.replace(at[k], parts[k].size(), parts[k]);
    }
    const absl::StatusOr<tr::fs::FileDigest> bd = tr::fs::write_regions_durable(path, spans);
    REQUIRE(bd.ok());
    CHECK(tr::test::read_file(path) == big_want);
    const absl::StatusOr<tr::fs::FileDigest> big_reread = tr::fs::digest_file(path);
    REQUIRE(big_reread.ok());
    CHECK(bd->bytes == big);
    CHECK(bd->crc32 == big_reread->crc32);
    // Overlapping regions are a caller's bug: an error, not a file with a guess in it.
    std::vector<tr::fs::FileRegion> overlap = {{0, blobs[1].data(), 100},
                                               {50, blobs[1].data(), 10}};
    CHECK_FALSE(tr::fs::write_regions_durable(path, overlap).ok());
    fs::remove_all(dir);
  }
}
