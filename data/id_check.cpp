#include "data/id_check.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <nlohmann/json.hpp>

namespace tr::data {
namespace {

// What identifies a version of a file: its absolute path, size and modification time (ns).
nlohmann::json identity(const std::string& file, int64_t limit) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return nullptr;
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(file, ec).lexically_normal().string();
  return {{"file", ec ? file : abs},
          {"bytes", static_cast<int64_t>(st.st_size)},
          {"mtime_ns", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec},
          {"limit", limit}};
}

// A cache entry: a file's identity and, when the scan found it, its id range ("ids": [lo, hi]).
bool same_file(nlohmann::json entry, const nlohmann::json& id) {
  if (!entry.is_object()) return false;
  entry.erase("ids");
  return entry == id;
}

IdRange range_of(const nlohmann::json& entry) {
  const auto it = entry.find("ids");
  if (it == entry.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() ||
      !(*it)[1].is_number_integer())
    return IdRange{};
  return IdRange{(*it)[0].get<int64_t>(), (*it)[1].get<int64_t>(), true};
}

}  // namespace

absl::StatusOr<IdCheck> check_token_ids(const std::vector<std::string>& paths, SourceFormat format,
                                        int64_t limit, const std::string& cache) {
  nlohmann::json known = nlohmann::json::array();
  if (!cache.empty()) {
    const nlohmann::json c = nlohmann::json::parse(cache, nullptr, /*allow_exceptions=*/false);
    if (c.is_object() && c.contains("checked") && c["checked"].is_array()) known = c["checked"];
  }
  IdCheck out;
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& path : paths) {
    absl::StatusOr<std::unique_ptr<TokenSource>> src = TokenSource::open(path, format);
    if (!src.ok()) return src.status();
    const nlohmann::json id = identity((*src)->token_file(), limit);
    const auto seen = std::find_if(known.begin(), known.end(), [&](const nlohmann::json& e) {
      return !id.is_null() && same_file(e, id);
    });
    if (seen != known.end()) {
      ++out.cached;
      out.ranges.push_back(range_of(*seen));
      continue;
    }
    absl::StatusOr<IdRange> range = (*src)->check_ids(limit);
    if (!range.ok()) return range.status();
    ++out.scanned;
    out.bytes_scanned += static_cast<double>((*src)->num_tokens()) *
                         static_cast<double>(token_dtype_size((*src)->dtype()));
    out.ranges.push_back(*range);
    if (id.is_null()) continue;
    nlohmann::json entry = id;
    if (range->known) entry["ids"] = {range->lo, range->hi};
    known.push_back(entry);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.cache_json = nlohmann::json{{"checked", known}}.dump(1) + "\n";
  return out;
}

}  // namespace tr::data
