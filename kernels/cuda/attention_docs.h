// Block-causal attention on cuDNN (attention.cpp): packed documents become a ragged batch, each
// document an entry of its own (Transformer Engine's THD layout): cuDNN reads entry d's rows
// from element offsets of the packed tensors and masks past each entry's length, so a document
// attends only to itself and no work is spent across documents. These kernels build the entries
// on the device from the rows' document starts (no host sync), move the softmax statistics
// between cuDNN's row-major layout and ours, and fill the rows a block leaves untouched.
#pragma once

#include <cstdint>

#include "core/ctx.h"
#include "core/tensor.h"
#include "kernels/ragged.h"

namespace tr::cuda {

// A ragged batch's table as cuDNN binds it: lengths i32 and element offsets i64 of each entry's
// first row in q (and dq), k and v (and their gradients), out (and dout) and the row-major
// statistics, each entry at its slot (kernels/ragged.h RaggedParts).
struct RaggedTable {
  int32_t* len_q = nullptr;
  int32_t* len_kv = nullptr;
  int64_t* off_q = nullptr;
  int64_t* off_kv = nullptr;
  int64_t* off_o = nullptr;
  int64_t* off_stats = nullptr;
};
// Elements per row of each tensor: the packed qkv rows' width (q and kv), or a block's nh hd and
// nkv hd; out's nh hd; the statistics' nh.
struct RaggedRows {
  int64_t q, kv, o, stats;
};

// The table of every part (kernels/ragged.h: ragged_parts, whose host starts are these device
// starts' copy), built on the device: an entry per document, causal over its own rows. A device
// count of documents or a length other than the host's traps rather than let cuDNN read past an
// entry. `scratch`: parts.documents + 1 i64 (each document's first row, then `rows`).
void ragged_documents(Ctx& ctx, const RaggedTable& table, const RaggedParts& parts,
                      int64_t* scratch, const int32_t* start, int64_t rows, int64_t period,
                      RaggedRows w);
// One entry for a block whose `kv_rows` keys all lie before its `rows` queries (context
// parallelism), the key block starting at position k_first: only the first query document can
// reach back into it, so the entry is that document's rows over the keys from its start on
// (the caller skips a block whose first document starts after it: no key is visible).
void ragged_prefix(Ctx& ctx, const RaggedTable& table, const int32_t* start, int64_t rows,
                   int64_t kv_rows, int64_t k_first, RaggedRows w);
// Statistics between ours, lse [batch, nh, seq], and cuDNN's row-major rows [batch * seq, nh]:
// into lse (`to_lse`) or from it.
void stats_layout(Ctx& ctx, float* lse, float* rows, int64_t batch, int64_t seq, int64_t nh,
                  bool to_lse);
// ragged_prefix's block after cuDNN ran it: the query rows that see no key get out 0 and lse
// -inf (forward); dq 0 for them and dk, dv 0 for the keys before the first query's document
// (backward). out, dq [rows, nh, hd], lse [nh, rows] f32, dk, dv [kv_rows, nkv, hd]; bf16.
void hidden_rows_fwd(Ctx& ctx, Tensor out, Tensor lse, const int32_t* start, int64_t k_first,
                     int64_t kv_rows);
void hidden_rows_bwd(Ctx& ctx, Tensor dq, Tensor dk, Tensor dv, const int32_t* start,
                     int64_t k_first);

}  // namespace tr::cuda
