// CPU reference backend: fp32 and fp64 implementations of every op in kernels/ops.h, with the
// same signatures and gradient rules. Callers go through the tr:: entry points in ops.h, which
// check preconditions and dispatch here; these functions trust their arguments' shapes.
#pragma once

#include <cstdint>
#include <string>

#include "core/ctx.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace tr::cpu {

// Every op of kernels/backend_ops.inc.
#define TR_BACKEND_OP(ret, name, params) ret name params;
#include "kernels/backend_ops.inc"
#undef TR_BACKEND_OP

// Calls f(float{}) or f(double{}) for dtype f32 or f64, so a generic lambda can pick the
// template instance: dispatch_float(t.dtype, "op", [&](auto tag) { impl<decltype(tag)>(...); }).
template <class F>
void dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32:
      f(float{});
      return;
    case DType::f64:
      f(double{});
      return;
    default:
      break;
  }
  TR_ASSERT(false,
            std::string(op) + ": the CPU backend runs f32 and f64, not " + dtype_name(dtype));
}

}  // namespace tr::cpu
