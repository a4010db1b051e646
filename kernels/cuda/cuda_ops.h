// CUDA backend: the ops of kernels/ops.h on the GPU, f32 and bf16 (activations and weights
// in bf16, parameter gradients and optimizer state in f32). Callers go through the tr:: entry
// points in ops.h, which check preconditions and dispatch here. Each launcher runs on
// ctx.stream, checks the launch and never synchronises the device (sum_squares waits for its
// own stream: its result goes to the host).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/core/ctx.h"
#include "kernels/core/tensor.h"
#include "kernels/ops.h"
#include "kernels/versions.h"

namespace tr::cuda {

// True when a CUDA device can run kernels here (a driver and at least one GPU).
bool device_available();
int device_count();

// One process's GPU: selects device `index`, creates the compute stream (the handles of
// cuBLASLt and cuDNN are made once, on first use) and the ops' workspace. ctx() hands ops all
// three.
class DeviceContext {
 public:
  DeviceContext(int index, size_t workspace_bytes);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;
  Ctx ctx() const;
  int index() const { return index_; }
  size_t workspace_bytes() const { return workspace_.bytes(); }
  // Waits for everything queued on the stream.
  void synchronize() const;

 private:
  int index_;
  void* stream_ = nullptr;  // cudaStream_t
  Buffer workspace_;
};
// Name of device `index` ("NVIDIA H100 80GB HBM3"), or "" when there is none.
std::string device_name(int index);
// Its PCI bus id ("0000:3B:00.0"): the same physical GPU has the same id in every process,
// whatever CUDA_VISIBLE_DEVICES renumbered.
std::string device_pci_bus_id(int index);
// The current device: name, dense bf16 peak from a table of known GPUs (0 if unknown), memory
// in use.
DeviceInfo device_info();
// The CUDA runtime, driver, cuBLASLt and cuDNN versions loaded (nccl left 0; parallel/ fills it).
LibraryVersions library_versions();
void synchronize(const Ctx& ctx);

void embedding_fwd(Ctx& ctx, Tensor out, Tensor tokens, Tensor table, int64_t vocab_offset);
void embedding_bwd(Ctx& ctx, Tensor dtable, Tensor dout, Tensor tokens, int64_t vocab_offset);

void rmsnorm_fwd(Ctx& ctx, Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps);
void rmsnorm_bwd(Ctx& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight,
                 Tensor rstd, bool accumulate_din, bool assign_dweight);
void add_rmsnorm_fwd(Ctx& ctx, Tensor sum, Tensor out, Tensor rstd, Tensor a, Tensor b,
                     Tensor weight, float eps);

void linear_fwd(Ctx& ctx, Tensor out, Tensor in, Tensor weight, Tensor bias);
void linear_bwd(Ctx& ctx, Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in,
                Tensor weight, bool assign_dweight);

// bf16 only (cuDNN fused attention).
AttentionPlan attention_prepare(Ctx& ctx, int batch, int seq_len, int n_heads, int n_kv_heads,
                                int head_dim);
// Whether the backward graph attention_bwd runs for this shape and ctx.deterministic is cuDNN's
// deterministic one (it may have fallen back to the other mode); builds it if needed.
bool attention_bwd_deterministic(Ctx& ctx, int batch, int seq_len, int n_heads, int n_kv_heads,
                                 int head_dim);
void attention_fwd(Ctx& ctx, Tensor out, Tensor lse, Tensor qkv, int batch, int seq_len,
                   int n_heads, int n_kv_heads, int head_dim);
void attention_bwd(Ctx& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv,
                   int batch, int seq_len, int n_heads, int n_kv_heads, int head_dim);

void rope_fwd(Ctx& ctx, Tensor x, int n_rope_heads, int seq_len, float theta);
void rope_bwd(Ctx& ctx, Tensor dx, int n_rope_heads, int seq_len, float theta);

void swiglu_fwd(Ctx& ctx, Tensor out, Tensor gateup);
void swiglu_bwd(Ctx& ctx, Tensor dgateup, Tensor dout, Tensor gateup);

void cross_entropy_fwd_bwd(Ctx& ctx, Tensor losses, Tensor logits, Tensor targets,
                           int64_t vocab_valid, float grad_scale, bool compute_grad);
void xent_row_max(Ctx& ctx, Tensor row_max, Tensor logits, int64_t vocab_valid);
void xent_sums(Ctx& ctx, Tensor sums, Tensor logits, Tensor targets, Tensor row_max,
               int64_t vocab_offset, int64_t vocab_valid);
void xent_shard_stats(Ctx& ctx, Tensor stats, Tensor logits, Tensor targets, int64_t vocab_offset,
                      int64_t vocab_valid);
void xent_combine(Ctx& ctx, Tensor row_max, Tensor sums, Tensor all_stats);
void xent_loss_grad(Ctx& ctx, Tensor losses, Tensor logits, Tensor targets, Tensor row_max,
                    Tensor sums, int64_t vocab_offset, int64_t vocab_valid, float grad_scale,
                    bool compute_grad);

void add(Ctx& ctx, Tensor out, Tensor a, Tensor b);
void scale_(Ctx& ctx, Tensor x, float s);
void zero_(Ctx& ctx, Tensor x);
double sum_squares(Ctx& ctx, Tensor x);
void accumulate_sum(Ctx& ctx, Tensor acc, Tensor x, bool squares);
void accumulate_sum_squares_pieces(Ctx& ctx, Tensor acc, Tensor x, Tensor pieces, int64_t base);
void upload_async(Ctx& ctx, Tensor dst, Tensor src);
void read_f64(Ctx& ctx, Tensor src, double* out);
void cast(Ctx& ctx, Tensor out, Tensor in);

void adamw_update_pieces(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v,
                         Tensor compute_copy, Tensor pieces, AdamWIndex index, const AdamWParams& p,
                         float grad_scale);
void adamw_update(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p,
                  Tensor compute_copy);

}  // namespace tr::cuda
