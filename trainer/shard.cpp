#include "trainer/shard.h"

#include <algorithm>
#include <cstring>

namespace tr {
namespace {

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// Rows and columns of a tensor seen as a matrix (a vector is one row).
struct Mat {
  int64_t rows, cols;
};
Mat mat(const std::vector<int64_t>& shape) {
  return shape.size() == 2 ? Mat{shape[0], shape[1]} : Mat{1, product(shape)};
}

// Copies block `r` of a TP-split tensor between its local layout (`local`, shape p.shape) and
// the global one (`global`, shape p.global_shape); `to_global` picks the direction. Rows past
// the global row count (vocabulary padding) are skipped, or zeroed when copying to local.
void copy_block(const ParamInfo& p, int r, float* local, float* global, bool to_global) {
  const Mat l = mat(p.shape), g = mat(p.global_shape);
  const bool rows_split = p.split_dim == 0 && p.shape.size() == 2;
  const bool vec_split = p.split_dim == 0 && p.shape.size() == 1;
  for (int64_t i = 0; i < l.rows; ++i) {
    const int64_t gi = rows_split ? i + r * l.rows : i;
    const int64_t gj = p.split_dim == 1 ? r * l.cols : vec_split ? r * l.cols : 0;
    float* lp = local + i * l.cols;
    if (gi >= g.rows) {
      if (!to_global) std::fill(lp, lp + l.cols, 0.0f);
      continue;
    }
    float* gp = global + gi * g.cols + gj;
    if (to_global)
      std::memcpy(gp, lp, sizeof(float) * l.cols);
    else
      std::memcpy(lp, gp, sizeof(float) * l.cols);
  }
}

}  // namespace

GlobalTensors::GlobalTensors(const ParamLayout& layout) {
  int64_t total = 0;
  for (const ParamInfo& p : layout.tensors) total += product(p.global_shape);
  data.assign(static_cast<size_t>(total), 0.0f);
  int64_t at = 0;
  for (const ParamInfo& p : layout.tensors) {
    refs.push_back({p.name, p.global_shape, data.data() + at});
    at += product(p.global_shape);
  }
}

void gather_global(const ParamLayout& layout, Comm& tp, const float* local, GlobalTensors& out) {
  std::vector<float> blocks;
  for (size_t k = 0; k < layout.tensors.size(); ++k) {
    const ParamInfo& p = layout.tensors[k];
    float* global = out.refs[k].data;
    float* mine = const_cast<float*>(local) + p.offset;
    if (p.split_dim < 0) {  // replicated: every rank holds the whole tensor
      copy_block(p, 0, mine, global, true);
      continue;
    }
    blocks.resize(static_cast<size_t>(p.numel * tp.size()));
    Tensor all(blocks.data(), DType::f32, Device::cpu, {p.numel * tp.size()});
    tp.all_gather(all, Tensor(mine, DType::f32, Device::cpu, {p.numel}));
    for (int r = 0; r < tp.size(); ++r) copy_block(p, r, blocks.data() + r * p.numel, global, true);
  }
}

void scatter_global(const ParamLayout& layout, const GlobalTensors& in, float* local) {
  for (size_t k = 0; k < layout.tensors.size(); ++k) {
    const ParamInfo& p = layout.tensors[k];
    const int r = p.split_dim < 0 ? 0 : static_cast<int>(p.split_offset / p.shape[p.split_dim]);
    copy_block(p, r, local + p.offset, in.refs[k].data, false);
  }
}

}  // namespace tr
