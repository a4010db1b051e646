#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/bf16.h"
#include "nlohmann/json.hpp"

namespace tr::st {
namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // the safetensors library's limit

std::string shape_str(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

// Bytes per element of a header dtype; 0 for one we do not know.
int dtype_bytes(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

// Order of element types in a file the safetensors library writes (its dtype enum, descending).
int file_rank(ElemType t) {
  switch (t) {
    case ElemType::f32:
      return 2;
    case ElemType::bf16:
      return 1;
    case ElemType::f16:
      return 0;
  }
  return 0;
}

// Parses one file's header into entries (offsets made absolute) and checks them.
absl::Status parse_header(const fs::MappedFile& f, int file, std::vector<Entry>& out) {
  const std::string& path = f.path();
  if (f.size() < 8)
    return absl::InvalidArgumentError(absl::StrCat("safetensors file ", path, " is ", f.size(),
                                                   " bytes: too short for a header"));
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);  // little-endian, as is every host we build for
  if (n > kMaxHeaderBytes || n > f.size() - 8)
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file ", path, " declares a ", n, "-byte header in a ", f.size(),
                     "-byte file; it is truncated or not a safetensors file"));
  const char* text = reinterpret_cast<const char*>(f.data() + 8);
  nlohmann::json h = nlohmann::json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  if (!h.is_object())
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file ", path, ": the header is not a JSON object"));
  const uint64_t data_start = 8 + n, data_bytes = f.size() - data_start;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const nlohmann::json& v = it.value();
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors file ", path, ": tensor '", it.key(), "' ", why));
    };
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
        !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      return bad("needs \"dtype\", \"shape\" and two \"data_offsets\"");
    Entry e;
    e.name = it.key();
    e.dtype = v["dtype"].get<std::string>();
    e.file = file;
    uint64_t numel = 1;
    for (const nlohmann::json& d : v["shape"]) {
      if (!d.is_number_unsigned())
        return bad("has a shape entry that is not a non-negative integer");
      e.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
    }
    const nlohmann::json& o = v["data_offsets"];
    if (!o[0].is_number_unsigned() || !o[1].is_number_unsigned())
      return bad("has data_offsets that are not non-negative integers");
    const uint64_t b = o[0].get<uint64_t>(), end = o[1].get<uint64_t>();
    if (b > end || end > data_bytes)
      return bad(absl::StrCat("has data_offsets [", b, ", ", end, "] outside the file's ",
                              data_bytes, " data bytes; the file is truncated"));
    const int eb = dtype_bytes(e.dtype);
    if (eb == 0) return bad(absl::StrCat("has an unknown dtype '", e.dtype, "'"));
    if (end - b != numel * static_cast<uint64_t>(eb))
      return bad(absl::StrCat("of dtype ", e.dtype, " and shape ", shape_str(e.shape), " needs ",
                              numel * static_cast<uint64_t>(eb), " bytes but data_offsets span ",
                              end - b));
    e.begin = data_start + b;
    e.end = data_start + end;
    spans.emplace_back(b, end);
    out.push_back(std::move(e));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second)
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors file ", path, ": two tensors' data overlap"));
  return absl::OkStatus();
}

// Element i of a tensor's raw bytes as fp32.
template <ElemType T>
float load_elem(const uint8_t* p, int64_t i) {
  if constexpr (T == ElemType::f32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  } else {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    if constexpr (T == ElemType::bf16) {
      return bf16_to_f32(h);
    } else {
      _Float16 x;
      std::memcpy(&x, &h, 2);
      return static_cast<float>(x);
    }
  }
}

template <ElemType T>
void copy_rows(const uint8_t* base, const std::vector<int64_t>& shape,
               std::span<const int64_t> start, std::span<const int64_t> extent, float* out) {
  // Rows of the last dimension: walk the block's leading indices in row-major order.
  const size_t nd = shape.size();
  if (nd == 0) {
    out[0] = load_elem<T>(base, 0);
    return;
  }
  const int64_t cols = extent[nd - 1];
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < nd; ++d) rows *= extent[d];
  std::vector<int64_t> idx(nd, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t flat = 0;  // element index of the row's first element in the whole tensor
    for (size_t d = 0; d < nd; ++d) flat = flat * shape[d] + start[d] + idx[d];
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = load_elem<T>(base, flat + c);
    for (size_t d = nd - 1; d-- > 0;) {  // next row: increment the leading indices
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

absl::StatusOr<ElemType> parse_elem_type(std::string_view name) {
  if (name == "F32") return ElemType::f32;
  if (name == "BF16") return ElemType::bf16;
  if (name == "F16") return ElemType::f16;
  return absl::InvalidArgumentError(
      absl::StrCat("element type '", std::string(name), "' is not one of F32, BF16, F16"));
}

const char* elem_type_name(ElemType t) {
  switch (t) {
    case ElemType::f32:
      return "F32";
    case ElemType::bf16:
      return "BF16";
    case ElemType::f16:
      return "F16";
  }
  return "?";
}

int elem_bytes(ElemType t) {
  return t == ElemType::f32 ? 4 : 2;
}

absl::StatusOr<Reader> Reader::open(const std::string& path) {
  namespace sfs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;  // from the index: tensor -> file
  if (sfs::is_directory(path, ec)) {
    const std::string index = fs::join(path, "model.safetensors.index.json");
    const std::string single = fs::join(path, "model.safetensors");
    if (sfs::exists(index, ec)) {
      std::ifstream in(index);
      nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors index ", index, " is not JSON with a \"weight_map\" object"));
      std::set<std::string> seen;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string())
          return absl::InvalidArgumentError(absl::StrCat(
              "safetensors index ", index, ": the file of '", it.key(), "' is not a string"));
        const std::string file = it.value().get<std::string>();
        if (file.find('/') != std::string::npos)
          return absl::InvalidArgumentError(absl::StrCat(
              "safetensors index ", index, " names file '", file, "' outside its directory"));
        weight_map[it.key()] = file;
        if (seen.insert(file).second) files.push_back(file);
      }
      std::sort(files.begin(), files.end());
      for (std::string& f : files) f = fs::join(path, f);
    } else if (sfs::exists(single, ec)) {
      files.push_back(single);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(path,
                       " holds neither model.safetensors nor model.safetensors.index.json; pass a "
                       "Hugging Face model directory (save_pretrained's output)"));
    }
  } else if (sfs::exists(path, ec)) {
    files.push_back(path);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no such file or directory"));
  }
  Reader r;
  for (size_t i = 0; i < files.size(); ++i) {
    absl::StatusOr<fs::MappedFile> f = fs::MappedFile::open(files[i]);
    if (!f.ok()) return f.status();
    r.files_.push_back(std::make_unique<fs::MappedFile>(std::move(*f)));
    if (absl::Status st = parse_header(*r.files_.back(), static_cast<int>(i), r.tensors_); !st.ok())
      return st;
  }
  std::sort(r.tensors_.begin(), r.tensors_.end(),
            [](const Entry& a, const Entry& b) { return a.name < b.name; });
  for (size_t i = 1; i < r.tensors_.size(); ++i)
    if (r.tensors_[i].name == r.tensors_[i - 1].name)
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", r.tensors_[i].name, "' is in both ", r.file_path(r.tensors_[i - 1].file),
          " and ", r.file_path(r.tensors_[i].file)));
  for (const auto& [name, file] : weight_map) {
    const Entry* e = r.find(name);
    if (e == nullptr || r.file_path(e->file) != fs::join(path, file))
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors index in ", path, " puts tensor '", name, "' in ", file,
                       ", which does not hold it; the index and the shards disagree"));
  }
  return r;
}

const Entry* Reader::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const Entry& e, std::string_view n) { return e.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

absl::Status Reader::read_f32(const Entry& e, std::span<const int64_t> start,
                              std::span<const int64_t> extent, float* out) const {
  absl::StatusOr<ElemType> t = parse_elem_type(e.dtype);
  if (!t.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", e.name, "' in ", file_path(e.file), ": ", t.status().message()));
  std::vector<int64_t> s0(e.shape.size(), 0);
  if (extent.empty()) {
    start = s0;
    extent = e.shape;
  }
  if (start.size() != e.shape.size() || extent.size() != e.shape.size())
    return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "' has rank ",
                                                   e.shape.size(), "; asked for a block of rank ",
                                                   extent.size()));
  for (size_t d = 0; d < e.shape.size(); ++d)
    if (start[d] < 0 || extent[d] < 0 || start[d] + extent[d] > e.shape[d])
      return absl::InvalidArgumentError(
          absl::StrCat("block outside tensor '", e.name, "' of shape ", shape_str(e.shape)));
  for (int64_t x : extent)
    if (x == 0) return absl::OkStatus();
  const uint8_t* base = files_[e.file]->data() + e.begin;
  switch (*t) {
    case ElemType::f32:
      copy_rows<ElemType::f32>(base, e.shape, start, extent, out);
      break;
    case ElemType::bf16:
      copy_rows<ElemType::bf16>(base, e.shape, start, extent, out);
      break;
    case ElemType::f16:
      copy_rows<ElemType::f16>(base, e.shape, start, extent, out);
      break;
  }
  return absl::OkStatus();
}

int64_t WriteEntry::bytes() const {
  int64_t n = elem_bytes(type);
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<Writer> Writer::create(const std::string& path, std::vector<WriteEntry> entries,
                                      const std::map<std::string, std::string>& metadata) {
  std::stable_sort(entries.begin(), entries.end(), [](const WriteEntry& a, const WriteEntry& b) {
    if (file_rank(a.type) != file_rank(b.type)) return file_rank(a.type) > file_rank(b.type);
    return a.name < b.name;
  });
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  int64_t at = 0;
  for (const WriteEntry& e : entries) {
    if (h.contains(e.name))
      return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "' written twice"));
    nlohmann::ordered_json t = nlohmann::ordered_json::object();
    t["dtype"] = elem_type_name(e.type);
    t["shape"] = e.shape;
    t["data_offsets"] = {at, at + e.bytes()};
    h[e.name] = t;
    at += e.bytes();
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  absl::StatusOr<fs::WriteFile> f = fs::WriteFile::open(path);
  if (!f.ok()) return f.status();
  const uint64_t n = text.size();
  if (absl::Status st = f->append(&n, 8); !st.ok()) return st;
  if (absl::Status st = f->append(text.data(), text.size()); !st.ok()) return st;
  return Writer(std::move(*f), std::move(entries));
}

absl::Status Writer::append(std::span<const float> values) {
  if (next_ >= entries_.size())
    return absl::FailedPreconditionError(
        absl::StrCat(file_.path(), ": every tensor is written already"));
  const WriteEntry& e = entries_[next_];
  if (static_cast<int64_t>(values.size()) * elem_bytes(e.type) != e.bytes())
    return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "' of shape ",
                                                   shape_str(e.shape), " given ", values.size(),
                                                   " values"));
  ++next_;
  if (e.type == ElemType::f32) return file_.append(values.data(), values.size() * 4);
  constexpr size_t kChunk = size_t{1} << 20;  // converted a chunk at a time
  std::vector<uint16_t> buf(std::min(values.size(), kChunk));
  for (size_t i = 0; i < values.size(); i += kChunk) {
    const size_t n = std::min(kChunk, values.size() - i);
    for (size_t k = 0; k < n; ++k) {
      if (e.type == ElemType::bf16) {
        buf[k] = f32_to_bf16(values[i + k]);
      } else {
        const _Float16 x = static_cast<_Float16>(values[i + k]);
        std::memcpy(&buf[k], &x, 2);
      }
    }
    if (absl::Status st = file_.append(buf.data(), n * 2); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status Writer::finish() {
  if (next_ != entries_.size())
    return absl::FailedPreconditionError(
        absl::StrCat(file_.path(), ": ", entries_.size() - next_, " tensors were not written"));
  return file_.sync_and_close();
}

}  // namespace tr::st
