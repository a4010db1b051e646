#include "trainer/plan/resilience.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "trainer/layout/flat_buffers.h"

namespace tr {
namespace {

// The choice of `steps` per save for saves costing `cost`; `other_stall` is the share of time
// other saves already take (persistent ones beside local ones).
IntervalChoice choose(int64_t steps, double step_s, const SaveCost& cost, double mtbf_s,
                      double restart_s, double other_stall) {
  IntervalChoice c;
  c.steps = std::max<int64_t>(1, steps);
  c.interval_s = static_cast<double>(c.steps) * step_s;
  c.lost_per_failure_s = restart_s + cost.load_s + c.interval_s / 2 + cost.write_s;
  const double stall = cost.stall_s / (c.interval_s + cost.stall_s);
  c.goodput = std::max(0.0, 1.0 - other_stall - stall - c.lost_per_failure_s / mtbf_s);
  return c;
}

// Young/Daly's interval in steps: sqrt(2 stall MTBF), at least the write time (a save commits
// before the next starts) and one step.
int64_t young_daly_steps(const SaveCost& cost, double mtbf_s, double step_s) {
  const double tau = std::max(std::sqrt(2.0 * cost.stall_s * mtbf_s), cost.write_s);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(tau / step_s)));
}

}  // namespace

FailurePlan plan_failures(const Config& cfg, const Plan& plan, double mtbf_hours_per_node,
                          const StorageSpec& s) {
  FailurePlan f;
  f.mtbf_hours_per_node = mtbf_hours_per_node;
  f.storage = s;
  f.job_mtbf_s = mtbf_hours_per_node * 3600.0 / plan.nodes;
  // A rank's part as a GPU rank holds it (its masters and moments; whole without ZeRO-1).
  const double rank = rank_state_bytes(cfg, plan.layout.topo, true);
  const double node = rank * plan.gpus_per_node;
  // Persistent: every rank writes its part to the shared filesystem; asynchronous saves stall
  // only for the copy to host memory.
  f.persistent.bytes_per_rank = rank;
  f.persistent.write_s = plan.checkpoint_bytes / s.storage_bw;
  f.persistent.stall_s = cfg.checkpoint.async ? rank / s.host_copy_bw : f.persistent.write_s;
  f.persistent.load_s = plan.checkpoint_bytes / s.storage_bw;
  // Local: the copy to host memory, then in the background the node's parts and the replicas it
  // holds to its disk, and each part to its replica holders on other nodes (over the rank's NIC);
  // a replaced node reads its parts back from their replicas.
  const int replicas = f.local_replicas = cfg.checkpoint.local_replicas_on(plan.nodes);
  f.local.bytes_per_rank = rank;
  f.local.stall_s = rank / s.host_copy_bw;
  f.local.write_s =
      std::max(node * (1 + replicas) / s.local_disk_bw, rank * replicas / plan.gpu.network_bw);
  f.local.load_s = std::max(node / s.local_disk_bw, rank / plan.gpu.network_bw);
  const double step_s = plan.step_s;
  const int64_t configured = cfg.checkpoint.interval > 0 ? cfg.checkpoint.interval : 0;
  if (configured > 0)
    f.persistent_configured =
        choose(configured, step_s, f.persistent, f.job_mtbf_s, s.restart_s, 0.0);
  f.persistent_young = choose(young_daly_steps(f.persistent, f.job_mtbf_s, step_s), step_s,
                              f.persistent, f.job_mtbf_s, s.restart_s, 0.0);
  // Beside the configured persistent saves (or Young/Daly's, when none are configured).
  const IntervalChoice& kept = configured > 0 ? f.persistent_configured : f.persistent_young;
  const double persistent_stall = f.persistent.stall_s / (kept.interval_s + f.persistent.stall_s);
  f.local_young = choose(young_daly_steps(f.local, f.job_mtbf_s, step_s), step_s, f.local,
                         f.job_mtbf_s, s.restart_s, persistent_stall);
  if (cfg.checkpoint.local_interval > 0)
    f.local_configured = choose(cfg.checkpoint.local_interval, step_s, f.local, f.job_mtbf_s,
                                s.restart_s, persistent_stall);
  return f;
}

namespace {

std::string duration(double s) {
  if (s < 120) return absl::StrFormat("%.0f s", s);
  if (s < 2 * 3600) return absl::StrFormat("%.1f min", s / 60);
  return absl::StrFormat("%.2f h", s / 3600);
}

std::string choice_line(const char* what, const IntervalChoice& c) {
  return absl::StrFormat("  %s every %d steps (%s): %s lost per failure, goodput %.1f%%\n", what,
                         c.steps, duration(c.interval_s), duration(c.lost_per_failure_s),
                         100 * c.goodput);
}

nlohmann::json choice_json(const IntervalChoice& c) {
  return {{"steps", c.steps},
          {"interval_s", c.interval_s},
          {"lost_per_failure_s", c.lost_per_failure_s},
          {"goodput", c.goodput}};
}

nlohmann::json cost_json(const SaveCost& c) {
  return {{"gib_per_rank", c.bytes_per_rank / kGiB},
          {"stall_s", c.stall_s},
          {"write_s", c.write_s},
          {"load_s", c.load_s}};
}

}  // namespace

std::string format_failures(const FailurePlan& f) {
  std::string out = absl::StrFormat(
      "failures: a node fails every %.0f h, the job every %s; a restart costs %s before its "
      "load (estimates: --hardware sets host_copy_gbps %.0f, local_disk_gbps %.0f, storage_gbps "
      "%.0f, restart_s %.0f)\n",
      f.mtbf_hours_per_node, duration(f.job_mtbf_s), duration(f.storage.restart_s),
      f.storage.host_copy_bw / 1e9, f.storage.local_disk_bw / 1e9, f.storage.storage_bw / 1e9,
      f.storage.restart_s);
  absl::StrAppendFormat(&out,
                        "  persistent save: %.2f GiB per rank, stall %.2f s, committed after %s, "
                        "loaded in %s\n",
                        f.persistent.bytes_per_rank / kGiB, f.persistent.stall_s,
                        duration(f.persistent.write_s), duration(f.persistent.load_s));
  if (f.persistent_configured.steps > 0)
    out += choice_line("persistent, checkpoint.interval:", f.persistent_configured);
  out += choice_line("persistent, Young/Daly:", f.persistent_young);
  const std::string replicas = f.local_replicas == 0 ? "no replica"
                               : f.local_replicas == 1
                                   ? "a replica on another node"
                                   : absl::StrCat(f.local_replicas, " replicas on other nodes");
  absl::StrAppendFormat(&out,
                        "  local save (node-local, %s): stall %.2f s, committed after %s, loaded "
                        "in %s\n",
                        replicas, f.local.stall_s, duration(f.local.write_s),
                        duration(f.local.load_s));
  if (f.local_configured.steps > 0)
    out += choice_line("local, checkpoint.local_interval:", f.local_configured);
  out += choice_line("local, Young/Daly, beside the persistent saves:", f.local_young);
  return out;
}

std::string failures_json(const FailurePlan& f) {
  nlohmann::json j = {{"mtbf_hours_per_node", f.mtbf_hours_per_node},
                      {"job_mtbf_s", f.job_mtbf_s},
                      {"restart_s", f.storage.restart_s},
                      {"persistent", cost_json(f.persistent)},
                      {"local", cost_json(f.local)},
                      {"local_replicas", f.local_replicas},
                      {"persistent_young", choice_json(f.persistent_young)},
                      {"local_young", choice_json(f.local_young)}};
  if (f.persistent_configured.steps > 0)
    j["persistent_configured"] = choice_json(f.persistent_configured);
  if (f.local_configured.steps > 0) j["local_configured"] = choice_json(f.local_configured);
  return j.dump();
}

}  // namespace tr
