#include "kernels/ragged.h"

#include <algorithm>

#include "core/check.h"

namespace tr {
namespace {

int64_t aligned_slot(int64_t slot) {
  return (slot + 3) / 4 * 4;
}

}  // namespace

int64_t ragged_slots_bound(int64_t rows) {
  return rows + 4 * RaggedParts::kMax;  // each part adds its end offset and an alignment gap
}

RaggedParts ragged_parts(const int32_t* start, int64_t rows, int64_t period) {
  RaggedParts p;
  if (rows == 0) return p;
  for_each_document(start, rows, period, [&](int64_t, int64_t) { ++p.documents; });
  int64_t first = 0;
  for (int bit = 62; bit >= 0; --bit) {
    const int64_t count = int64_t{1} << bit;
    if ((p.documents & count) == 0) continue;
    TR_ASSERT(p.n < RaggedParts::kMax, "ragged: too many documents");
    p.part[p.n++] = {first, count, p.slots, 0};
    first += count;
    p.slots = aligned_slot(p.slots + count + 1);
  }
  int64_t d = 0;
  int at = 0;  // the part of document d
  for_each_document(start, rows, period, [&](int64_t, int64_t len) {
    while (d >= p.part[at].first + p.part[at].count) ++at;
    p.part[at].longest = std::max(p.part[at].longest, len);
    ++d;
  });
  return p;
}

RaggedTableRows ragged_table(const RaggedParts& parts, const int32_t* start, int64_t rows,
                             int64_t period) {
  RaggedTableRows t{std::vector<int32_t>(parts.slots, -1),
                    std::vector<int64_t>(parts.slots + 1, -1)};
  int64_t d = 0;
  int at = 0;
  for_each_document(start, rows, period, [&](int64_t first, int64_t len) {
    while (d >= parts.part[at].first + parts.part[at].count) ++at;
    const RaggedPart& p = parts.part[at];
    const int64_t slot = p.slot + d - p.first;
    t.len[slot] = static_cast<int32_t>(len);
    t.row[slot] = first;
    t.row[slot + 1] = first + len;  // the next entry's start, or the part's end
    ++d;
  });
  return t;
}

}  // namespace tr
