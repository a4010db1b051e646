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
       "more micro-batches per step (a larger train.global_batch or a smaller "
       "train.micro_batch) or fewer stages (parallel.pp)"},
      {"tensor-parallel communication", p.tp_s,
       "a smaller parallel.tp, its GPUs going to pp or dp instead"},
      {"pipeline sends", p.pp_s, "fewer pipeline stages (parallel.pp)"},
      {"the data-parallel gradient reduction", p.dp_s,
       "parallel.grad_reduce_dtype=bf16, or more tokens per step (the trainer also overlaps it "
       "with backward, which the plan does not count)"},
      {"context-parallel exchange", p.cp_s, "parallel.cp_comm=ring, or a smaller parallel.cp"}};
  std::stable_sort(parts.begin(), parts.end(),
                   [](const StepPart& a, const StepPart& b) { return a.seconds > b.seconds; });
  return parts;
}

// The layouts --suggest tries: every tp (a power of two that divides the KV heads and fits a
// node) and pp (a power of two that divides the layers) on these GPUs, dp auto, ZeRO-1, sequence
// parallel with tp, the config's cp, micro-batch and recompute.
std::vector<Config> candidate_layouts(const Config& cfg, int gpus_per_node) {
  std::vector<Config> out;
  for (int64_t tp = 1; tp <= gpus_per_node; tp *= 2) {
    if (cfg.model.num_kv_heads % tp != 0) continue;
    for (int64_t pp = 1; pp <= cfg.model.num_layers && pp <= 64; pp *= 2) {
      if (cfg.model.num_layers % pp != 0) continue;
      Config c = cfg;
      c.parallel.tp = tp;
      c.parallel.pp = pp;
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
  return out;
}

}  // namespace

std::string plan_bottleneck(const Plan& p) {
  const std::vector<StepPart> parts = step_parts(p);
  return absl::StrFormat(
      "bottleneck: %s, %.0f%% of the predicted step; %s would shrink it (next: %s, %.0f%%)\n",
      parts[0].name, 100 * parts[0].seconds / p.step_s, parts[0].remedy, parts[1].name,
      100 * parts[1].seconds / p.step_s);
}

absl::StatusOr<std::string> suggest_layouts(const Config& cfg, const GpuSpec& gpu, int nodes,
                                            int gpus_per_node, int best) {
  struct Ranked {
    Plan plan;
    bool current;
  };
  std::vector<Ranked> fit;
  int tried = 0;
  for (const Config& c : candidate_layouts(cfg, gpus_per_node)) {
    absl::StatusOr<Plan> p = make_plan(c, gpu, nodes, gpus_per_node);
    if (!p.ok()) continue;  // not a layout of these GPUs (dp, batch or heads do not divide)
    ++tried;
    if (!p->fits) continue;
    const bool current = c.parallel.tp == cfg.parallel.tp && c.parallel.pp == cfg.parallel.pp;
    fit.push_back({std::move(*p), current});
  }
  std::stable_sort(fit.begin(), fit.end(), [](const Ranked& a, const Ranked& b) {
    return a.plan.tokens_per_s_per_gpu > b.plan.tokens_per_s_per_gpu;
  });
  if (fit.empty())
    return absl::InvalidArgumentError(absl::StrCat(
        "no layout of ", nodes * gpus_per_node, " ", gpu.name, " GPUs fits this model (", tried,
        " tried); add nodes, or raise parallel.cp or train.recompute"));
  std::string out = absl::StrFormat(
      "layouts of %d x %d %s that fit, by predicted tokens/s/GPU (%d of %d tried; dp auto, "
      "zero1, sequence parallel with tp, this config's cp %d, micro-batch %d and recompute "
      "%s):\n| rank | tp | pp | dp | memory GiB (worst stage) | tokens/s/GPU | MFU | bottleneck |\n"
      "|---|---|---|---|---|---|---|---|\n",
      nodes, gpus_per_node, gpu.name, static_cast<int>(fit.size()), tried,
      static_cast<int>(cfg.parallel.cp), static_cast<int>(cfg.train.micro_batch),
      cfg.train.recompute);
  for (size_t i = 0; i < fit.size() && static_cast<int>(i) < best; ++i) {
    const Plan& p = fit[i].plan;
    double worst = 0;
    for (const StageMemory& m : p.stages) worst = std::max(worst, m.total());
    // Under 5% of the GPU's memory to spare: allocator fragmentation or a longer document can
    // take that.
    const bool tight = worst > 0.95 * p.gpu.memory_bytes;
    absl::StrAppendFormat(
        &out, "| %d | %d | %d | %d | %.1f of %.0f%s | %.0f | %.1f%% | %s |%s\n",
        static_cast<int>(i + 1), p.layout.topo.tp, p.layout.topo.pp, p.layout.topo.dp, worst / kGiB,
        p.gpu.memory_bytes / kGiB, tight ? " (tight)" : "", p.tokens_per_s_per_gpu, 100 * p.mfu,
        step_parts(p)[0].name, fit[i].current ? " <- this config's tp and pp" : "");
  }
  return out;
}

}  // namespace tr
