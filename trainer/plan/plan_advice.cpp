// The planner's advice: what limits a plan's step and what would shrink it, and the layouts of
// the same model on the same GPUs ranked by their predicted speed (trainer plan --suggest).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/plan/plan.h"

namespace tr {
namespace {

// A part of the predicted step, and what would shrink it.
struct StepPart {
  const char* name;
  double seconds;
  const char* remedy;
};

std::vector<StepPart> step_parts(const Plan& p) {
  std::vector<StepPart> parts = {
      {"compute", p.compute_s - p.bubble_s,
       "the GEMMs themselves: fewer recomputed FLOPs (train.recompute) or faster kernels"},
      {"the pipeline bubble", p.bubble_s,
       "a schedule with less of it (parallel.pipeline_schedule interleaved or zero_bubble), more "
       "micro-batches per step (a larger train.global_batch or a smaller train.micro_batch) or "
       "fewer stages (parallel.pp)"},
      {"tensor-parallel communication", p.tp_s,
       "a smaller parallel.tp, its GPUs going to pp or dp instead"},
      {"pipeline sends", p.pp_s, "fewer pipeline stages (parallel.pp)"},
      {"the data-parallel gradient reduction", p.dp_s,
       "parallel.grad_reduce_dtype=bf16, or more tokens per micro-batch (the part the last "
       "micro-batch's backward and the first forward do not cover)"},
      {"context-parallel exchange", p.cp_s, "parallel.cp_comm=ring, or a smaller parallel.cp"},
      {"expert-parallel exchanges", p.ep_s,
       "a smaller parallel.ep (within a node), or fewer tokens routed per step"}};
  std::stable_sort(parts.begin(), parts.end(),
                   [](const StepPart& a, const StepPart& b) { return a.seconds > b.seconds; });
  return parts;
}

// The layouts --suggest tries: every tp (a power of two that divides the KV heads and fits a
// node) and pp (a power of two that divides the layers) on these GPUs, and for a mixture of
// experts every ep (a power of two that divides the experts; make_plan refuses those that do
// not divide dp x cp), dp auto, ZeRO-1, sequence parallel with tp, the config's cp, micro-batch
// and recompute.
std::vector<Config> candidate_layouts(const Config& cfg, int gpus_per_node) {
  std::vector<Config> out;
  std::vector<int64_t> eps = {1};
  for (int64_t ep = 2; ep <= cfg.model.num_experts && ep <= 64; ep *= 2)
    if (cfg.model.num_experts % ep == 0) eps.push_back(ep);
  for (int64_t tp = 1; tp <= gpus_per_node; tp *= 2) {
    if (cfg.model.num_kv_heads % tp != 0) continue;
    for (int64_t pp = 1; pp <= cfg.model.num_layers && pp <= 64; pp *= 2) {
      if (cfg.model.num_layers % pp != 0) continue;
      for (int64_t ep : eps) {
        Config c = cfg;
        c.parallel.tp = tp;
        c.parallel.pp = pp;
        c.parallel.ep = ep;
        c.parallel.dp = 0;
        c.parallel.pipeline_layers.clear();
        c.parallel.pipeline_schedule = "1f1b";
        c.parallel.virtual_stages = 1;
        c.parallel.sequence_parallel = tp > 1;
        c.parallel.zero1 = true;
        c.train.recompute_layers.clear();
        out.push_back(std::move(c));
      }
    }
  }
  return out;
}

}  // namespace

std::vector<ScheduleOption> schedule_options(const Config& cfg, const Plan& plan) {
  std::vector<ScheduleOption> out;
  const int64_t pp = cfg.parallel.pp, layers = cfg.model.num_layers;
  if (pp < 2) return out;
  std::vector<std::pair<std::string, int64_t>> kinds = {{"1f1b", 1}};
  // The config's own split of the layers where the chunk count is its own, else an even one.
  const int64_t own_v = cfg.parallel.virtual_stages;
  for (int64_t v = 2; v <= 8; ++v)
    if (plan.layout.micro_batches % pp == 0 && (v == own_v || layers % (pp * v) == 0))
      kinds.emplace_back("interleaved", v);
  kinds.emplace_back("zero_bubble", 1);
  for (const auto& [name, v] : kinds) {
    Config c = cfg;
    c.parallel.pipeline_schedule = name;
    c.parallel.virtual_stages = v;
    if (v != own_v) c.parallel.pipeline_layers.clear();
    absl::StatusOr<Plan> p =
        make_plan(c, plan.gpu, plan.nodes, plan.gpus_per_node, {}, plan.attention_span);
    if (!p.ok()) continue;
    ScheduleOption o;
    o.schedule = p->layout.schedule_text();
    o.sets = absl::StrCat("--set parallel.pipeline_schedule=", name,
                          " --set parallel.virtual_stages=", v);
    o.bubble = p->bubble;
    o.step_s = p->step_s;
    o.fits = p->fits;
    for (const StageMemory& m : p->stages) o.activations = std::max(o.activations, m.activations);
    out.push_back(o);
  }
  // Another schedule than 1f1b only for a predicted gain past the model's own error (its bubble
  // assumes W as long as B, and the rest of the step is an estimate too).
  constexpr double kWorthIt = 0.02;
  ScheduleOption* best = nullptr;
  for (ScheduleOption& o : out)
    if (o.fits && (best == nullptr || o.step_s < best->step_s * (1 - kWorthIt))) best = &o;
  if (best != nullptr) best->pick = true;
  return out;
}

std::string format_schedule_options(const Config& cfg, const Plan& plan) {
  const std::vector<ScheduleOption> options = schedule_options(cfg, plan);
  std::string out = "pipeline schedules on these GPUs (the bubble with equal F, B and W times):\n";
  absl::StrAppend(&out, "  schedule           bubble  activations (GiB)  step (s)  fits\n");
  const ScheduleOption* pick = nullptr;
  for (const ScheduleOption& o : options) {
    absl::StrAppendFormat(&out, "  %-17s %6.1f%%  %17.2f  %8.3f  %s\n", o.schedule, 100 * o.bubble,
                          o.activations / kGiB, o.step_s, o.fits ? "yes" : "no");
    if (o.pick) pick = &o;
  }
  if (pick == nullptr)
    absl::StrAppend(&out, "  pick: none fits\n");
  else
    absl::StrAppendFormat(&out, "  pick: %s (%s; another schedule only 2%% faster or more)\n",
                          pick->schedule, pick->sets);
  return out;
}

std::string plan_bottleneck(const Plan& p) {
  const std::vector<StepPart> parts = step_parts(p);
  return absl::StrFormat(
      "bottleneck: %s, %.0f%% of the predicted step; %s would shrink it (next: %s, %.0f%%)\n",
      parts[0].name, 100 * parts[0].seconds / p.step_s, parts[0].remedy, parts[1].name,
      100 * parts[1].seconds / p.step_s);
}

absl::StatusOr<std::string> suggest_layouts(const Config& cfg, const GpuSpec& gpu, int nodes,
                                            int gpus_per_node, int best, double attention_span) {
  struct Ranked {
    Plan plan;
    bool current;
  };
  std::vector<Ranked> fit;
  int tried = 0;
  for (const Config& c : candidate_layouts(cfg, gpus_per_node)) {
    absl::StatusOr<Plan> p = make_plan(c, gpu, nodes, gpus_per_node, {}, attention_span);
    if (!p.ok()) continue;  // not a layout of these GPUs (dp, batch or heads do not divide)
    ++tried;
    if (!p->fits) continue;
    const bool current = c.parallel.tp == cfg.parallel.tp && c.parallel.pp == cfg.parallel.pp &&
                         c.parallel.ep == cfg.parallel.ep;
    fit.push_back({std::move(*p), current});
  }
  std::stable_sort(fit.begin(), fit.end(), [](const Ranked& a, const Ranked& b) {
    return a.plan.tokens_per_s_per_gpu > b.plan.tokens_per_s_per_gpu;
  });
  if (fit.empty())
    return absl::InvalidArgumentError(absl::StrCat(
        "no layout of ", nodes * gpus_per_node, " ", gpu.name, " GPUs fits this model (", tried,
        " tried); add nodes, or raise parallel.cp or train.recompute"));
  // A mixture of experts' table has an ep column.
  const bool moe = cfg.model.num_experts > 0;
  std::string out = absl::StrFormat(
      "layouts of %d x %d %s that fit, by predicted tokens/s/GPU (%d of %d tried; dp auto, "
      "zero1, sequence parallel with tp, this config's cp %d, micro-batch %d and recompute "
      "%s):\n| rank | tp | pp | dp |%s memory GiB (worst stage) | tokens/s/GPU | MFU | "
      "bottleneck |\n|---|---|---|---|%s---|---|---|---|\n",
      nodes, gpus_per_node, gpu.name, static_cast<int>(fit.size()), tried,
      static_cast<int>(cfg.parallel.cp), static_cast<int>(cfg.train.micro_batch),
      cfg.train.recompute, moe ? " ep |" : "", moe ? "---|" : "");
  for (size_t i = 0; i < fit.size() && static_cast<int>(i) < best; ++i) {
    const Plan& p = fit[i].plan;
    double worst = 0;
    for (const StageMemory& m : p.stages) worst = std::max(worst, m.total());
    // Under 5% of the GPU's memory to spare: allocator fragmentation or a longer document can
    // take that.
    const bool tight = worst > 0.95 * p.gpu.memory_bytes;
    absl::StrAppendFormat(
        &out, "| %d | %d | %d | %d |%s %.1f of %.0f%s | %.0f | %.1f%% | %s |%s\n",
        static_cast<int>(i + 1), p.layout.topo.tp, p.layout.topo.pp, p.layout.topo.dp,
        moe ? absl::StrCat(" ", p.layout.topo.ep, " |") : "", worst / kGiB,
        p.gpu.memory_bytes / kGiB, tight ? " (tight)" : "", p.tokens_per_s_per_gpu, 100 * p.mfu,
        step_parts(p)[0].name,
        fit[i].current ? (moe ? " <- this config's tp, pp and ep" : " <- this config's tp and pp")
                       : "");
  }
  return out;
}

std::string explain_plan(const Config& cfg, const Plan& p) {
  const StageCompute& c = p.compute[static_cast<size_t>(p.slowest_stage)];
  const GpuSpec& g = p.gpu;
  std::string out = absl::StrFormat(
      "step model: stage %d of %d (the slowest), one GPU, seconds per step\n"
      "| part | seconds | share | at |\n|---|---|---|---|\n",
      c.stage, static_cast<int>(p.compute.size()));
  auto row = [&](const std::string& part, double s, const std::string& at) {
    absl::StrAppendFormat(&out, "| %s | %.4f | %.1f%% | %s |\n", part, s, 100 * s / p.step_s, at);
  };
  const double stream = g.copy_bw * g.stream_fraction;
  row("GEMMs", c.gemm_s,
      absl::StrFormat("%.0f TFLOP/s on average, %.2f of the %.0f TFLOP/s GEMM ceiling",
                      c.gemm_flop / c.gemm_s / 1e12, c.gemm_flop / c.gemm_s / g.gemm_flops,
                      g.gemm_flops / 1e12));
  // The keys per query move the rate where they are far from 4096 (attention_length_factor).
  const std::string length = absl::StrFormat("%.2f", attention_length_factor(p.attention_span));
  row("attention", c.attention_s,
      absl::StrFormat("forward %.2f, backward %.2f of the %.0f TFLOP/s peak (head_dim %d%s)",
                      attention_fraction(g, cfg.model.head_dim, false),
                      attention_fraction(g, cfg.model.head_dim, true), g.peak_bf16_flops / 1e12,
                      static_cast<int>(cfg.model.head_dim),
                      length == "1.00" ? ""
                                       : absl::StrFormat(", x%s at %.0f keys per query", length,
                                                         p.attention_span)));
  const std::string streaming = absl::StrFormat("%.0f GB/s (%.2f of the %.0f GB/s copy)",
                                                stream / 1e9, g.stream_fraction, g.copy_bw / 1e9);
  row("memory-bound passes", c.memory_s,
      absl::StrFormat("%.1f GB at %s", c.memory_bytes / 1e9, streaming));
  row("loss (cross-entropy)", c.loss_s, c.loss_s > 0 ? streaming : "not on this stage");
  row("optimizer", c.optimizer_s, streaming);
  row("pipeline bubble", p.bubble_s,
      absl::StrFormat("%.1f%% of the micro-batches' time idle", 100 * p.bubble));
  row("tp communication", p.tp_s,
      p.tp_hidden_s > 0
          ? absl::StrFormat("%.2f GB in %.0f calls, %.4f s, %.4f s of it hidden beside the QKV "
                            "and gate/up weight gradients",
                            p.tp_bytes / 1e9, p.tp_calls, p.tp_comm_s, p.tp_hidden_s)
          : absl::StrFormat("%.2f GB in %.0f calls, %.4f s, not overlapped", p.tp_bytes / 1e9,
                            p.tp_calls, p.tp_comm_s));
  row("pp sends", p.pp_s, absl::StrFormat("%.2f GB in %.0f sends", p.pp_bytes / 1e9, p.pp_calls));
  row("dp reduction (exposed)", p.dp_s,
      p.dp_buckets == 0
          ? std::string("no data-parallel group")
          : absl::StrFormat("%.2f GB in %.0f buckets (%s over %d %s), %.4f s, the rest under the "
                            "last backward and first forward",
                            p.dp_bytes / 1e9, p.dp_buckets, algorithm_name(p.dp_algorithm),
                            p.dp_span.nodes, p.dp_span.nodes > 1 ? "nodes" : "node", p.dp_comm_s));
  if (p.layout.topo.cp > 1)
    row("cp exchange (exposed)", p.cp_s,
        absl::StrFormat("%.2f GB, %.4f s; %s", p.cp_bytes / 1e9, p.cp_comm_s,
                        cfg.parallel.cp_comm == "ring"
                            ? "the K/V passes beside the chunk attention, the rest waited for"
                            : "the attention waits for the gathered K and V"));
  if (p.layout.topo.ep > 1)
    row("ep exchanges", p.ep_s,
        absl::StrFormat("%.2f GB in %.0f calls over %d %s, in order; the busiest rank's rows at "
                        "%.1fx the mean",
                        p.ep_bytes / 1e9, p.ep_calls, p.ep_span.nodes,
                        p.ep_span.nodes > 1 ? "nodes" : "node", kExpertImbalance));
  row("step", p.step_s,
      absl::StrFormat("%.0f tokens/s/GPU, MFU %.1f%%", p.tokens_per_s_per_gpu, 100 * p.mfu));
  absl::StrAppendFormat(
      &out,
      "by where it runs: %d layers at %.4f s each (%.4f s), LM head and loss %.4f s, embedding "
      "%.4f s, optimizer %.4f s\n",
      static_cast<int>(c.layers), c.layers > 0 ? c.layers_s / static_cast<double>(c.layers) : 0.0,
      c.layers_s, c.head_s, c.embedding_s, c.optimizer_s);
  if (p.compute.size() > 1) {
    absl::StrAppend(&out, "each stage's compute (without the bubble):");
    for (const StageCompute& s : p.compute)
      absl::StrAppendFormat(&out, " stage %d %.4f s;", s.stage, s.total_s());
    out.back() = '\n';
  }
  return out;
}

}  // namespace tr
