// Embedding lookup (vocab-parallel ready): this rank holds rows [vocab_offset, vocab_offset + Vl).
#include <cstring>

#include "kernels/cpu/cpu_ops.h"

namespace tr::cpu {
namespace {

// Row of `table` for token `tok`, or -1 when another rank owns it.
int64_t local_row(int32_t tok, int64_t vocab_offset, int64_t vocab_local) {
  const int64_t row = static_cast<int64_t>(tok) - vocab_offset;
  return (row >= 0 && row < vocab_local) ? row : -1;
}

// out [T,H], tokens i32 [T], table [Vl,H].
template <class T>
void embedding_fwd_impl(Tensor out, Tensor tokens, Tensor table, int64_t vocab_offset) {
  const int64_t n_tok = out.dim(0), hidden = out.dim(1), vocab_local = table.dim(0);
  const int32_t* tok = tokens.ptr<int32_t>();
  const T* tab = table.ptr<T>();
  T* o = out.ptr<T>();
  for (int64_t t = 0; t < n_tok; ++t) {
    const int64_t row = local_row(tok[t], vocab_offset, vocab_local);
    T* dst = o + t * hidden;
    if (row < 0) {
      std::memset(dst, 0, sizeof(T) * hidden);
    } else {
      std::memcpy(dst, tab + row * hidden, sizeof(T) * hidden);
    }
  }
}

// dtable [Vl,H] ACCUMULATES the rows of dout [T,H].
template <class T>
void embedding_bwd_impl(Tensor dtable, Tensor dout, Tensor tokens, int64_t vocab_offset) {
  const int64_t n_tok = dout.dim(0), hidden = dout.dim(1), vocab_local = dtable.dim(0);
  const int32_t* tok = tokens.ptr<int32_t>();
  const T* g = dout.ptr<T>();
  T* dtab = dtable.ptr<T>();
  for (int64_t t = 0; t < n_tok; ++t) {
    const int64_t row = local_row(tok[t], vocab_offset, vocab_local);
    if (row < 0) continue;
    T* dst = dtab + row * hidden;
    const T* src = g + t * hidden;
    for (int64_t h = 0; h < hidden; ++h) dst[h] += src[h];
  }
}

}  // namespace

void embedding_fwd(Ctx&, Tensor out, Tensor tokens, Tensor table, int64_t vocab_offset) {
  dispatch_float(out.dtype, "embedding_fwd", [&](auto tag) {
    embedding_fwd_impl<decltype(tag)>(out, tokens, table, vocab_offset);
  });
}

void embedding_bwd(Ctx&, Tensor dtable, Tensor dout, Tensor tokens, int64_t vocab_offset) {
  dispatch_float(dtable.dtype, "embedding_bwd", [&](auto tag) {
    embedding_bwd_impl<decltype(tag)>(dtable, dout, tokens, vocab_offset);
  });
}

}  // namespace tr::cpu
