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
    if (!id.is_null() && std::find(known.begin(), known.end(), id) != known.end()) {
      ++out.cached;
      continue;
    }
    if (absl::Status st = (*src)->check_ids(limit); !st.ok()) return st;
    ++out.scanned;
    out.bytes_scanned += static_cast<double>((*src)->num_tokens()) *
                         static_cast<double>(token_dtype_size((*src)->dtype()));
    if (!id.is_null()) known.push_back(id);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.cache_json = nlohmann::json{{"checked", known}}.dump(1) + "\n";
  return out;
}

}  // namespace tr::data
