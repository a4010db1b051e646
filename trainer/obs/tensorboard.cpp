#include "trainer/obs/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "trainer/obs/tensorboard.pb.h"

namespace tr {
uint32_t masked_crc32c(const void* data, size_t n) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, n);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

absl::Status EventFileWriter::open(const std::string& dir, int64_t resume_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::InvalidArgumentError(
        absl::StrCat("TensorBoard directory '", dir, "' cannot be created: ", ec.message()));
  char host[256] = "host";
  gethostname(host, sizeof(host) - 1);
  // Readers (TensorBoard too) take a directory's event files in name order, which is time order
  // only while the times differ: a run resumed within the second its predecessor started would
  // sort by pid, which wraps. So a new file's time is past every earlier file's.
  auto now = static_cast<int64_t>(unix_time());
  constexpr std::string_view kPrefix = "events.out.tfevents.";
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(kPrefix)) continue;
    const int64_t t = std::strtoll(name.c_str() + kPrefix.size(), nullptr, 10);
    now = std::max(now, t + 1);
  }
  const std::string base =
      absl::StrCat(dir, "/events.out.tfevents.", now, ".", host, ".", static_cast<long>(getpid()));
  path_ = base;
  for (int n = 1; std::filesystem::exists(path_); ++n) path_ = absl::StrCat(base, ".", n);
  f_ = std::fopen(path_.c_str(), "wb");
  if (f_ == nullptr) return absl::InvalidArgumentError(absl::StrCat("cannot create ", path_));
  tb::Event version;
  version.set_wall_time(unix_time());
  version.set_file_version("brain.Event:2");
  record(version.SerializeAsString());
  if (resume_step > 0) {
    tb::Event restart;
    restart.set_wall_time(unix_time());
    restart.set_step(resume_step + 1);  // readers drop steps >= this: resume_step stays
    restart.mutable_session_log()->set_status(tb::SessionLog::START);
    record(restart.SerializeAsString());
  }
  flush();
  return absl::OkStatus();
}

EventFileWriter::~EventFileWriter() {
  if (f_ != nullptr) std::fclose(f_);
}

void EventFileWriter::record(const std::string& data) {
  if (f_ == nullptr) return;
  const uint64_t n = data.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));  // little endian
  const uint32_t len_crc = masked_crc32c(len, sizeof(len)),
                 data_crc = masked_crc32c(data.data(), n);
  unsigned char crc[2][4];
  for (int i = 0; i < 4; ++i) {
    crc[0][i] = static_cast<unsigned char>(len_crc >> (8 * i));
    crc[1][i] = static_cast<unsigned char>(data_crc >> (8 * i));
  }
  check(std::fwrite(len, 1, sizeof(len), f_) == sizeof(len) && std::fwrite(crc[0], 1, 4, f_) == 4 &&
        std::fwrite(data.data(), 1, n, f_) == n && std::fwrite(crc[1], 1, 4, f_) == 4);
}

void EventFileWriter::check(bool ok) {
  if (ok || failed_) return;
  failed_ = true;
  std::fprintf(stderr,
               "warning: cannot write %s (%s): TensorBoard events are being lost; metrics.jsonl "
               "has them\n",
               path_.c_str(), std::strerror(errno));
  std::fflush(stderr);
}

void EventFileWriter::scalar(const std::string& tag, int64_t step, double value) {
  tb::Event e;
  e.set_wall_time(unix_time());
  e.set_step(step);
  tb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  record(e.SerializeAsString());
}

void EventFileWriter::text(const std::string& tag, int64_t step, const std::string& markdown) {
  tb::Event e;
  e.set_wall_time(unix_time());
  e.set_step(step);
  tb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tb::TensorProto* t = v->mutable_tensor();
  t->set_dtype(7);            // DT_STRING
  t->mutable_tensor_shape();  // a scalar: no dims
  t->add_string_val(markdown);
  record(e.SerializeAsString());
}

void EventFileWriter::flush() {
  if (f_ != nullptr) check(std::fflush(f_) == 0);
}

}  // namespace tr
