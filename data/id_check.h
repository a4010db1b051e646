// Every token id of the data files checked against the model's vocabulary before any training,
// not found mid-run after logs were written: each file is scanned once (its smallest and largest
// id, TokenSource::check_ids), and a file checked before at the same size, modification time and
// limit is skipped: the run remembers what it checked in a small JSON file (by default in its
// checkpoint.dir), so a restart re-reads nothing. docs/PERFORMANCE.md has the scan's speed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/token_source.h"

namespace tr::data {

struct IdCheck {
  int scanned = 0, cached = 0;  // files scanned now, files the cache vouched for
  double bytes_scanned = 0, seconds = 0;
  std::string cache_json;       // the cache with this check's files: store it once the run owns it
  std::vector<IdRange> ranges;  // each path's smallest and largest id, in the order given
};

// Checks every token of `paths` (opened as `format`) is a whole number in [0, limit). `cache` is
// the text of a cache written before ("" for none; a malformed one counts as none). Errors are
// read()'s one line naming the file and the first bad token. The cache keeps each file's range.
absl::StatusOr<IdCheck> check_token_ids(const std::vector<std::string>& paths, SourceFormat format,
                                        int64_t limit, const std::string& cache);

}  // namespace tr::data
