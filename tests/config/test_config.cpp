// Config parsing, validation and output; presets; LR schedules; the topology's rank layout.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/strings/str_split.h"
#include "core/switches.h"
#include "parallel/topology.h"
#include "tests/test_util.h"
#include "trainer/config/config.h"
#include "trainer/config/config_fields.h"
#include "trainer/obs/metrics.h"
#include "trainer/optim/optim.h"

namespace tr {
namespace {

const char* kBase = R"(
model: {hidden_size: 64, intermediate_size: 128, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        head_dim: 16, vocab_size: 257, max_seq_len: 256}
data: {train: [{path: data/x}], seq_len: 32}
train: {steps: 10, global_batch: 4, micro_batch: 2}
)";

std::string error_of(const std::string& yaml, std::vector<std::string> sets = {}) {
  absl::StatusOr<Config> c = parse_config(yaml, sets, "test.yaml");
  REQUIRE_FALSE(c.ok());
  return std::string(c.status().message());
}

TEST_CASE("config: a minimal config parses with defaults", "[config]") {
  absl::StatusOr<Config> c = parse_config(kBase, {});
  REQUIRE(c.ok());
  CHECK(c->model.hidden_size == 64);
  CHECK(c->data.train.size() == 1);
  CHECK(c->data.train[0].path == "data/x");
  CHECK(c->data.train[0].weight == 1.0);
  CHECK(c->parallel.dp == 0);  // auto
  CHECK(c->optim.schedule == "cosine");
  CHECK(c->checkpoint.keep_last == 2);
}

TEST_CASE("config: unknown key suggests the nearest one", "[config]") {
  std::string e = error_of(std::string(kBase) + "optim: {lrr: 0.1}\n");
  CHECK(e == "unknown key 'optim.lrr' in test.yaml; did you mean 'lr'?");
  e = error_of(std::string(kBase) + "chekpoint: {dir: x}\n");
  CHECK(e == "unknown section 'chekpoint' in test.yaml; did you mean 'checkpoint'?");
}

TEST_CASE("config: wrong types and ranges name the key", "[config]") {
  CHECK(error_of(kBase, {"train.steps=ten"}) == "train.steps: expected an integer, got 'ten'");
  CHECK(error_of(kBase, {"train.steps=2.5"}) == "train.steps: expected an integer, got '2.5'");
  CHECK(error_of(kBase, {"optim.lr=-0.1"}) == "optim.lr must be in [0, 10] (got -0.1)");
  // Values used in fp32 are bounded by what fp32 holds: 1e-300 would be 0 there.
  CHECK(error_of(kBase, {"optim.eps=1e-300"}) == "optim.eps must be in [1e-30, 1] (got 1e-300)");
  CHECK(error_of(kBase, {"train.max_skipped_steps=0"}) ==
        "train.max_skipped_steps must be >= 1 (got 0)");
  CHECK(error_of(kBase, {"train.spike_factor=-1"}) == "train.spike_factor must be >= 0 (got -1)");
  CHECK(error_of(kBase, {"optim.beta1=1.5"}) == "optim.beta1 must be in [0, 0.999999] (got 1.5)");
  CHECK(error_of(kBase, {"checkpoint.keep_last=1"}) ==
        "checkpoint.keep_last must be in [2, 1048576] (got 1)");
  CHECK(error_of(kBase, {"model.tie_embeddings=maybe"}) ==
        "model.tie_embeddings: expected true or false, got 'maybe'");
  CHECK(error_of(kBase, {"train.recompute=some"}) ==
        "train.recompute must be one of none|selective|full (got 'some'); did you mean 'none'?");
  CHECK(error_of(kBase, {"train.recompute_layers=[1]"}) ==
        "train.recompute_layers is set but train.recompute is none; it counts the layers of "
        "train.recompute: full");
  CHECK(error_of(kBase, {"train.recompute=full", "train.recompute_layers=[3]"}) ==
        "train.recompute_layers asks for 3 layers on pipeline stage 0, which has 2");
  CHECK(error_of(kBase, {"train.recompute=full", "train.recompute_layers=[1, 1, 1]"}) ==
        "train.recompute_layers has 3 counts; give one (every stage) or parallel.pp 1 (one per "
        "stage)");
  // FP8 on CUDA: each GEMM's rows of 16-byte multiples (the CPU takes any shape).
  CHECK(error_of(kBase,
                 {"train.precision=fp8", "train.backend=cuda", "model.intermediate_size=120"}) ==
        "train.precision=fp8 on cuda needs model.intermediate_size / parallel.tp to be a multiple "
        "of 16 (FP8 GEMM rows of 16 bytes), and it is 120; change it or set "
        "train.precision=bf16");
  CHECK(parse_config(kBase, {"train.precision=fp8", "model.intermediate_size=120"}).ok());
  CHECK(parse_config(kBase, {"train.precision=fp8", "train.backend=cuda"}).ok());
  CHECK(error_of(kBase, {"train.fp8_format=e5m2"}) ==
        "train.fp8_format must be one of hybrid|e4m3 (got 'e5m2'); did you mean 'e4m3'?");
  CHECK(error_of(kBase, {"optim.schedule=cosin"}) ==
        "optim.schedule must be one of cosine|linear|constant|wsd (got 'cosin'); did you mean "
        "'cosine'?");
  CHECK(error_of(kBase, {"data.train=[{path: a, weight: 0}]"}) ==
        "data.train[0].weight must be > 0 (got 0)");
}

TEST_CASE("config: cross-field checks", "[config]") {
  CHECK(error_of(kBase, {"model.num_kv_heads=3"}) ==
        "model.num_heads 4 is not a multiple of model.num_kv_heads 3");
  CHECK(error_of(kBase, {"data.seq_len=512"}) == "data.seq_len 512 exceeds model.max_seq_len 256");
  CHECK(
      error_of(kBase, {"parallel.pp=4"}) ==
      "model.num_layers 2 is not divisible by parallel.pp 4; set parallel.pipeline_layers to split "
      "them unevenly");
  CHECK(error_of(kBase, {"parallel.pp=2", "parallel.pipeline_layers=[1, 2]"}) ==
        "parallel.pipeline_layers has 2 stages summing to 3 layers; it needs parallel.pp 2 stages "
        "summing to model.num_layers 2");
  // Pipeline schedules: virtual stages only under interleaved, which needs two of them and two
  // ranks; its layers split over pp x virtual_stages.
  CHECK(error_of(kBase, {"parallel.pipeline_schedule=interleaved", "parallel.pp=2"}) ==
        "parallel.pipeline_schedule interleaved needs parallel.pp >= 2 and "
        "parallel.virtual_stages >= 2 (got pp 2, virtual_stages 1); use 1f1b otherwise");
  CHECK(error_of(kBase, {"parallel.virtual_stages=2", "parallel.pp=2"}) ==
        "parallel.virtual_stages 2 needs parallel.pipeline_schedule: interleaved (it is 1f1b); "
        "set virtual_stages: 1 or the schedule to interleaved");
  CHECK(error_of(kBase, {"parallel.pipeline_schedule=interleaved", "parallel.pp=2",
                         "parallel.virtual_stages=2"}) ==
        "model.num_layers 2 is not divisible by parallel.pp x parallel.virtual_stages = 4 virtual "
        "stages; set parallel.pipeline_layers to split them unevenly");
  CHECK(parse_config(kBase, {"parallel.pipeline_schedule=interleaved", "parallel.pp=2",
                             "parallel.virtual_stages=2", "model.num_layers=3",
                             "parallel.pipeline_layers=[1, 1, 0, 1]"})
            .status()
            .message()
            .find("parallel.pipeline_layers[2] must be in [1, 4096]") != std::string_view::npos);
  CHECK(parse_config(kBase, {"parallel.pipeline_schedule=interleaved", "parallel.pp=2",
                             "parallel.virtual_stages=2", "model.num_layers=5",
                             "parallel.pipeline_layers=[1, 1, 2, 1]"})
            .ok());
  CHECK(error_of(kBase, {"parallel.pipeline_schedule=zero_bubbles"})
            .find("parallel.pipeline_schedule must be one of 1f1b|interleaved|zero_bubble") !=
        std::string::npos);
  CHECK(error_of(kBase, {"parallel.pipeline_layers=[0, 2]", "parallel.pp=2"}) ==
        "parallel.pipeline_layers[0] must be in [1, 4096] (got 0)");
  CHECK(parse_config(kBase,
                     {"model.num_layers=3", "parallel.pp=2", "parallel.pipeline_layers=[1, 2]"})
            .ok());
  CHECK(error_of(kBase, {"model.intermediate_size=130", "parallel.tp=4", "model.num_kv_heads=4"}) ==
        "model.intermediate_size 130 is not divisible by parallel.tp 4");
  CHECK(error_of(kBase, {"parallel.tp=4"}) ==
        "model.num_kv_heads 2 is not divisible by parallel.tp 4; use a tp that divides it");
  CHECK(error_of(kBase, {"train.eval_interval=5"}) ==
        "train.eval_interval is 5 but data.valid is empty; add data.valid or set "
        "train.eval_interval=0");
  CHECK(error_of(kBase, {"optim.min_lr=1"}) == "optim.min_lr 1 exceeds optim.lr 3e-04");
  CHECK(error_of(kBase, {"log.trace_steps=[3, 2]"}) ==
        "log.trace_steps is [first, last] with first <= last, e.g. [10, 11]; got 2 values 3 > 2");
  CHECK(error_of(kBase, {"log.trace_steps=[3]"}) ==
        "log.trace_steps is [first, last] with first <= last, e.g. [10, 11]; got 1 value");
  CHECK(error_of(kBase, {"log.profile_steps=[5, 4]"}) ==
        "log.profile_steps is [first, last] with first <= last, e.g. [10, 11]; got 2 values 5 > 4");
  // The value is printed as given, not rounded through a double (which wrapped to INT64_MIN).
  CHECK(error_of(kBase, {"log.trace_steps=[2, 9223372036854775807]"}) ==
        "log.trace_steps[1] must be at most 9000000000000000000 (got 9223372036854775807)");
  CHECK(
      error_of(kBase, {"train.steps=9223372036854775807"}).ends_with("(got 9223372036854775807)"));
  CHECK(error_of(kBase, {"optim.warmup_steps=20"}) ==
        "optim.warmup_steps 20 exceeds train.steps 10; set optim.warmup_steps to at most 10 (a "
        "tenth, 1, is common) or raise train.steps");
  CHECK(error_of(kBase, {"data.seq_len=36", "parallel.cp=4"}) ==
        "data.seq_len 36 does not split into 2 x parallel.cp = 8 equal chunks; make it a multiple "
        "of 8 or change parallel.cp");
  CHECK(parse_config(kBase, {"data.seq_len=40", "parallel.cp=4"}).ok());
  CHECK(parse_config(kBase, {"data.document_mask=block_causal", "train.backend=cuda"}).ok());
  CHECK(parse_config(kBase, {"data.document_mask=block_causal", "data.eod_id=0"}).ok());
  CHECK(error_of(kBase, {"parallel.cp_comm=alltoall"})
            .find("parallel.cp_comm must be one of allgather|ring (got 'alltoall')") !=
        std::string::npos);
}

// data.eod_id names a token of the vocabulary: one at or above it never occurs in the data.
TEST_CASE("config: data.eod_id at or above model.vocab_size is refused naming it", "[config]") {
  for (const std::string id : {"257", "300", "65536", "1099511627776"}) {
    INFO(id);
    CHECK(error_of(kBase, {"data.eod_id=" + id}) ==
          "data.eod_id " + id +
              " is not a token of the model's vocabulary (model.vocab_size 257: ids 0 to 256); "
              "set the data's end-of-document id, or -1 for the one prepare_data recorded");
  }
  CHECK(parse_config(kBase, {"data.eod_id=256"}).ok());
}

// model.rope_scaling's fields as one list says: required ones given, numbers finite and in range,
// no key of another rope type; each error names the field.
TEST_CASE("config: rope_scaling blocks are checked field by field", "[config]") {
  const std::string llama3 = "type: llama3, factor: 8, original_max_position_embeddings: 16";
  const std::string yarn = "type: yarn, factor: 4, original_max_position_embeddings: 16";
  const struct {
    std::string block, error;
  } bad[] = {
      {llama3 + ", low_freq_factor: 1",
       "model.rope_scaling.high_freq_factor is missing; a llama3 block needs factor, "
       "original_max_position_embeddings, low_freq_factor, high_freq_factor"},
      {"type: llama3, factor: .inf, original_max_position_embeddings: 16, low_freq_factor: 1, "
       "high_freq_factor: 4",
       "model.rope_scaling.factor must be a finite number in [1, 1e+06] (got '.inf')"},
      {llama3 + ", low_freq_factor: 1, high_freq_factor: 4, beta_fast: 32",
       "model.rope_scaling.beta_fast is not a key of a llama3 block, which has factor, "
       "original_max_position_embeddings, low_freq_factor, high_freq_factor"},
      {llama3 + ", low_freq_factor: 0, high_freq_factor: 4",
       "model.rope_scaling.low_freq_factor must be a finite number in (0, 1e+06] (got '0')"},
      {"type: yarn, factor: 4",
       "model.rope_scaling.original_max_position_embeddings is missing; "
       "a yarn block needs factor, original_max_position_embeddings"},
      {yarn + ", beta_slow: .nan",
       "model.rope_scaling.beta_slow must be a finite number in (0, 1e+06] (got '.nan')"},
      {"type: yarn, factor: 4, original_max_position_embeddings: 16.5",
       "model.rope_scaling.original_max_position_embeddings must be a finite whole number in [1, "
       "1.67772e+07] (got '16.5')"},
      {yarn + ", high_freq_factor: 4",
       "model.rope_scaling.high_freq_factor is not a key of a yarn block, which has factor, "
       "original_max_position_embeddings, beta_fast, beta_slow, attention_factor, truncate"},
      {yarn + ", truncate: 3", "model.rope_scaling.truncate: expected a bool, got '3'"},
      {yarn + ", factr: 4",
       "model.rope_scaling.factr is not a rope_scaling key; did you mean "
       "'factor'?"},
  };
  for (const auto& b : bad) {
    INFO(b.block);
    CHECK(error_of(kBase, {"model.rope_scaling={" + b.block + "}"}) == b.error);
  }
  absl::StatusOr<Config> c = parse_config(
      kBase, {"model.rope_scaling={" + llama3 + ", low_freq_factor: 1, high_freq_factor: 4}"});
  REQUIRE(c.ok());
  CHECK(c->model.rope_scaling.high_freq_factor == 4);
  c = parse_config(kBase, {"model.rope_scaling={" + yarn + ", beta_fast: 16, truncate: false}"});
  REQUIRE(c.ok());
  CHECK(c->model.rope_scaling.beta_fast == 16);
  CHECK_FALSE(c->model.rope_scaling.truncate);
}

TEST_CASE("config: --set overrides and its errors", "[config]") {
  absl::StatusOr<Config> c =
      parse_config(kBase, {"train.micro_batch=4", "optim.lr=1e-3", "parallel.dp=1"});
  REQUIRE(c.ok());
  CHECK(c->train.micro_batch == 4);
  CHECK(c->optim.lr == 1e-3);
  CHECK(c->parallel.dp == 1);
  // An override's error names the override, not the file it overrides.
  CHECK(error_of(kBase, {"train.micro_bach=4"}) ==
        "unknown key 'train.micro_bach' in --set 'train.micro_bach=4'; did you mean "
        "'micro_batch'?");
  CHECK(error_of(kBase, {"trian.steps=4"}) ==
        "unknown section 'trian' in --set 'trian.steps=4'; did you mean 'train'?");
  CHECK(error_of(kBase, {"steps=4"}) ==
        "--set 'steps=4': expected section.key=value, e.g. --set train.micro_batch=2");
}

TEST_CASE("config: odd documents are one-line errors, not crashes", "[config]") {
  CHECK(error_of("{[a]: 1}") == "test.yaml: keys must be plain names, got a list");
  CHECK(error_of("model: {[a]: 1}") ==
        "test.yaml: section 'model': keys must be plain names, got a list");
  CHECK(error_of(std::string(kBase) + "optim: {lr: 1.0e-3, lr: 2.0e-3}\n") ==
        "test.yaml: section 'optim': key 'lr' appears twice");
  CHECK(error_of(kBase, {"data.train=[{[x]: 1}]"}).find("data.train[0]") != std::string::npos);
  CHECK(error_of("- a\n- b\n") == "test.yaml: the top level must be a mapping of sections");
  CHECK(error_of(kBase, {"model.hidden_size=[1, 2]"}) ==
        "model.hidden_size: expected an integer, got a list");
  test::TempDir dir;
  absl::StatusOr<Config> d = load_config(dir.path(), {});
  REQUIRE_FALSE(d.ok());
  CHECK(std::string(d.status().message()) ==
        "config '" + dir.path() + "' is not a file; --config takes a YAML file");
}

TEST_CASE("config: invalid YAML names file, line and column", "[config]") {
  std::string e = error_of("model: {hidden_size: 64\ntrain: [");
  CHECK(e.rfind("test.yaml:", 0) == 0);
  CHECK(e.find("invalid YAML") != std::string::npos);
}

TEST_CASE("config: the resolved YAML parses back to itself", "[config]") {
  absl::StatusOr<Config> c =
      parse_config(kBase, {"optim.lr=0.1", "data.valid=[{path: v, weight: 0.5}]"});
  REQUIRE(c.ok());
  const std::string y = to_yaml(*c);
  absl::StatusOr<Config> back = parse_config(y, {});
  REQUIRE(back.ok());
  CHECK(to_yaml(*back) == y);
  CHECK(back->optim.lr == 0.1);
  CHECK(back->data.valid[0].weight == 0.5);
}

TEST_CASE("config: differences between two resolved configs are listed by key", "[config]") {
  absl::StatusOr<Config> a = parse_config(kBase, {}),
                         b = parse_config(kBase, {"optim.lr=0.001", "train.steps=20"});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(config_differences(to_yaml(*a), to_yaml(*a)).empty());
  CHECK(config_differences(to_yaml(*a), to_yaml(*b)) ==
        std::vector<std::string>{"train.steps: 10 -> 20", "optim.lr: 3.0e-04 -> 0.001"});
  // A float written the way an older trainer wrote it ("3e-04") is the same value.
  std::string older = to_yaml(*a);
  older.replace(older.find("3.0e-04"), 7, "3e-04");
  CHECK(config_differences(older, to_yaml(*a)).empty());
}

// Every float of a resolved config reads back as a float in PyYAML (YAML 1.1: "1e-06" is a
// string there and "3" an int), the reader of tools/sweep and users' scripts.
TEST_CASE("config: PyYAML reads every float of the resolved config as a float", "[config]") {
  absl::StatusOr<Config> cfg = parse_config(kBase, {"optim.weight_decay=0", "train.seed=3"});
  REQUIRE(cfg.ok());
  test::TempDir dir;
  test::write_file(dir / "config.yaml", to_yaml(*cfg));
  std::string keys;
  for (const config_detail::Field& f : config_detail::fields())
    if (f.kind == config_detail::Kind::Float) keys += std::string(" ") + f.section + "." + f.key;
  const std::string script = dir / "check.py";
  test::write_file(script, R"(import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
bad = [k for k in sys.argv[2:] if not isinstance(d[k.split('.')[0]][k.split('.')[1]], float)]
print("not floats:", bad) if bad else print("all floats")
sys.exit(1 if bad else 0)
)");
  const test::CmdResult r =
      test::run_cmd("python3 " + script + " " + (dir / "config.yaml") + keys + " 2>&1");
  INFO(r.output << to_yaml(*cfg));
  CHECK(r.exit_code == 0);
  CHECK(r.output == "all floats\n");
  CHECK(keys.find("optim.weight_decay") != std::string::npos);  // 0 is written 0.0
}

TEST_CASE("config: preset files carry the built-in shapes", "[config]") {
  for (const std::string& name : preset_names()) {
    INFO(name);
    const std::string path = tr::test::source_dir() + "/configs/" + name + ".yaml";
    absl::StatusOr<Config> file = load_config(path, {});
    REQUIRE(file.ok());
    // The preset alone (no explicit fields) must give the same model section.
    absl::StatusOr<Config> preset = parse_config(
        "model: {preset: " + name +
            "}\ndata: {train: [x], seq_len: 128}\ntrain: {steps: 1, global_batch: 1}\n",
        {});
    REQUIRE(preset.ok());
    const ModelConfig &a = file->model, &b = preset->model;
    CHECK(a.hidden_size == b.hidden_size);
    CHECK(a.intermediate_size == b.intermediate_size);
    CHECK(a.num_layers == b.num_layers);
    CHECK(a.num_heads == b.num_heads);
    CHECK(a.num_kv_heads == b.num_kv_heads);
    CHECK(a.head_dim == b.head_dim);
    CHECK(a.vocab_size == b.vocab_size);
    CHECK(a.max_seq_len == b.max_seq_len);
    CHECK(a.rope_theta == b.rope_theta);
    CHECK(a.rms_norm_eps == b.rms_norm_eps);
    CHECK(a.tie_embeddings == b.tie_embeddings);
    CHECK(a.family == b.family);
    CHECK(a.rope_scaling == b.rope_scaling);
  }
  absl::StatusOr<Config> c72 =
      load_config(tr::test::source_dir() + "/configs/qwen2.5-72b.yaml", {});
  REQUIRE(c72.ok());
  CHECK(c72->model.hidden_size == 8192);
  CHECK(c72->model.num_layers == 80);
  CHECK(c72->parallel.tp == 8);
  CHECK(c72->parallel.pp == 2);
  CHECK(error_of("model: {preset: qwen2.5-8b}\n", {}) ==
        "model.preset 'qwen2.5-8b' is unknown; known presets: qwen2.5-0.5b, qwen2.5-1.5b, "
        "qwen2.5-3b, "
        "qwen2.5-7b, qwen2.5-14b, qwen2.5-32b, qwen2.5-72b, llama-3.2-1b, llama-3.2-3b, "
        "llama-3.1-8b, llama-3.1-70b, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-14b, "
        "qwen3-32b, qwen3-30b-a3b, qwen3-235b-a22b; did you mean 'qwen2.5-3b'?");
}

TEST_CASE("config: docs/config.md holds the generated key table", "[config]") {
  const std::string doc = test::read_file(tr::test::source_dir() + "/docs/config.md");
  INFO("regenerate with: build/trainer/trainer --help-config");
  CHECK(doc.find(config_docs_markdown()) != std::string::npos);
}

TEST_CASE("metrics: docs/metrics.md holds the generated key table", "[config]") {
  const std::string doc = test::read_file(tr::test::source_dir() + "/docs/metrics.md");
  INFO("regenerate with: build/trainer/trainer --help-metrics");
  CHECK(doc.find(metrics_docs_markdown()) != std::string::npos);
}

// A step line carries exactly the table's step keys (the optional ones when their condition
// holds), so docs/metrics.md cannot miss a key the trainer writes.
TEST_CASE("metrics: a step line's keys are the documented ones", "[config]") {
  test::TempDir dir;
  MetricsLog log;
  REQUIRE(log.open(dir / "log", 0).ok());
  StepMetrics m;
  m.step = 3;
  m.total_steps = 10;
  m.tokens = 64;
  m.step_time_s = 0.5;
  m.world = 2;
  log.step(m, false);  // the plain CPU step
  m.peak_flops = 1e12;
  m.device_mem_mib = 5;
  m.attention_bwd = "fast";
  m.skipped = "spike";
  m.slowest_rank = 1;
  log.step(m, false);  // every optional key
  const std::vector<std::string> names = metric_names();
  log.exit(3, 0);
  const std::vector<std::string> lines =
      absl::StrSplit(test::read_file(dir / "log/metrics.jsonl"), '\n', absl::SkipEmpty());
  REQUIRE(lines.size() == 4);  // the start event, two steps, the exit event
  CHECK(nlohmann::json::parse(lines[0])["event"] == "start");
  CHECK(nlohmann::json::parse(lines[3])["event"] == "exit");
  std::vector<size_t> sizes;
  for (const std::string& line : lines) {
    const nlohmann::json j = nlohmann::json::parse(line);
    for (const auto& [key, value] : j.items()) {
      INFO(key);
      CHECK(std::find(names.begin(), names.end(), key) != names.end());
    }
    sizes.push_back(j.size());
  }
  CHECK(sizes[0] == 4);   // event, step, time, startup_s
  CHECK(sizes[1] == 23);  // the plain CPU step
  CHECK(sizes[2] == 23 + 7);
  CHECK(sizes[3] == 4);  // event, step, code, time  // skipped, slowest_rank/busy/median, mfu,
                         // device_mem, attention_bwd
}

TEST_CASE("config: docs/debug.md holds the generated switch table", "[config]") {
  const std::string doc = test::read_file(tr::test::source_dir() + "/docs/debug.md");
  INFO("regenerate with: build/trainer/trainer --help-switches");
  CHECK(doc.find(switch_docs_markdown()) != std::string::npos);
}

// One on/off rule for every switch; a malformed value is bad input, not "on".
TEST_CASE("switches: one on/off rule, flipped in process and restored", "[config]") {
  CHECK(parse_switch_value("1") == std::optional<bool>(true));
  CHECK(parse_switch_value("0") == std::optional<bool>(false));
  CHECK(parse_switch_value("") == std::optional<bool>(false));
  for (const char* bad : {"yes", "true", "on", " 1", "10", "2", "-1"}) {
    INFO(bad);
    CHECK_FALSE(parse_switch_value(bad).has_value());
  }
  const bool was = switch_on(Switch::grad_zero);
  const size_t active = active_switches().size();
  {
    const ScopedSwitch on(Switch::grad_zero, !was);
    CHECK(switch_on(Switch::grad_zero) == !was);
    const int64_t n = taken_count(Switch::grad_zero);
    CHECK(take(Switch::grad_zero) == !was);
    CHECK(taken_count(Switch::grad_zero) == n + (was ? 0 : 1));
    const ScopedSetting fault(Setting::test_fault, "hang:3");
    CHECK(setting(Setting::test_fault) == "hang:3");
    const std::vector<std::string> a = active_switches();
    CHECK(std::find(a.begin(), a.end(), "TR_TEST_FAULT=hang:3") != a.end());
    CHECK((std::find(a.begin(), a.end(), "TR_GRAD_ZERO=1") != a.end()) == !was);
  }
  CHECK(switch_on(Switch::grad_zero) == was);
  CHECK(active_switches().size() == active);
  CHECK(validate_switches().ok());  // the test's own environment is well formed
}

TEST_CASE("optim: learning-rate schedules", "[config]") {
  OptimConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 10;
  CHECK(lr_at(o, 110, 1) == Approx(0.1));
  CHECK(lr_at(o, 110, 10) == Approx(1.0));
  o.schedule = "cosine";
  CHECK(lr_at(o, 110, 60) == Approx(0.55));  // half way: (lr + min_lr) / 2
  CHECK(lr_at(o, 110, 110) == Approx(0.1));
  CHECK(lr_at(o, 110, 35) == Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25))));
  o.schedule = "linear";
  CHECK(lr_at(o, 110, 60) == Approx(0.55));
  CHECK(lr_at(o, 110, 85) == Approx(0.325));
  o.schedule = "constant";
  CHECK(lr_at(o, 110, 100) == Approx(1.0));
  o.schedule = "wsd";
  o.decay_fraction = 0.2;  // last 22 steps decay
  CHECK(lr_at(o, 110, 88) == Approx(1.0));
  CHECK(lr_at(o, 110, 99) == Approx(0.55));
  CHECK(lr_at(o, 110, 110) == Approx(0.1));
}

TEST_CASE("topology: rank layout is tp fastest, then cp, then dp, then pp", "[config]") {
  absl::StatusOr<Topology> t = Topology::make(16, 13, 2, 2, 0);
  REQUIRE(t.ok());
  CHECK(t->dp == 4);
  CHECK(t->tp_rank == 1);
  CHECK(t->dp_rank == 2);
  CHECK(t->pp_rank == 1);
  CHECK(t->rank_at(1, 2, 1) == 13);
  absl::StatusOr<Topology> bad = Topology::make(1, 0, 8, 2, 0);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()) ==
        "parallel layout: world size 1 is not divisible by tp 8 x pp 2 = 16; launch a multiple of "
        "16 ranks or "
        "change parallel.tp/pp");
  bad = Topology::make(8, 0, 2, 2, 3);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()) ==
        "parallel layout: tp 2 x pp 2 x dp 3 = 12 ranks but this run has 8 processes; launch 12 "
        "ranks (srun -n 12) "
        "or change parallel.tp/pp/dp");
  // 32 ranks = tp 2 x cp 2 x dp 4 x pp 2: rank 29 = 1 + 2 * (0 + 2 * (3 + 4 * 1)).
  t = Topology::make(32, 29, 2, 2, 0, 2);
  REQUIRE(t.ok());
  CHECK(t->dp == 4);
  CHECK(t->tp_rank == 1);
  CHECK(t->cp_rank == 0);
  CHECK(t->dp_rank == 3);
  CHECK(t->pp_rank == 1);
  CHECK(t->rank_at(1, 3, 1, 0) == 29);
  CHECK(t->dp_cp() == 8);
  CHECK(t->dp_cp_rank() == 6);
  CHECK(t->of_rank(31).cp_rank == 1);
  CHECK(t->describe() ==
        "world 32 = tp 2 x cp 2 x dp 4 x pp 2; rank 29 = (tp 1, cp 0, dp 3, pp 1)");
  bad = Topology::make(8, 0, 2, 1, 0, 3);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()) ==
        "parallel layout: world size 8 is not divisible by tp 2 x cp 3 x pp 1 = 6; launch a "
        "multiple of 6 ranks or change parallel.tp/cp/pp");
}

}  // namespace
}  // namespace tr
