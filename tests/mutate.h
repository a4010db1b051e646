// Seeded mutations of files from other tools, for the fuzz tests of their readers: bytes
// (flipped, inserted, deleted, cut short) and JSON structure (a value replaced by one of another
// type or an extreme, a key dropped or added, an array emptied).
#pragma once

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tr::test {

// One byte-level mutation of `bytes` within [from, to) (to = 0: the end).
inline std::string mutate_bytes(std::string bytes, std::mt19937& rng, size_t from = 0,
                                size_t to = 0) {
  if (to == 0 || to > bytes.size()) to = bytes.size();
  if (from >= to) return bytes;
  const size_t at = from + rng() % (to - from);
  switch (rng() % 5) {
    case 0:  // one bit
      bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8)));
      break;
    case 1:  // one byte, any value
      bytes[at] = static_cast<char>(rng() % 256);
      break;
    case 2:
      bytes.insert(at, 1, static_cast<char>(rng() % 256));
      break;
    case 3:
      bytes.erase(at, 1 + rng() % 8);
      break;
    default:  // cut short
      bytes.resize(at);
  }
  return bytes;
}

// A JSON value of a random type, often one a reader does not expect there.
inline nlohmann::json odd_value(std::mt19937& rng) {
  switch (rng() % 10) {
    case 0:
      return nullptr;
    case 1:
      return rng() % 2 == 0;
    case 2:
      return -static_cast<int64_t>(rng() % 1000);
    case 3:
      return int64_t{1} << (31 + rng() % 32);
    case 4:
      return std::numeric_limits<uint64_t>::max();
    case 5:
      return 1e308 * (rng() % 2 ? 1 : -1);
    case 6:
      return std::to_string(rng() % 300);
    case 7:
      return nlohmann::json::array({rng() % 5, "x"});
    case 8:
      return nlohmann::json::object({{"type", "yarn"}, {"factor", 0}});
    default:
      return static_cast<int64_t>(rng() % 300);
  }
}

// The paths of every value in `j` (objects' keys and arrays' indices), as JSON pointers.
inline void value_paths(const nlohmann::json& j, const nlohmann::json::json_pointer& at,
                        std::vector<nlohmann::json::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it) value_paths(it.value(), at / it.key(), out);
  else if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i) value_paths(j[i], at / i, out);
}

// One structural mutation of `j`: a value replaced, a key removed, a key added, or a container
// emptied, at a path picked at random.
inline nlohmann::json mutate_json(nlohmann::json j, std::mt19937& rng) {
  std::vector<nlohmann::json::json_pointer> paths;
  value_paths(j, nlohmann::json::json_pointer(), paths);
  const nlohmann::json::json_pointer at = paths[rng() % paths.size()];
  nlohmann::json& v = j[at];
  switch (rng() % 4) {
    case 0:
      if (!at.empty()) {
        nlohmann::json& parent = j[at.parent_pointer()];
        if (parent.is_object()) {
          parent.erase(at.back());
          break;
        }
      }
      [[fallthrough]];
    case 1:
      v = odd_value(rng);
      break;
    case 2:
      if (v.is_object()) {
        v["extra_" + std::to_string(rng() % 100)] = odd_value(rng);
        break;
      }
      [[fallthrough]];
    default:
      if (v.is_object() || v.is_array())
        v.clear();
      else
        v = odd_value(rng);
  }
  return j;
}

}  // namespace tr::test
