#include "parallel/context_parallel.h"

#include <string>

#include "core/check.h"

namespace tr {

std::vector<int64_t> cp_positions(int64_t seq_len, int cp, int rank) {
  TR_ASSERT(cp > 0 && rank >= 0 && rank < cp && seq_len % (2 * cp) == 0,
            "cp_positions: seq_len " + std::to_string(seq_len) +
                " must divide by 2 * cp = " + std::to_string(2 * cp) + ", rank " +
                std::to_string(rank) + " of " + std::to_string(cp));
  const int64_t chunk = seq_len / (2 * cp);
  std::vector<int64_t> pos;
  pos.reserve(static_cast<size_t>(2 * chunk));
  for (int64_t c : {int64_t{rank}, int64_t{2 * cp - 1 - rank}})
    for (int64_t i = 0; i < chunk; ++i) pos.push_back(c * chunk + i);
  return pos;
}

}  // namespace tr
