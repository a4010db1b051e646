// Hugging Face safetensors, read and written directly (no Python): a little-endian u64 header
// length N, N bytes of JSON ({"__metadata__": {...}, "<name>": {"dtype": "BF16", "shape":
// [...], "data_offsets": [begin, end]}, ...}, padded with spaces to a multiple of 8), then the
// raw row-major little-endian tensors, offsets relative to the end of the header.
//
// Reading maps the files and copies only the blocks asked for, so a rank of a 72B job touches
// its slices and nothing else. Writing streams one tensor at a time, converting from fp32.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/fs_io.h"
#include "core/mapped_file.h"

namespace tr::st {

// The element types we convert to and from fp32 ("F32", "BF16", "F16" in the header).
enum class ElemType { f32, bf16, f16 };
absl::StatusOr<ElemType> parse_elem_type(std::string_view name);  // "BF16" -> bf16
const char* elem_type_name(ElemType t);                           // bf16 -> "BF16"
int elem_bytes(ElemType t);

struct Entry {
  std::string name;
  std::string dtype;  // as in the header ("BF16", "I64", ...): other types are listed, not read
  std::vector<int64_t> shape;
  int file = 0;        // index into Reader::files()
  uint64_t begin = 0;  // byte offsets of the data in that file (absolute)
  uint64_t end = 0;
};

// A model's safetensors: one file, or a Hugging Face model directory holding
// model.safetensors, or the shards listed by model.safetensors.index.json.
class Reader {
 public:
  // `path`: a directory (index first, then model.safetensors) or a .safetensors file. Every
  // header is checked (offsets inside the file, sizes matching shapes, no overlaps); an error
  // names the file and what is wrong.
  static absl::StatusOr<Reader> open(const std::string& path);

  const std::vector<Entry>& tensors() const { return tensors_; }  // sorted by name
  const Entry* find(std::string_view name) const;
  const std::string& file_path(int file) const { return files_[file]->path(); }
  size_t file_count() const { return files_.size(); }

  // Copies block [start, start + extent) of `e` (both empty: the whole tensor) into `out` as
  // fp32, row-major. The dtype must be F32, BF16 or F16.
  absl::Status read_f32(const Entry& e, std::span<const int64_t> start,
                        std::span<const int64_t> extent, float* out) const;

 private:
  std::vector<std::unique_ptr<fs::MappedFile>> files_;
  std::vector<Entry> tensors_;
};

struct WriteEntry {
  std::string name;
  ElemType type = ElemType::f32;
  std::vector<int64_t> shape;
  int64_t bytes() const;
};

// One safetensors file written tensor by tensor. The header is laid out as the `safetensors`
// library lays it out (tensors by element size, largest first, then by name; "__metadata__"
// first; compact JSON padded with spaces), so a file we write holds the same bytes as the one
// `save_pretrained` writes for the same tensors.
class Writer {
 public:
  // Creates `path` (truncating it) and writes the header.
  static absl::StatusOr<Writer> create(const std::string& path, std::vector<WriteEntry> entries,
                                       const std::map<std::string, std::string>& metadata);
  // The order in which the tensors must be appended.
  const std::vector<WriteEntry>& order() const { return entries_; }
  // The next tensor's values, converted to its type (bf16 and f16 round to nearest even).
  absl::Status append(std::span<const float> values);
  // After every tensor: fsync and close.
  absl::Status finish();

 private:
  Writer(fs::WriteFile f, std::vector<WriteEntry> e)
      : file_(std::move(f)), entries_(std::move(e)) {}
  fs::WriteFile file_;
  std::vector<WriteEntry> entries_;
  size_t next_ = 0;
};

}  // namespace tr::st
