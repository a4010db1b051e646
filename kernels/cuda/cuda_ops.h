// CUDA backend: the ops of kernels/ops.h on the GPU, f32 and bf16 (activations and weights
// in bf16, parameter gradients and optimizer state in f32). Callers go through the tr:: entry
// points in ops.h, which check preconditions and dispatch here. Each launcher runs on
// ctx.stream, checks the launch and never synchronises the device (sum_squares waits for its
// own stream: its result goes to the host).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ctx.h"
#include "core/tensor.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "kernels/versions.h"

namespace tr::cuda {

// The device, its context and timeline: kernels/device.h.

// The current device: name, dense bf16 peak from a table of known GPUs (0 if unknown), memory
// in use.
DeviceInfo device_info();
void synchronize(const Ctx& ctx);

// Every op of kernels/backend_ops.inc, and the CUDA-only ones below.
#define TR_BACKEND_OP(ret, name, params) ret name params;
#include "kernels/backend_ops.inc"
#undef TR_BACKEND_OP

// bf16 only (cuDNN fused attention).
AttentionPlan attention_prepare(Ctx& ctx, int batch, int seq_len, int n_heads, int n_kv_heads,
                                int head_dim, int cp_chunk, bool documents);
// Whether the backward graph attention_bwd runs for this shape and ctx.deterministic is cuDNN's
// deterministic one (it may have fallen back to the other mode); builds it if needed.
bool attention_bwd_deterministic(Ctx& ctx, int batch, int seq_len, int n_heads, int n_kv_heads,
                                 int head_dim);
// linear_fwd and linear_bwd without a bias over a row count that changes from call to call (a
// grouped linear's groups): their GEMMs are planned for the count's bucket (gemm.h), so that a
// run's cuBLASLt plans stay few whatever its routing.
void linear_fwd_varying_rows(Ctx& ctx, Tensor out, Tensor in, Tensor weight);
void linear_bwd_varying_rows(Ctx& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in,
                             Tensor weight, bool assign_dweight);
void upload_async(Ctx& ctx, Tensor dst, Tensor src);
void read_f64(Ctx& ctx, Tensor src, double* out);

}  // namespace tr::cuda
