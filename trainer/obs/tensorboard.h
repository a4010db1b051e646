// TensorBoard event files: log.dir/tb/events.out.tfevents.<time>.<host>.<pid>, written with
// protobuf (trainer/obs/tensorboard.proto) as TFRecord records (length, masked CRC32C, data, masked
// CRC32C). TensorBoard reads every file in the directory and merges them, so each process of a
// run writes a file of its own and never touches another's; a resumed process starts its file
// with a restart marker at its resume step, so readers drop the later steps an interrupted
// process wrote.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"

namespace tr {

class EventFileWriter {
 public:
  // Creates dir and a new event file in it; `resume_step` > 0 writes the restart marker.
  absl::Status open(const std::string& dir, int64_t resume_step);
  ~EventFileWriter();
  bool is_open() const { return f_ != nullptr; }
  const std::string& path() const { return path_; }
  void scalar(const std::string& tag, int64_t step, double value);
  // Text (Markdown) at `step`, shown by TensorBoard's text plugin.
  void text(const std::string& tag, int64_t step, const std::string& markdown);
  // Pushes what was written to the file (a killed run keeps it up to here).
  void flush();
  // Whether a write has failed (a full disk): events are being lost. Warned once, on stderr.
  bool failed() const { return failed_; }

 private:
  void record(const std::string& data);
  void check(bool ok);
  std::FILE* f_ = nullptr;
  std::string path_;
  bool failed_ = false;
};

// The masked CRC32C of TFRecord framing (Boost.CRC's CRC-32C).
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace tr
