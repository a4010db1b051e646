// manifest.json: the list of a checkpoint's files with size and crc32. Written last, so its
// presence marks a committed checkpoint. Internal to tr_checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/fs_io.h"

namespace tr::ckpt {

inline constexpr char kManifestFile[] = "manifest.json";
inline constexpr char kManifestFormat[] = "trainer-checkpoint";
inline constexpr int kManifestVersion = 1;

struct Manifest {
  int64_t step = 0;
  std::map<std::string, fs::FileDigest> files;  // file name in the checkpoint dir -> digest
};

// Digests `files` (names inside `dir`) and writes `dir`/manifest.json durably (fsync),
// listing them and the files of `known` (digests computed by their writers).
absl::Status write_manifest(const std::string& dir, int64_t step,
                            const std::vector<std::string>& files,
                            const std::map<std::string, fs::FileDigest>& known = {});

// Reads and parses `dir`/manifest.json: present, valid JSON, our format and version, a step
// and a well-formed file table listing model.h5.
absl::StatusOr<Manifest> read_manifest(const std::string& dir);

// Every file of `m` exists in `dir` with its recorded size, and the share of `part` of `parts`
// has its recorded crc32 (parts = 0: no crc32 checks): shard_R.h5 is part R modulo parts's (under
// the layout that wrote it, the rank that reads its blocks, so the check leaves the file in that
// node's page cache for the load instead of reading it from storage a second time), and the other
// files go round in their order.
absl::Status check_manifest_files(const std::string& dir, const Manifest& m, int part = 0,
                                  int parts = 1);

}  // namespace tr::ckpt
