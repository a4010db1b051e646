#include "trainer/layout/run_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "trainer/layout/flat_buffers.h"

namespace tr {

std::string RunLayout::schedule_text() const {
  if (schedule == PipeScheduleKind::interleaved)
    return absl::StrCat(schedule_name(schedule), " v ", virtual_stages);
  return schedule_name(schedule);
}

std::vector<PipeAction> RunLayout::pipeline_actions() const {
  return make_schedule(schedule, topo.pp, virtual_stages,
                       static_cast<int>(micro_batches))[topo.pp_rank];
}

int RunLayout::in_flight() const {
  // The most in flight is reached by the end of the warm-up, which is shorter than 4 pp
  // micro-batches under every schedule; a step of more holds as many as one of 4 pp.
  const int64_t m = std::min<int64_t>(micro_batches, 4 * topo.pp);
  return slots_needed(
      make_schedule(schedule, topo.pp, virtual_stages, static_cast<int>(m))[topo.pp_rank]);
}

RunLayout RunLayout::of_rank(int rank) const {
  RunLayout f = *this;
  f.topo = topo.of_rank(rank);
  return f;
}

absl::StatusOr<RunLayout> run_layout(const Config& cfg, int world, int rank) {
  const ParallelConfig& p = cfg.parallel;
  absl::StatusOr<Topology> topo =
      Topology::make(world, rank, static_cast<int>(p.tp), static_cast<int>(p.pp),
                     static_cast<int>(p.dp), static_cast<int>(p.cp), static_cast<int>(p.ep));
  if (!topo.ok()) return topo.status();
  const TrainConfig& t = cfg.train;
  const int64_t per_step = t.micro_batch * topo->dp;
  if (t.global_batch % per_step != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "train.global_batch ", t.global_batch, " is not divisible by train.micro_batch ",
        t.micro_batch, " x dp ", topo->dp, " = ", per_step, "; make it a multiple of ", per_step,
        " or change parallel.dp / the number of ranks"));
  // Sequence parallelism splits each micro-batch's tokens on this rank (its 1/cp of every
  // sequence) over the TP ranks.
  const int64_t tokens = t.micro_batch * cfg.data.seq_len / topo->cp;
  if (p.sequence_parallel && topo->tp > 1 && tokens % topo->tp != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.sequence_parallel: train.micro_batch x data.seq_len", topo->cp > 1 ? " / cp" : "",
        " = ", tokens, " tokens do not split over parallel.tp ", topo->tp,
        "; change data.seq_len or micro_batch"));
  RunLayout f;
  f.topo = *topo;
  TR_ASSERT(parse_schedule(p.pipeline_schedule, &f.schedule), "a validated schedule name");
  f.virtual_stages = static_cast<int>(p.virtual_stages);
  f.micro_batches = t.global_batch / (t.micro_batch * f.topo.dp);
  const std::string why =
      schedule_unsupported(f.schedule, f.topo.pp, f.virtual_stages, f.micro_batches);
  if (!why.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.pipeline_schedule ", p.pipeline_schedule, ": ", why));
  f.zero1 = zero1_on(cfg, f.topo);
  f.sequence_parallel = p.sequence_parallel && f.topo.tp > 1;
  f.tokens_per_step = t.global_batch * cfg.data.seq_len;
  f.flops_per_token = flops_per_token(cfg);
  f.tied_embeddings = cfg.model.tie_embeddings;
  return f;
}

namespace {

// Attention's training FLOPs of one document of n tokens, over n squared (causal counting: the
// 2 QK^T and 2 AV matmuls' 4 n^2 q / 2 in forward, twice that in backward, per layer).
double attention_flops_per_sq(const Config& c) {
  const ModelConfig& m = c.model;
  return 6 * static_cast<double>(m.num_layers) * static_cast<double>(m.num_heads) *
         static_cast<double>(m.head_dim);
}

}  // namespace

double layer_matmul_params(const ModelConfig& m, int64_t layer) {
  const double H = static_cast<double>(m.hidden_size), hd = static_cast<double>(m.head_dim);
  const double q = static_cast<double>(m.num_heads) * hd,
               kv = static_cast<double>(m.num_kv_heads) * hd;
  const double mlp = m.sparse_layer(layer)
                         ? H * static_cast<double>(m.num_experts) +
                               3 * H * static_cast<double>(m.moe_intermediate_size) *
                                   static_cast<double>(m.experts_per_token)
                         : 3 * H * static_cast<double>(m.intermediate_size);
  return H * (q + 2 * kv) + q * H + mlp;
}

double flops_per_token(const Config& c) {
  const ModelConfig& m = c.model;
  double n_matmul = static_cast<double>(m.vocab_size) * static_cast<double>(m.hidden_size);
  for (int64_t l = 0; l < m.num_layers; ++l) n_matmul += layer_matmul_params(m, l);
  return 6 * n_matmul + attention_flops_per_sq(c) * static_cast<double>(c.data.seq_len);
}

double flops_per_token(const Config& c, double tokens, double doc_len_sq) {
  if (c.data.document_mask != "block_causal") return flops_per_token(c);
  const double seq = static_cast<double>(c.data.seq_len);
  return flops_per_token(c) + attention_flops_per_sq(c) * (doc_len_sq / tokens - seq);
}

ModelOptions model_options(const Config& cfg, const RunLayout& layout, Device device,
                           bool separate_compute_copy, int64_t loss_chunk, bool plan_only) {
  ModelOptions o;
  o.batch = cfg.train.micro_batch;
  o.seq_len = cfg.data.seq_len;
  o.dtype = device == Device::cuda ? DType::bf16 : DType::f32;
  o.loss_chunk = loss_chunk;
  o.flat_multiple = flat_multiple(cfg, layout.topo);
  o.slots = layout.in_flight();
  o.split_backward = layout.split_backward();
  o.overlap_tp = cfg.parallel.overlap_tp;
  o.documents = cfg.data.document_mask == "block_causal";
  o.separate_compute_copy = separate_compute_copy;
  o.plan_only = plan_only;
  o.shards = dp_shards(cfg, layout.topo);
  o.gemm = {.fp8 = cfg.train.precision == "fp8",
            .grad = cfg.train.fp8_format == "e4m3" ? DType::f8e4m3 : DType::f8e5m2};
  return o;
}

}  // namespace tr
