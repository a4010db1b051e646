// HDF5 primitives for the checkpoint layer: an owning hid_t, fp32 tensor datasets, string
// datasets and scalar attributes. Internal to tr_checkpoint.
//
// Failures that can come from the file or the disk (open, create, write, close, a missing
// object) return absl::Status; failures of in-memory calls on objects we just made
// (dataspaces, types, property lists) are program errors and stop via H5_CHECK.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tr::ckpt::h5 {

// Owns one HDF5 identifier and closes it with the matching H5*close. Move-only.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  Handle(Handle&& other) noexcept : id_(other.id_), close_(other.close_) { other.id_ = -1; }
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; returns the close status (a file close flushes, so this can fail).
  herr_t reset();

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Turns off HDF5's automatic error stack printing (once per process): bad files must give
// our one-line message, not a library stack dump.
void quiet_errors();

// A file access property list with file locking that degrades gracefully on filesystems
// without flock (Lustre, some NFS).
Handle file_access_plist();

// Creates `path` (fails if it exists) / opens it read-only. `page_aligned`: every object of
// 4 KiB or more starts on a 4 KiB boundary of the file (datasets written directly, O_DIRECT).
absl::StatusOr<Handle> create_file(const std::string& path, bool page_aligned = false);
absl::StatusOr<Handle> open_file_readonly(const std::string& path);
// Closes a file written to: closing flushes, so a failure here is a write failure ("cannot close
// HDF5 file PATH (HDF5: No space left on device)").
absl::Status close_written_file(Handle& file, const std::string& path);

// Writes `count` floats at `data` as a new fp32 dataset `path` (absolute, "/a/b/c") with
// `shape` (empty = scalar), creating intermediate groups.
absl::Status write_f32(hid_t file, const std::string& path, const std::vector<int64_t>& shape,
                       const float* data);

// A new fp32 dataset `path` of `shape` whose space in the file is allocated now and never
// written by HDF5 (no fill): returns the byte offset of its contiguous data in the file, which
// the caller writes itself after the file is closed (fs::write_regions_durable); 0 for an empty
// dataset, which has no data.
absl::StatusOr<uint64_t> create_f32_allocated(hid_t file, const std::string& path,
                                              const std::vector<int64_t>& shape);

// True when every component of the absolute `path` exists as a link.
bool path_exists(hid_t file, const std::string& path);

// A dataset's element type and shape, for checks before a read.
struct DatasetInfo {
  bool is_f32 = false;         // IEEE float of 4 bytes
  std::string type_desc;       // e.g. "float64", "int32" when not fp32
  std::vector<int64_t> shape;  // empty = scalar
};
absl::StatusOr<DatasetInfo> dataset_info(hid_t file, const std::string& path);

// Reads a dataset whose shape the caller checked into `out` (converted to native float): the
// block at `start` of `extent` elements per dimension, or all of it when both are empty. `dapl`
// is the dataset access property list (H5P_DEFAULT, or vds_access_plist for a checkpoint).
absl::Status read_f32(hid_t file, const std::string& path, float* out, hid_t dapl = H5P_DEFAULT,
                      const std::vector<int64_t>& start = {},
                      const std::vector<int64_t>& extent = {});

// A dataset access property list that resolves the relative source file names of virtual
// datasets against `dir`, whatever the working directory.
Handle vds_access_plist(const std::string& dir);

// The source file names of a virtual dataset, each once, in mapping order; {} when `path` is
// an ordinary dataset.
absl::StatusOr<std::vector<std::string>> virtual_sources(hid_t file, const std::string& path);

// One mapping of a virtual dataset: the block at `start` of `extent` is all of dataset
// `dataset` (its shape is `extent`) in file `file` (relative to the virtual file's directory).
struct VirtualPiece {
  std::vector<int64_t> start, extent;
  std::string file, dataset;
};
// Creates fp32 virtual dataset `path` of `shape` stitched from `pieces` (intermediate groups
// created). Elements no piece covers read as 0.
absl::Status write_virtual_f32(hid_t file, const std::string& path,
                               const std::vector<int64_t>& shape,
                               const std::vector<VirtualPiece>& pieces);

// Absolute paths of all datasets under group `group` ("/model"), sorted; {} if none.
std::vector<std::string> list_datasets(hid_t file, const std::string& group);

// Variable-length UTF-8 string datasets (scalar).
absl::Status write_string(hid_t file, const std::string& path, std::string_view value);
absl::StatusOr<std::string> read_string(hid_t file, const std::string& path);

// Scalar attributes on an object (group or dataset).
void write_attr_i64(hid_t obj, const char* name, int64_t value);
void write_attr_u64(hid_t obj, const char* name, uint64_t value);
void write_attr_f64(hid_t obj, const char* name, double value);
void write_attr_string(hid_t obj, const char* name, std::string_view value);
// A 1-D f64 attribute (possibly empty).
void write_attr_f64_array(hid_t obj, const char* name, const std::vector<double>& values);
absl::StatusOr<std::vector<double>> read_attr_f64_array(hid_t obj, const char* name);
// Whether `obj` has attribute `name`.
bool has_attr(hid_t obj, const char* name);
absl::StatusOr<int64_t> read_attr_i64(hid_t obj, const char* name);
absl::StatusOr<uint64_t> read_attr_u64(hid_t obj, const char* name);
absl::StatusOr<double> read_attr_f64(hid_t obj, const char* name);

// "[64,128]"
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace tr::ckpt::h5
