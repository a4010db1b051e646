#include "data/token_source.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tr::data {

size_t token_dtype_size(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::u8:
    case TokenDType::i8:
      return 1;
    case TokenDType::i16:
    case TokenDType::u16:
      return 2;
    case TokenDType::i32:
    case TokenDType::f32:
    case TokenDType::u32:
      return 4;
    case TokenDType::i64:
    case TokenDType::f64:
      return 8;
  }
  return 0;
}

const char* token_dtype_name(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::u8:
      return "u8";
    case TokenDType::i8:
      return "i8";
    case TokenDType::i16:
      return "i16";
    case TokenDType::i32:
      return "i32";
    case TokenDType::i64:
      return "i64";
    case TokenDType::f64:
      return "f64";
    case TokenDType::f32:
      return "f32";
    case TokenDType::u16:
      return "u16";
    case TokenDType::u32:
      return "u32";
  }
  return "?";
}

absl::StatusOr<SourceFormat> parse_source_format(std::string_view name) {
  if (name == "auto") return SourceFormat::auto_detect;
  if (name == "megatron") return SourceFormat::megatron;
  if (name == "llmc") return SourceFormat::llmc;
  return absl::InvalidArgumentError(absl::StrCat("unknown data format '", std::string(name),
                                                 "'; expected auto, megatron or llmc"));
}

const char* source_format_name(SourceFormat format) {
  switch (format) {
    case SourceFormat::auto_detect:
      return "auto";
    case SourceFormat::megatron:
      return "megatron";
    case SourceFormat::llmc:
      return "llmc";
  }
  return "?";
}

namespace {

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix.data(), suffix.size()) == 0;
}

// Reads the llm.c magic of a file; 0 when it is shorter than 4 bytes or unreadable.
int32_t peek_magic(const std::string& path) {
  auto file = fs::MappedFile::open(path);
  if (!file.ok() || file->size() < sizeof(int32_t)) return 0;
  return load<int32_t>(file->data());
}

// " (relative to the working directory DIR)" for a relative path; "" for an absolute one.
std::string relative_note(const std::string& path) {
  if (path.empty() || path[0] == '/') return "";
  std::error_code ec;
  return absl::StrCat(" (a relative path: from the working directory ",
                      std::filesystem::current_path(ec).string(), ")");
}

std::string not_found_message(const std::string& path) {
  return absl::StrCat("data path '", path, "' not found", relative_note(path), ": expected ", path,
                      ".bin + ", path, ".idx (Megatron) or an llm.c shard file");
}

// Fields of a Megatron .idx header (data/formats.h has the layout), validated against the file
// size.
struct IdxHeader {
  TokenDType dtype;
  uint64_t num_seqs;     // S
  uint64_t num_doc_idx;  // D
};

absl::StatusOr<IdxHeader> parse_idx_header(const fs::MappedFile& idx) {
  const std::string& name = idx.path();
  const size_t size = idx.size();
  if (size < kMegatronHeaderBytes)
    return absl::InvalidArgumentError(absl::StrCat("index file ", name, " is ", size,
                                                   " bytes, shorter than the 34-byte Megatron "
                                                   "header; it is truncated or not a .idx file"));
  const uint8_t* p = idx.data();
  if (std::memcmp(p, kMegatronMagic, sizeof(kMegatronMagic)) != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "index file ", name, " has a bad magic (expected \"MMIDIDX\\0\\0\"); it is not a ",
        "Megatron indexed-dataset index"));
  const uint64_t version = load<uint64_t>(p + 9);
  if (version != kMegatronVersion)
    return absl::InvalidArgumentError(absl::StrCat("index file ", name, " has version ", version,
                                                   "; only version 1 is supported"));
  const uint8_t code = p[17];
  if (code < 1 || code > 8)
    return absl::InvalidArgumentError(
        absl::StrCat("index file ", name, " has unknown token dtype code ", code,
                     " (expected 1..8: u8 i8 i16 i32 i64 f64 f32 u16)"));
  IdxHeader h{static_cast<TokenDType>(code), load<uint64_t>(p + 18), load<uint64_t>(p + 26)};
  // 34 + 12 S + 8 D == size, computed without overflow.
  const bool fits = h.num_seqs <= size / 12 && h.num_doc_idx <= size / 8;
  if (!fits || kMegatronHeaderBytes + 12 * h.num_seqs + 8 * h.num_doc_idx != size)
    return absl::InvalidArgumentError(absl::StrCat(
        "index file ", name, " is ", size, " bytes but its header (", h.num_seqs, " sequences, ",
        h.num_doc_idx, " document-index entries) needs 34 + 12*S + 8*D bytes; the file is ",
        "truncated or corrupt"));
  if (h.num_seqs == 0)
    return absl::InvalidArgumentError(
        absl::StrCat("index file ", name, " lists no sequences; the dataset has no tokens"));
  return h;
}

// Checks lengths >= 0 and offsets[i+1] == offsets[i] + lengths[i] * elem; returns the total
// token count and the first byte offset.
absl::StatusOr<std::pair<int64_t, int64_t>> check_sequences(const fs::MappedFile& idx,
                                                            const IdxHeader& h) {
  const uint8_t* lengths = idx.data() + kMegatronHeaderBytes;
  const uint8_t* offsets = lengths + 4 * h.num_seqs;
  const int64_t elem = static_cast<int64_t>(token_dtype_size(h.dtype));
  const int64_t first = load<int64_t>(offsets);
  int64_t expect = first;
  int64_t tokens = 0;
  constexpr int64_t kMaxOffset = int64_t{1} << 60;
  for (uint64_t i = 0; i < h.num_seqs; ++i) {
    const int32_t len = load<int32_t>(lengths + 4 * i);
    const int64_t off = load<int64_t>(offsets + 8 * i);
    if (len < 0)
      return absl::InvalidArgumentError(absl::StrCat("index file ", idx.path(), ": sequence ", i,
                                                     " has negative length ", len,
                                                     "; the index is corrupt"));
    if (off != expect || off < 0 || off > kMaxOffset)
      return absl::InvalidArgumentError(
          absl::StrCat("index file ", idx.path(), ": sequence ", i, " starts at byte ", off,
                       " but the previous sequences end at byte ", expect,
                       "; offsets do not match lengths (the index is corrupt)"));
    expect = off + len * elem;
    tokens += len;
  }
  if (tokens == 0)
    return absl::InvalidArgumentError(
        absl::StrCat("index file ", idx.path(), " lists only empty sequences; no tokens"));
  return std::make_pair(tokens, first);
}

// Document index: D >= 1 entries, starting at 0, non-decreasing, ending at S.
absl::Status check_doc_index(const fs::MappedFile& idx, const IdxHeader& h) {
  const uint8_t* doc = idx.data() + kMegatronHeaderBytes + 12 * h.num_seqs;
  if (h.num_doc_idx == 0)
    return absl::InvalidArgumentError(
        absl::StrCat("index file ", idx.path(), " has an empty document index; it is corrupt"));
  int64_t prev = 0;
  for (uint64_t i = 0; i < h.num_doc_idx; ++i) {
    const int64_t v = load<int64_t>(doc + 8 * i);
    if ((i == 0 && v != 0) || v < prev || v > static_cast<int64_t>(h.num_seqs))
      return absl::InvalidArgumentError(absl::StrCat(
          "index file ", idx.path(), ": document index entry ", i, " is ", v,
          "; entries must rise from 0 to the sequence count ", h.num_seqs, " (corrupt index)"));
    prev = v;
  }
  if (prev != static_cast<int64_t>(h.num_seqs))
    return absl::InvalidArgumentError(
        absl::StrCat("index file ", idx.path(), ": document index ends at ", prev,
                     " but there are ", h.num_seqs, " sequences; the index is corrupt"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenSource>> TokenSource::open_megatron(const std::string& prefix) {
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";
  if (!path_exists(idx_path)) return absl::NotFoundError(not_found_message(prefix));
  if (!path_exists(bin_path))
    return absl::NotFoundError(absl::StrCat("data path '", prefix, "': found ", idx_path, " but ",
                                            bin_path, " is missing"));
  auto idx = fs::MappedFile::open(idx_path);
  if (!idx.ok()) return idx.status();
  auto header = parse_idx_header(*idx);
  if (!header.ok()) return header.status();
  auto seqs = check_sequences(*idx, *header);
  if (!seqs.ok()) return seqs.status();
  if (auto st = check_doc_index(*idx, *header); !st.ok()) return st;

  auto bin = fs::MappedFile::open(bin_path);
  if (!bin.ok()) return bin.status();
  const auto [tokens, first] = *seqs;
  const uint64_t needed = static_cast<uint64_t>(first) +
                          static_cast<uint64_t>(tokens) * token_dtype_size(header->dtype);
  if (bin->size() < needed)
    return absl::InvalidArgumentError(
        absl::StrCat("data file ", bin_path, " is ", bin->size(), " bytes but ", idx_path, " says ",
                     needed, "; the .bin is truncated or belongs to another index"));

  std::unique_ptr<TokenSource> src(new TokenSource());
  src->path_ = prefix;
  src->format_ = SourceFormat::megatron;
  src->dtype_ = header->dtype;
  src->tokens_ = std::move(*bin);
  src->first_byte_ = static_cast<size_t>(first);
  src->num_tokens_ = tokens;
  src->num_documents_ = static_cast<int64_t>(header->num_doc_idx) - 1;
  return src;
}

absl::StatusOr<std::unique_ptr<TokenSource>> TokenSource::open_llmc(const std::string& path) {
  auto file = fs::MappedFile::open(path);
  if (!file.ok()) {
    if (absl::IsNotFound(file.status())) return absl::NotFoundError(not_found_message(path));
    return file.status();
  }
  if (file->size() < kLlmcHeaderBytes)
    return absl::InvalidArgumentError(absl::StrCat("llm.c shard ", path, " is ", file->size(),
                                                   " bytes, shorter than its 1024-byte header"));
  const int32_t magic = load<int32_t>(file->data());
  const int32_t version = load<int32_t>(file->data() + 4);
  const uint32_t count = load<uint32_t>(file->data() + 8);
  TokenDType dtype;
  if (magic == kLlmcMagicV1 && version == 1) {
    dtype = TokenDType::u16;
  } else if (magic == kLlmcMagicV7 && version == 7) {
    dtype = TokenDType::u32;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "llm.c shard ", path, " has magic ", magic, " version ", version, "; expected ",
        kLlmcMagicV1, " version 1 (uint16 tokens) or ", kLlmcMagicV7, " version 7 (uint32)"));
  }
  const uint64_t expected = kLlmcHeaderBytes + uint64_t{count} * token_dtype_size(dtype);
  if (file->size() != expected)
    return absl::InvalidArgumentError(
        absl::StrCat("llm.c shard ", path, " is ", file->size(), " bytes but its header says ",
                     count, " ", token_dtype_name(dtype), " tokens (", expected,
                     " bytes with the header); the file is truncated or was not fully written"));
  if (count == 0)
    return absl::InvalidArgumentError(absl::StrCat("llm.c shard ", path, " holds no tokens"));

  std::unique_ptr<TokenSource> src(new TokenSource());
  src->path_ = path;
  src->format_ = SourceFormat::llmc;
  src->dtype_ = dtype;
  src->tokens_ = std::move(*file);
  src->first_byte_ = kLlmcHeaderBytes;
  src->num_tokens_ = count;
  return src;
}

absl::StatusOr<std::unique_ptr<TokenSource>> TokenSource::open(const std::string& path,
                                                               SourceFormat format) {
  if (format == SourceFormat::megatron) return open_megatron(path);
  if (format == SourceFormat::llmc) return open_llmc(path);
  if (path_exists(path + ".idx")) return open_megatron(path);
  if (is_regular_file(path)) {
    const int32_t magic = peek_magic(path);
    if (magic == kLlmcMagicV1 || magic == kLlmcMagicV7) return open_llmc(path);
    for (std::string_view ext : {".bin", ".idx"}) {
      const std::string prefix = path.substr(0, path.size() - ext.size());
      if (ends_with(path, ext) && path_exists(prefix + ".idx"))
        return absl::InvalidArgumentError(
            absl::StrCat("data path '", path, "' names one file of a Megatron dataset; pass the ",
                         "prefix '", prefix, "' without the extension"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("data file '", path, "' is neither a Megatron prefix (no ", path,
                     ".idx) nor an llm.c shard (header magic ", magic, ", expected ", kLlmcMagicV1,
                     " or ", kLlmcMagicV7,
                     "); if it is text or JSONL, tokenize it first: prepare_data --output PREFIX "
                     "[--format text] [--tokenizer tokenizer.json] ",
                     path, ", then give PREFIX as the path"));
  }
  if (path_exists(path))
    return absl::InvalidArgumentError(
        absl::StrCat("data path '", path, "' is a directory; expected a Megatron prefix (", path,
                     "/NAME for NAME.bin + NAME.idx) or an llm.c shard file"));
  return absl::NotFoundError(not_found_message(path));
}

namespace {

// Converts count tokens of type T at p into out; every value must be a whole number in
// [0, limit). Returns the index of the first bad token, or -1.
template <class T>
int64_t convert(const uint8_t* p, std::span<int32_t> out, int64_t limit, double* bad_value) {
  for (size_t i = 0; i < out.size(); ++i) {
    const T v = load<T>(p + i * sizeof(T));
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      ok = v >= 0 && v < static_cast<T>(limit) && std::trunc(v) == v;
    } else if constexpr (std::is_signed_v<T>) {
      ok = v >= 0 && static_cast<int64_t>(v) < limit;
    } else {
      ok = static_cast<uint64_t>(v) < static_cast<uint64_t>(limit);
    }
    if (!ok) {
      *bad_value = static_cast<double>(v);
      return static_cast<int64_t>(i);
    }
    out[i] = static_cast<int32_t>(v);
  }
  return -1;
}

// The smallest and largest of count values of type T at p (integers), in blocks the compiler
// vectorises.
template <class T>
std::pair<int64_t, int64_t> min_max(const uint8_t* p, int64_t count) {
  T lo = std::numeric_limits<T>::max(), hi = std::numeric_limits<T>::lowest();
  constexpr int64_t kBlock = 4096;
  T block[kBlock];
  for (int64_t i = 0; i < count; i += kBlock) {
    const int64_t n = std::min(kBlock, count - i);
    std::memcpy(block, p + i * static_cast<int64_t>(sizeof(T)), static_cast<size_t>(n) * sizeof(T));
    for (int64_t j = 0; j < n; ++j) {
      lo = std::min(lo, block[j]);
      hi = std::max(hi, block[j]);
    }
  }
  return {static_cast<int64_t>(lo), static_cast<int64_t>(hi)};
}

}  // namespace

absl::StatusOr<IdRange> TokenSource::check_ids(int64_t limit) const {
  constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max();
  if (limit <= 0 || limit > kMaxId) limit = kMaxId;
  const uint8_t* p = tokens_.data() + first_byte_;
  std::pair<int64_t, int64_t> range{0, 0};
  switch (dtype_) {
    case TokenDType::u8:
      range = min_max<uint8_t>(p, num_tokens_);
      break;
    case TokenDType::i8:
      range = min_max<int8_t>(p, num_tokens_);
      break;
    case TokenDType::i16:
      range = min_max<int16_t>(p, num_tokens_);
      break;
    case TokenDType::u16:
      if (limit > std::numeric_limits<uint16_t>::max()) return IdRange{};  // all fit
      range = min_max<uint16_t>(p, num_tokens_);
      break;
    case TokenDType::i32:
      range = min_max<int32_t>(p, num_tokens_);
      break;
    case TokenDType::u32:
      range = min_max<uint32_t>(p, num_tokens_);
      break;
    case TokenDType::i64:
      range = min_max<int64_t>(p, num_tokens_);
      break;
    case TokenDType::f32:
    case TokenDType::f64:
      range = {-1, -1};  // whole numbers are checked by read(), chunk by chunk
      break;
  }
  if (num_tokens_ == 0) return IdRange{0, -1, true};
  if (range.first >= 0 && range.second < limit) return IdRange{range.first, range.second, true};
  // Out of range (or floats): read() names the first bad token; floats' range from their ids.
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<int32_t> buf(static_cast<size_t>(std::min(kChunk, num_tokens_)));
  IdRange ids{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(), true};
  for (int64_t i = 0; i < num_tokens_; i += kChunk) {
    const int64_t n = std::min(kChunk, num_tokens_ - i);
    if (absl::Status st = read(i, std::span<int32_t>(buf.data(), static_cast<size_t>(n)), limit);
        !st.ok())
      return st;
    const auto [lo, hi] = std::minmax_element(buf.begin(), buf.begin() + n);
    ids.lo = std::min<int64_t>(ids.lo, *lo);
    ids.hi = std::max<int64_t>(ids.hi, *hi);
  }
  return ids;
}

absl::Status TokenSource::read(int64_t begin, std::span<int32_t> out, int64_t limit) const {
  const int64_t count = static_cast<int64_t>(out.size());
  if (begin < 0 || count > num_tokens_ || begin > num_tokens_ - count)
    return absl::OutOfRangeError(absl::StrCat("read of tokens [", begin, ", ", begin + count,
                                              ") is outside ", token_file(), " which has ",
                                              num_tokens_, " tokens"));
  constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max();
  if (limit <= 0 || limit > kMaxId) limit = kMaxId;
  const uint8_t* p = tokens_.data() + first_byte_ + begin * token_dtype_size(dtype_);
  double bad = 0;
  int64_t at = -1;
  switch (dtype_) {
    case TokenDType::u8:
      at = convert<uint8_t>(p, out, limit, &bad);
      break;
    case TokenDType::i8:
      at = convert<int8_t>(p, out, limit, &bad);
      break;
    case TokenDType::i16:
      at = convert<int16_t>(p, out, limit, &bad);
      break;
    case TokenDType::i32:
      at = convert<int32_t>(p, out, limit, &bad);
      break;
    case TokenDType::i64:
      at = convert<int64_t>(p, out, limit, &bad);
      break;
    case TokenDType::f64:
      at = convert<double>(p, out, limit, &bad);
      break;
    case TokenDType::f32:
      at = convert<float>(p, out, limit, &bad);
      break;
    case TokenDType::u16:
      at = convert<uint16_t>(p, out, limit, &bad);
      break;
    case TokenDType::u32:
      at = convert<uint32_t>(p, out, limit, &bad);
      break;
  }
  if (at < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("token ", begin + at, " of ", token_file(), " (", token_dtype_name(dtype_),
                   ") has value ", bad, ", not a token id in [0, ", limit,
                   "); the data was written for another vocabulary or is corrupt"));
}

}  // namespace tr::data
