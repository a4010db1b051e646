// Deterministic parameter initialisation: every value is a pure function of
// (seed, tensor name, element index), so any rank layout produces the same global weights.
#pragma once

#include <cstdint>
#include <string>

#include <vector>

#include "core/tensor.h"
#include "trainer/model/model_layout.h"

namespace tr {

enum class InitKind { zeros, ones, normal };

// Fills the first `count` elements of t (host, f32 or f64) and zeroes the rest (e.g. the
// rows of a padded vocabulary). `first_index` is the global index of t's element 0.
void fill_init(Tensor t, InitKind kind, double std, uint64_t seed, const std::string& name,
               int64_t count, int64_t first_index = 0);

// A rank's initial weights, [layout.total] on the host: Normal(0, std) matrices and embedding
// (output projections std / sqrt(2 L)), zero biases, unit norms; each value a pure function of
// (seed, tensor name, element index in the whole tensor), so every layout initialises the same
// global weights (vocabulary padding rows are zero).
std::vector<float> initial_weights(const ParamLayout& layout, const ModelDims& dims, uint64_t seed,
                                   double std);

// Standard normal sample number `index` of stream `stream` (Box-Muller on two hashed uniforms).
double normal_at(uint64_t stream, uint64_t index);

}  // namespace tr
