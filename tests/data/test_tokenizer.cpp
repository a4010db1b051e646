// The Hugging Face byte-level BPE reader (data/hf_tokenizer.h) on small tokenizer.json files
// written here: the merge order, the regex split, NFC, added tokens, decode, and one-line
// errors for what it does not implement. tests/tools/test_tokenizer.py checks it against the
// `tokenizers` package on Qwen2.5's real tokenizer.
#include <catch2/catch.hpp>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/dataset_meta.h"
#include "data/hf_tokenizer.h"
#include "tests/cli_util.h"
#include "tests/mutate.h"
#include "tests/test_util.h"

namespace tr::data {
namespace {

// GPT-2's byte-level alphabet, derived here independently of the reader: byte b as UTF-8.
std::string byte_char(int b) {
  static std::vector<int> cp = [] {
    std::vector<int> out(256);
    int next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool keep = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174);
      out[i] = keep ? i : next++;
    }
    return out;
  }();
  const int c = cp[b];
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// Bytes are ids 0..255; merges h+e, l+l, he+ll, " "+w; <|endoftext|> (special) and <x>.
nlohmann::json small_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::string sp = byte_char(' ');
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab[sp + "w"] = 259;
  nlohmann::json j;
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", R"('s|'t| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  j["model"] = {
      {"type", "BPE"},
      {"vocab", vocab},
      {"merges", nlohmann::json::array(
                     {nlohmann::json::array({"h", "e"}), nlohmann::json::array({"l", "l"}),
                      nlohmann::json::array({"he", "ll"}), nlohmann::json::array({sp, "w"})})}};
  j["added_tokens"] = {{{"id", 260}, {"content", "<|endoftext|>"}, {"special", true}},
                       {{"id", 261}, {"content", "<x>"}, {"special", false}}};
  return j;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> load(const nlohmann::json& j,
                                                const std::string& eod = "") {
  static test::TempDir dir;
  const std::string path = dir / "tokenizer.json";
  test::write_file(path, j.dump());
  return load_hf_tokenizer(path, eod);
}

TEST_CASE("tokenizer: byte-level BPE merges by rank, splits by the regex, keeps added tokens",
          "[data]") {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = load(small_tokenizer());
  INFO(t.status().message());
  REQUIRE(t.ok());
  const Tokenizer& tok = **t;
  CHECK(tok.vocab_size() == 262);
  CHECK(tok.eod_id() == 260);
  // "hello" -> he l l o -> he ll o -> hell o; " world" -> " w" o r l d; "hell" after the added
  // token is a piece of its own.
  const std::vector<int32_t> want = {258, 'o', 259, 'o', 'r', 'l', 'd', 260, 258, 261, 'x', 'y'};
  CHECK(tok.encode("hello world<|endoftext|>hell<x>xy") == want);
  // Special tokens decode to nothing, other added tokens to their text.
  CHECK(tok.decode(want) == "hello worldhell<x>xy");
  // NFC: e + combining acute is é (C3 A9); malformed UTF-8 becomes U+FFFD.
  CHECK(tok.encode("e\xCC\x81") == std::vector<int32_t>{0xC3, 0xA9});
  CHECK(tok.encode("a\xFF") == std::vector<int32_t>{'a', 0xEF, 0xBF, 0xBD});
  CHECK(tok.encode("").empty());
  // Merges never cross pieces: "he" + "llo" stays apart when a space splits them.
  CHECK(tok.encode("he llo") == std::vector<int32_t>{256, ' ', 257, 'o'});
  // --eod-token picks another token.
  absl::StatusOr<std::unique_ptr<Tokenizer>> x = load(small_tokenizer(), "<x>");
  REQUIRE(x.ok());
  CHECK((*x)->eod_id() == 261);
  // The older "a b" form of merges reads the same.
  nlohmann::json old = small_tokenizer();
  old["model"]["merges"] = nlohmann::json::array({"h e", "l l", "he ll"});
  absl::StatusOr<std::unique_ptr<Tokenizer>> o = load(old);
  REQUIRE(o.ok());
  CHECK((*o)->encode("hello") == std::vector<int32_t>{258, 'o'});
}

TEST_CASE("tokenizer: what the reader does not implement is one error naming it", "[data]") {
  auto error_of = [](const nlohmann::json& j, const std::string& eod = "") {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = load(j, eod);
    return t.ok() ? std::string("ok") : std::string(t.status().message());
  };
  nlohmann::json j = small_tokenizer();
  j["model"]["type"] = "WordPiece";
  CHECK_THAT(error_of(j), Catch::Contains("model type 'WordPiece'; supported: byte-level BPE"));
  j = small_tokenizer();
  j["normalizer"] = {{"type", "Lowercase"}};
  CHECK_THAT(error_of(j), Catch::Contains("normalizer {\"type\":\"Lowercase\"}"));
  j = small_tokenizer();
  j["model"]["vocab"].erase(byte_char('q'));
  CHECK_THAT(error_of(j), Catch::Contains("byte 113 has no token of its own"));
  j = small_tokenizer();
  j["model"]["merges"].push_back(nlohmann::json::array({"x", "y"}));
  CHECK_THAT(error_of(j), Catch::Contains("merge 'x y' of tokens not in the vocab"));
  j = small_tokenizer();
  j["added_tokens"][1]["lstrip"] = true;
  CHECK_THAT(error_of(j), Catch::Contains("added token '<x>' with lstrip: true"));
  CHECK_THAT(error_of(small_tokenizer(), "<|end|>"),
             Catch::Contains("has no end-of-document token '<|end|>'; name one of its tokens "
                             "with --eod-token"));
  j = small_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  CHECK_THAT(error_of(j), Catch::Contains("pre-tokenizer regex does not compile"));
  CHECK_THAT(std::string(load_hf_tokenizer("/nonexistent/tokenizer.json").status().message()),
             Catch::Contains("cannot read tokenizer file '/nonexistent/tokenizer.json'"));
}

// Entries no tokenizer writes (an id that is a string, two tokens sharing an id, an id past the
// vocabulary, a value of the wrong JSON type) are one error naming the entry, not a crash.
TEST_CASE("tokenizer: a damaged tokenizer.json is one error naming the entry", "[data]") {
  auto error_of = [](const nlohmann::json& j) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = load(j);
    if (t.ok()) return std::string("ok");
    CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(t.status().message());
  };
  nlohmann::json j = small_tokenizer();
  j["added_tokens"][1]["id"] = "261";
  CHECK_THAT(error_of(j), Catch::Contains("added token '<x>' has id \"261\", not an integer"));
  j = small_tokenizer();
  j["model"]["vocab"]["ll"] = 256;
  CHECK_THAT(error_of(j), Catch::Contains("vocabulary entries 'he' and 'll' share id 256"));
  j = small_tokenizer();
  j["model"]["vocab"]["hell"] = int64_t{1} << 40;
  CHECK_THAT(error_of(j), Catch::Contains("vocabulary entry 'hell' has id 1099511627776, outside "
                                          "0..261 (ids number its 262 entries and added tokens "
                                          "from 0)"));
  j = small_tokenizer();
  j["model"]["vocab"]["hell"] = "258";
  CHECK_THAT(error_of(j),
             Catch::Contains("vocabulary entry 'hell' has id \"258\", not an integer"));
  j = small_tokenizer();
  j["added_tokens"][1]["id"] = 260;
  CHECK_THAT(error_of(j), Catch::Contains("added tokens '<|endoftext|>' and '<x>' share id 260"));
  j = small_tokenizer();
  j["added_tokens"][1]["id"] = 257;
  CHECK_THAT(error_of(j), Catch::Contains("added token '<x>' has id 257, which is another "
                                          "vocabulary entry's"));
  j = small_tokenizer();
  j["model"]["type"] = 5;
  CHECK_THAT(error_of(j), Catch::Contains("a field has the wrong JSON type"));
  j = small_tokenizer();
  j["model"]["merges"][0] = nlohmann::json::array({1, 2});
  CHECK_THAT(error_of(j), Catch::Contains("a field has the wrong JSON type"));
  // GPT-2's form: an added token repeating its vocabulary entry, same id, is fine.
  j = small_tokenizer();
  j["model"]["vocab"]["<|endoftext|>"] = 260;
  CHECK(error_of(j) == "ok");
}

// prepare_data records the tokenizer beside the dataset (PREFIX.meta.json); the trainer
// refuses, with exit 2 and one line, ids that do not fit model.vocab_size, byte data under a
// preset (unless data.allow_byte_tokenizer), and datasets of two tokenizers.
TEST_CASE("tokenizer: the trainer refuses data whose tokenizer does not fit the model", "[cli]") {
  test::RunDir run(10);
  const std::string jsonl = run.dir / "docs.jsonl", hf = run.dir / "tok.json";
  std::string lines;
  for (int i = 0; i < 40; ++i)
    lines += R"({"text": "hello world, the quick brown fox jumps over the lazy dog )" +
             std::to_string(i) + "\"}\n";
  test::write_file(jsonl, lines);
  test::write_file(hf, small_tokenizer().dump());
  auto prepare = [&](const std::string& prefix, const std::string& tok) {
    test::CmdResult r = test::run_cmd(tr::test::prepare_data_bin() + " --output " + prefix +
                                      " --tokenizer " + tok + " " + jsonl);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  };
  prepare(run.dir / "train", "byte");
  prepare(run.dir / "valid", "byte");
  absl::StatusOr<std::optional<DatasetMeta>> meta = read_dataset_meta(run.dir / "train");
  REQUIRE(meta.ok());
  REQUIRE(meta->has_value());
  CHECK((*meta)->tokenizer == "byte");
  CHECK((*meta)->vocab_size == 257);
  CHECK((*meta)->eod_id == 256);
  // Byte data under a preset (every model field still given explicitly: the small model).
  const std::string preset = "--set model.preset=qwen2.5-0.5b --set model.rms_norm_eps=1e-6 ";
  test::expect_bad_input(run.trainer(preset + "--dry-run"),
                         "data " + run.dir / "train" +
                             " was made by the byte tokenizer, but model.preset is qwen2.5-0.5b; "
                             "tokenize with prepare_data --tokenizer path/to/tokenizer.json, or "
                             "set data.allow_byte_tokenizer: true");
  CHECK(run.trainer(preset + "--dry-run --set data.allow_byte_tokenizer=true").exit_code == 0);
  // 262 ids into a model of 257.
  prepare(run.dir / "train", hf);
  meta = read_dataset_meta(run.dir / "train");
  REQUIRE(meta.ok());
  CHECK((*meta)->tokenizer == "hf-bpe");
  CHECK((*meta)->vocab_size == 262);
  CHECK((*meta)->eod_id == 260);
  test::expect_bad_input(run.trainer("--dry-run"),
                         "data " + run.dir / "train" +
                             " was made by tok.json (byte-level BPE, 262 ids, end of document "
                             "260): its ids do not fit model.vocab_size 257");
  // Two tokenizers in one run.
  test::expect_bad_input(run.trainer("--dry-run --set model.vocab_size=262"),
                         "data " + run.dir / "valid" +
                             " was made by byte (tokenizer, 257 ids, end of document 256) but " +
                             run.dir / "train" + " by tok.json");
  prepare(run.dir / "valid", hf);
  CHECK(run.trainer("--dry-run --set model.vocab_size=262").exit_code == 0);
}

// Malformed UTF-8 through prepare_data --tokenizer, in text and in jsonl, is Python's
// errors="replace": the shards equal those of the replaced text, on 1 and 2 threads, over
// several 1 MB chunks.
TEST_CASE("tokenizer: prepare_data replaces malformed UTF-8 as Python does on 1 and 2 threads",
          "[cli]") {
  test::TempDir dir;
  // Each malformed piece and Python's replacement of it (U+FFFD per maximal subpart).
  const std::string r = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> pieces = {
      {"\xE2\x82", r},
      {"\xF0\x80", r + r},
      {"\xED\xA0\x80", r + r + r},
      {"\xC0\xAF", r + r},
      {"\xF4\x90\x80\x80", r + r + r + r},
      {"\xFF", r},
      {"\xF0\x9F\x98", r},
      {"\xE2\x82\xAC", "\xE2\x82\xAC"}};
  std::string bad_jsonl, good_jsonl;
  std::vector<std::string> bad_docs(4), good_docs(4);
  for (int i = 0; i < 24000; ++i) {
    const auto& [bad, good] = pieces[static_cast<size_t>(i) % pieces.size()];
    const std::string word = "hello " + std::to_string(i) + " world " + std::string(40, 'x') + " ";
    bad_jsonl += R"({"text": ")" + word + bad + "x" + bad + "\"}\n";
    good_jsonl += R"({"text": ")" + word + good + "x" + good + "\"}\n";
    bad_docs[static_cast<size_t>(i) % 4] += word + bad + "\n";
    good_docs[static_cast<size_t>(i) % 4] += word + good + "\n";
  }
  bad_docs[3] += "\xE2\x82";  // cut short at the end of the input
  good_docs[3] += r;
  std::filesystem::create_directories(dir / "bad");
  std::filesystem::create_directories(dir / "good");
  for (size_t k = 0; k < bad_docs.size(); ++k) {
    test::write_file(dir / ("bad/" + std::to_string(k)), bad_docs[k]);
    test::write_file(dir / ("good/" + std::to_string(k)), good_docs[k]);
  }
  test::write_file(dir / "bad.jsonl", bad_jsonl);
  test::write_file(dir / "good.jsonl", good_jsonl);
  test::write_file(dir / "tok.json", small_tokenizer().dump());
  auto prepare = [&](const std::string& out, const std::string& args) {
    const test::CmdResult c =
        test::run_cmd(tr::test::prepare_data_bin() + " --output " + (dir / out) + " --tokenizer " +
                      (dir / "tok.json") + " " + args);
    INFO(c.output);
    REQUIRE(c.exit_code == 0);
  };
  auto same = [&](const std::string& a, const std::string& b) {
    for (const char* ext : {".bin", ".idx"})
      CHECK((test::read_file(dir / (a + ext)) == test::read_file(dir / (b + ext))));
  };
  for (const std::string format : {"text", "jsonl"}) {
    const bool text = format == "text";
    const std::string bad = text ? dir / "bad" : dir / "bad.jsonl";
    const std::string good = text ? dir / "good" : dir / "good.jsonl";
    prepare(format + "_want", "--format " + format + " --threads 1 " + good);
    for (const char* threads : {"1", "2"}) {
      INFO(format << " on " << threads << " threads");
      prepare(format + "_" + threads, "--format " + format + " --threads " + threads + " " + bad);
      same(format + "_" + threads, format + "_want");
    }
  }
}

// A few hundred seeded mutations of a tokenizer.json (bytes and JSON structure): each loads into
// a tokenizer that encodes and decodes text faithfully, or is refused as bad input with one
// line; none throws or crashes.
TEST_CASE("tokenizer: damaged tokenizer.json files load faithfully or are one error line",
          "[data]") {
  const std::string good = small_tokenizer().dump();
  const std::string text = "hello world, well done!";  // no digits: the mutations write those
  std::mt19937 rng(47);
  int loaded = 0, refused = 0;
  for (int i = 0; i < 400; ++i) {
    // Bytes; the structure anywhere; the structure outside the vocabulary (whose 262 entries
    // would otherwise take most of the mutations).
    std::string bytes;
    if (i % 3 == 0) {
      bytes = test::mutate_bytes(good, rng);
    } else if (i % 3 == 1) {
      bytes = test::mutate_json(small_tokenizer(), rng).dump();
    } else {
      nlohmann::json j = small_tokenizer();
      const nlohmann::json vocab = j["model"]["vocab"];
      j["model"].erase("vocab");
      j = test::mutate_json(j, rng);
      if (j.is_object() && j.contains("model") && j["model"].is_object())
        j["model"]["vocab"] = vocab;
      bytes = j.dump();
    }
    INFO("mutation " << i << ": " << bytes.substr(0, 2000));
    static test::TempDir dir;
    test::write_file(dir / "tokenizer.json", bytes);
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = absl::InternalError("not run");
    try {
      t = load_hf_tokenizer(dir / "tokenizer.json", "");
    } catch (const std::exception& e) {
      FAIL("mutation " << i << " threw: " << e.what());
    }
    if (!t.ok()) {
      ++refused;
      INFO(t.status().message());
      CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(std::string(t.status().message()).find('\n') == std::string::npos);
      continue;
    }
    ++loaded;
    const std::vector<int32_t> ids = (*t)->encode(text);
    for (int32_t id : ids) CHECK((id >= 0 && id < (*t)->vocab_size()));
    CHECK((*t)->decode(ids) == text);
  }
  CHECK(loaded >= 20);  // both outcomes were exercised (most damage is refused)
  CHECK(refused >= 100);
}

// The same through prepare_data: exit 0, or exit 2 with one error line; never a signal or an
// abort.
TEST_CASE("cli: damaged tokenizer.json files through prepare_data: exit 0, or 2 with one line",
          "[cli]") {
  test::TempDir dir;
  test::write_file(dir / "in.jsonl", "{\"text\": \"hello world\"}\n");
  std::mt19937 rng(53);
  int exit2 = 0;
  for (int i = 0; i < 10; ++i) {
    nlohmann::json j = test::mutate_json(small_tokenizer(), rng);
    if (i == 0) j["added_tokens"][1]["id"] = "261";  // the crash this test was written for
    test::write_file(dir / "tokenizer.json", j.dump());
    const test::CmdResult r =
        test::run_cmd(tr::test::prepare_data_bin() + " --output " + (dir / "out") +
                      " --tokenizer " + (dir / "tokenizer.json") + " " + (dir / "in.jsonl"));
    INFO("mutation " << i << "\n" << r.output);
    REQUIRE((r.exit_code == 0 || r.exit_code == 2));
    if (r.exit_code == 2) {
      ++exit2;
      test::expect_bad_input(r, "tokenizer");
    }
  }
  CHECK(exit2 >= 2);
}

}  // namespace
}  // namespace tr::data
