#include "data/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "data/utf8.h"

namespace tr::data {
namespace {

using nlohmann::json;

// GPT-2's byte-level alphabet: byte b is written as the code point byte_char[b] in vocab and
// merges (printable Latin-1 bytes as themselves, the rest moved to U+0100 and up).
std::array<int32_t, 256> byte_chars() {
  std::array<int32_t, 256> cp{};
  int32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    cp[b] = printable ? b : next++;
  }
  return cp;
}

// The inverse of byte_chars(), indexed by code point (the alphabet ends below U+0144): the byte
// each code point stands for, -1 for the code points outside the alphabet. A table, not a map:
// loading Qwen2.5's vocabulary and merges looks up about two million code points.
using ByteOfChar = std::array<int16_t, 0x144>;
ByteOfChar byte_of_char() {
  const std::array<int32_t, 256> cp = byte_chars();
  ByteOfChar byte_of;
  byte_of.fill(-1);
  for (int b = 0; b < 256; ++b) byte_of[static_cast<size_t>(cp[b])] = static_cast<int16_t>(b);
  return byte_of;
}

// A vocabulary entry in the byte-level alphabet back to the raw bytes it stands for.
absl::StatusOr<std::string> to_bytes(const std::string& token, const ByteOfChar& byte_of) {
  std::string out;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(token.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(token.size());
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    const int b = n > 0 && cp >= 0 && cp < static_cast<utf8proc_int32_t>(byte_of.size())
                      ? byte_of[static_cast<size_t>(cp)]
                      : -1;
    if (b < 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "token '", token, "' is not in the byte-level alphabet: not a byte-level BPE"));
    out.push_back(static_cast<char>(b));
    p += n;
    left -= n;
  }
  return out;
}

std::string nfc(const std::string& text) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return text;  // valid UTF-8 by construction; keep it as is
  std::string s(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return s;
}

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex: true).
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
};

// model.vocab's entries and model.merges' elements, taken out of the document while it is parsed:
// as a JSON object of 151k members (a std::map) and an array of 151k small arrays they cost most
// of the load. Entries in file order; a value that is a container is kept as an empty one of its
// kind.
struct Bulk {
  bool vocab = false;  // model.vocab was an object, its entries here
  std::vector<std::pair<std::string, json>> entries;
  bool merges = false;  // model.merges was an array, its elements here
  std::vector<json> merge_list;
};

// Parses tokenizer.json into `bulk` and the document left without those two sections' contents
// (model.vocab an empty object, model.merges an empty array); discarded when not valid JSON.
json parse_tokenizer_json(const std::string& text, Bulk& bulk) {
  using Event = json::parse_event_t;
  // The key and whether the container is an object at each depth of the current path (depth:
  // the number of containers open around an event; a container's start and end come at its own
  // depth, its members one deeper). A discarded container reports its start but not its end, so
  // the path is kept by depth, never by counting ends.
  std::array<std::string, 4> keys;
  std::array<bool, 4> object{};
  int in = 0;  // 1: inside model.vocab, 2: inside model.merges
  auto at_model_member = [&](const char* name) {
    return object[0] && object[1] && keys[1] == "model" && keys[2] == name;
  };
  return json::parse(
      text,
      [&](int depth, Event e, json& parsed) -> bool {
        switch (e) {
          case Event::key:
            if (depth < 4) keys[depth] = parsed.get<std::string>();
            if (depth <= 2) in = 0;  // another member of model or of the root: out of both
            // A vocabulary entry's key stays out of the document; its value event follows.
            return !(in == 1 && depth == 3);
          case Event::object_start:
          case Event::array_start:
            if (in == 1 && depth == 3)  // a container where an id belongs: kept as an empty one
              bulk.entries.emplace_back(keys[3],
                                        e == Event::object_start ? json::object() : json::array());
            if (depth == 2 && e == Event::object_start && at_model_member("vocab")) {
              in = 1;
              bulk.vocab = true;
            } else if (depth == 2 && e == Event::array_start && at_model_member("merges")) {
              in = 2;
              bulk.merges = true;
            }
            if (depth < 4) object[depth] = e == Event::object_start;
            return true;
          case Event::object_end:
          case Event::array_end:
            if (depth <= 2) in = 0;
            if (in == 2 && depth == 3) {  // a merge as an array: taken out
              bulk.merge_list.push_back(std::move(parsed));
              return false;
            }
            return true;
          case Event::value:
            if (in == 1 && depth == 3) {
              bulk.entries.emplace_back(keys[3], std::move(parsed));
              return true;  // its key was left out: the value is dropped with it
            }
            if (in == 2 && depth == 3) {  // a merge as a string: taken out
              bulk.merge_list.push_back(std::move(parsed));
              return false;
            }
            return true;
        }
        return true;
      },
      false);
}

class HfBpeTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> load(const std::string& path,
                                                         const std::string& eod_token);
  ~HfBpeTokenizer() override {
    if (regex_) pcre2_code_free(regex_);
  }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t eod_id() const override { return eod_; }
  int64_t vocab_size() const override { return vocab_size_; }
  std::string name() const override { return name_; }

 private:
  void encode_segment(const std::string& text, std::vector<int32_t>& out) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;    // cached
  void merge(std::string_view piece, std::vector<int32_t>& out) const;  // the BPE loop
  // The parts of load(), each reading one section of tokenizer.json into this tokenizer.
  absl::Status read_model_flags(const json& model, const std::string& path);
  absl::Status read_pre_tokenizer(const json& j, const std::string& path);
  absl::Status read_vocab(const Bulk& bulk, const std::string& path, int32_t* max_id);
  absl::Status read_merges(const json& model, const Bulk& bulk, const std::string& path);
  absl::Status read_added_tokens(const json& j, const std::string& path, int32_t* max_id);
  // All of them in order (a value of another JSON type than asked for throws).
  absl::Status read_sections(const json& j, const Bulk& bulk, const std::string& path);
  static constexpr size_t kCacheEntries = 1 << 18;

  std::string name_;
  bool nfc_ = false, ignore_merges_ = false;
  pcre2_code* regex_ = nullptr;
  absl::flat_hash_map<std::string, int32_t> id_of_;  // raw bytes -> id
  std::vector<std::string> bytes_of_;                // id -> raw bytes (BPE vocabulary)
  std::array<int32_t, 256> byte_id_{};               // the id of each single byte
  // (left id, right id) -> (rank, merged id)
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::vector<AddedToken> added_;        // longest first
  std::array<bool, 256> added_first_{};  // bytes an added token starts with
  std::unordered_map<int32_t, size_t> added_index_;
  int32_t eod_ = -1;
  int64_t vocab_size_ = 0;
  int64_t added_count_ = 0;  // entries of tokenizer.json's added_tokens, while loading
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

absl::Status unsupported(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer '", path, "': ", what,
      "; supported: byte-level BPE tokenizer.json files (GPT-2, Qwen2/2.5, Llama 3 style)"));
}

// A tokenizer.json entry that no tokenizer could have written: which, and that it is damaged.
absl::Status bad_entry(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer '", path, "': ", what, "; the file is damaged or hand-edited"));
}

absl::Status HfBpeTokenizer::read_model_flags(const json& model, const std::string& path) {
  if (model.value("type", "") != "BPE")
    return unsupported(path, absl::StrCat("model type '", model.value("type", ""), "'"));
  if (model.value("byte_fallback", false)) return unsupported(path, "byte_fallback: true");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      return unsupported(path, absl::StrCat(key, " '", model[key].get<std::string>(), "'"));
  if (model.contains("dropout") && !model["dropout"].is_null())
    return unsupported(path, "BPE dropout");
  ignore_merges_ = model.value("ignore_merges", false);
  return absl::OkStatus();
}

// Normalizer: none or NFC. Pre-tokenizer: Sequence[Split(regex, Isolated), ByteLevel(use_regex
// false)], or ByteLevel(use_regex true) alone (GPT-2's regex), compiled here.
absl::Status HfBpeTokenizer::read_pre_tokenizer(const json& j, const std::string& path) {
  const json& norm = j.contains("normalizer") ? j["normalizer"] : json();
  if (!norm.is_null()) {
    if (norm.value("type", "") != "NFC")
      return unsupported(path, absl::StrCat("normalizer ", norm.dump()));
    nfc_ = true;
  }
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  std::string pattern;
  auto byte_level_ok = [&](const json& b, bool want_regex) {
    return b.value("type", "") == "ByteLevel" && !b.value("add_prefix_space", false) &&
           b.value("use_regex", true) == want_regex;
  };
  if (!pre.is_null() && pre.value("type", "") == "Sequence" &&
      pre.value("pretokenizers", json::array()).size() == 2) {
    const json& split = pre["pretokenizers"][0];
    if (split.value("type", "") != "Split" || split.value("behavior", "") != "Isolated" ||
        split.value("invert", false) || !split.contains("pattern") ||
        !split["pattern"].contains("Regex") || !byte_level_ok(pre["pretokenizers"][1], false))
      return unsupported(path, absl::StrCat("pre_tokenizer ", pre.dump()));
    pattern = split["pattern"]["Regex"].get<std::string>();
  } else if (!pre.is_null() && byte_level_ok(pre, true)) {
    pattern = kGpt2Pattern;
  } else {
    return unsupported(path, absl::StrCat("pre_tokenizer ", pre.dump()));
  }
  int err = 0;
  PCRE2_SIZE at = 0;
  regex_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &at, nullptr);
  if (regex_ == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return unsupported(path, absl::StrCat("pre-tokenizer regex does not compile at offset ", at,
                                          ": ", reinterpret_cast<const char*>(msg)));
  }
  pcre2_jit_compile(regex_, PCRE2_JIT_COMPLETE);  // faster when available; optional
  return absl::OkStatus();
}

// The vocabulary in raw bytes; every byte must have a token of its own.
absl::Status HfBpeTokenizer::read_vocab(const Bulk& bulk, const std::string& path,
                                        int32_t* max_id) {
  if (!bulk.vocab)  // model.vocab absent or not an object
    return unsupported(path, "no model.vocab");
  const ByteOfChar byte_of = byte_of_char();
  // Ids number the tokens from 0: none reaches the count of vocabulary entries and added tokens.
  const int64_t limit = static_cast<int64_t>(bulk.entries.size()) + added_count_;
  id_of_.reserve(bulk.entries.size());
  for (const auto& [token, id_json] : bulk.entries) {
    absl::StatusOr<std::string> bytes = to_bytes(token, byte_of);
    if (!bytes.ok()) return unsupported(path, std::string(bytes.status().message()));
    if (!id_json.is_number_integer())
      return bad_entry(path, absl::StrCat("vocabulary entry '", token, "' has id ", id_json.dump(),
                                          ", not an integer"));
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id >= limit)
      return bad_entry(path, absl::StrCat("vocabulary entry '", token, "' has id ", id,
                                          ", outside 0..", limit - 1, " (ids number its ", limit,
                                          " entries and added tokens from 0)"));
    *max_id = std::max(*max_id, static_cast<int32_t>(id));
    if (static_cast<size_t>(id) >= bytes_of_.size()) bytes_of_.resize(static_cast<size_t>(id) + 1);
    std::string& slot = bytes_of_[static_cast<size_t>(id)];
    if (!slot.empty())
      return bad_entry(path, absl::StrCat("vocabulary entries '", absl::CHexEscape(slot), "' and '",
                                          token, "' share id ", id));
    slot = *bytes;
    id_of_[*bytes] = static_cast<int32_t>(id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = id_of_.find(std::string(1, static_cast<char>(b)));
    if (it == id_of_.end())
      return unsupported(path, absl::StrCat("byte ", b, " has no token of its own"));
    byte_id_[b] = it->second;
  }
  return absl::OkStatus();
}

// The merges, in rank order: ["a", "b"] pairs, or "a b" strings in older files.
absl::Status HfBpeTokenizer::read_merges(const json& model, const Bulk& bulk,
                                         const std::string& path) {
  if (model.contains("merges") && !bulk.merges)
    return unsupported(path, absl::StrCat("model.merges ", model["merges"].dump().substr(0, 80),
                                          " is not a list"));
  const ByteOfChar byte_of = byte_of_char();
  const std::vector<json>& merges = bulk.merge_list;  // none when model.merges is absent
  merges_.reserve(merges.size());
  int32_t rank = 0;
  for (const json& m : merges) {
    std::string a, b;
    if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) return unsupported(path, absl::StrCat("merge '", s, "'"));
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else {
      return unsupported(path, absl::StrCat("merge ", m.dump()));
    }
    absl::StatusOr<std::string> ab = to_bytes(a, byte_of), bb = to_bytes(b, byte_of);
    if (!ab.ok() || !bb.ok()) return unsupported(path, absl::StrCat("merge '", a, " ", b, "'"));
    auto ia = id_of_.find(*ab), ib = id_of_.find(*bb), im = id_of_.find(*ab + *bb);
    if (ia == id_of_.end() || ib == id_of_.end() || im == id_of_.end())
      return unsupported(path, absl::StrCat("merge '", a, " ", b, "' of tokens not in the vocab"));
    merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(rank++, im->second));
  }
  return absl::OkStatus();
}

// Added tokens: matched in the raw text before anything else, the longest first.
absl::Status HfBpeTokenizer::read_added_tokens(const json& j, const std::string& path,
                                               int32_t* max_id) {
  for (const json& a : j.value("added_tokens", json::array())) {
    if (!a.is_object() || !a.contains("content") || !a["content"].is_string())
      return bad_entry(path, absl::StrCat("added token ", a.dump(), " has no \"content\" string"));
    if (!a.contains("id") || !a["id"].is_number_integer())
      return bad_entry(path,
                       absl::StrCat("added token '", a["content"].get<std::string>(), "' has id ",
                                    a.value("id", json()).dump(), ", not an integer"));
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (a.value(flag, false))
        return unsupported(
            path, absl::StrCat("added token '", a.value("content", ""), "' with ", flag, ": true"));
    if (a.value("normalized", false) && a.value("content", "") != nfc(a.value("content", "")))
      return unsupported(path, absl::StrCat("normalized added token '", a.value("content", ""),
                                            "' that NFC changes"));
    const int64_t id = a["id"].get<int64_t>();
    if (id < 0 || id >= std::numeric_limits<int32_t>::max())
      return bad_entry(path, absl::StrCat("added token '", a["content"].get<std::string>(),
                                          "' has id ", id, ", outside 0..2^31-2"));
    AddedToken tok{a["content"].get<std::string>(), static_cast<int32_t>(id),
                   a.value("special", false)};
    if (tok.content.empty()) return unsupported(path, "an empty added token");
    for (const AddedToken& other : added_)
      if (other.id == tok.id)
        return bad_entry(path, absl::StrCat("added tokens '", other.content, "' and '", tok.content,
                                            "' share id ", id));
    // An added token may repeat a vocabulary entry (GPT-2's <|endoftext|>), not take another's id.
    if (static_cast<size_t>(id) < bytes_of_.size() && !bytes_of_[static_cast<size_t>(id)].empty() &&
        bytes_of_[static_cast<size_t>(id)] != tok.content)
      return bad_entry(path, absl::StrCat("added token '", tok.content, "' has id ", id,
                                          ", which is another vocabulary entry's"));
    *max_id = std::max(*max_id, tok.id);
    added_.push_back(std::move(tok));
  }
  std::stable_sort(added_.begin(), added_.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  for (size_t i = 0; i < added_.size(); ++i) {
    added_index_[added_[i].id] = i;
    added_first_[static_cast<unsigned char>(added_[i].content[0])] = true;
  }
  return absl::OkStatus();
}

absl::Status HfBpeTokenizer::read_sections(const json& j, const Bulk& bulk,
                                           const std::string& path) {
  // A reference into the document: value() would copy the vocabulary and the merges.
  static const json kNone = json::object();
  const auto found = j.find("model");
  const json& model = found != j.end() ? *found : kNone;
  if (!model.is_object()) return unsupported(path, "\"model\" is not an object");
  added_count_ = j.contains("added_tokens") && j["added_tokens"].is_array()
                     ? static_cast<int64_t>(j["added_tokens"].size())
                     : 0;
  int32_t max_id = -1;
  if (absl::Status st = read_model_flags(model, path); !st.ok()) return st;
  if (absl::Status st = read_pre_tokenizer(j, path); !st.ok()) return st;
  if (absl::Status st = read_vocab(bulk, path, &max_id); !st.ok()) return st;
  if (absl::Status st = read_merges(model, bulk, path); !st.ok()) return st;
  if (absl::Status st = read_added_tokens(j, path, &max_id); !st.ok()) return st;
  vocab_size_ = max_id + 1;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> HfBpeTokenizer::load(const std::string& path,
                                                                const std::string& eod_token) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read tokenizer file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  Bulk bulk;
  const json j = parse_tokenizer_json(text.str(), bulk);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer file '", path, "' is not valid JSON"));
  auto t = std::make_unique<HfBpeTokenizer>();
  try {
    if (absl::Status st = t->read_sections(j, bulk, path); !st.ok()) return st;
  } catch (const json::exception& e) {  // a field of another JSON type than the format's
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer '", path, "': a field has the wrong JSON type (", e.what(),
                     "); the file is damaged or not a Hugging Face tokenizer.json"));
  }
  const std::string eod = eod_token.empty() ? "<|endoftext|>" : eod_token;
  for (const AddedToken& a : t->added_)
    if (a.content == eod) t->eod_ = a.id;
  if (t->eod_ < 0)
    if (auto it = t->id_of_.find(eod); it != t->id_of_.end()) t->eod_ = it->second;
  if (t->eod_ < 0)
    return absl::InvalidArgumentError(absl::StrCat("tokenizer '", path,
                                                   "' has no end-of-document token '", eod,
                                                   "'; name one of its tokens with --eod-token"));
  t->name_ = absl::StrCat(path, " (byte-level BPE, ", t->vocab_size_, " ids, end of document ",
                          t->eod_, ")");
  return std::unique_ptr<Tokenizer>(std::move(t));
}

// Merges the adjacent pair of lowest rank (the leftmost of equals) until none is left, as
// Hugging Face's BPE does. Pieces are short (words), so a scan per merge is enough.
void HfBpeTokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  // Words repeat: each thread keeps the ids of the pieces it has seen (bounded).
  struct Hash {  // lookups by string_view, without building a key string
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  struct Cache {
    const HfBpeTokenizer* owner = nullptr;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> ids;
  };
  thread_local Cache cache;
  if (cache.owner != this || cache.ids.size() > kCacheEntries) {
    cache.ids.clear();
    cache.owner = this;
  }
  if (auto it = cache.ids.find(piece); it != cache.ids.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t before = out.size();
  merge(piece, out);
  cache.ids.emplace(
      std::string(piece),
      std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(before), out.end()));
}

void HfBpeTokenizer::merge(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_)
    if (auto it = id_of_.find(absl::string_view(piece.data(), piece.size())); it != id_of_.end()) {
      out.push_back(it->second);
      return;
    }
  std::vector<int32_t> sym(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) sym[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  for (;;) {
    int32_t best_rank = INT32_MAX, merged = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merges_.find(pair_key(sym[i], sym[i + 1]));
      if (it != merges_.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        merged = it->second.second;
        best = i;
      }
    }
    if (merged < 0) break;
    sym[best] = merged;
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

// Normalizes, splits with the regex (matches and the text between them are pieces) and runs
// BPE on each piece.
void HfBpeTokenizer::encode_segment(const std::string& raw, std::vector<int32_t>& out) const {
  const std::string text = nfc_ ? nfc(raw) : raw;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex_, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t last = 0, from = 0;
  while (from < text.size()) {
    const int rc = pcre2_match(regex_, subject, text.size(), from, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (s > last) bpe(std::string_view(text).substr(last, s - last), out);
    if (e > s) bpe(std::string_view(text).substr(s, e - s), out);
    last = std::max(last, e);
    from = e > s ? e : e + 1;  // an empty match: step past one byte (continuation bytes too)
    while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
  }
  if (last < text.size()) bpe(std::string_view(text).substr(last), out);
  pcre2_match_data_free(md);
}

std::vector<int32_t> HfBpeTokenizer::encode(std::string_view input) const {
  std::string text(input);
  replace_malformed_utf8(text);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  size_t start = 0;  // of the text not yet encoded
  for (size_t pos = 0; pos < text.size();) {
    const AddedToken* hit = nullptr;
    if (added_first_[static_cast<unsigned char>(text[pos])])
      for (const AddedToken& a : added_)  // longest first
        if (text.compare(pos, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    if (pos > start) encode_segment(text.substr(start, pos - start), ids);
    ids.push_back(hit->id);
    pos += hit->content.size();
    start = pos;
  }
  if (start < text.size()) encode_segment(text.substr(start), ids);
  return ids;
}

std::string HfBpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (auto it = added_index_.find(id); it != added_index_.end()) {
      if (!added_[it->second].special) text += added_[it->second].content;
    } else if (id >= 0 && static_cast<size_t>(id) < bytes_of_.size()) {
      text += bytes_of_[id];
    } else {
      text += "\xEF\xBF\xBD";
    }
  }
  return text;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& path,
                                                             const std::string& eod_token) {
  return HfBpeTokenizer::load(path, eod_token);
}

}  // namespace tr::data
