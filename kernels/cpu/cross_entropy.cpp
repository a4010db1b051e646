// Cross-entropy on one chunk of logits, optionally writing the gradient over the logits.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/cpu/cpu_ops.h"

namespace tr::cpu {
namespace {

// logits [C,Vl] (columns >= vocab_valid are padding), targets i32 [C], losses [C] ASSIGNED.
// With compute_grad, logits are overwritten by grad_scale * (softmax - onehot), 0 on padding.
// A negative target is ignored: loss 0 and a gradient row of 0.
template <class T>
void cross_entropy_impl(Tensor losses, Tensor logits, Tensor targets, int64_t vocab_valid,
                        float grad_scale, bool compute_grad) {
  const int64_t rows = logits.dim(0), vocab_local = logits.dim(1);
  const int32_t* tgt = targets.ptr<int32_t>();
  T* loss = losses.ptr<T>();
  for (int64_t r = 0; r < rows; ++r) {
    T* x = logits.ptr<T>() + r * vocab_local;
    const int64_t target = tgt[r];
    if (target < 0) {
      loss[r] = T(0);
      if (compute_grad) std::fill(x, x + vocab_local, T(0));
      continue;
    }
    TR_ASSERT(target < vocab_valid, "cross_entropy: target " + std::to_string(target) + " of row " +
                                        std::to_string(r) + " is outside [0, " +
                                        std::to_string(vocab_valid) + ")");
    double max = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < vocab_valid; ++j) max = std::max(max, static_cast<double>(x[j]));
    double sum = 0.0;
    for (int64_t j = 0; j < vocab_valid; ++j) sum += std::exp(x[j] - max);
    const double lse = max + std::log(sum);
    loss[r] = static_cast<T>(lse - x[target]);
    if (!compute_grad) continue;
    for (int64_t j = 0; j < vocab_valid; ++j)
      x[j] = static_cast<T>(grad_scale * (std::exp(x[j] - lse) - (j == target ? 1.0 : 0.0)));
    for (int64_t j = vocab_valid; j < vocab_local; ++j) x[j] = T(0);
  }
}

// Vocab-parallel steps (see ops.h); row r's shard columns are vocabulary ids offset + j.
template <class T>
void row_max_impl(Tensor row_max, Tensor logits, int64_t valid) {
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = logits.ptr<T>() + r * cols;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < valid; ++j) m = std::max(m, static_cast<double>(x[j]));
    row_max.ptr<T>()[r] = static_cast<T>(m);
  }
}

template <class T>
void sums_impl(Tensor sums, Tensor logits, Tensor targets, Tensor row_max, int64_t offset,
               int64_t valid) {
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = logits.ptr<T>() + r * cols;
    const double m = row_max.ptr<T>()[r];
    double sum = 0.0;
    for (int64_t j = 0; j < valid; ++j) sum += std::exp(x[j] - m);
    const int64_t local = targets.ptr<int32_t>()[r] - offset;
    sums.ptr<T>()[2 * r] = static_cast<T>(sum);
    sums.ptr<T>()[2 * r + 1] = local >= 0 && local < valid ? x[local] : T(0);
  }
}

// One pass per row: the running max and the sum of exponentials relative to it (online softmax).
template <class T>
void shard_stats_impl(Tensor stats, Tensor logits, Tensor targets, int64_t offset, int64_t valid) {
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = logits.ptr<T>() + r * cols;
    double m = -std::numeric_limits<double>::infinity(), s = 0.0;
    for (int64_t j = 0; j < valid; ++j) {
      const double v = x[j];
      if (v > m) {
        s *= std::exp(m - v);  // 0 while m is -inf: s is 0 then
        m = v;
      }
      s += std::exp(v - m);
    }
    const int64_t local = targets.ptr<int32_t>()[r] - offset;
    T* out = stats.ptr<T>() + 3 * r;
    out[0] = static_cast<T>(m);
    out[1] = static_cast<T>(s);
    out[2] = local >= 0 && local < valid ? x[local] : T(0);
  }
}

template <class T>
void combine_impl(Tensor row_max, Tensor sums, Tensor all_stats) {
  const int64_t ranks = all_stats.dim(0), rows = all_stats.dim(1);
  const T* st = all_stats.ptr<T>();
  for (int64_t r = 0; r < rows; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t k = 0; k < ranks; ++k)
      m = std::max(m, static_cast<double>(st[(k * rows + r) * 3]));
    double s = 0.0, target = 0.0;
    for (int64_t k = 0; k < ranks; ++k) {
      const T* one = st + (k * rows + r) * 3;
      if (one[1] > 0) s += one[1] * std::exp(one[0] - m);
      target += one[2];
    }
    row_max.ptr<T>()[r] = static_cast<T>(m);
    sums.ptr<T>()[2 * r] = static_cast<T>(s);
    sums.ptr<T>()[2 * r + 1] = static_cast<T>(target);
  }
}

template <class T>
void loss_grad_impl(Tensor losses, Tensor logits, Tensor targets, Tensor row_max, Tensor sums,
                    int64_t offset, int64_t valid, float grad_scale, bool compute_grad) {
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    T* x = logits.ptr<T>() + r * cols;
    if (targets.ptr<int32_t>()[r] < 0) {  // ignored
      losses.ptr<T>()[r] = T(0);
      if (compute_grad) std::fill(x, x + cols, T(0));
      continue;
    }
    const double lse = static_cast<double>(row_max.ptr<T>()[r]) +
                       std::log(static_cast<double>(sums.ptr<T>()[2 * r]));
    losses.ptr<T>()[r] = static_cast<T>(lse - static_cast<double>(sums.ptr<T>()[2 * r + 1]));
    if (!compute_grad) continue;
    const int64_t local = targets.ptr<int32_t>()[r] - offset;
    for (int64_t j = 0; j < valid; ++j)
      x[j] = static_cast<T>(grad_scale * (std::exp(x[j] - lse) - (j == local ? 1.0 : 0.0)));
    for (int64_t j = valid; j < cols; ++j) x[j] = T(0);
  }
}

}  // namespace

void xent_row_max(Ctx&, Tensor row_max, Tensor logits, int64_t vocab_valid) {
  dispatch_float(logits.dtype, "xent_row_max",
                 [&](auto tag) { row_max_impl<decltype(tag)>(row_max, logits, vocab_valid); });
}

void xent_sums(Ctx&, Tensor sums, Tensor logits, Tensor targets, Tensor row_max,
               int64_t vocab_offset, int64_t vocab_valid) {
  dispatch_float(logits.dtype, "xent_sums", [&](auto tag) {
    sums_impl<decltype(tag)>(sums, logits, targets, row_max, vocab_offset, vocab_valid);
  });
}

void xent_shard_stats(Ctx&, Tensor stats, Tensor logits, Tensor targets, int64_t vocab_offset,
                      int64_t vocab_valid) {
  dispatch_float(logits.dtype, "xent_shard_stats", [&](auto tag) {
    shard_stats_impl<decltype(tag)>(stats, logits, targets, vocab_offset, vocab_valid);
  });
}

void xent_combine(Ctx&, Tensor row_max, Tensor sums, Tensor all_stats) {
  dispatch_float(row_max.dtype, "xent_combine",
                 [&](auto tag) { combine_impl<decltype(tag)>(row_max, sums, all_stats); });
}

void xent_loss_grad(Ctx&, Tensor losses, Tensor logits, Tensor targets, Tensor row_max, Tensor sums,
                    int64_t vocab_offset, int64_t vocab_valid, float grad_scale,
                    bool compute_grad) {
  dispatch_float(logits.dtype, "xent_loss_grad", [&](auto tag) {
    loss_grad_impl<decltype(tag)>(losses, logits, targets, row_max, sums, vocab_offset, vocab_valid,
                                  grad_scale, compute_grad);
  });
}

void cross_entropy_fwd_bwd(Ctx&, Tensor losses, Tensor logits, Tensor targets, int64_t vocab_valid,
                           float grad_scale, bool compute_grad) {
  dispatch_float(logits.dtype, "cross_entropy_fwd_bwd", [&](auto tag) {
    cross_entropy_impl<decltype(tag)>(losses, logits, targets, vocab_valid, grad_scale,
                                      compute_grad);
  });
}

}  // namespace tr::cpu
