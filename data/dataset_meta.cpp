#include "data/dataset_meta.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/fs_io.h"

namespace tr::data {

std::string DatasetMeta::describe() const {
  const std::string what =
      tokenizer == "hf-bpe"
          ? absl::StrCat(std::filesystem::path(source).filename().string(), " (byte-level BPE")
          : absl::StrCat(tokenizer, " (tokenizer");
  return absl::StrCat(what, ", ", vocab_size, " ids, end of document ", eod_id, ")");
}

std::string dataset_meta_path(const std::string& prefix) {
  return prefix + ".meta.json";
}

absl::Status write_dataset_meta(const std::string& prefix, const DatasetMeta& m) {
  const nlohmann::json j = {{"format", "trainer-dataset-meta"}, {"version", 1},
                            {"tokenizer", m.tokenizer},         {"source", m.source},
                            {"source_bytes", m.source_bytes},   {"source_crc32", m.source_crc32},
                            {"vocab_size", m.vocab_size},       {"eod_id", m.eod_id}};
  return fs::write_file_atomic(dataset_meta_path(prefix), j.dump(2) + "\n");
}

absl::StatusOr<std::optional<DatasetMeta>> read_dataset_meta(const std::string& prefix) {
  const std::string path = dataset_meta_path(prefix);
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::optional<DatasetMeta>();
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset metadata ", path, " is malformed (", why,
        "); remake the dataset with prepare_data, or delete the file to skip the check"));
  };
  if (j.is_discarded() || !j.is_object()) return bad("not JSON");
  if (j.value("format", "") != "trainer-dataset-meta") return bad("format");
  DatasetMeta m;
  try {
    m.tokenizer = j.at("tokenizer").get<std::string>();
    m.source = j.at("source").get<std::string>();
    m.source_bytes = j.at("source_bytes").get<uint64_t>();
    m.source_crc32 = j.at("source_crc32").get<uint32_t>();
    m.vocab_size = j.at("vocab_size").get<int64_t>();
    m.eod_id = j.at("eod_id").get<int32_t>();
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
  return std::optional<DatasetMeta>(m);
}

}  // namespace tr::data
