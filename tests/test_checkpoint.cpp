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

  FakeModel(const std::vector<Spec>& specs, uint32_t seed) {
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
  return {step, step * 32, 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step),
          3e-4 * static_cast<double>(step) / 7.0, step * 4096};
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
  FakeModel got(kTinyModel, 0);
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

bool have_tool(const char* tool) {
  return std::system((std::string("command -v ") + tool + " >/dev/null 2>&1").c_str()) == 0;
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
      setenv("TR_TEST_CRASH_POINT", c.stage, 1);
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
  if (!have_tool("h5ls")) {
    WARN("h5ls is not on PATH (install hdf5-tools); skipping the h5ls check");
    return;
  }
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
  if (have_tool("h5dump")) {
    std::string attr = run_capture("h5dump -a /state/step '" + h5 + "' 2>&1");
    CHECK_THAT(attr, Catch::Contains("(0): 20"));
  }
}
