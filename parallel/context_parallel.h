// Context parallelism's causal load balancing: the sequence is cut into 2 * cp equal chunks and
// CP rank r holds chunks r and 2 cp - 1 - r, so that every rank's queries see the same number of
// keys in all (an early chunk, cheap, with a late one, dear).
#pragma once

#include <cstdint>
#include <vector>

namespace tr {

// How a CP group's attention meets the other ranks' keys and values (parallel.cp_comm;
// parallel/cp_attention.h): all-gathered once, or passed around the ring.
enum class CpExchange { all_gather, ring };

// The global positions of CP rank `rank`'s tokens of a sequence of `seq_len`, in the order the
// rank holds them (its first chunk, then its second). seq_len must divide by 2 * cp.
std::vector<int64_t> cp_positions(int64_t seq_len, int cp, int rank);

}  // namespace tr
