// Hugging Face interop without Python: safetensors read and written by checkpoint/safetensors.h,
// and the trainer's model.init_from and `trainer export-hf` end to end. The transformers oracle
// (its loss on imported and exported models) is tests/tools/test_hf.py.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "core/bf16.h"
#include "core/exit_codes.h"
#include "tests/cli_util.h"
#include "tests/mutate.h"
#include "tests/test_util.h"
#include "trainer/checkpoint/hf.h"
#include "trainer/checkpoint/ownership.h"

namespace tr {
namespace {

namespace sfs = std::filesystem;
using st::ElemType;
using test::CmdResult;
using test::expect_bad_input;
using test::read_checkpoint;
using test::run_cmd;
using test::RunDir;
using test::TempDir;

std::vector<float> iota(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * static_cast<float>(i) - 1.0f;
  return v;
}

void write(const std::string& path, std::vector<st::WriteEntry> entries,
           const std::map<std::string, std::vector<float>>& values) {
  absl::StatusOr<st::Writer> w = st::Writer::create(path, std::move(entries), {{"format", "pt"}});
  REQUIRE(w.ok());
  for (const st::WriteEntry& e : w->order()) REQUIRE(w->append(values.at(e.name)).ok());
  REQUIRE(w->finish().ok());
}

std::vector<float> read_all(const st::Reader& r, const std::string& name) {
  const st::Entry* e = r.find(name);
  REQUIRE(e != nullptr);
  int64_t n = 1;
  for (int64_t d : e->shape) n *= d;
  std::vector<float> out(static_cast<size_t>(n));
  REQUIRE(r.read_f32(*e, {}, {}, out.data()).ok());
  return out;
}

// A file from a raw header and `data_bytes` zero bytes of data.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << std::string(data_bytes, '\0');
}

std::string open_error(const std::string& path) {
  absl::StatusOr<st::Reader> r = st::Reader::open(path);
  REQUIRE_FALSE(r.ok());
  return std::string(r.status().message());
}

TEST_CASE("safetensors: files read back, laid out as the safetensors library lays them out",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir / "m.safetensors";
  const std::map<std::string, std::vector<float>> values = {
      {"b", iota(6, 0.37f)}, {"a", iota(3, 1.0f / 3)}, {"c", {3.25f}}, {"z", iota(4, 0.1f)}};
  write(path,
        {{"b", ElemType::f32, {2, 3}},
         {"a", ElemType::f16, {3}},
         {"c", ElemType::f32, {1}},
         {"z", ElemType::bf16, {2, 2}}},
        values);
  // The header as safetensors 0.8 writes it for these tensors: metadata first, then F32, BF16,
  // F16, each by name; compact JSON padded with spaces to a multiple of 8.
  const std::string bytes = test::read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  std::string header = bytes.substr(8, n);
  while (!header.empty() && header.back() == ' ') header.pop_back();
  CHECK(
      header ==
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("c":{"dtype":"F32","shape":[1],"data_offsets":[24,28]},)"
      R"("z":{"dtype":"BF16","shape":[2,2],"data_offsets":[28,36]},)"
      R"("a":{"dtype":"F16","shape":[3],"data_offsets":[36,42]}})");
  CHECK(bytes.size() == 8 + n + 42);

  absl::StatusOr<st::Reader> r = st::Reader::open(path);
  REQUIRE(r.ok());
  REQUIRE(r->tensors().size() == 4);
  CHECK(r->find("z")->dtype == "BF16");
  CHECK(r->find("nope") == nullptr);
  CHECK(read_all(*r, "b") == values.at("b"));
  CHECK(read_all(*r, "c") == values.at("c"));
  std::vector<float> z = read_all(*r, "z"), a = read_all(*r, "a");
  for (size_t i = 0; i < 4; ++i) CHECK(z[i] == round_to_bf16(values.at("z")[i]));
  for (size_t i = 0; i < 3; ++i)
    CHECK(a[i] == static_cast<float>(static_cast<_Float16>(values.at("a")[i])));
  CHECK(a[1] != values.at("a")[1]);  // 1/3 - 1 is not a half: the values really were rounded
}

TEST_CASE("safetensors: blocks of a tensor", "[safetensors]") {
  TempDir dir;
  const std::string path = dir / "m.safetensors";
  const std::vector<float> cube = iota(3 * 4 * 5, 1.0f), mat = iota(6 * 7, 0.5f);
  write(path, {{"cube", ElemType::f32, {3, 4, 5}}, {"mat", ElemType::bf16, {6, 7}}},
        {{"cube", cube}, {"mat", mat}});
  absl::StatusOr<st::Reader> r = st::Reader::open(path);
  REQUIRE(r.ok());
  std::vector<float> out(12);
  const std::vector<int64_t> start = {1, 1, 2}, extent = {2, 3, 2};
  REQUIRE(r->read_f32(*r->find("cube"), start, extent, out.data()).ok());
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 2; ++k)
        CHECK(out[static_cast<size_t>((i * 3 + j) * 2 + k)] ==
              cube[static_cast<size_t>(((1 + i) * 4 + 1 + j) * 5 + 2 + k)]);
  const std::vector<int64_t> ms = {4, 0}, me = {2, 7};
  REQUIRE(r->read_f32(*r->find("mat"), ms, me, out.data()).ok());
  for (size_t i = 0; i < 14 && i < out.size(); ++i) CHECK(out[i] == round_to_bf16(mat[28 + i]));
  const std::vector<int64_t> past = {5, 0}, two = {2, 7};
  CHECK_FALSE(r->read_f32(*r->find("mat"), past, two, out.data()).ok());
}

TEST_CASE("safetensors: a damaged file is one error naming it", "[safetensors]") {
  TempDir dir;
  const std::string good = dir / "good.safetensors";
  write(good, {{"t", ElemType::f32, {4}}}, {{"t", iota(4, 1)}});
  const std::string cut = dir / "cut.safetensors";
  sfs::copy_file(good, cut);
  sfs::resize_file(cut, sfs::file_size(good) - 4);
  std::string e = open_error(cut);
  CHECK(e.find(cut) != std::string::npos);
  CHECK(e.find("truncated") != std::string::npos);

  const std::string tiny = dir / "tiny.safetensors";
  test::write_file(tiny, "abc");
  CHECK(open_error(tiny).find("too short for a header") != std::string::npos);

  const std::string huge = dir / "huge.safetensors";
  write_raw(huge, "{}", 0);
  {
    std::fstream f(huge, std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t n = uint64_t{1} << 40;
    f.write(reinterpret_cast<const char*>(&n), 8);
  }
  CHECK(open_error(huge).find("-byte header in a") != std::string::npos);

  const std::string notjson = dir / "notjson.safetensors";
  write_raw(notjson, "{not json", 0);
  CHECK(open_error(notjson).find("not a JSON object") != std::string::npos);

  const std::string size = dir / "size.safetensors";
  write_raw(size, R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8);
  CHECK(open_error(size).find("needs 8 bytes but data_offsets span 4") != std::string::npos);

  const std::string overlap = dir / "overlap.safetensors";
  write_raw(overlap,
            R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("u":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12);
  CHECK(open_error(overlap).find("overlap") != std::string::npos);

  const std::string ints = dir / "ints.safetensors";
  write_raw(ints, R"({"t":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8);
  absl::StatusOr<st::Reader> r = st::Reader::open(ints);
  REQUIRE(r.ok());  // listed...
  float x = 0;
  absl::Status s = r->read_f32(*r->find("t"), {}, {}, &x);  // ...but not read as floats
  CHECK(std::string(s.message()).find("'I64' is not one of F32, BF16, F16") != std::string::npos);

  CHECK(open_error(dir / "missing.safetensors").find("no such file") != std::string::npos);
  const std::string empty_dir = dir / "empty";
  sfs::create_directories(empty_dir);
  CHECK(open_error(empty_dir).find("holds neither model.safetensors nor") != std::string::npos);
}

TEST_CASE("safetensors: a sharded model directory through its index", "[safetensors]") {
  TempDir dir;
  write(dir / "model-00001-of-00002.safetensors", {{"a", ElemType::f32, {2}}},
        {{"a", {1.0f, 2.0f}}});
  write(dir / "model-00002-of-00002.safetensors", {{"b", ElemType::bf16, {1}}}, {{"b", {3.0f}}});
  test::write_file(dir / "model.safetensors.index.json",
                   R"({"metadata": {"total_size": 10}, "weight_map": {)"
                   R"("a": "model-00001-of-00002.safetensors", )"
                   R"("b": "model-00002-of-00002.safetensors"}})");
  absl::StatusOr<st::Reader> r = st::Reader::open(dir.path());
  REQUIRE(r.ok());
  CHECK(r->file_count() == 2);
  CHECK(read_all(*r, "a") == std::vector<float>{1.0f, 2.0f});
  CHECK(read_all(*r, "b") == std::vector<float>{3.0f});
  test::write_file(dir / "model.safetensors.index.json",
                   R"({"weight_map": {"a": "model-00002-of-00002.safetensors", )"
                   R"("b": "model-00002-of-00002.safetensors"}})");
  CHECK(open_error(dir.path()).find("the index and the shards disagree") != std::string::npos);
}

// ---- the trainer ----

// The trained weights of `run`'s checkpoint `step` exported to `out`.
CmdResult export_hf(const RunDir& run, const std::string& step, const std::string& out,
                    const std::string& args = "") {
  return run_cmd(tr::test::trainer_bin() + " export-hf --checkpoint " +
                 (run.dir / ("ckpt/" + step)) + " --out " + out + " " + args);
}

// A run that only loads: lr 0 keeps the imported weights through its one step.
const std::string kFrozen = " --set optim.lr=0 --set optim.min_lr=0";
// RunDir's warm-up is longer than these runs.
const std::string kNoWarmup = " --set optim.warmup_steps=0";

TEST_CASE("cli: export-hf, then model.init_from starts those weights under any layout",
          "[cli][mpi]") {
  std::vector<std::string> shape = test::kLayoutShape;
  shape.push_back("optim.warmup_steps=0");
  std::string args = "--set train.micro_batch=1";
  for (const std::string& kv : shape) args += " --set " + kv;
  RunDir trained(3);
  {
    CmdResult r = trained.trainer(args);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
  const std::string hf = trained.dir / "hf";
  CmdResult e = export_hf(trained, "step_00000003", hf, "--dtype fp32");
  INFO(e.output);
  REQUIRE(e.exit_code == 0);
  CHECK(e.output.find("exported ") != std::string::npos);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
    CHECK(sfs::exists(hf + "/" + f));
  const nlohmann::json config = nlohmann::json::parse(test::read_file(hf + "/config.json"));
  CHECK(config["num_hidden_layers"] == 4);
  CHECK(config["num_key_value_heads"] == 4);
  CHECK(config["tie_word_embeddings"] == true);
  CHECK(config["vocab_size"] == 257);
  const std::vector<float> want =
      read_checkpoint(trained.config, trained.dir / "ckpt/step_00000003", shape).p;

  // Imported under 1 rank and three multi-rank layouts: each saves exactly the exported weights,
  // and every layout's first loss is the same.
  struct Case {
    int ranks;
    std::string layout;
  };
  double first_loss = 0;
  for (const Case& c : {Case{1, ""}, Case{4, " --set parallel.tp=2 --set parallel.pp=2"},
                        Case{4, " --set parallel.pp=2 --set parallel.zero1=true"},
                        Case{4, " --set parallel.tp=4 --set parallel.sequence_parallel=true"}}) {
    RunDir run(1);
    const std::string a = args + kFrozen + " --set model.init_from=" + hf + c.layout;
    CmdResult r = c.ranks == 1 ? run.trainer(a) : run.mpirun(c.ranks, a);
    INFO(c.layout << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("initialised from " + hf) != std::string::npos);
    CHECK(read_checkpoint(run.config, run.dir / "ckpt/step_00000001", shape).p == want);
    const double loss = run.metrics()[0]["loss"].get<double>();
    if (c.ranks == 1) first_loss = loss;
    CHECK(std::abs(loss - first_loss) < 1e-5);
  }
  // ...and that first loss is the trained model's, not a fresh one's.
  CHECK(first_loss < trained.metrics()[0]["loss"].get<double>() - 0.1);

  // bf16 (the default) and shards with an index hold the same tensors, rounded.
  const std::string bf16 = trained.dir / "hf-bf16";
  REQUIRE(export_hf(trained, "step_00000003", bf16, "--max-shard-gib 0.00005").exit_code == 0);
  CHECK(sfs::exists(bf16 + "/model.safetensors.index.json"));
  CHECK_FALSE(sfs::exists(bf16 + "/model.safetensors"));
  absl::StatusOr<st::Reader> a = st::Reader::open(hf), b = st::Reader::open(bf16);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(b->file_count() > 1);
  REQUIRE(a->tensors().size() == b->tensors().size());
  for (const st::Entry& t : a->tensors()) {
    INFO(t.name);
    REQUIRE(b->find(t.name) != nullptr);
    CHECK(b->find(t.name)->dtype == "BF16");
    std::vector<float> x = read_all(*a, t.name), y = read_all(*b, t.name);
    for (float& v : x) v = round_to_bf16(v);
    CHECK(x == y);
  }
}

// Trains `trained` one step with `sets`, exports it (fp32) and checks that model.init_from
// takes the export with the same `sets` and refuses it without them, naming `refusal`. Returns
// the export's directory.
std::string export_and_reimport(const RunDir& trained, const std::string& sets,
                                const std::string& refusal) {
  {
    CmdResult r = trained.trainer(kNoWarmup + sets);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
  const std::string hf = trained.dir / "hf";
  REQUIRE(export_hf(trained, "step_00000001", hf, "--dtype fp32").exit_code == 0);
  {
    RunDir run(1);
    CmdResult r = run.trainer(kFrozen + kNoWarmup + sets + " --set model.init_from=" + hf);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("initialised from " + hf) != std::string::npos);
  }
  RunDir run(1);
  CmdResult r = run.trainer(kFrozen + kNoWarmup + " --set model.init_from=" + hf);
  INFO(r.output);
  CHECK(r.exit_code == kExitBadInput);
  CHECK(r.output.find(refusal) != std::string::npos);
  return hf;
}

// model.rope_scaling (YaRN) as Hugging Face spells it: a run trains with it, the resolved config
// and export-hf's config.json carry it (both transformers spellings), model.init_from takes the
// export only with the same rope_scaling, and malformed blocks are one line each.
TEST_CASE("cli: a YaRN model exports its rope_scaling and imports only with the same", "[cli]") {
  const std::string yarn =
      " --set 'model.rope_scaling={type: yarn, factor: 4, original_max_position_embeddings: 16}'";
  RunDir trained(1);
  const std::string hf = export_and_reimport(
      trained, yarn,
      "config.json has rope_scaling {type: yarn, factor: 4, original_max_position_embeddings: 16, "
      "beta_fast: 32, beta_slow: 1, attention_factor: 0, truncate: true} but model.rope_scaling "
      "is none; set model.rope_scaling to {type: yarn");
  CHECK(test::read_file(trained.dir / "log/config.yaml")
            .find("rope_scaling: {type: yarn, factor: 4.0, original_max_position_embeddings: 16, "
                  "beta_fast: 32.0, beta_slow: 1.0, attention_factor: 0.0, truncate: true}") !=
        std::string::npos);
  const nlohmann::json config = nlohmann::json::parse(test::read_file(hf + "/config.json"));
  INFO(config.dump());
  CHECK(config["rope_scaling"]["type"] == "yarn");
  CHECK(config["rope_scaling"]["factor"] == 4.0);
  CHECK(config["rope_scaling"]["original_max_position_embeddings"] == 16);
  CHECK(config["rope_parameters"]["rope_type"] == "yarn");
  CHECK(config["rope_parameters"]["factor"] == 4.0);
  CHECK_FALSE(config["rope_parameters"].contains("attention_factor"));  // from the factor
  const struct {
    std::string value, error;
  } bad[] = {
      {"{type: linear, factor: 2}",
       "model.rope_scaling.type must be yarn, llama3 or none (got 'linear')"},
      {"{type: llama3, factor: 8, low_freq_factor: 4, high_freq_factor: 1, "
       "original_max_position_embeddings: 16}",
       "model.rope_scaling: llama3 needs low_freq_factor < high_freq_factor (got 4 and 1)"},
      {"{type: yarn, factor: 4}",
       "model.rope_scaling.original_max_position_embeddings is missing; a yarn block needs "
       "factor, original_max_position_embeddings"},
      {"{type: yarn, factr: 4}",
       "model.rope_scaling.factr is not a rope_scaling key; did you mean 'factor'?"},
      {"4",
       "model.rope_scaling: expected none, {type: yarn, factor: F, "
       "original_max_position_embeddings: N} or {type: llama3, factor: F, low_freq_factor: L, "
       "high_freq_factor: H, original_max_position_embeddings: N}, got '4'"}};
  for (const auto& b : bad) {
    CmdResult r = trained.trainer("--dry-run --set 'model.rope_scaling=" + b.value + "'");
    INFO(b.value << "\n" << r.output);
    CHECK(r.exit_code == kExitBadInput);
    CHECK(r.output.find("error: " + b.error) != std::string::npos);
  }
}

// Llama 3's rope_scaling the same way: the resolved config, export-hf's config.json (both
// transformers spellings, rope_type llama3 with its four numbers), and init_from with the same
// block only.
TEST_CASE("cli: a Llama 3 rope model exports its rope_scaling and imports only with the same",
          "[cli]") {
  const std::string llama3 =
      " --set 'model.rope_scaling={type: llama3, factor: 8, low_freq_factor: 1, "
      "high_freq_factor: 4, original_max_position_embeddings: 16}'";
  RunDir trained(1);
  const std::string hf = export_and_reimport(
      trained, llama3,
      "config.json has rope_scaling {type: llama3, factor: 8, low_freq_factor: 1, "
      "high_freq_factor: 4, original_max_position_embeddings: 16} but model.rope_scaling is none");
  CHECK(test::read_file(trained.dir / "log/config.yaml")
            .find("rope_scaling: {type: llama3, factor: 8.0, low_freq_factor: 1.0, "
                  "high_freq_factor: 4.0, original_max_position_embeddings: 16}") !=
        std::string::npos);
  const nlohmann::json config = nlohmann::json::parse(test::read_file(hf + "/config.json"));
  INFO(config.dump());
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    CHECK(config[key]["rope_type"] == "llama3");
    CHECK(config[key]["factor"] == 8.0);
    CHECK(config[key]["low_freq_factor"] == 1.0);
    CHECK(config[key]["high_freq_factor"] == 4.0);
    CHECK(config[key]["original_max_position_embeddings"] == 16);
  }
}

// model.family llama: no q, k, v biases in the checkpoint or the export, config.json says
// LlamaForCausalLM, and init_from refuses it for a qwen2 run naming the fix.
TEST_CASE("cli: a llama-family run exports a Llama model and imports only as one", "[cli]") {
  RunDir trained(1);
  const std::string hf = export_and_reimport(
      trained, " --set model.family=llama",
      "config.json has model_type llama but model.family is qwen2; set model.family to llama");
  const nlohmann::json config = nlohmann::json::parse(test::read_file(hf + "/config.json"));
  INFO(config.dump());
  CHECK(config["architectures"] == nlohmann::json::array({"LlamaForCausalLM"}));
  CHECK(config["model_type"] == "llama");
  CHECK(config["attention_bias"] == false);
  CHECK_FALSE(config.contains("use_sliding_window"));
  // The safetensors header names every tensor: projections, norms, no bias.
  const std::string st = test::read_file(hf + "/model.safetensors");
  uint64_t header = 0;
  std::memcpy(&header, st.data(), 8);
  const nlohmann::json names = nlohmann::json::parse(st.substr(8, header));
  CHECK(names.contains("model.layers.0.self_attn.q_proj.weight"));
  for (const auto& [name, _] : names.items()) CHECK(name.find("bias") == std::string::npos);
}

TEST_CASE("cli: bad model.init_from and export-hf input is one error line and exit 2", "[cli]") {
  RunDir trained(1);
  {
    CmdResult r = trained.trainer(kNoWarmup);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
  const std::string hf = trained.dir / "hf";
  REQUIRE(export_hf(trained, "step_00000001", hf).exit_code == 0);
  RunDir run(1);
  auto init = [&](const std::string& dir, const std::string& more = "") {
    return run.trainer("--set model.init_from=" + dir + kNoWarmup + more);
  };
  expect_bad_input(init(run.dir / "nowhere"), "config.json cannot be read");
  // A config.json that is a directory; a rope_scaling that is no block.
  const std::string odd = run.dir / "odd";
  sfs::copy(hf, odd);
  sfs::remove(odd + "/config.json");
  sfs::create_directory(odd + "/config.json");
  expect_bad_input(init(odd), "config.json cannot be read (no such file, or not a file)");
  sfs::remove(odd + "/config.json");
  nlohmann::json config = nlohmann::json::parse(test::read_file(hf + "/config.json"));
  config["rope_scaling"] = "yes";
  test::write_file(odd + "/config.json", config.dump());
  expect_bad_input(init(odd), "\"rope_scaling\" is \"yes\"; it must be null or an object");
  config["rope_scaling"] = nullptr;
  config["model_type"] = 7;
  test::write_file(odd + "/config.json", config.dump());
  expect_bad_input(init(odd), "config.json: a field has the wrong JSON type");
  // A weight that is NaN, or infinite: refused at import, naming the tensor and the file.
  sfs::copy_file(hf + "/config.json", odd + "/config.json", sfs::copy_options::overwrite_existing);
  for (const float poison : {std::nanf(""), -INFINITY}) {
    absl::StatusOr<st::Reader> full = st::Reader::open(hf);
    REQUIRE(full.ok());
    std::vector<st::WriteEntry> all;
    std::map<std::string, std::vector<float>> values;
    for (const st::Entry& t : full->tensors()) {
      all.push_back({t.name, ElemType::f32, t.shape});
      values[t.name] = read_all(*full, t.name);
    }
    values["model.layers.1.mlp.up_proj.weight"][5] = poison;
    write(odd + "/model.safetensors", all, values);
    expect_bad_input(init(odd), "tensor model.layers.1.mlp.up_proj.weight in " + odd +
                                    "/model.safetensors holds 1 non-finite value (NaN or Inf; "
                                    "the first at element 5");
  }
  expect_bad_input(init(hf, " --set model.intermediate_size=64"),
                   "config.json has intermediate_size 128 but model.intermediate_size is 64");
  expect_bad_input(init(hf, " --set model.tie_embeddings=false"),
                   "config.json has tie_word_embeddings true but model.tie_embeddings is false");
  // A model directory short of a tensor, and one whose file is cut short.
  const std::string part = run.dir / "part";
  sfs::create_directories(part);
  sfs::copy_file(hf + "/config.json", part + "/config.json");
  {
    absl::StatusOr<st::Reader> full = st::Reader::open(hf);
    REQUIRE(full.ok());
    std::vector<st::WriteEntry> keep;
    std::map<std::string, std::vector<float>> values;
    for (const st::Entry& t : full->tensors())
      if (t.name != "model.norm.weight") {
        keep.push_back({t.name, ElemType::bf16, t.shape});
        values[t.name] = read_all(*full, t.name);
      }
    write(part + "/model.safetensors", keep, values);
  }
  expect_bad_input(init(part), "tensor model.norm.weight is missing; the model needs it");
  const std::string cut = run.dir / "cut";
  sfs::copy(hf, cut);
  sfs::resize_file(cut + "/model.safetensors", sfs::file_size(cut + "/model.safetensors") / 2);
  expect_bad_input(init(cut), "truncated");
  CHECK_FALSE(sfs::exists(run.dir / "ckpt/latest"));

  // A resumed run ignores model.init_from, even one that would not load.
  CmdResult r =
      trained.trainer("--set train.steps=2 --set model.init_from=" + (run.dir / "x") + kNoWarmup);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("is ignored: resuming from") != std::string::npos);

  // export-hf: no such checkpoint, an --out that holds files, a bad --dtype.
  auto exp = [&](const std::string& args) {
    return run_cmd(tr::test::trainer_bin() + " export-hf " + args);
  };
  expect_bad_input(exp("--checkpoint " + (run.dir / "none") + " --out " + (run.dir / "o")),
                   run.dir / "none");
  const std::string before = test::read_file(hf + "/config.json");
  expect_bad_input(exp("--checkpoint " + (trained.dir / "ckpt/step_00000001") + " --out " + hf),
                   "exists and is not an empty directory");
  CHECK(test::read_file(hf + "/config.json") == before);
  expect_bad_input(exp("--checkpoint x --out y --dtype fp8"), "--dtype 'fp8' is not one of");
  expect_bad_input(exp("--out y"), "export-hf needs --checkpoint STEP_DIR and --out DIR");

  // A write that fails (files capped at a few KiB, as a full disk would stop them): exit 1, one
  // line naming the file, and nothing left behind.
  const std::string full = run.dir / "full";
  const CmdResult capped = run_cmd("sh -c 'trap \"\" XFSZ; ulimit -f 8; exec " +
                                   tr::test::trainer_bin() + " export-hf --checkpoint " +
                                   (trained.dir / "ckpt/step_00000001") + " --out " + full + "'");
  INFO(capped.output);
  CHECK(capped.exit_code == kExitFailure);
  CHECK(capped.output.find("error: ") == 0);
  CHECK(capped.output.find(full + ".tmp/model.safetensors") != std::string::npos);
  CHECK(std::count(capped.output.begin(), capped.output.end(), '\n') == 1);
  CHECK_FALSE(sfs::exists(full));
  CHECK_FALSE(sfs::exists(full + ".tmp"));
}

// A bad export-hf --out is bad input, refused before the checkpoint is read and leaving every
// file as it was: a path under a regular file (once exit 1, "cannot remove .../out.tmp"), that
// file itself, and that file with a trailing '/' (once removed and replaced by the export).
TEST_CASE("hf: a bad export-hf --out is one line naming it, and damages nothing", "[hf]") {
  TempDir dir;
  const std::string file = dir.path() + "/file";
  std::ofstream(file) << "keep";
  auto refusal = [&](const std::string& out) {
    ExportOptions o;
    o.checkpoint = dir.path() + "/no_checkpoint";
    o.out = out;
    const absl::Status st = export_hf(o);
    INFO(out << ": " << st);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(st.message()).starts_with("--out " + out));
    CHECK(test::read_file(file) == "keep");
    return std::string(st.message());
  };
  CHECK(refusal(file + "/out") ==
        "--out " + file + "/out: " + file + " is not a directory; choose a path in one");
  CHECK(refusal(file + "/a/b").find(file + " is not a directory") != std::string::npos);
  CHECK(refusal(file).find("exists and is not an empty directory") != std::string::npos);
  CHECK(refusal(file + "/").find("exists and is not an empty directory") != std::string::npos);
  CHECK_FALSE(sfs::exists(file + ".tmp"));

  // Through the trainer: exit 2 and one line.
  expect_bad_input(run_cmd(tr::test::trainer_bin() + " export-hf --checkpoint " + dir.path() +
                           " --out " + file + "/out"),
                   "--out " + file + "/out: " + file + " is not a directory");
  CHECK(test::read_file(file) == "keep");
}

// The fuzz tests' model: RunDir's tiny Qwen2 (tests/cli_util.h), and a Hugging Face directory
// of it written here (config.json as transformers spells it; model.safetensors of seeded weights,
// in F32, BF16 and F16).
const char kTinyModel[] = R"(
model: {hidden_size: 64, intermediate_size: 128, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        head_dim: 16, vocab_size: 257, max_seq_len: 64, rope_theta: 10000, tie_embeddings: true}
data: {train: [{path: unused}], seq_len: 32}
train: {steps: 1, global_batch: 8, micro_batch: 4}
)";

std::string tiny_config_json() {
  nlohmann::json j = {{"architectures", {"Qwen2ForCausalLM"}},
                      {"model_type", "qwen2"},
                      {"hidden_size", 64},
                      {"intermediate_size", 128},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 16},
                      {"vocab_size", 257},
                      {"hidden_act", "silu"},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"rope_scaling", nullptr},
                      {"tie_word_embeddings", true},
                      {"use_sliding_window", false},
                      {"torch_dtype", "float32"}};
  return j.dump(2);
}

std::string tiny_safetensors(const Config& cfg) {
  const absl::StatusOr<Topology> one = Topology::make(1, 0, 1, 1, 1);
  REQUIRE(one.ok());
  std::mt19937 rng(3);
  std::vector<st::WriteEntry> entries;
  std::map<std::string, std::vector<float>> values;
  const ElemType types[] = {ElemType::f32, ElemType::bf16, ElemType::f16};
  for (const ckpt::TensorRef& t : model_tensors(cfg, *one)) {
    entries.push_back({hf_name(t.name), types[entries.size() % 3], t.shape});
    std::vector<float>& v = values[hf_name(t.name)];
    v.resize(static_cast<size_t>(t.block_numel()));
    for (float& x : v) x = std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng);
  }
  TempDir dir;
  write(dir / "m.safetensors", entries, values);
  return test::read_file(dir / "m.safetensors");
}

// The tensors of a safetensors file's bytes as floats, decoded here independently of
// checkpoint/safetensors.h; empty when the bytes are not a well-formed file.
std::map<std::string, std::vector<float>> decode_safetensors(const std::string& bytes) {
  std::map<std::string, std::vector<float>> out;
  if (bytes.size() < 8) return {};
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8) return {};
  const nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n), nullptr, false);
  if (!h.is_object()) return {};
  const size_t data = 8 + n;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const nlohmann::json& e = it.value();
    if (!e.is_object() || !e.contains("dtype") || !e.contains("data_offsets")) return {};
    const std::string dtype = e["dtype"].is_string() ? e["dtype"].get<std::string>() : "";
    const int width = dtype == "F32" ? 4 : dtype == "BF16" || dtype == "F16" ? 2 : 0;
    const uint64_t begin = e["data_offsets"][0].get<uint64_t>(),
                   end = e["data_offsets"][1].get<uint64_t>();
    if (width == 0 || begin > end || data + end > bytes.size()) return {};
    std::vector<float>& v = out[it.key()];
    for (uint64_t at = data + begin; at + width <= data + end; at += width) {
      if (dtype == "F32") {
        float x;
        std::memcpy(&x, bytes.data() + at, 4);
        v.push_back(x);
      } else {
        uint16_t u;
        std::memcpy(&u, bytes.data() + at, 2);
        _Float16 x;
        std::memcpy(&x, &u, 2);
        v.push_back(dtype == "BF16" ? bf16_to_f32(u) : static_cast<float>(x));
      }
    }
  }
  return out;
}

// model.init_from reads what other tools wrote: a few hundred seeded mutations of a config.json
// and a safetensors file (bytes, JSON structure, the header's length, the data) each import
// exactly what the file says (checked against the decoder above) or are refused as bad input
// with one line; no mutation throws or crashes.
TEST_CASE("hf: damaged config.json and safetensors files import exactly or are one error line",
          "[hf]") {
  absl::StatusOr<Config> cfg = parse_config(kTinyModel, {});
  INFO(cfg.status().message());
  REQUIRE(cfg.ok());
  TempDir dir;
  cfg->model.init_from = dir.path();
  const absl::StatusOr<Topology> one = Topology::make(1, 0, 1, 1, 1);
  REQUIRE(one.ok());
  const std::string good_config = tiny_config_json(), good_weights = tiny_safetensors(*cfg);
  uint64_t header = 0;
  std::memcpy(&header, good_weights.data(), 8);
  std::vector<float> params(static_cast<size_t>(rank_layout(*cfg, *one).total));
  std::mt19937 rng(41);
  int imported = 0, refused = 0;
  for (int i = 0; i < 400; ++i) {
    std::string config = good_config, weights = good_weights;
    switch (i % 6) {
      case 0:
        config = test::mutate_bytes(config, rng);
        break;
      case 1:
        config = test::mutate_json(nlohmann::json::parse(config), rng).dump();
        break;
      case 2:  // the header's text
        weights = test::mutate_bytes(weights, rng, 8, 8 + header);
        break;
      case 3: {  // the header's structure, its length kept true
        std::string h =
            test::mutate_json(nlohmann::json::parse(weights.substr(8, header)), rng).dump();
        h.append((8 - h.size() % 8) % 8, ' ');
        const uint64_t n = h.size();
        weights =
            std::string(reinterpret_cast<const char*>(&n), 8) + h + weights.substr(8 + header);
        break;
      }
      case 4:  // the length, or the data
        weights = rng() % 4 == 0 ? test::mutate_bytes(weights, rng, 0, 8)
                                 : test::mutate_bytes(weights, rng, 8 + header);
        break;
      default:  // a byte of the data, in place
        weights[8 + header + rng() % (weights.size() - 8 - header)] = static_cast<char>(rng());
    }
    test::write_file(dir / "config.json", config);
    test::write_file(dir / "model.safetensors", weights);
    INFO("mutation " << i);
    absl::Status status;
    try {
      absl::StatusOr<st::Reader> r = open_hf_model(dir.path(), *cfg, *one);
      status = r.ok() ? load_hf_rank_part(*r, *cfg, *one, params.data()) : r.status();
    } catch (const std::exception& e) {
      FAIL("mutation " << i << " threw: " << e.what());
    }
    if (!status.ok()) {
      ++refused;
      INFO(status.message());
      CHECK(status.code() == absl::StatusCode::kInvalidArgument);  // exit 2, not 1
      CHECK(std::string(status.message()).find('\n') == std::string::npos);
      CHECK_FALSE(status.message().empty());
      continue;
    }
    ++imported;
    const std::map<std::string, std::vector<float>> want = decode_safetensors(weights);
    for (const ckpt::TensorRef& b : rank_param_blocks(*cfg, *one, params.data())) {
      INFO(b.name);
      REQUIRE(want.count(hf_name(b.name)) == 1);
      CHECK(std::equal(b.data, b.data + b.block_numel(), want.at(hf_name(b.name)).begin(),
                       want.at(hf_name(b.name)).end()));
    }
  }
  CHECK(imported >= 50);  // both outcomes were exercised
  CHECK(refused >= 100);
}

// A config.json's rope block is checked by the same list of fields as the YAML's: a llama3
// block without low_freq_factor (which transformers refuses), a value out of range, a key of
// the other type or none known are one line naming the field, under rope_scaling or
// rope_parameters; the complete block imports.
TEST_CASE("hf: config.json rope blocks are checked field by field, as the YAML's are", "[hf]") {
  absl::StatusOr<Config> cfg =
      parse_config(kTinyModel, {"model.rope_scaling={type: llama3, factor: 8, low_freq_factor: 1, "
                                "high_freq_factor: 4, original_max_position_embeddings: 16}"});
  REQUIRE(cfg.ok());
  TempDir dir;
  cfg->model.init_from = dir.path();
  const absl::StatusOr<Topology> one = Topology::make(1, 0, 1, 1, 1);
  REQUIRE(one.ok());
  test::write_file(dir / "model.safetensors", tiny_safetensors(*cfg));
  const nlohmann::json llama3 = {{"rope_type", "llama3"},
                                 {"factor", 8.0},
                                 {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0},
                                 {"original_max_position_embeddings", 16}};
  auto open_with = [&](const char* key, const nlohmann::json& block) {
    nlohmann::json config = nlohmann::json::parse(tiny_config_json());
    config[key] = block;
    test::write_file(dir / "config.json", config.dump());
    return open_hf_model(dir.path(), *cfg, *one).status();
  };
  REQUIRE(open_with("rope_scaling", llama3).ok());
  const std::string at = dir / "config.json: ";
  const auto without = [&](const char* field) {
    nlohmann::json b = llama3;
    b.erase(field);
    return b;
  };
  const auto with = [&](const char* field, const nlohmann::json& v) {
    nlohmann::json b = llama3;
    b[field] = v;
    return b;
  };
  const struct {
    const char* key;
    nlohmann::json block;
    std::string error;
  } bad[] = {
      {"rope_scaling", without("low_freq_factor"),
       "rope_scaling.low_freq_factor is missing; a llama3 block needs factor, "
       "original_max_position_embeddings, low_freq_factor, high_freq_factor"},
      {"rope_parameters", without("high_freq_factor"),
       "rope_parameters.high_freq_factor is missing; a llama3 block"},
      {"rope_scaling", with("factor", 1e300),
       "rope_scaling.factor must be a finite number in [1, 1e+06] (got 1e+300)"},
      {"rope_scaling", with("original_max_position_embeddings", -16),
       "rope_scaling.original_max_position_embeddings must be a finite whole number"},
      {"rope_scaling", with("beta_fast", 32),
       "rope_scaling.beta_fast is not a key of a llama3 block"},
      {"rope_scaling", with("truncate", "yes"),
       "rope_scaling.truncate is not a key of a llama3 block"},
      {"rope_scaling", with("low_freq", 1), "rope_scaling.low_freq is not a rope_scaling key"},
      {"rope_scaling", with("factor", "8"),
       "rope_scaling.factor must be a finite number in [1, 1e+06] (got \"8\")"},
      {"rope_scaling",
       {{"type", "yarn"},
        {"factor", 4.0},
        {"original_max_position_embeddings", 16},
        {"beta_slow", 0}},
       "rope_scaling.beta_slow must be a finite number in (0, 1e+06] (got 0)"}};
  for (const auto& b : bad) {
    const absl::Status st = open_with(b.key, b.block);
    INFO(b.block.dump() << "\n" << st.message());
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(st.message()).rfind(at + b.error, 0) == 0);
  }
}

// The same kind of damage through the processes: trainer --dry-run with model.init_from ends in
// exit 0 or exit 2 with one error line, never a signal, an abort or exit 1.
TEST_CASE("cli: damaged Hugging Face files through the trainer: exit 0, or 2 with one line",
          "[cli]") {
  absl::StatusOr<Config> cfg = parse_config(kTinyModel, {});
  INFO(cfg.status().message());
  REQUIRE(cfg.ok());
  RunDir run(1);
  const std::string hf = run.dir / "hf";
  sfs::create_directories(hf);
  const std::string weights = tiny_safetensors(*cfg);
  std::mt19937 rng(43);
  int exit2 = 0;
  for (int i = 0; i < 8; ++i) {
    test::write_file(hf + "/config.json",
                     test::mutate_json(nlohmann::json::parse(tiny_config_json()), rng).dump());
    test::write_file(hf + "/model.safetensors", i % 2 ? test::mutate_bytes(weights, rng) : weights);
    const CmdResult r = run.trainer("--dry-run --set model.init_from=" + hf);
    INFO("mutation " << i << "\n" << r.output);
    REQUIRE((r.exit_code == 0 || r.exit_code == kExitBadInput));
    if (r.exit_code == kExitBadInput) {
      ++exit2;
      expect_bad_input(r, "");
    }
  }
  CHECK(exit2 >= 2);
}

}  // namespace
}  // namespace tr
