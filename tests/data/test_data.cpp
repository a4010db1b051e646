// Data layer: readers, writer, samples, shuffle, blending, loader, tokenizer, prepare_data.
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "data/id_check.h"
#include "data/loader.h"
#include "data/sampling.h"
#include "data/token_source.h"
#include "data/tokenizer.h"
#include "data/writer.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace tr::data;

namespace {

// A fresh mkdtemp directory, removed with everything in it at scope exit.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tr_data_XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

using Bytes = std::vector<uint8_t>;

template <class T>
void put(Bytes& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}

void write_file(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(out.good());
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// A hand-written .idx in the Megatron layout; one document per sequence unless docs is given.
const std::string kIdxMagic("MMIDIDX\0\0", 9);
Bytes idx_bytes(uint8_t code, const std::vector<int32_t>& lengths, size_t elem,
                uint64_t version = 1, const std::string& magic = kIdxMagic,
                std::vector<int64_t> docs = {}) {
  Bytes b(magic.begin(), magic.end());
  if (docs.empty())
    for (size_t i = 0; i <= lengths.size(); ++i) docs.push_back(static_cast<int64_t>(i));
  put(b, version);
  put(b, code);
  put(b, static_cast<uint64_t>(lengths.size()));
  put(b, static_cast<uint64_t>(docs.size()));
  for (int32_t l : lengths) put(b, l);
  int64_t off = 0;
  for (int32_t l : lengths) {
    put(b, off);
    off += l * static_cast<int64_t>(elem);
  }
  for (int64_t v : docs) put(b, v);
  return b;
}

template <class T>
Bytes encode_as(const std::vector<double>& values) {
  Bytes b;
  for (double v : values) put(b, static_cast<T>(v));
  return b;
}

std::unique_ptr<TokenSource> open_ok(const std::string& path,
                                     SourceFormat format = SourceFormat::auto_detect) {
  auto src = TokenSource::open(path, format);
  INFO(src.status().ToString());
  REQUIRE(src.ok());
  return std::move(*src);
}

std::vector<int32_t> read_all(const TokenSource& src) {
  std::vector<int32_t> out(src.num_tokens());
  auto st = src.read(0, out);
  INFO(st.ToString());
  REQUIRE(st.ok());
  return out;
}

std::string open_error(const std::string& path, SourceFormat format = SourceFormat::auto_detect) {
  auto src = TokenSource::open(path, format);
  REQUIRE_FALSE(src.ok());
  return std::string(src.status().message());
}

// Writes PREFIX.bin/.idx with one document per entry of docs.
void write_dataset(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs,
                   int64_t vocab) {
  auto w = IndexedDatasetWriter::create(prefix, vocab);
  REQUIRE(w.ok());
  for (const auto& d : docs) REQUIRE((*w)->add_document(d).ok());
  REQUIRE((*w)->finish().ok());
}

// A source whose token at stream position p is p % vocab, split into documents of doc_len.
void write_ramp(const std::string& prefix, int64_t tokens, int64_t doc_len, int64_t vocab = 257) {
  std::vector<std::vector<int32_t>> docs;
  for (int64_t p = 0; p < tokens; ++p) {
    if (p % doc_len == 0) docs.emplace_back();
    docs.back().push_back(static_cast<int32_t>(p % vocab));
  }
  write_dataset(prefix, docs, vocab);
}

LoaderOptions loader_options(std::vector<DataPath> paths) {
  LoaderOptions o;
  o.paths = std::move(paths);
  o.seq_len = 8;
  o.seed = 42;
  o.global_batch = 8;
  o.micro_batch = 2;
  return o;
}

std::unique_ptr<DataLoader> make_loader(const LoaderOptions& o) {
  auto loader = DataLoader::create(o);
  INFO(loader.status().ToString());
  REQUIRE(loader.ok());
  return std::move(*loader);
}

// All micro-batches of a step back to back: inputs, or targets.
std::vector<int32_t> flat(const StepBatch& step, bool targets = false) {
  std::vector<int32_t> out;
  for (const MicroBatch& m : step.micro_batches) {
    const auto& v = targets ? m.targets : m.inputs;
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

SampleSpace one_source(const std::string& prefix, int64_t seq_len, bool shuffle) {
  std::vector<WeightedSource> sources;
  sources.push_back({open_ok(prefix), 1.0});
  auto space = SampleSpace::create(std::move(sources), seq_len, 99, shuffle);
  REQUIRE(space.ok());
  return std::move(*space);
}

StepBatch next_ok(DataLoader& loader) {
  auto step = loader.next();
  INFO(step.status().ToString());
  REQUIRE(step.ok());
  return std::move(*step);
}

}  // namespace

TEST_CASE("data: writer round trip, u16 and i32") {
  TempDir dir;
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 256}, {}, {3, 4, 5, 256}, {256}};
  const std::vector<int32_t> stream = {1, 2, 256, 3, 4, 5, 256, 256};
  write_dataset(dir / "small", docs, 257);
  CHECK(fs::file_size(dir / "small.bin") == 2 * stream.size());
  CHECK(fs::file_size(dir / "small.idx") == 34 + 12 * 4 + 8 * 5);
  CHECK(read_file(dir / "small.idx")[17] == 8);  // u16
  auto src = open_ok(dir / "small");
  CHECK(src->dtype() == TokenDType::u16);
  CHECK(src->num_documents() == 4);
  CHECK(read_all(*src) == stream);

  const std::vector<std::vector<int32_t>> big = {{151643, 0, 70000}, {151935}};
  write_dataset(dir / "big", big, 151936);
  CHECK(read_file(dir / "big.idx")[17] == 4);  // i32
  CHECK(fs::file_size(dir / "big.bin") == 16);
  auto big_src = open_ok(dir / "big", SourceFormat::megatron);
  CHECK(big_src->dtype() == TokenDType::i32);
  CHECK(read_all(*big_src) == std::vector<int32_t>{151643, 0, 70000, 151935});
  // Reads at an offset, and a model vocabulary limit.
  std::vector<int32_t> two(2);
  REQUIRE(big_src->read(1, two).ok());
  CHECK(two == std::vector<int32_t>{0, 70000});
  auto st = big_src->read(0, two, 100000);
  CHECK_THAT(std::string(st.message()),
             Catch::Contains("token 0 of " + dir / "big.bin") && Catch::Contains("value 151643"));
  CHECK_FALSE(big_src->read(3, two).ok());  // past the end
}

// The id scan reports each file's smallest and largest id, also from its cache: a file of
// nothing but the end-of-document token is found without a second pass (data.eod_mask_loss).
TEST_CASE("data: the id check reports each file's id range, also when cached") {
  TempDir dir;
  write_dataset(dir / "eod", {{256, 256}, {256}}, 257);
  write_dataset(dir / "text", {{1, 2, 256}, {7, 256}}, 257);
  const std::vector<std::string> paths = {dir / "eod", dir / "text"};
  absl::StatusOr<IdCheck> first = check_token_ids(paths, SourceFormat::megatron, 257, "");
  REQUIRE(first.ok());
  absl::StatusOr<IdCheck> again =
      check_token_ids(paths, SourceFormat::megatron, 257, first->cache_json);
  REQUIRE(again.ok());
  CHECK(again->cached == 2);
  for (const IdCheck* c : {&*first, &*again}) {
    REQUIRE(c->ranges.size() == 2);
    CHECK(c->ranges[0].only(256));
    CHECK_FALSE(c->ranges[1].only(256));
    CHECK(c->ranges[1].lo == 1);
    CHECK(c->ranges[1].hi == 256);
  }
}

TEST_CASE("data: writer rejects bad tokens and leaves no half-written pair") {
  TempDir dir;
  auto w = IndexedDatasetWriter::create(dir / "x", 257);
  REQUIRE(w.ok());
  const std::vector<int32_t> bad = {1, 257};
  CHECK_THAT(std::string((*w)->add_document(bad).message()),
             Catch::Contains("outside [0, vocab 257)"));
  const std::vector<int32_t> good = {1, 2};
  REQUIRE((*w)->add_document(good).ok());
  CHECK(fs::exists(dir / "x.bin.tmp"));
  CHECK_FALSE(fs::exists(dir / "x.bin"));
  CHECK_FALSE(fs::exists(dir / "x.idx"));
  w->reset();  // abandoned before finish()
  CHECK(fs::is_empty(dir.path));
  // finish() replaces an older pair completely.
  write_dataset(dir / "x", {{5, 6, 7}}, 257);
  write_dataset(dir / "x", {{8, 9}}, 257);
  CHECK(read_all(*open_ok(dir / "x")) == std::vector<int32_t>{8, 9});
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 2);
}

TEST_CASE("data: reader converts every .idx token dtype") {
  TempDir dir;
  const std::vector<double> values = {0, 1, 7, 100, 127, 3};
  const std::vector<int32_t> expect = {0, 1, 7, 100, 127, 3};
  struct Case {
    uint8_t code;
    size_t elem;
    Bytes bin;
    std::string bad;  // empty: reads back as `expect`; else the bad value in the error
  };
  const std::vector<Case> cases = {
      {1, 1, encode_as<uint8_t>(values), ""},
      {2, 1, encode_as<int8_t>(values), ""},
      {3, 2, encode_as<int16_t>(values), ""},
      {4, 4, encode_as<int32_t>(values), ""},
      {5, 8, encode_as<int64_t>(values), ""},
      {6, 8, encode_as<double>(values), ""},
      {7, 4, encode_as<float>(values), ""},
      {8, 2, encode_as<uint16_t>(values), ""},
      // Values that do not convert exactly to a token id are errors, never silent casts.
      {7, 4, encode_as<float>({1, 2.5, 0, 0, 0, 0}), "value 2.5"},
      {6, 8, encode_as<double>({-1, 2, 0, 0, 0, 0}), "value -1"},
      {5, 8, encode_as<int64_t>({3, 1e10, 0, 0, 0, 0}), "value 1e+10"},
      {2, 1, encode_as<int8_t>({-3, 4, 0, 0, 0, 0}), "value -3"}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    INFO("dtype code " << int(c.code));
    std::string name = "d";  // (not "d" + to_string(i): GCC 12 -Wrestrict false positive)
    name += std::to_string(i);
    const std::string prefix = dir / name;
    write_file(prefix + ".idx", idx_bytes(c.code, {2, 3, 1}, c.elem));
    write_file(prefix + ".bin", c.bin);
    auto src = open_ok(prefix);
    CHECK(static_cast<int>(src->dtype()) == c.code);
    CHECK(src->num_tokens() == 6);
    if (c.bad.empty()) {
      CHECK(read_all(*src) == expect);
    } else {
      std::vector<int32_t> out(6);
      CHECK_THAT(std::string(src->read(0, out).message()),
                 Catch::Contains(c.bad) && Catch::Contains("not a token id"));
    }
  }
}

TEST_CASE("data: llm.c v1 and v7 shards") {
  TempDir dir;
  const std::vector<int32_t> small = {50256, 1, 2, 65535};
  REQUIRE(write_llmc_shard(dir / "v1.bin", small, 1).ok());
  Bytes raw = read_file(dir / "v1.bin");
  REQUIRE(raw.size() == 1024 + 2 * 4);
  std::vector<int32_t> header(3);
  std::memcpy(header.data(), raw.data(), 12);
  CHECK(header == std::vector<int32_t>{20240520, 1, 4});
  auto v1 = open_ok(dir / "v1.bin");
  CHECK(v1->format() == SourceFormat::llmc);
  CHECK(v1->dtype() == TokenDType::u16);
  CHECK(read_all(*v1) == small);

  const std::vector<int32_t> large = {151643, 0, 70000, 9};
  CHECK_FALSE(write_llmc_shard(dir / "no.bin", large, 1).ok());
  REQUIRE(write_llmc_shard(dir / "v7.bin", large, 7).ok());
  CHECK(fs::file_size(dir / "v7.bin") == 1024 + 4 * 4);
  auto v7 = open_ok(dir / "v7.bin", SourceFormat::llmc);
  CHECK(v7->dtype() == TokenDType::u32);
  CHECK(read_all(*v7) == large);
}

TEST_CASE("data: format detection and explicit formats") {
  TempDir dir;
  write_dataset(dir / "meg", {{1, 2, 3}}, 257);
  REQUIRE(write_llmc_shard(dir / "shard.bin", std::vector<int32_t>{4, 5}, 1).ok());
  CHECK(open_ok(dir / "meg")->format() == SourceFormat::megatron);
  CHECK(open_ok(dir / "shard.bin")->format() == SourceFormat::llmc);
  CHECK_THAT(open_error(dir / "meg.bin"), Catch::Contains("pass the prefix '" + dir / "meg'"));
  CHECK_THAT(open_error(dir / "shard.bin", SourceFormat::megatron), Catch::Contains("not found"));
  CHECK_THAT(open_error(dir / "meg.bin", SourceFormat::llmc),
             Catch::Contains("shorter than its 1024-byte header"));
  fs::remove(dir / "meg.bin");
  CHECK(open_error(dir / "meg") == "data path '" + dir / "meg" + "': found " + dir / "meg.idx" +
                                       " but " + dir / "meg.bin" + " is missing");
  CHECK_THAT(open_error(dir.path), Catch::Contains("is a directory"));
  // Text or JSONL given as data: the message says how to tokenize it.
  std::ofstream(dir / "corpus.jsonl") << "{\"text\": \"hello\"}\n";
  CHECK_THAT(open_error(dir / "corpus.jsonl"),
             Catch::Contains("; if it is text or JSONL, tokenize it first: prepare_data --output "
                             "PREFIX [--format text] [--tokenizer tokenizer.json] " +
                             dir / "corpus.jsonl" + ", then give PREFIX as the path"));
  CHECK(parse_source_format("llmc").value() == SourceFormat::llmc);
  CHECK_FALSE(parse_source_format("hdf5").ok());
}

TEST_CASE("data: samples are cut across document boundaries") {
  TempDir dir;
  write_ramp(dir / "ramp", 25, 10);  // documents [0..9] [10..19] [20..24]
  const SampleSpace space = one_source(dir / "ramp", 4, /*shuffle=*/false);
  CHECK(space.num_samples(0) == 6);  // (25 - 1) / 4
  std::vector<int32_t> s(5);
  REQUIRE(space.read(0, s).ok());
  CHECK(s == std::vector<int32_t>{0, 1, 2, 3, 4});
  REQUIRE(space.read(2, s).ok());  // crosses the document boundary at 10
  CHECK(s == std::vector<int32_t>{8, 9, 10, 11, 12});
  REQUIRE(space.read(5, s).ok());  // the last full sample ends at the last token
  CHECK(s == std::vector<int32_t>{20, 21, 22, 23, 24});
  REQUIRE(space.read(8, s).ok());  // epoch 1 wraps around
  CHECK(s == std::vector<int32_t>{8, 9, 10, 11, 12});
}

TEST_CASE("data: permutation is a deterministic bijection") {
  for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 16ull, 17ull, 1000ull, 4097ull}) {
    INFO("n = " << n);
    Permutation p(n, permutation_key(1234, 0, 0));
    Permutation again(n, permutation_key(1234, 0, 0));
    std::vector<int> seen(n, 0);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t v = p(i);
      REQUIRE(v < n);
      ++seen[v];
      CHECK(again(i) == v);
    }
    CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<long>(n));
  }
  // Another key gives another order; the order is pinned so a change breaks resume loudly.
  Permutation a(1000, permutation_key(1234, 0, 0)), b(1000, permutation_key(1234, 1, 0));
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) same += a(i) == b(i);
  CHECK(same < 20);
  const std::vector<uint64_t> pinned = {a(0), a(1), a(2), a(3), a(999)};
  CHECK(pinned == std::vector<uint64_t>{267, 830, 306, 101, 198});
}

TEST_CASE("data: shuffled epochs visit every sample once") {
  TempDir dir;
  write_ramp(dir / "r", 8 * 37 + 1, 50);  // 37 samples of seq_len 8
  const SampleSpace space = one_source(dir / "r", 8, /*shuffle=*/true);
  REQUIRE(space.num_samples(0) == 37);
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t k = 0; k < 74; ++k) (k < 37 ? epoch0 : epoch1).push_back(space.locate(k).sample);
  CHECK(std::set<int64_t>(epoch0.begin(), epoch0.end()).size() == 37);
  CHECK(std::set<int64_t>(epoch1.begin(), epoch1.end()).size() == 37);
  CHECK(epoch0 != epoch1);
  std::vector<int32_t> s(9);
  REQUIRE(space.read(5, s).ok());  // sample content follows the shuffled index
  CHECK(s[0] == 8 * epoch0[5] % 257);
  CHECK(s[8] == (8 * epoch0[5] + 8) % 257);
}

TEST_CASE("data: blending tracks weights and is deterministic") {
  TempDir dir;
  std::vector<WeightedSource> a, b;
  for (int i = 0; i < 3; ++i) {
    write_ramp(dir / std::to_string(i), 1000, 100);
    a.push_back({open_ok(dir / std::to_string(i)), double(5 - 2 * i)});  // 5:3:1
    b.push_back({open_ok(dir / std::to_string(i)), double(5 - 2 * i)});
  }
  auto sa = SampleSpace::create(std::move(a), 8, 3, true);
  auto sb = SampleSpace::create(std::move(b), 8, 3, true);
  REQUIRE(sa.ok());
  REQUIRE(sb.ok());
  const double w[3] = {5.0 / 9, 3.0 / 9, 1.0 / 9};
  std::vector<int64_t> count(3, 0);
  std::vector<int> first;
  double worst = 0;
  for (int64_t k = 0; k < 300000; ++k) {
    const SampleRef r = sa->locate(k);
    if (k < 12) first.push_back(r.source);
    // Within a source, indices are handed out in order: 0, 1, 2, ...
    REQUIRE(r.index == count[r.source]);
    ++count[r.source];
    for (int i = 0; i < 3; ++i) worst = std::max(worst, std::abs(count[i] - w[i] * (k + 1)));
    if (k % 997 == 0) {
      const SampleRef q = sb->locate(k);
      REQUIRE((q.source == r.source && q.index == r.index && q.sample == r.sample));
    }
  }
  // Documented bound: depth/2 (depth 2 for 3 sources), for every prefix of the stream.
  CHECK(sa->schedule().depth() == 2);
  CHECK(worst <= 1.0 + 1e-6);
  // Pinned: a code change that reorders the blend would break resume of existing runs.
  CHECK(first == std::vector<int>{0, 1, 0, 1, 0, 2, 0, 1, 0, 0, 1, 0});
  // Far indices are exact too (random access, no replay): counts at k = 1e12.
  auto seven = BlendSchedule::create(std::vector<double>{1, 2, 3, 4, 5, 6, 7});
  REQUIRE(seven.ok());
  CHECK(seven->depth() == 3);
  const int64_t far = 1000000000000;
  for (int64_t k = far; k < far + 2000; ++k) {
    const auto [src, index] = seven->locate(k);
    CHECK(std::abs(index - (src + 1) / 28.0 * k) <= 1.5 + 1e-3);
  }
  CHECK_FALSE(SampleSpace::create({}, 8, 0, true).ok());
  CHECK_FALSE(BlendSchedule::create(std::vector<double>{1, 0}).ok());
}

TEST_CASE("data: loader dp split reassembles the global batch") {
  TempDir dir;
  write_ramp(dir / "a", 4000, 333);
  write_ramp(dir / "b", 3000, 100);
  LoaderOptions o = loader_options({{dir / "a", 2.0}, {dir / "b", 1.0}});
  auto whole = make_loader(o);
  o.dp_size = 4;
  o.micro_batch = 1;
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (o.dp_rank = 0; o.dp_rank < 4; ++o.dp_rank) ranks.push_back(make_loader(o));
  for (int step = 0; step < 3; ++step) {
    const StepBatch ref = next_ok(*whole);
    REQUIRE(ref.micro_batches.size() == 4);
    CHECK(ref.consumed_before == step * 8);
    std::vector<int64_t> ids;
    std::vector<int32_t> inputs, targets;
    for (auto& rank : ranks) {
      const StepBatch part = next_ok(*rank);
      REQUIRE(part.micro_batches.size() == 2);
      ids.insert(ids.end(), part.sample_ids.begin(), part.sample_ids.end());
      const std::vector<int32_t> in = flat(part), tgt = flat(part, true);
      inputs.insert(inputs.end(), in.begin(), in.end());
      targets.insert(targets.end(), tgt.begin(), tgt.end());
    }
    CHECK(ids == ref.sample_ids);
    CHECK(ids.front() == step * 8);
    CHECK(inputs == flat(ref));
    CHECK(targets == flat(ref, true));
  }
  CHECK(whole->consumed_samples() == 24);
}

TEST_CASE("data: loader inputs and targets are the shifted sample") {
  TempDir dir;
  write_ramp(dir / "r", 8 * 10 + 1, 7);
  LoaderOptions o = loader_options({{dir / "r", 1.0}});
  o.shuffle = false;
  o.global_batch = 4;
  auto loader = make_loader(o);
  next_ok(*loader);
  const StepBatch step = next_ok(*loader);  // samples 4..7
  CHECK(step.sample_ids == std::vector<int64_t>{4, 5, 6, 7});
  REQUIRE(step.micro_batches.size() == 2);
  const MicroBatch& m = step.micro_batches[1];  // samples 6 and 7
  REQUIRE(m.inputs.size() == 16);
  for (int row = 0; row < 2; ++row)
    for (int t = 0; t < 8; ++t) {
      CHECK(m.inputs[row * 8 + t] == (6 + row) * 8 + t);
      CHECK(m.targets[row * 8 + t] == (6 + row) * 8 + t + 1);
    }
  // reset() replays from the given point (the evaluation path).
  loader->reset(0);
  CHECK(loader->consumed_samples() == 0);
  CHECK(next_ok(*loader).micro_batches[0].inputs[8] == 8);
}

// Block-causal attention's document starts: a document begins at a sample's first token and
// right after each end-of-document token, per sample, in the loader's micro-batches; with
// reset_positions each token's position in its document, with mask_after_eod the target after
// the end-of-document token ignored, and each micro-batch's document statistics.
TEST_CASE("data: document starts restart after each end-of-document token") {
  const std::vector<int32_t> x = {5, 0, 7, 8, 0, 0, 9};
  std::vector<int32_t> starts(x.size());
  document_starts(x.data(), static_cast<int64_t>(x.size()), 0, starts.data());
  CHECK(starts == std::vector<int32_t>{0, 0, 2, 2, 2, 5, 6});
  TempDir dir;
  write_ramp(dir / "r", 8 * 10 + 1, 100);  // token p % 257 at stream position p
  LoaderOptions o = loader_options({{dir / "r", 1.0}});
  o.shuffle = false;
  o.global_batch = 4;
  o.eod_id = 13;  // at stream position 13: input 5 of sample 1
  o.doc_starts = true;
  auto loader = make_loader(o);
  const StepBatch step = next_ok(*loader);
  const MicroBatch& m = step.micro_batches[0];  // samples 0 and 1
  REQUIRE(m.doc_start.size() == 16);
  CHECK(std::vector<int32_t>(m.doc_start.begin(), m.doc_start.begin() + 8) ==
        std::vector<int32_t>(8, 0));
  CHECK(std::vector<int32_t>(m.doc_start.begin() + 8, m.doc_start.end()) ==
        std::vector<int32_t>{0, 0, 0, 0, 0, 0, 6, 6});
  CHECK(step.micro_batches[1].doc_start == std::vector<int32_t>(16, 0));
  CHECK(m.positions.empty());
  CHECK(m.targets[8 + 5] == 14);  // not masked without mask_after_eod
  CHECK(m.docs.loss_targets == 16);
  CHECK(m.docs.doc_len_sq == 64 + 36 + 4);
  CHECK(step.micro_batches[1].docs.doc_len_sq == 128);
  // Positions restart in each document; the target after the end of a document is ignored.
  o.reset_positions = true;
  o.mask_after_eod = true;
  const MicroBatch both = next_ok(*make_loader(o)).micro_batches[0];
  CHECK(std::vector<int32_t>(both.positions.begin() + 8, both.positions.end()) ==
        std::vector<int32_t>{0, 1, 2, 3, 4, 5, 0, 1});
  CHECK(std::vector<int32_t>(both.positions.begin(), both.positions.begin() + 8) ==
        std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(std::vector<int32_t>(both.targets.begin() + 8, both.targets.end()) ==
        std::vector<int32_t>{9, 10, 11, 12, 13, kIgnoredTarget, 15, 16});
  CHECK(both.inputs == m.inputs);
  CHECK(both.docs.loss_targets == 15);
  // Without an end-of-document id there are none; under context parallelism a rank's kept
  // positions carry the whole sample's starts and positions, and the statistics of its targets
  // and of the whole samples.
  o.eod_id = -1;
  CHECK_FALSE(validate_loader_options(o).ok());
  o.doc_starts = o.reset_positions = o.mask_after_eod = false;
  CHECK(next_ok(*make_loader(o)).micro_batches[0].doc_start.empty());
  o.eod_id = 13;
  o.doc_starts = o.reset_positions = o.mask_after_eod = true;
  o.positions = {0, 1, 6, 7};
  const MicroBatch kept = next_ok(*make_loader(o)).micro_batches[0];
  CHECK(kept.doc_start == std::vector<int32_t>{0, 0, 0, 0, 0, 0, 6, 6});
  CHECK(kept.positions == std::vector<int32_t>{0, 1, 6, 7, 0, 1, 0, 1});
  CHECK(kept.docs.loss_targets == 8);
  CHECK(kept.docs.doc_len_sq == 64 + 36 + 4);
}

TEST_CASE("data: loader resumes exactly from consumed samples, also with another dp") {
  TempDir dir;
  write_ramp(dir / "a", 5000, 77);
  write_ramp(dir / "b", 100, 50);  // 12 samples: the 24 drawn from b span two epochs
  LoaderOptions o = loader_options({{dir / "a", 1.0}, {dir / "b", 1.0}});
  auto straight = make_loader(o);
  std::vector<StepBatch> steps;
  for (int i = 0; i < 6; ++i) steps.push_back(next_ok(*straight));
  CHECK(straight->consumed_samples() == 48);

  o.consumed_samples = 3 * 8;
  auto resumed = make_loader(o);
  CHECK(resumed->consumed_samples() == 24);
  for (int i = 3; i < 6; ++i) {
    const StepBatch s = next_ok(*resumed);
    CHECK(s.sample_ids == steps[i].sample_ids);
    CHECK(flat(s) == flat(steps[i]));
    CHECK(flat(s, true) == flat(steps[i], true));
  }
  CHECK(resumed->consumed_samples() == 48);
  o.dp_size = 2;
  o.dp_rank = 1;
  const StepBatch half = next_ok(*make_loader(o));  // dp=2 rank 1 at step 3: second half
  CHECK(half.micro_batches[1].inputs == steps[3].micro_batches[3].inputs);
}

TEST_CASE("data: loader reports read errors and bad options") {
  TempDir dir;
  write_file(dir / "f.idx", idx_bytes(7, {20}, 4));
  std::vector<double> values(20, 3.0);
  values[13] = 0.5;
  write_file(dir / "f.bin", encode_as<float>(values));
  LoaderOptions o = loader_options({{dir / "f", 1.0}});
  o.seq_len = 4;
  o.global_batch = 4;
  o.shuffle = false;
  auto loader = make_loader(o);
  auto first = loader->next();
  REQUIRE_FALSE(first.ok());
  CHECK_THAT(std::string(first.status().message()),
             Catch::Contains("token 13 of " + dir / "f.bin") && Catch::Contains("value 0.5"));
  CHECK_FALSE(loader->next().ok());  // the error persists
  CHECK(loader->consumed_samples() == 0);

  o.global_batch = 6;
  o.dp_size = 4;
  auto bad = DataLoader::create(o);
  CHECK(bad.status().message() ==
        "data: global_batch 6 is not divisible by dp_size 4; make it a multiple of 4");
}

TEST_CASE("data: error for a missing path") {
  CHECK(open_error("/nonexistent/x") ==
        "data path '/nonexistent/x' not found: expected /nonexistent/x.bin + /nonexistent/x.idx "
        "(Megatron) or an llm.c shard file");
  // A relative path says where it was looked for.
  CHECK(open_error("nonexistent/x") ==
        "data path 'nonexistent/x' not found (a relative path: from the working directory " +
            fs::current_path().string() +
            "): expected nonexistent/x.bin + nonexistent/x.idx (Megatron) or an llm.c shard file");
}

TEST_CASE("data: error for a bad .idx magic") {
  TempDir dir;
  write_file(dir / "m.idx", idx_bytes(8, {3}, 2, 1, std::string("NOTANIDX\0", 9)));
  write_file(dir / "m.bin", encode_as<uint16_t>({1, 2, 3}));
  CHECK_THAT(open_error(dir / "m"),
             Catch::Contains("index file " + dir / "m.idx") && Catch::Contains("bad magic"));
}

TEST_CASE("data: error for a bad .idx version") {
  TempDir dir;
  write_file(dir / "v.idx", idx_bytes(8, {3}, 2, /*version=*/2));
  write_file(dir / "v.bin", encode_as<uint16_t>({1, 2, 3}));
  CHECK(open_error(dir / "v") ==
        "index file " + dir / "v.idx" + " has version 2; only version 1 is supported");
}

TEST_CASE("data: error for a .bin shorter than the index says") {
  TempDir dir;
  write_file(dir / "t.idx", idx_bytes(8, {1000, 1000}, 2));
  write_file(dir / "t.bin", Bytes(1000, 0));
  CHECK(open_error(dir / "t") ==
        "data file " + dir / "t.bin" + " is 1000 bytes but " + dir / "t.idx" +
            " says 4000; the .bin is truncated or belongs to another index");
}

TEST_CASE("data: errors for inconsistent .idx contents") {
  TempDir dir;
  write_file(dir / "c.bin", encode_as<uint16_t>({1, 2, 3}));
  Bytes cut = idx_bytes(8, {3}, 2);
  cut.pop_back();
  write_file(dir / "c.idx", cut);
  CHECK_THAT(open_error(dir / "c"), Catch::Contains("is 61 bytes but its header"));
  write_file(dir / "c.idx", idx_bytes(8, {1, 2}, 2, 1, kIdxMagic, {0, 1}));
  CHECK_THAT(open_error(dir / "c"), Catch::Contains("document index ends at 1 but there are 2"));
  write_file(dir / "c.idx", idx_bytes(9, {3}, 2));
  CHECK_THAT(open_error(dir / "c"), Catch::Contains("unknown token dtype code 9"));
}

TEST_CASE("data: error for an llm.c shard whose size does not match its header") {
  TempDir dir;
  REQUIRE(write_llmc_shard(dir / "s.bin", std::vector<int32_t>{1, 2, 3, 4}, 7).ok());
  fs::resize_file(dir / "s.bin", 1024 + 12);
  CHECK(open_error(dir / "s.bin") == "llm.c shard " + dir / "s.bin" +
                                         " is 1036 bytes but its header says 4 u32 tokens (1040 "
                                         "bytes with the header); the file is truncated or was "
                                         "not fully written");
}

TEST_CASE("data: error for too few tokens for one sample") {
  TempDir dir;
  write_dataset(dir / "few", {{1, 2, 3, 256}}, 257);
  auto o = loader_options({{dir / "few", 1.0}});
  o.seq_len = 4;
  auto loader = DataLoader::create(o);
  REQUIRE_FALSE(loader.ok());
  CHECK(loader.status().message() ==
        "data source '" + dir / "few" +
            "' has 4 tokens, fewer than seq_len+1 = 5 needed for one sample; use more data or a "
            "shorter seq_len");
}

TEST_CASE("data: byte tokenizer") {
  ByteTokenizer tok;
  CHECK(tok.vocab_size() == 257);
  CHECK(tok.eod_id() == 256);
  CHECK(tok.name() == "byte");
  const std::string text = "h\xC3\xA9!";
  const std::vector<int32_t> ids = tok.encode(text);
  CHECK(ids == std::vector<int32_t>{104, 195, 169, 33});
  std::vector<int32_t> with_eod = ids;
  with_eod.push_back(256);
  CHECK(tok.decode(with_eod) == text);
  CHECK(tok.decode(std::vector<int32_t>{65, 999}) == "A\xEF\xBF\xBD");
  CHECK(make_tokenizer("byte").ok());
  CHECK_FALSE(make_tokenizer("gpt2").ok());
}

TEST_CASE("data: prepare_data tool writes a readable dataset") {
  TempDir dir;
  fs::create_directories(dir / "in/sub");
  std::ofstream(dir / "in/b.jsonl") << "{\"text\": \"hi\"}\n\n{\"text\": \"\"}\n";
  std::ofstream(dir / "in/sub/a.jsonl") << "{\"text\": \"ok\", \"id\": 3}\n";
  // Runs the tool; returns (exit code, stdout + stderr).
  auto run = [&](const std::string& args) {
    FILE* p = popen((tr::test::prepare_data_bin() + " " + args + " 2>&1").c_str(), "r");
    REQUIRE(p != nullptr);
    std::string out;
    char buf[512];
    while (fgets(buf, sizeof(buf), p)) out += buf;
    return std::make_pair(WEXITSTATUS(pclose(p)), out);
  };
  auto [rc, out] = run("--output " + dir / "out/ds " + dir / "in");
  REQUIRE(rc == 0);
  CHECK_THAT(out, Catch::Contains("2 documents (1 empty skipped), 6 tokens"));
  // Sorted recursive order: in/b.jsonl before in/sub/a.jsonl.
  CHECK(read_all(*open_ok(dir / "out/ds")) == std::vector<int32_t>{'h', 'i', 256, 'o', 'k', 256});
  REQUIRE(run("--format text --output " + dir / "t " + dir / "in/sub/a.jsonl").first == 0);
  CHECK(open_ok(dir / "t")->num_tokens() == 25);  // 24 bytes of the file + EOD
  std::ofstream(dir / "bad.jsonl") << "{\"text\": 5}\n";
  CHECK(run("--output " + dir / "x " + dir / "bad.jsonl") ==
        std::make_pair(2, "prepare_data: error: " + dir / "bad.jsonl" +
                              ":1: expected a JSON object with a string field \"text\"\n"));
  CHECK_FALSE(fs::exists(dir / "x.idx"));
  // An input of several chunks (3 MB of lines) gives the same files on 1 and 3 threads, and
  // a bad line late in it is the error on both, before a later one.
  {
    std::ofstream big(dir / "big.jsonl");
    for (int i = 0; i < 30000; ++i)
      big << "{\"text\": \"document " << i << std::string(80 + i % 17, 'x') << "\"}\n";
  }
  REQUIRE(run("--output " + dir / "one --threads 1 " + dir / "big.jsonl").first == 0);
  REQUIRE(run("--output " + dir / "three --threads 3 " + dir / "big.jsonl").first == 0);
  for (const char* ext : {".bin", ".idx"})
    CHECK(tr::test::read_file(dir / ("one" + std::string(ext))) ==
          tr::test::read_file(dir / ("three" + std::string(ext))));
  CHECK(open_ok(dir / "three")->num_documents() == 30000);
  {
    std::ofstream big(dir / "big.jsonl", std::ios::app);
    big << "{\"text\": 7}\n{\"text\": \"fine\"}\n{\"oops\n";
  }
  for (const char* threads : {"1", "3"})
    CHECK(run("--output " + dir / "late --threads " + threads + " " + dir / "big.jsonl") ==
          std::make_pair(2, "prepare_data: error: " + dir / "big.jsonl" +
                                ":30001: expected a JSON object with a string field \"text\"\n"));
  // A number JSON cannot hold is that line's error too, not a crash.
  std::ofstream(dir / "huge.jsonl") << "{\"text\": \"a\"}\n{\"text\": \"b\", \"n\": 1e999}\n";
  for (const char* threads : {"1", "2"}) {
    const auto [code, said] =
        run("--output " + dir / "huge --threads " + threads + " " + dir / "huge.jsonl");
    CHECK(code == 2);
    CHECK_THAT(said, Catch::StartsWith("prepare_data: error: " + dir / "huge.jsonl" +
                                       ":2: invalid JSON ("));
  }
}
