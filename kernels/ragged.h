// Block-causal attention as ragged batches (cuDNN's packed layout): the documents of a call split
// into launches, and the table each launch reads, computed on the host. The CUDA backend builds
// the table on the device (kernels/cuda/attention_docs.h); ragged_table() is its oracle.
#pragma once

#include <cstdint>
#include <vector>

#include "core/check.h"

namespace tr {

// Calls f(first_row, rows) for each document of `rows` starts (each row's document's first
// position in its sequence), a sequence beginning every `period` rows: the runs of equal starts
// within each sequence, in order. The one host reading of document starts.
template <class F>
void for_each_document(const int32_t* start, int64_t rows, int64_t period, F&& f) {
  TR_ASSERT(period > 0 && rows % period == 0, "documents: whole sequences of rows");
  int64_t first = 0;
  for (int64_t r = 1; r <= rows; ++r) {
    if (r == rows || r % period == 0 || start[r] != start[r - 1]) {
      f(first, r - first);
      first = r;
    }
  }
}

// The documents of a call in parts of a power-of-two count, largest first (13 = 8 + 4 + 1): each
// part one launch over exactly its documents, so that no entry is ever empty (cuDNN before 9.25
// mishandles empty entries) while the graphs a run builds stay few (one per count and length
// bucket). Part p reads the table from slot `slot` on: `count` lengths and count + 1 offsets;
// slots are multiples of 4, so each part's lengths and offsets start 16-byte aligned. `longest`:
// the rows of the part's longest document.
struct RaggedPart {
  int64_t first = 0, count = 0, slot = 0, longest = 0;
};
struct RaggedParts {
  static constexpr int kMax = 48;  // parts of up to 2^47 documents
  int n = 0;
  int64_t documents = 0;
  int64_t slots = 0;  // the table's length: offsets take slots + 1
  RaggedPart part[kMax];
};
// The parts of the documents of `rows` starts (each row's document's first position in its
// sequence), a sequence beginning every `period` rows: the runs of equal starts within each
// sequence, as count_documents() counts them.
RaggedParts ragged_parts(const int32_t* start, int64_t rows, int64_t period);
// A bound on the table's slots for the documents of `rows` rows (a buffer's size, before the
// documents are known).
int64_t ragged_slots_bound(int64_t rows);

// The table on the host: `len` [slots] each entry's rows (its queries, and its keys), `row`
// [slots + 1] the row each entry starts at, and after a part's last entry the row it ends at
// (element offsets are these rows times a tensor's row width). Slots no part uses hold -1.
struct RaggedTableRows {
  std::vector<int32_t> len;
  std::vector<int64_t> row;
};
RaggedTableRows ragged_table(const RaggedParts& parts, const int32_t* start, int64_t rows,
                             int64_t period);

}  // namespace tr
