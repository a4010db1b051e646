#include "checkpoint/h5_io.h"

#include <algorithm>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/check.h"

namespace tr::ckpt::h5 {
namespace {

// The most specific message on HDF5's error stack (where the failure was detected), for one
// line of context after a failed call; "" when the stack is empty.
std::string h5_error_detail() {
  std::string detail;
  auto take_first = [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
    auto* out = static_cast<std::string*>(data);
    if (n == 0 && err->desc != nullptr) *out = err->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_first, &detail);
  return detail;
}

// HDF5's description of a failed system call spans lines ("file write failed: time = ...\n,
// filename = ..., errno = 28, error message = 'No space left on device', ..."): keep the
// system's message, so that an error stays one line.
std::string one_line(const std::string& detail) {
  const std::string key = "error message = '";
  if (size_t at = detail.find(key); at != std::string::npos) {
    const size_t from = at + key.size(), to = detail.find('\'', from);
    if (to != std::string::npos) return detail.substr(from, to - from);
  }
  std::string out = detail;
  std::replace(out.begin(), out.end(), '\n', ' ');
  return out;
}

std::string with_detail(std::string msg) {
  std::string detail = one_line(h5_error_detail());
  if (!detail.empty()) absl::StrAppend(&msg, " (HDF5: ", detail, ")");
  return msg;
}

Handle scalar_space() {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5_CHECK(space.get());
  return space;
}

Handle simple_space(const std::vector<int64_t>& shape) {
  if (shape.empty()) return scalar_space();
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  H5_CHECK(space.get());
  return space;
}

// Variable-length UTF-8 string type.
Handle vlen_string_type() {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5_CHECK(type.get());
  H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  return type;
}

Handle intermediate_groups_plist() {
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5_CHECK(lcpl.get());
  H5_CHECK(H5Pset_create_intermediate_group(lcpl.get(), 1));
  return lcpl;
}

std::string type_desc(hid_t type) {
  size_t bits = H5Tget_size(type) * 8;
  switch (H5Tget_class(type)) {
    case H5T_FLOAT:
      return absl::StrCat("float", bits);
    case H5T_INTEGER:
      return absl::StrCat(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int", bits);
    case H5T_STRING:
      return "string";
    default:
      return "non-numeric type";
  }
}

template <typename T>
void write_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const T& value) {
  Handle space = scalar_space();
  Handle attr(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5_CHECK(attr.get());
  H5_CHECK(H5Awrite(attr.get(), mem_type, &value));
}

template <typename T>
absl::StatusOr<T> read_attr(hid_t obj, const char* name, hid_t mem_type) {
  if (H5Aexists(obj, name) <= 0)
    return absl::NotFoundError(absl::StrCat("no attribute '", name, "'"));
  Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  T value{};
  if (!attr.valid() || H5Aread(attr.get(), mem_type, &value) < 0) {
    return absl::DataLossError(with_detail(absl::StrCat("cannot read attribute '", name, "'")));
  }
  return value;
}

}  // namespace

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    close_ = other.close_;
    other.id_ = -1;
  }
  return *this;
}

herr_t Handle::reset() {
  herr_t rc = 0;
  if (id_ >= 0 && close_ != nullptr) rc = close_(id_);
  id_ = -1;
  return rc;
}

// HDF5's own clean-up at exit closes the files still open: one whose close failed (a full
// disk) is left half-open, and HDF5 1.10 then crashes in that clean-up (rc 139) after the error
// was reported. Every file we write is closed (and its close checked) by its Handle, so the
// library's exit hook has nothing to do: switch it off before HDF5 initialises.
const bool g_no_hdf5_atexit = [] {
  H5dont_atexit();
  return true;
}();

// HDF5's automatic printing of error stacks, off: errors come back as one Status line. The
// setting is per thread in a thread-safe HDF5 (the background saver writes from its own
// thread), so each thread turns it off before its first call.
void quiet_errors() {
  thread_local bool quiet = false;
  if (quiet) return;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  quiet = true;
}

Handle file_access_plist() {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5_CHECK(fapl.get());
  H5_CHECK(H5Pset_file_locking(fapl.get(), /*use_file_locking=*/1, /*ignore_when_disabled=*/1));
  return fapl;
}

absl::StatusOr<Handle> create_file(const std::string& path, bool page_aligned) {
  quiet_errors();
  Handle fapl = file_access_plist();
  if (page_aligned) H5_CHECK(H5Pset_alignment(fapl.get(), 4096, 4096));
  Handle file(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!file.valid()) {
    return absl::UnavailableError(with_detail(absl::StrCat("cannot create HDF5 file ", path)));
  }
  return file;
}

absl::Status close_written_file(Handle& file, const std::string& path) {
  if (file.reset() < 0)
    return absl::UnavailableError(with_detail(absl::StrCat("cannot close HDF5 file ", path)));
  return absl::OkStatus();
}

absl::StatusOr<Handle> open_file_readonly(const std::string& path) {
  quiet_errors();
  Handle fapl = file_access_plist();
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!file.valid()) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path,
                                            " cannot be opened by HDF5: not an HDF5 file or "
                                            "corrupt"));
  }
  return file;
}

absl::Status write_f32(hid_t file, const std::string& path, const std::vector<int64_t>& shape,
                       const float* data) {
  Handle space = simple_space(shape);
  Handle lcpl = intermediate_groups_plist();
  Handle dset(H5Dcreate2(file, path.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), H5P_DEFAULT,
                         H5P_DEFAULT),
              H5Dclose);
  if (!dset.valid()) {
    return absl::UnavailableError(with_detail(absl::StrCat("cannot create dataset ", path)));
  }
  if (H5Sget_simple_extent_npoints(space.get()) > 0 &&
      H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    return absl::UnavailableError(with_detail(absl::StrCat("cannot write dataset ", path)));
  }
  if (dset.reset() < 0) {
    return absl::UnavailableError(with_detail(absl::StrCat("cannot close dataset ", path)));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> create_f32_allocated(hid_t file, const std::string& path,
                                              const std::vector<int64_t>& shape) {
  Handle space = simple_space(shape);
  Handle lcpl = intermediate_groups_plist();
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5_CHECK(dcpl.get());
  H5_CHECK(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS));
  H5_CHECK(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
  H5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
  Handle dset(H5Dcreate2(file, path.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), dcpl.get(),
                         H5P_DEFAULT),
              H5Dclose);
  if (!dset.valid()) {
    return absl::UnavailableError(with_detail(absl::StrCat("cannot create dataset ", path)));
  }
  if (H5Sget_simple_extent_npoints(space.get()) == 0) return uint64_t{0};
  const haddr_t at = H5Dget_offset(dset.get());
  if (at == HADDR_UNDEF) {
    return absl::UnavailableError(
        with_detail(absl::StrCat("dataset ", path, " has no allocated space")));
  }
  return static_cast<uint64_t>(at);
}

bool path_exists(hid_t file, const std::string& path) {
  std::string prefix;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    absl::StrAppend(&prefix, "/", part);
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
}

absl::StatusOr<DatasetInfo> dataset_info(hid_t file, const std::string& path) {
  Handle dset(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) return absl::DataLossError(with_detail("cannot open dataset " + path));
  Handle type(H5Dget_type(dset.get()), H5Tclose);
  Handle space(H5Dget_space(dset.get()), H5Sclose);
  H5_CHECK(type.get());
  H5_CHECK(space.get());
  DatasetInfo info;
  info.is_f32 = H5Tget_class(type.get()) == H5T_FLOAT && H5Tget_size(type.get()) == 4;
  info.type_desc = type_desc(type.get());
  int rank = H5Sget_simple_extent_ndims(space.get());
  H5_CHECK(rank);
  std::vector<hsize_t> dims(rank);
  H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  info.shape.assign(dims.begin(), dims.end());
  return info;
}

absl::Status read_f32(hid_t file, const std::string& path, float* out, hid_t dapl,
                      const std::vector<int64_t>& start, const std::vector<int64_t>& extent) {
  Handle dset(H5Dopen2(file, path.c_str(), dapl), H5Dclose);
  if (!dset.valid()) return absl::DataLossError(with_detail("cannot open dataset " + path));
  Handle space(H5Dget_space(dset.get()), H5Sclose);
  H5_CHECK(space.get());
  Handle mem = simple_space(extent);
  hid_t mem_space = H5S_ALL;
  if (!extent.empty()) {
    std::vector<hsize_t> at(start.begin(), start.end()), count(extent.begin(), extent.end());
    for (hsize_t c : count)
      if (c == 0) return absl::OkStatus();
    H5_CHECK(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, at.data(), nullptr, count.data(),
                                 nullptr));
    mem_space = mem.get();
  }
  if (H5Sget_select_npoints(space.get()) == 0) return absl::OkStatus();
  if (H5Dread(dset.get(), H5T_NATIVE_FLOAT, mem_space, space.get(), H5P_DEFAULT, out) < 0) {
    return absl::DataLossError(with_detail("cannot read dataset " + path));
  }
  return absl::OkStatus();
}

Handle vds_access_plist(const std::string& dir) {
  Handle dapl(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
  H5_CHECK(dapl.get());
  H5_CHECK(H5Pset_virtual_prefix(dapl.get(), dir.c_str()));
  return dapl;
}

absl::StatusOr<std::vector<std::string>> virtual_sources(hid_t file, const std::string& path) {
  Handle dset(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) return absl::DataLossError(with_detail("cannot open dataset " + path));
  Handle dcpl(H5Dget_create_plist(dset.get()), H5Pclose);
  H5_CHECK(dcpl.get());
  std::vector<std::string> files;
  if (H5Pget_layout(dcpl.get()) != H5D_VIRTUAL) return files;
  size_t count = 0;
  H5_CHECK(H5Pget_virtual_count(dcpl.get(), &count));
  for (size_t i = 0; i < count; ++i) {
    ssize_t n = H5Pget_virtual_filename(dcpl.get(), i, nullptr, 0);
    H5_CHECK(n);
    std::string name(static_cast<size_t>(n) + 1, '\0');
    H5_CHECK(H5Pget_virtual_filename(dcpl.get(), i, name.data(), name.size()));
    name.resize(static_cast<size_t>(n));
    if (std::find(files.begin(), files.end(), name) == files.end()) files.push_back(name);
  }
  return files;
}

absl::Status write_virtual_f32(hid_t file, const std::string& path,
                               const std::vector<int64_t>& shape,
                               const std::vector<VirtualPiece>& pieces) {
  Handle space = simple_space(shape);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5_CHECK(dcpl.get());
  const float zero = 0.0f;
  H5_CHECK(H5Pset_fill_value(dcpl.get(), H5T_NATIVE_FLOAT, &zero));
  for (const VirtualPiece& p : pieces) {
    std::vector<hsize_t> at(p.start.begin(), p.start.end()),
        count(p.extent.begin(), p.extent.end());
    Handle dst = simple_space(shape);
    if (!shape.empty())
      H5_CHECK(H5Sselect_hyperslab(dst.get(), H5S_SELECT_SET, at.data(), nullptr, count.data(),
                                   nullptr));
    Handle src = simple_space(p.extent);
    H5_CHECK(H5Pset_virtual(dcpl.get(), dst.get(), p.file.c_str(), p.dataset.c_str(), src.get()));
  }
  Handle lcpl = intermediate_groups_plist();
  Handle dset(H5Dcreate2(file, path.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), dcpl.get(),
                         H5P_DEFAULT),
              H5Dclose);
  if (!dset.valid() || dset.reset() < 0) {
    return absl::UnavailableError(
        with_detail(absl::StrCat("cannot create virtual dataset ", path)));
  }
  return absl::OkStatus();
}

std::vector<std::string> list_datasets(hid_t file, const std::string& group) {
  std::vector<std::string> names;
  if (!path_exists(file, group)) return names;
  Handle grp(H5Gopen2(file, group.c_str(), H5P_DEFAULT), H5Gclose);
  if (!grp.valid()) return names;  // `group` is not a group: it holds no datasets
  auto visit = [](hid_t g, const char* name, const H5L_info_t* info, void* data) -> herr_t {
    if (info->type != H5L_TYPE_HARD) return 0;
    Handle obj(H5Oopen(g, name, H5P_DEFAULT), H5Oclose);
    if (obj.valid() && H5Iget_type(obj.get()) == H5I_DATASET) {
      static_cast<std::vector<std::string>*>(data)->push_back(name);
    }
    return 0;
  };
  H5Lvisit(grp.get(), H5_INDEX_NAME, H5_ITER_INC, visit, &names);
  for (std::string& n : names) n = absl::StrCat(group, "/", n);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status write_string(hid_t file, const std::string& path, std::string_view value) {
  if (value.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("string for ", path, " contains a NUL byte"));
  }
  std::string owned(value);
  const char* ptr = owned.c_str();
  Handle type = vlen_string_type();
  Handle space = scalar_space();
  Handle lcpl = intermediate_groups_plist();
  Handle dset(
      H5Dcreate2(file, path.c_str(), type.get(), space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
      H5Dclose);
  if (!dset.valid() || H5Dwrite(dset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &ptr) < 0 ||
      dset.reset() < 0) {
    return absl::UnavailableError(with_detail("cannot write string dataset " + path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> read_string(hid_t file, const std::string& path) {
  if (!path_exists(file, path)) return absl::NotFoundError("no dataset " + path);
  Handle dset(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) return absl::DataLossError(with_detail("cannot open dataset " + path));
  Handle file_type(H5Dget_type(dset.get()), H5Tclose);
  H5_CHECK(file_type.get());
  if (H5Tget_class(file_type.get()) != H5T_STRING || H5Tis_variable_str(file_type.get()) <= 0) {
    return absl::DataLossError(absl::StrCat("dataset ", path, " is not a variable-length string"));
  }
  Handle mem_type = vlen_string_type();
  char* ptr = nullptr;
  if (H5Dread(dset.get(), mem_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &ptr) < 0) {
    return absl::DataLossError(with_detail("cannot read string dataset " + path));
  }
  std::string value = ptr != nullptr ? ptr : "";
  H5free_memory(ptr);
  return value;
}

void write_attr_i64(hid_t obj, const char* name, int64_t value) {
  write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, value);
}
void write_attr_u64(hid_t obj, const char* name, uint64_t value) {
  write_attr(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, value);
}
void write_attr_f64(hid_t obj, const char* name, double value) {
  write_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, value);
}
void write_attr_string(hid_t obj, const char* name, std::string_view value) {
  std::string owned(value);
  const char* ptr = owned.c_str();
  Handle type = vlen_string_type();
  write_attr(obj, name, type.get(), type.get(), ptr);
}

void write_attr_f64_array(hid_t obj, const char* name, const std::vector<double>& values) {
  const hsize_t n = values.size();
  Handle space(H5Screate(n == 0 ? H5S_NULL : H5S_SIMPLE), H5Sclose);
  H5_CHECK(space.get());
  if (n > 0) H5_CHECK(H5Sset_extent_simple(space.get(), 1, &n, nullptr));
  Handle attr(H5Acreate2(obj, name, H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose);
  H5_CHECK(attr.get());
  if (n > 0) H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, values.data()));
}

absl::StatusOr<std::vector<double>> read_attr_f64_array(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0)
    return absl::NotFoundError(absl::StrCat("no attribute '", name, "'"));
  Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  Handle space(attr.valid() ? H5Aget_space(attr.get()) : -1, H5Sclose);
  const hssize_t n = space.valid() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  if (n < 0 || (space.valid() && H5Sget_simple_extent_ndims(space.get()) > 1))
    return absl::DataLossError(with_detail(absl::StrCat("cannot read attribute '", name, "'")));
  std::vector<double> values(static_cast<size_t>(n));
  if (n > 0 && H5Aread(attr.get(), H5T_NATIVE_DOUBLE, values.data()) < 0)
    return absl::DataLossError(with_detail(absl::StrCat("cannot read attribute '", name, "'")));
  return values;
}

bool has_attr(hid_t obj, const char* name) {
  return H5Aexists(obj, name) > 0;
}

absl::StatusOr<int64_t> read_attr_i64(hid_t obj, const char* name) {
  return read_attr<int64_t>(obj, name, H5T_NATIVE_INT64);
}
absl::StatusOr<uint64_t> read_attr_u64(hid_t obj, const char* name) {
  return read_attr<uint64_t>(obj, name, H5T_NATIVE_UINT64);
}
absl::StatusOr<double> read_attr_f64(hid_t obj, const char* name) {
  return read_attr<double>(obj, name, H5T_NATIVE_DOUBLE);
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

}  // namespace tr::ckpt::h5
