#include "checkpoint/manifest.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "checkpoint/model_file.h"

namespace tr::ckpt {
namespace {

using nlohmann::json;

// A manifest may only name plain files inside its own directory.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

absl::Status bad_manifest(const std::string& path, absl::string_view why) {
  return absl::DataLossError(absl::StrCat("checkpoint manifest ", path, " is corrupt: ", why));
}

absl::StatusOr<Manifest> parse_manifest(const std::string& path, const json& j) {
  if (!j.is_object()) return bad_manifest(path, "not a JSON object");
  if (!j.contains("format") || j["format"] != kManifestFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a trainer checkpoint manifest (format ",
                     j.contains("format") ? j["format"].dump() : "missing", ", expected \"",
                     kManifestFormat, "\")"));
  }
  if (!j.contains("version") || !j["version"].is_number_integer() ||
      j["version"].get<int64_t>() != kManifestVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint manifest ", path, " has version ",
                     j.contains("version") ? j["version"].dump() : "missing",
                     "; this build reads version ", kManifestVersion));
  }
  if (!j.contains("step") || !j["step"].is_number_integer()) {
    return bad_manifest(path, "no integer \"step\"");
  }
  if (!j.contains("files") || !j["files"].is_object()) {
    return bad_manifest(path, "no \"files\" table");
  }
  Manifest m;
  m.step = j["step"].get<int64_t>();
  for (const auto& [name, entry] : j["files"].items()) {
    if (!is_plain_file_name(name)) {
      return bad_manifest(path, absl::StrCat("file name \"", name, "\" is not a plain name"));
    }
    if (!entry.is_object() || !entry.contains("bytes") || !entry["bytes"].is_number_unsigned() ||
        !entry.contains("crc32") || !entry["crc32"].is_number_unsigned() ||
        entry["crc32"].get<uint64_t>() > UINT32_MAX) {
      return bad_manifest(path, absl::StrCat("entry for \"", name,
                                             "\" needs unsigned \"bytes\" "
                                             "and 32-bit \"crc32\""));
    }
    m.files[name] = {entry["bytes"].get<uint64_t>(),
                     static_cast<uint32_t>(entry["crc32"].get<uint64_t>())};
  }
  if (!m.files.count(kModelFile)) {
    return bad_manifest(path, absl::StrCat("it does not list ", kModelFile));
  }
  return m;
}

}  // namespace

absl::Status write_manifest(const std::string& dir, int64_t step,
                            const std::vector<std::string>& files,
                            const std::map<std::string, fs::FileDigest>& known) {
  json table = json::object();
  for (const auto& [name, d] : known) table[name] = {{"bytes", d.bytes}, {"crc32", d.crc32}};
  for (const std::string& name : files) {
    absl::StatusOr<fs::FileDigest> d = fs::digest_file(fs::join(dir, name));
    if (!d.ok()) return d.status();
    table[name] = {{"bytes", d->bytes}, {"crc32", d->crc32}};
  }
  json j = {{"format", kManifestFormat},
            {"version", kManifestVersion},
            {"step", step},
            {"files", std::move(table)}};
  return fs::write_file_durable(fs::join(dir, kManifestFile), j.dump(2) + "\n");
}

absl::StatusOr<Manifest> read_manifest(const std::string& dir) {
  std::string path = fs::join(dir, kManifestFile);
  if (!fs::exists(path)) {
    return absl::NotFoundError(absl::StrCat(
        "checkpoint ", dir, " has no ", kManifestFile,
        ": it is not a committed checkpoint (an interrupted save, or not a checkpoint dir)"));
  }
  absl::StatusOr<std::string> text = fs::read_file(path);
  if (!text.ok()) return text.status();
  json j;
  try {
    j = json::parse(*text);
  } catch (const json::parse_error& e) {
    return bad_manifest(path, absl::StrCat("not valid JSON (", e.what(), ")"));
  }
  return parse_manifest(path, j);
}

namespace {

// The writer's rank of a shard file ("shard_00012.h5": 12), or -1 for the other files.
int shard_writer(const std::string& name) {
  int rank = -1;
  char tail = 0;
  if (std::sscanf(name.c_str(), "shard_%d.h%c", &rank, &tail) != 2 || tail != '5' ||
      name.size() != 14)
    return -1;
  return rank;
}

}  // namespace

absl::Status check_manifest_files(const std::string& dir, const Manifest& m, int part, int parts) {
  int others = -1;  // the index of a file that is not a shard among those
  for (const auto& [name, want] : m.files) {
    const int writer = shard_writer(name);
    const int index = writer >= 0 ? writer : ++others;
    std::string path = fs::join(dir, name);
    if (!fs::exists(path)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", path, " listed in the manifest is missing"));
    }
    absl::StatusOr<uint64_t> size = fs::file_size(path);
    if (!size.ok()) return size.status();
    if (*size != want.bytes) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file ", path, " is corrupt: size mismatch (manifest ", want.bytes,
          " bytes, file ", *size, " bytes); the file was truncated or modified"));
    }
    if (parts <= 0 || index % parts != part) continue;  // another part's share
    absl::StatusOr<fs::FileDigest> got = fs::digest_file(path);
    if (!got.ok()) return got.status();
    if (got->crc32 != want.crc32) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", path, " is corrupt: crc32 mismatch (manifest ",
                       want.crc32, ", file ", got->crc32, "); the file was truncated or modified"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tr::ckpt
