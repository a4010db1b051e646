#include "trainer/plan/step_model.h"

#include <algorithm>

#include "trainer/model/model_layout.h"

namespace tr {

double gemm_shape_efficiency(double m, double n, double k) {
  auto fill = [](double d) { return d / (d + 256.0); };
  const double full = fill(8192) * fill(8192) * fill(8192);
  return std::min(1.0, fill(m) * fill(n) * fill(k) / full);
}

double attention_fraction(int64_t head_dim, bool backward) {
  const double at64 = backward ? 0.27 : 0.38, at128 = backward ? 0.45 : 0.60;
  const double x = std::clamp((static_cast<double>(head_dim) - 64.0) / 64.0, 0.0, 1.0);
  return at64 + x * (at128 - at64);
}

namespace {

constexpr double kBf16 = 2.0;  // bytes per activation element

// Seconds of one M x N x K product's forward, input gradient and weight gradient. The weight
// gradient accumulates into the fp32 gradient (beta 1): each micro-batch reads and writes its
// N x K floats besides the product.
struct Gemm {
  double m, n, k;
};
double gemm_fwd_s(const Gemm& g, double rate) {
  return 2 * g.m * g.n * g.k / (rate * gemm_shape_efficiency(g.m, g.n, g.k));
}
double gemm_bwd_s(const Gemm& g, double rate, double stream) {
  const double flops = 2 * g.m * g.n * g.k;
  return flops / (rate * gemm_shape_efficiency(g.m, g.k, g.n)) +  // dX = dY W
         flops / (rate * gemm_shape_efficiency(g.n, g.k, g.m)) +  // dW = dY^T X
         8 * g.n * g.k / stream;                                  // dW += (fp32)
}

}  // namespace

std::vector<StageCompute> stage_compute(const Config& cfg, const RunLayout& layout,
                                        const GpuSpec& gpu,
                                        const std::vector<double>& params_on_rank) {
  const Topology& topo = layout.topo;
  const double gemm_rate = gpu.gemm_flops, stream = gpu.copy_bw * kStreamFraction;
  const double m = static_cast<double>(layout.micro_batches);
  const double seq = static_cast<double>(cfg.data.seq_len);
  const double T = static_cast<double>(cfg.train.micro_batch) * seq / topo.cp;  // tokens here
  // Outside the tensor-parallel regions (norms, residual stream) a rank holds T / tp tokens
  // under sequence parallelism.
  const double Ts = layout.sequence_parallel ? T / topo.tp : T;
  const double passes = static_cast<double>(layout.recompute_passes());
  std::vector<StageCompute> out;
  for (int stage = 0; stage < topo.pp; ++stage) {
    const ModelDims d = ModelDims::from(cfg, layout.of_rank(topo.rank_at(0, 0, stage)).topo);
    const double H = static_cast<double>(d.hidden), I = static_cast<double>(d.inter);
    const double A = static_cast<double>(d.heads * d.head_dim);
    const double R = static_cast<double>((d.heads + d.kv_heads) * d.head_dim);  // RoPE's heads
    const double L = static_cast<double>(d.layers);
    const double full = static_cast<double>(std::min(d.recompute_full, d.layers));
    StageCompute c;
    c.stage = stage;
    c.layers = d.layers;
    // Per layer and micro-batch: the four projections (gate and up as one), attention, and the
    // memory-bound passes (RMSNorm twice, two residual adds, RoPE, SwiGLU; forward and
    // backward elements read plus written).
    const Gemm gemms[] = {
        {T, static_cast<double>(d.qkv_out()), H}, {T, H, A}, {T, 2 * I, H}, {T, H, I}};
    double gemm_fwd = 0, gemm_bwd = 0, flop_fwd = 0;
    for (const Gemm& g : gemms) {
      flop_fwd += 2 * g.m * g.n * g.k;
      gemm_fwd += gemm_fwd_s(g, gemm_rate);
      gemm_bwd += gemm_bwd_s(g, gemm_rate, stream);
    }
    const double peak = gpu.peak_bf16_flops;
    const double attn_fwd = 2 * T * seq * A / (peak * attention_fraction(d.head_dim, false));
    const double attn_bwd = 4 * T * seq * A / (peak * attention_fraction(d.head_dim, true));
    const double bytes_fwd = (10 * H * Ts + 2 * R * T + 3 * I * T) * kBf16;
    const double bytes_bwd = (12 * H * Ts + 2 * R * T + 5 * I * T) * kBf16;
    const double selective = d.recompute_selective ? (4 * H * Ts + 3 * I * T) * kBf16 * passes : 0;
    c.gemm_flop = m * flop_fwd * (3 * L + full * passes);
    c.gemm_s = m * (L * (gemm_fwd + gemm_bwd) + full * passes * gemm_fwd);
    c.attention_s = m * (L * (attn_fwd + attn_bwd) + full * passes * attn_fwd);
    c.memory_bytes = m * (L * (bytes_fwd + bytes_bwd + selective) + full * passes * bytes_fwd);
    c.memory_s = c.memory_bytes / stream;
    c.forward_s = m * L * (gemm_fwd + attn_fwd + bytes_fwd / stream);
    c.layers_s = c.gemm_s + c.attention_s + c.memory_s;
    if (d.first_stage) {  // the embedding's gather (bf16 rows) and scatter-add (fp32 rows)
      const double bytes = m * T * H * (2 * kBf16 + kBf16 + 8);
      c.embedding_s = bytes / stream;
      c.memory_bytes += bytes;
      c.memory_s += c.embedding_s;
    }
    if (d.last_stage) {
      // The final norm, the LM head's three GEMMs and the cross-entropy's two reads and one
      // write of the bf16 logits.
      const Gemm head = {T, static_cast<double>(d.vocab_local), H};
      const double head_gemm =
          m * (gemm_fwd_s(head, gemm_rate) + gemm_bwd_s(head, gemm_rate, stream));
      c.gemm_flop += m * 6 * head.m * head.n * head.k;
      const double loss =
          m * (5 * H * Ts + 3 * static_cast<double>(d.vocab_local) * T) * kBf16 / stream;
      c.gemm_s += head_gemm;
      c.loss_s = loss;
      c.head_s = head_gemm + loss;
      c.forward_s += c.head_s;
    }
    c.forward_s += c.embedding_s / 2;
    c.backward_s = c.pipelined_s() - c.forward_s;
    // AdamW over the rank's range (fp32 master, gradient, m, v read; master, m, v and the bf16
    // compute copy written: 30 bytes a parameter) and the norm's read of every gradient here.
    const double P = params_on_rank[static_cast<size_t>(stage)];
    const double shards = layout.zero1 ? topo.dp_cp() : 1;
    c.optimizer_s = P * (30.0 / shards + 4.0) / stream;
    out.push_back(c);
  }
  return out;
}

}  // namespace tr
