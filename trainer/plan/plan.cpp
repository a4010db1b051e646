#include "trainer/plan/plan.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/tensor.h"
#include "parallel/topology.h"
#include "trainer/layout/flat_buffers.h"
#include "trainer/model/model.h"
#include "trainer/model/step_io.h"
#include "trainer/optim/optim.h"
#include "trainer/plan/collectives.h"
#include "trainer/plan/step_model.h"

namespace tr {
namespace {

// cuDNN's deterministic flash-attention backward keeps a dP buffer of batch x heads x
// pad64(seq)^2 bf16 (cuDNN < 9.25); the forward needs far less. An estimate, not a reading.
double attention_workspace_estimate(int64_t batch, int64_t heads, int64_t seq) {
  const double s = static_cast<double>((seq + 63) / 64 * 64);
  return static_cast<double>(batch) * static_cast<double>(heads) * s * s * 2.0;
}

// Bytes one rank sends in a ring all-reduce / reduce-scatter / all-gather of `bytes`.
double ring_all_reduce(double bytes, int n) {
  return n > 1 ? 2.0 * (n - 1) / n * bytes : 0.0;
}
double ring_half(double bytes, int n) {
  return n > 1 ? static_cast<double>(n - 1) / n * bytes : 0.0;
}

}  // namespace

StageMemory rank_memory(const Config& cfg, const RunLayout& layout, Device device,
                        bool separate_compute_copy, int64_t loss_chunk) {
  const Topology& st = layout.topo;
  const TrainConfig& t = cfg.train;
  const ParallelConfig& par = cfg.parallel;
  const int64_t seq = cfg.data.seq_len;
  const bool zero1 = layout.zero1;
  const ModelDims dims = ModelDims::from(cfg, st);
  StageMemory m;
  m.stage = st.pp_rank;
  m.in_flight = layout.in_flight();
  const ModelOptions options =
      model_options(cfg, layout, device, separate_compute_copy, loss_chunk, /*plan_only=*/true);
  const DType dtype = options.dtype;
  ParamBuffer params = make_param_buffer(dims, options, device);
  const DecoderModel model(dims, options, params, Ctx{device});
  const bool separate =
      DistributedOptimizer::keeps_separate_masters(options.dtype, options.separate_compute_copy);
  const WeightMemory w = weight_memory(
      params,
      DistributedOptimizer::master_bytes(params.layout().capacity, options.shards, separate));
  m.weights = static_cast<double>(w.masters);
  m.compute_copy = static_cast<double>(w.compute_copy);
  m.grads = static_cast<double>(params.grad_bytes());
  m.activations = static_cast<double>(model.activation_bytes());
  m.loss_chunk_tokens = model.loss_chunk();
  m.loss_chunk_logits = static_cast<double>(model.loss_chunk()) *
                        static_cast<double>(dims.vocab_local) * dtype_size(dtype);
  const ParamLayout& l = params.layout();
  // AdamW's m and v of this rank's range and the reduced gradient shard (ZeRO-1: options.shards,
  // the experts' over their replicas), and the bf16 staging of each region's reduction.
  const DType reduce = grad_reduce_dtype(par);
  size_t staging = 0, staging_zero1 = 0;
  for (const FlatRegion& r : flat_regions(l, st)) {
    staging += GradReducer::staging_bytes(r.capacity, r.replicas, false, reduce);
    staging_zero1 += GradReducer::staging_bytes(r.capacity, r.replicas, true, reduce);
  }
  m.optimizer_without_zero1 =
      static_cast<double>(DistributedOptimizer::state_bytes(l.total, false) + staging);
  m.optimizer = zero1 ? static_cast<double>(
                            DistributedOptimizer::state_bytes(options.shards.shard_size(), true) +
                            staging_zero1)
                      : m.optimizer_without_zero1;
  if (device == Device::cuda) {
    m.workspace =
        static_cast<double>(kCudaWorkspaceBytes +
                            StepIO::device_bytes(layout.micro_batches, t.micro_batch * seq / st.cp,
                                                 device, cfg.data.token_doc_arrays()));
    // Under context parallelism cuDNN runs on one sequence's blocks of seq / (2 cp) tokens.
    m.attention_workspace = st.cp > 1
                                ? attention_workspace_estimate(1, dims.heads, seq / (2 * st.cp))
                                : attention_workspace_estimate(t.micro_batch, dims.heads, seq);
  }
  return m;
}

namespace {

// Each stage's memory, measured on its rank (0, 0, stage) as the trainer would build it.
void plan_memory(const Config& cfg, Plan& plan) {
  const Topology& topo = plan.layout.topo;
  for (int stage = 0; stage < topo.pp; ++stage) {
    const RunLayout sf = plan.layout.of_rank(topo.rank_at(0, 0, stage));
    const ModelDims dims = ModelDims::from(cfg, sf.topo);
    plan.recompute_full_layers += std::min(dims.recompute_full, dims.layers);
    const StageMemory m = rank_memory(cfg, sf, Device::cuda);
    plan.fits = plan.fits && m.total() <= plan.gpu.memory_bytes;
    plan.stages.push_back(m);
  }
}

// FLOPs per token (model and recomputed), parameters, checkpoint size and the bubble.
void plan_flops(const Config& cfg, Plan& plan) {
  const ModelConfig& mc = cfg.model;
  const double span = plan.attention_span;  // keys per query (seq_len without documents)
  const double H = static_cast<double>(mc.hidden_size), L = static_cast<double>(mc.num_layers);
  const double attn = L * span * static_cast<double>(mc.num_heads * mc.head_dim);
  // What the trainer's MFU counts (trainer/layout/run_layout.h), with the documents' span.
  plan.flops_per_token_causal = flops_per_token(cfg, 1.0, span);
  plan.flops_per_token_full = plan.flops_per_token_causal + 6.0 * attn;
  // A fully recomputed layer runs its forward again up to the SwiGLU: the QKV, O and gate/up
  // GEMMs (2 flops per weight per token; a sparse layer's router and its chosen experts' three)
  // and causal attention (2 s nh hd per token), averaged over the layers. Selective
  // recomputation runs only norms and SwiGLU (elementwise; not counted).
  const double Q = static_cast<double>((mc.num_heads + 2 * mc.num_kv_heads) * mc.head_dim),
               A = static_cast<double>(mc.num_heads * mc.head_dim),
               I = static_cast<double>(mc.intermediate_size);
  double recomputed = 0;
  for (int64_t l = 0; l < mc.num_layers; ++l)
    recomputed += layer_matmul_params(mc, l) - (mc.sparse_layer(l) ? 0.0 : H * I);
  const double layer_fwd = 2.0 * (recomputed / L + Q) + 2.0 * span * A;
  // Under zero_bubble a fully recomputed layer runs its forward again in both the B and the W
  // pass.
  plan.recompute_flops_per_token =
      static_cast<double>(plan.recompute_full_layers) * layer_fwd * plan.layout.recompute_passes();
  plan.params_total = model_param_count(cfg, plan.layout.topo);
  const double idle_expert = 3.0 * H * static_cast<double>(mc.moe_intermediate_size) *
                             static_cast<double>(mc.num_experts - mc.experts_per_token);
  plan.params_active = plan.params_total - static_cast<double>(mc.sparse_layers()) * idle_expert;
  plan.checkpoint_bytes = checkpoint_bytes(cfg, plan.layout.topo);
  plan.bubble = bubble_fraction(plan.layout.schedule, plan.layout.topo.pp,
                                plan.layout.virtual_stages, plan.layout.micro_batches);
}

// Communication per GPU per step (bytes sent), bf16 activations, fp32 gradients.
void plan_communication(const Config& cfg, Plan& plan) {
  const RunLayout& f = plan.layout;
  const int pp = f.topo.pp, tp = f.topo.tp, dp = f.topo.dp, cp = f.topo.cp;
  const auto m = static_cast<double>(f.micro_batches);
  const double H = static_cast<double>(cfg.model.hidden_size);
  const double tokens =
      static_cast<double>(cfg.train.micro_batch * cfg.data.seq_len) / cp;  // T on this rank
  const double act = tokens * H * 2.0;                                     // [T, H] bf16
  const bool sp = f.sequence_parallel;
  // Activations forward and their gradients back at each of the rank's v chunk boundaries.
  plan.pp_bytes = pp > 1 ? m * 2.0 * act / (sp ? tp : 1) * f.virtual_stages : 0;
  plan.pp_calls = pp > 1 ? m * 2.0 * f.virtual_stages : 0;
  // ZeRO-1 (the distributed optimizer): fp32 gradients reduce-scattered, the updated bf16
  // compute copy all-gathered; each region of the flat buffer over its replicas (the experts'
  // over the expert-data-parallel ranks).
  const ParamLayout l = rank_layout(cfg, f.topo);
  const double wire = dtype_size(grad_reduce_dtype(cfg.parallel)), copy = 2;  // bytes per element
  const auto region = [&](double elems, int ranks, double* bytes, double* gather, double* buckets) {
    *gather = f.zero1 ? ring_half(elems * copy, ranks) : 0;
    *bytes =
        *gather + (f.zero1 ? ring_half(elems * wire, ranks) : ring_all_reduce(elems * wire, ranks));
    // One reduction per bucket (parallel.dp_bucket_elems), and with ZeRO-1 one all-gather.
    *buckets = ranks > 1 ? std::ceil(elems / static_cast<double>(cfg.parallel.dp_bucket_elems)) : 0;
  };
  double dense_bytes = 0, dense_gather = 0, dense_buckets = 0;
  region(static_cast<double>(l.expert_begin), dp * cp, &dense_bytes, &dense_gather, &dense_buckets);
  region(static_cast<double>(l.capacity - l.expert_begin), f.topo.edp(), &plan.dp_expert_bytes,
         &plan.dp_expert_gather_bytes, &plan.dp_expert_buckets);
  plan.dp_bytes = dense_bytes + plan.dp_expert_bytes;
  plan.dp_gather_bytes = dense_gather + plan.dp_expert_gather_bytes;
  plan.dp_buckets = dense_buckets + plan.dp_expert_buckets;
}

// What a group's collectives send per GPU per step and how long they take: each op of the op
// list (the model's collectives on that group) timed on the links the group spans.
struct GroupTraffic {
  double bytes = 0, calls = 0, seconds = 0;
  // Of them, those started beside the compute (Lane::beside).
  double beside_bytes = 0, beside_calls = 0, beside_s = 0;
};

GroupTraffic group_traffic(const GpuSpec& gpu, const std::vector<StepOp>& collectives,
                           const std::string& group, GroupSpan span) {
  GroupTraffic t;
  if (span.ranks == 1) return t;
  for (const StepOp& op : collectives) {
    if (op.comm.group != group) continue;
    Collective c = Collective::send;  // an exchange: what it sends, to one neighbour
    double wire = op.bytes;
    // The routed rows' exchange: what leaves (or reaches) the busiest rank, its own rows aside.
    if (op.routed) wire *= kExpertImbalance * (span.ranks - 1) / span.ranks;
    switch (op.comm.kind) {
      case CommOp::all_reduce:
        c = Collective::all_reduce;
        wire = ring_all_reduce(op.bytes, span.ranks);
        break;
      case CommOp::all_gather:
      case CommOp::reduce_scatter:
        c = op.comm.kind == CommOp::all_gather ? Collective::all_gather
                                               : Collective::reduce_scatter;
        wire = ring_half(op.bytes, span.ranks);
        break;
      default:
        break;
    }
    const double bytes = op.count * wire;
    const double s = collective_time(gpu, c, span, bytes, op.count).seconds;
    t.bytes += bytes;
    t.calls += op.count;
    t.seconds += s;
    if (op.comm.lane == Lane::beside) {
      t.beside_bytes += bytes;
      t.beside_calls += op.count;
      t.beside_s += s;
    }
  }
  return t;
}

// Step time: the slowest stage's compute by op class (step_model.h), its micro-batches' part
// stretched by the bubble, plus the exposed communication, each group's collectives timed on
// the links it spans (collectives.h: NVLink inside a node, the NIC across nodes).
void plan_time(const Config& cfg, const OtherSystem& system, Plan& plan) {
  const GpuSpec& gpu = plan.gpu;
  const int tp = plan.layout.topo.tp;
  const double tokens_step = static_cast<double>(plan.layout.tokens_per_step);
  std::vector<double> params_on_rank;
  for (const StageMemory& m : plan.stages) params_on_rank.push_back(m.grads / 4);  // fp32
  plan.compute = stage_compute(cfg, plan.layout, gpu, params_on_rank, plan.attention_span);
  plan.slowest_stage =
      static_cast<int>(std::max_element(plan.compute.begin(), plan.compute.end(),
                                        [](const StageCompute& a, const StageCompute& b) {
                                          return a.total_s() < b.total_s();
                                        }) -
                       plan.compute.begin());
  const StageCompute& slow = plan.compute[static_cast<size_t>(plan.slowest_stage)];
  // The schedule's idle share (1F1B: m + pp - 1 slots for m micro-batches).
  const double stretch = 1 / (1 - plan.bubble);
  plan.bubble_s = slow.pipelined_s() * (stretch - 1);
  plan.compute_s = slow.total_s() + plan.bubble_s;
  const int g = plan.gpus_per_node;
  // The slowest stage's TP collectives (the model's op list: the TP regions' ends, the
  // vocab-parallel loss's statistics, the replicated weights' gradients). The step waits for
  // all of them but what the column-parallel weight gradients hide.
  const GroupTraffic tp_traffic =
      group_traffic(gpu, slow.collectives, "tp", group_span(tp, 1, plan.world, g));
  plan.tp_bytes = tp_traffic.bytes;
  plan.tp_calls = tp_traffic.calls;
  plan.tp_comm_s = tp_traffic.seconds;
  plan.tp_beside_bytes = tp_traffic.beside_bytes;
  plan.tp_beside_calls = tp_traffic.beside_calls;
  // Each projection's reduction (an equal share of the overlapped traffic) hides only behind its
  // own weight-gradient GEMM.
  if (const auto n = static_cast<double>(slow.column_weight_grads.size()); n > 0) {
    const double each = tp_traffic.beside_s / n;
    for (const double w : slow.column_weight_grads) plan.tp_hidden_s += std::min(each, w);
  }
  plan.tp_s = system.tp_overlap ? std::max(0.0, plan.tp_comm_s - slow.gemm_s)
                                : plan.tp_comm_s - plan.tp_hidden_s;
  // Stage neighbours are tp x cp x dp ranks apart: some cross nodes once the job spans nodes.
  const bool multi_node = plan.world > g;
  plan.pp_s =
      collective_time(gpu, Collective::send, {2, multi_node ? 2 : 1}, plan.pp_bytes, plan.pp_calls)
          .seconds;
  // With parallel.overlap_dp the trainer reduces the gradients bucket by bucket as the last
  // micro-batch's backward finishes them, and with overlap_param_gather ZeRO-1's all-gather of
  // the updated weights runs bucket by bucket under the next step's first forward: the step
  // waits for what those windows do not cover.
  const int cp = plan.layout.topo.cp, ep = plan.layout.topo.ep;
  plan.dp_span = group_span(plan.layout.topo.dp * cp, tp, plan.world, g);
  // The experts' replicas: ranks ep apart among the dp x cp ones.
  plan.edp_span = group_span(plan.layout.topo.edp(), tp * ep, plan.world, g);
  const double micro_batches = static_cast<double>(plan.layout.micro_batches);
  const bool zero1 = plan.layout.zero1;
  const auto gather = [&](GroupSpan span, double bytes, double buckets) {
    return collective_time(gpu, Collective::all_gather, span, bytes, zero1 ? buckets : 0.0).seconds;
  };
  const auto reduction = [&](GroupSpan span, double bytes, double buckets) {
    return collective_time(gpu, zero1 ? Collective::reduce_scatter : Collective::all_reduce, span,
                           bytes, buckets);
  };
  const double gather_s =
      gather(plan.dp_span, plan.dp_gather_bytes - plan.dp_expert_gather_bytes,
             plan.dp_buckets - plan.dp_expert_buckets) +
      gather(plan.edp_span, plan.dp_expert_gather_bytes, plan.dp_expert_buckets);
  const CollectiveTime reduce = reduction(
      plan.dp_span,
      plan.dp_bytes - plan.dp_gather_bytes - (plan.dp_expert_bytes - plan.dp_expert_gather_bytes),
      plan.dp_buckets - plan.dp_expert_buckets);
  plan.dp_algorithm = reduce.algorithm;
  const double reduce_s =
      reduce.seconds + reduction(plan.edp_span, plan.dp_expert_bytes - plan.dp_expert_gather_bytes,
                                 plan.dp_expert_buckets)
                           .seconds;
  plan.dp_comm_s = gather_s + reduce_s;
  const double under_backward = cfg.parallel.overlap_dp ? slow.backward_s / micro_batches : 0;
  const double under_forward =
      cfg.parallel.overlap_param_gather ? slow.forward_s / micro_batches : 0;
  plan.dp_s = std::max(0.0, reduce_s - under_backward) + std::max(0.0, gather_s - under_forward);
  // CP groups are the next-closest ranks after TP: inside a node while tp x cp GPUs fit in one.
  // The ring's K/V passes hide behind the attention.
  const GroupTraffic cp_traffic =
      group_traffic(gpu, slow.collectives, "cp", group_span(cp, tp, plan.world, g));
  plan.cp_bytes = cp_traffic.bytes;
  plan.cp_beside_bytes = cp_traffic.beside_bytes;
  plan.cp_comm_s = cp_traffic.seconds;
  plan.cp_s =
      plan.cp_comm_s - cp_traffic.beside_s + std::max(0.0, cp_traffic.beside_s - slow.attention_s);
  // Expert parallelism's exchanges run in order, between the router and the experts: the step
  // waits for all of them.
  plan.ep_span = group_span(ep, tp, plan.world, g);
  const GroupTraffic ep_traffic = group_traffic(gpu, slow.collectives, "ep", plan.ep_span);
  plan.ep_bytes = ep_traffic.bytes;
  plan.ep_calls = ep_traffic.calls;
  plan.ep_s = ep_traffic.seconds;
  plan.step_s = plan.compute_s + plan.tp_s + plan.pp_s + plan.dp_s + plan.cp_s + plan.ep_s;
  plan.tokens_per_s_per_gpu = tokens_step / plan.step_s / plan.world;
  plan.mfu = plan.flops_per_token_causal * plan.tokens_per_s_per_gpu / gpu.peak_bf16_flops;
}

// The plan's own outputs: finite, and an MFU in (0, 1]. Each --hardware key lies in its range,
// but numbers in range can still combine into an absurd plan: the error names the keys behind
// the part at fault.
absl::Status check_outputs(const Plan& p) {
  const char* compute = "gemm_tflops, gemm_fill, attention_*, stream_fraction, memory_gbps";
  const char* links =
      "nvlink_gbps, node_latency_us, network_gbps, network_latency_us, network_hop_latency_us";
  const std::tuple<const char*, double, const char*> parts[] = {
      {"compute time", p.compute_s, compute},
      {"tp communication time", p.tp_s, links},
      {"pp communication time", p.pp_s, links},
      {"dp communication time", p.dp_s, links},
      {"cp communication time", p.cp_s, links},
      {"ep communication time", p.ep_s, links},
      {"step time", p.step_s, compute},
      {"tokens/s per GPU", p.tokens_per_s_per_gpu, compute}};
  for (const auto& [what, value, keys] : parts)
    if (!std::isfinite(value) || value < 0)
      return absl::InvalidArgumentError(
          absl::StrFormat("--hardware: the plan's %s is %g; set the GPU's %s to numbers it reaches",
                          what, value, keys));
  if (!(p.mfu > 0 && p.mfu <= 1))
    return absl::InvalidArgumentError(absl::StrFormat(
        "--hardware: the plan's MFU is %g, outside (0, 1]; peak_bf16_tflops must be above what "
        "gemm_tflops and attention_* reach",
        p.mfu));
  return absl::OkStatus();
}

// The plan itself (make_plan without its search for a cp that fits).
absl::StatusOr<Plan> build_plan(const Config& cfg, const GpuSpec& gpu, int nodes, int gpus_per_node,
                                const OtherSystem& system, double attention_span) {
  if (nodes < 1 || gpus_per_node < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--nodes ", nodes, " and --gpus-per-node ", gpus_per_node, " must be >= 1"));
  Plan plan;
  plan.gpu = gpu;
  plan.nodes = nodes;
  plan.gpus_per_node = gpus_per_node;
  plan.world = nodes * gpus_per_node;
  plan.attention_span = attention_span > 0 ? attention_span : static_cast<double>(cfg.data.seq_len);
  absl::StatusOr<RunLayout> layout = run_layout(cfg, plan.world, 0);
  if (!layout.ok()) return layout.status();
  plan.layout = *layout;
  plan_memory(cfg, plan);
  plan_flops(cfg, plan);
  plan_communication(cfg, plan);
  plan_time(cfg, system, plan);
  if (absl::Status st = check_outputs(plan); !st.ok()) return st;
  return plan;
}

// The smallest parallel.cp above cfg's, doubling, whose plan on the same GPUs (dp auto) is a
// valid layout that fits; 0 = none.
int cp_that_fits(const Config& cfg, const GpuSpec& gpu, int nodes, int gpus_per_node,
                 double attention_span) {
  const int64_t fixed = cfg.parallel.tp * cfg.parallel.pp;
  for (int64_t cp = cfg.parallel.cp * 2; fixed * cp <= int64_t{nodes} * gpus_per_node; cp *= 2) {
    if (cfg.data.seq_len % (2 * cp) != 0) break;  // config.cpp's rule: nor will a larger cp
    Config c = cfg;
    c.parallel.cp = cp;
    c.parallel.dp = 0;
    absl::StatusOr<Plan> p = build_plan(c, gpu, nodes, gpus_per_node, {}, attention_span);
    if (p.ok() && p->fits) return static_cast<int>(cp);
  }
  return 0;
}

}  // namespace

absl::StatusOr<Plan> make_plan(const Config& cfg, const GpuSpec& gpu, int nodes, int gpus_per_node,
                               const OtherSystem& system, double attention_span) {
  if (cfg.train.precision == "fp8" && !(gpu.gemm_fp8_flops > 0))
    return absl::InvalidArgumentError(absl::StrCat(
        "train.precision=fp8 needs FP8 tensor cores, and ", gpu.name,
        " has none in the GPU table (or its --hardware file's gemm_fp8_tflops is 0); plan another "
        "--gpu or set train.precision=bf16"));
  absl::StatusOr<Plan> plan = build_plan(cfg, gpu, nodes, gpus_per_node, system, attention_span);
  if (plan.ok() && !plan->fits)
    plan->cp_needed = cp_that_fits(cfg, gpu, nodes, gpus_per_node, attention_span);
  return plan;
}

namespace {

// The memory table (GiB per GPU, a column per stage) and the verdict.
void format_memory(std::string& out, const Plan& p) {
  const bool zero1 = p.layout.zero1;
  absl::StrAppend(&out, "memory per GPU (GiB)     ");
  for (const StageMemory& m : p.stages) absl::StrAppendFormat(&out, "  stage %-3d", m.stage);
  absl::StrAppend(&out, "\n");
  auto row = [&](const char* what, auto get) {
    absl::StrAppendFormat(&out, "  %-23s", what);
    for (const StageMemory& m : p.stages) absl::StrAppendFormat(&out, "  %9.2f", get(m) / kGiB);
    absl::StrAppend(&out, "\n");
  };
  row(zero1 ? "weights (fp32, zero1)" : "weights (fp32 master)",
      [](const StageMemory& m) { return m.weights; });
  row("compute copy (bf16)", [](const StageMemory& m) { return m.compute_copy; });
  row("gradients (fp32)", [](const StageMemory& m) { return m.grads; });
  row(zero1 ? "adam m, v (zero1)" : "adam m, v", [](const StageMemory& m) { return m.optimizer; });
  row("  (without zero1)", [](const StageMemory& m) { return m.optimizer_without_zero1; });
  row("activations", [](const StageMemory& m) { return m.activations; });
  row("workspace", [](const StageMemory& m) { return m.workspace; });
  row("attention (estimated)", [](const StageMemory& m) { return m.attention_workspace; });
  row("total", [](const StageMemory& m) { return m.total(); });
  const auto worst = std::max_element(p.stages.begin(), p.stages.end(),
                                      [](auto& a, auto& b) { return a.total() < b.total(); });
  if (p.fits) {
    absl::StrAppendFormat(&out, "verdict: fits: stage %d needs %.1f GiB of %.0f GiB\n",
                          worst->stage, worst->total() / kGiB, p.gpu.memory_bytes / kGiB);
    return;
  }
  std::vector<std::pair<double, std::string>> terms = {
      {worst->weights + worst->compute_copy, "weights"},
      {worst->grads, "gradients"},
      {worst->optimizer, "optimizer states"},
      {worst->activations, "activations"}};
  std::sort(terms.rbegin(), terms.rend());
  absl::StrAppendFormat(&out,
                        "verdict: does not fit: stage %d needs %.1f GiB of %.0f GiB; largest: "
                        "%s %.1f GiB, %s %.1f GiB\n",
                        worst->stage, worst->total() / kGiB, p.gpu.memory_bytes / kGiB,
                        terms[0].second, terms[0].first / kGiB, terms[1].second,
                        terms[1].first / kGiB);
}

}  // namespace

std::string format_plan(const Config& cfg, const Plan& p) {
  std::string out;
  const Topology& t = p.layout.topo;
  absl::StrAppendFormat(
      &out,
      "plan: %d nodes x %d %s = %d GPUs; tp %d x %spp %d x dp %d%s%s%s; "
      "%.3gB parameters%s; %d micro-batches of %d x %d tokens per step\n",
      p.nodes, p.gpus_per_node, p.gpu.name, p.world, t.tp,
      t.cp > 1 ? absl::StrCat("cp ", t.cp, " x ") : "", t.pp, t.dp,
      t.ep > 1 ? absl::StrCat(" (ep ", t.ep, " of dp", t.cp > 1 ? " x cp" : "", ")") : "",
      p.layout.zero1 ? ", zero1" : "", p.layout.sequence_parallel ? ", sequence parallel" : "",
      p.params_total / 1e9,
      p.params_active < p.params_total
          ? absl::StrFormat(" (%.3gB active per token)", p.params_active / 1e9)
          : std::string(),
      p.layout.micro_batches, cfg.train.micro_batch, cfg.data.seq_len);
  absl::StrAppendFormat(&out,
                        "checkpoint: %.1f GiB per save (fp32 weights, Adam m and v); "
                        "checkpoint.keep_last=%d keeps %d on disk, one more during a save\n",
                        p.checkpoint_bytes / kGiB, cfg.checkpoint.keep_last,
                        cfg.checkpoint.keep_last);
  const StageMemory& last = p.stages.back();
  absl::StrAppendFormat(&out,
                        "loss: chunks of %d tokens of the %d in a micro-batch (at most %.2g GiB "
                        "of bf16 logits per chunk on the last stage)\n",
                        last.loss_chunk_tokens, cfg.train.micro_batch * cfg.data.seq_len / t.cp,
                        last.loss_chunk_logits / kGiB);
  format_memory(out, p);
  absl::StrAppendFormat(&out,
                        "FLOPs per token: %.4g (causal: 6 N_matmul + 6 L s nh hd, what MFU "
                        "counts); %.4g counting full attention\n",
                        p.flops_per_token_causal, p.flops_per_token_full);
  if (cfg.train.recompute == "selective")
    absl::StrAppend(&out,
                    "recompute: selective: norm and SwiGLU outputs recomputed in backward "
                    "(elementwise work; under sequence parallelism also their all-gathers)\n");
  if (cfg.train.recompute == "full")
    absl::StrAppendFormat(
        &out,
        "recompute: %s; %d of %d layers in full; %.4g FLOPs per token run again (%.1f%% more "
        "compute; MFU counts model FLOPs only)\n",
        cfg.train.recompute, static_cast<int>(p.recompute_full_layers),
        static_cast<int>(cfg.model.num_layers), p.recompute_flops_per_token,
        100 * p.recompute_flops_per_token / p.flops_per_token_causal);
  absl::StrAppendFormat(&out, "pipeline bubble: %.1f%% of each step (%s, %d micro-batches)\n",
                        100 * p.bubble, p.layout.schedule_text().c_str(), p.layout.micro_batches);
  if (t.pp > 1) absl::StrAppend(&out, format_schedule_options(cfg, p));
  const std::string cp_traffic =
      absl::StrCat(t.cp > 1 ? absl::StrFormat(", cp %.2f GB", p.cp_bytes / 1e9) : "",
                   t.ep > 1 ? absl::StrFormat(", ep %.2f GB", p.ep_bytes / 1e9) : "");
  absl::StrAppendFormat(&out,
                        "communication per GPU per step: tp %.2f GB, pp %.2f GB, dp %.2f GB%s\n",
                        p.tp_bytes / 1e9, p.pp_bytes / 1e9, p.dp_bytes / 1e9, cp_traffic);
  if (t.cp > 1)
    absl::StrAppendFormat(
        &out,
        "context parallel: cp %d (%s), %d tokens of each sequence per GPU; the "
        "K/V exchange takes %.2f s per step, %.2f s of it exposed%s\n",
        t.cp, cfg.parallel.cp_comm, cfg.data.seq_len / t.cp, p.cp_comm_s, p.cp_s,
        cfg.parallel.cp_comm == "ring" ? " (the K/V passes run beside the chunk attention)" : "");
  if (t.ep > 1)
    absl::StrAppendFormat(
        &out,
        "expert parallel: ep %d, %d experts of each sparse layer per GPU; the routed rows' "
        "exchanges take %.2f s per step (%.0f calls; the busiest rank at %.1fx the mean)\n",
        t.ep, static_cast<int>(cfg.model.num_experts / t.ep), p.ep_s, p.ep_calls, kExpertImbalance);
  if (!p.fits && p.cp_needed > 0)
    absl::StrAppendFormat(&out,
                          "long context: parallel.cp=%d would fit on these %d GPUs (dp auto); "
                          "try trainer plan --set parallel.cp=%d\n",
                          p.cp_needed, p.world, p.cp_needed);
  const std::string cp_time = absl::StrCat(t.cp > 1 ? absl::StrFormat(", cp %.2f", p.cp_s) : "",
                                           t.ep > 1 ? absl::StrFormat(", ep %.2f", p.ep_s) : "");
  absl::StrAppendFormat(&out,
                        "predicted step %.2f s (compute %.2f, tp %.2f, pp %.2f, dp %.2f%s "
                        "waited for): %.0f tokens/s/GPU, MFU %.1f%%\n",
                        p.step_s, p.compute_s, p.tp_s, p.pp_s, p.dp_s, cp_time,
                        p.tokens_per_s_per_gpu, 100 * p.mfu);
  absl::StrAppend(&out, plan_bottleneck(p));
  return out;
}

std::string plan_json(const Config& cfg, const Plan& p) {
  nlohmann::json stages = nlohmann::json::array();
  double worst = 0;
  for (const StageMemory& m : p.stages) {
    worst = std::max(worst, m.total());
    stages.push_back({{"stage", m.stage},
                      {"weights_gib", m.weights / kGiB},
                      {"compute_copy_gib", m.compute_copy / kGiB},
                      {"grads_gib", m.grads / kGiB},
                      {"optimizer_gib", m.optimizer / kGiB},
                      {"activations_gib", m.activations / kGiB},
                      {"workspace_gib", (m.workspace + m.attention_workspace) / kGiB},
                      {"total_gib", m.total() / kGiB}});
  }
  // Each stage's compute by op class (step_model.h), seconds per step on one GPU.
  nlohmann::json compute = nlohmann::json::array();
  for (const StageCompute& c : p.compute)
    compute.push_back({{"stage", c.stage},
                       {"gemm_s", c.gemm_s},
                       {"attention_s", c.attention_s},
                       {"memory_s", c.memory_s},
                       {"loss_s", c.loss_s},
                       {"optimizer_s", c.optimizer_s},
                       {"layers_s", c.layers_s},
                       {"head_s", c.head_s},
                       {"embedding_s", c.embedding_s}});
  // The resolved model and the GPU table, for the Python tools (tools/torch_baseline.py builds
  // the same model and counts MFU against the same peaks).
  const ModelConfig& mc = cfg.model;
  const nlohmann::json model = {
      {"hidden_size", mc.hidden_size},       {"intermediate_size", mc.intermediate_size},
      {"num_layers", mc.num_layers},         {"num_heads", mc.num_heads},
      {"num_kv_heads", mc.num_kv_heads},     {"head_dim", mc.head_dim},
      {"vocab_size", mc.vocab_size},         {"max_seq_len", mc.max_seq_len},
      {"rope_theta", mc.rope_theta},         {"rms_norm_eps", mc.rms_norm_eps},
      {"tie_embeddings", mc.tie_embeddings}, {"init_std", mc.init_std}};
  nlohmann::json hardware = nlohmann::json::array();
  for (const GpuSpec& g : gpu_table())
    hardware.push_back({{"name", g.name},
                        {"device_key", g.device_key},
                        {"peak_bf16_flops", g.peak_bf16_flops},
                        {"memory_gib", g.memory_bytes / kGiB},
                        {"hbm_bytes_per_s", g.hbm_bw},
                        {"nvlink_bytes_per_s", g.nvlink_bw},
                        {"network_bytes_per_s", g.network_bw},
                        {"gemm_flops", g.gemm_flops},
                        {"copy_bytes_per_s", g.copy_bw}});
  const nlohmann::json j = {{"gpu", p.gpu.name},
                            {"model", model},
                            {"hardware", hardware},
                            {"nodes", p.nodes},
                            {"gpus_per_node", p.gpus_per_node},
                            {"world", p.world},
                            {"tp", p.layout.topo.tp},
                            {"pp", p.layout.topo.pp},
                            {"dp", p.layout.topo.dp},
                            {"cp", p.layout.topo.cp},
                            {"cp_comm", cfg.parallel.cp_comm},
                            {"cp_bytes", p.cp_bytes},
                            {"ep", p.layout.topo.ep},
                            {"ep_bytes", p.ep_bytes},
                            {"cp_needed", p.cp_needed},
                            {"micro_batches", p.layout.micro_batches},
                            {"params", p.params_total},
                            {"params_active", p.params_active},
                            {"checkpoint_gib", p.checkpoint_bytes / kGiB},
                            {"loss_chunk_tokens", p.stages.back().loss_chunk_tokens},
                            {"fits", p.fits},
                            {"memory_gib", worst / kGiB},
                            {"gpu_memory_gib", p.gpu.memory_bytes / kGiB},
                            {"stages", stages},
                            {"flops_per_token_causal", p.flops_per_token_causal},
                            {"attention_span", p.attention_span},
                            {"flops_per_token_full", p.flops_per_token_full},
                            {"recompute", cfg.train.recompute},
                            {"recompute_flops_per_token", p.recompute_flops_per_token},
                            {"pipeline_schedule", schedule_name(p.layout.schedule)},
                            {"virtual_stages", p.layout.virtual_stages},
                            {"bubble", p.bubble},
                            {"tp_bytes", p.tp_bytes},
                            {"pp_bytes", p.pp_bytes},
                            {"dp_bytes", p.dp_bytes},
                            {"compute", compute},
                            {"slowest_stage", p.slowest_stage},
                            {"compute_s", p.compute_s},
                            {"bubble_s", p.bubble_s},
                            {"tp_s", p.tp_s},
                            {"pp_s", p.pp_s},
                            {"dp_s", p.dp_s},
                            {"cp_s", p.cp_s},
                            {"ep_s", p.ep_s},
                            {"step_s", p.step_s},
                            {"tokens_per_s_per_gpu", p.tokens_per_s_per_gpu},
                            {"mfu", p.mfu}};
  return j.dump() + "\n";
}

}  // namespace tr
