#include "trainer/plan/memory_fit.h"

#include <sys/vfs.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/fs_io.h"
#include "trainer/layout/flat_buffers.h"
#include "trainer/plan/plan.h"

namespace tr {
namespace {

std::string gib(double bytes) {
  return bytes >= kGiB ? absl::StrFormat("%.1f GiB", bytes / kGiB)
                       : absl::StrFormat("%.1f MiB", bytes / (1024.0 * 1024.0));
}

// A number in a cgroup file ("max" and errors: none).
bool read_number(const std::string& path, double* out) {
  std::ifstream f(path);
  std::string s;
  int64_t v = 0;
  if (!(f >> s) || !absl::SimpleAtoi(s, &v)) return false;
  *out = static_cast<double>(v);
  return true;
}

// The bytes the data loaders hold: each keeps its prefetched steps and the one in use, of this
// rank's samples (inputs and targets of its 1/cp of each sequence as int32, the sample ids).
double loader_bytes(const Config& cfg, const Topology& topo) {
  constexpr double kSteps = 2 + 1;  // LoaderOptions::prefetch_steps and the step in use
  const double samples = static_cast<double>(cfg.train.global_batch) / topo.dp;
  const double tokens = static_cast<double>(cfg.data.seq_len) / topo.cp;
  const double per_step = samples * (2.0 * tokens * 4 + 8);
  const int loaders = cfg.train.eval_interval > 0 ? 2 : 1;
  return loaders * kSteps * per_step;
}

}  // namespace

double host_memory_available() {
  double avail = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (!line.starts_with("MemAvailable:")) continue;
    std::istringstream in(line.substr(13));
    double kb = 0;
    if (in >> kb) avail = kb * 1024;
  }
  // cgroup v2: this process's group ("0::/path"), its limit and use.
  std::ifstream cg("/proc/self/cgroup");
  for (std::string line; std::getline(cg, line);) {
    if (!line.starts_with("0::")) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    double max = 0, current = 0;
    if (read_number(dir + "/memory.max", &max) && read_number(dir + "/memory.current", &current) &&
        max > current && (avail == 0 || max - current < avail))
      avail = max - current;
  }
  return avail;
}

double save_host_bytes(const Config& cfg, const Topology& topo, bool separate_masters, int nodes) {
  const CheckpointConfig& c = cfg.checkpoint;
  double bytes = c.async ? checkpoint_bytes(cfg, topo) / topo.world : 0;  // the blocks it owns
  if (c.local_interval > 0) {
    const double part = rank_state_bytes(cfg, topo, separate_masters);
    bytes += part;
    constexpr long kTmpfsMagic = 0x01021994;
    struct statfs fs {};
    if (statfs(c.local_dir.c_str(), &fs) == 0 && static_cast<long>(fs.f_type) == kTmpfsMagic)
      bytes += static_cast<double>(c.local_keep + 1) * part * (1 + c.local_replicas_on(nodes));
  }
  return bytes;
}

absl::Status check_memory(const Config& cfg, const RunLayout& layout, Device device,
                          const MemoryBudget& budget, bool separate_compute_copy,
                          int64_t loss_chunk) {
  const Topology& topo = layout.topo;
  const StageMemory m = rank_memory(cfg, layout, device, separate_compute_copy, loss_chunk);
  const double data = loader_bytes(cfg, topo);
  const int nodes = (topo.world + budget.ranks_on_host - 1) / std::max(budget.ranks_on_host, 1);
  const double saves =
      save_host_bytes(cfg, topo, device == Device::cuda || separate_compute_copy, nodes);
  const std::string saves_part = saves > 0 ? absl::StrCat(", saves ", gib(saves)) : "";
  const std::string parts = absl::StrCat(
      "weights ", gib(m.weights + m.compute_copy), ", gradients ", gib(m.grads), ", optimizer ",
      gib(m.optimizer), ", activations ", gib(m.activations), " (train.micro_batch ",
      cfg.train.micro_batch, " x data.seq_len ", cfg.data.seq_len, ")");
  // The way out of whichever part is the larger: the model's, or the loaders' samples.
  const char* fix =
      data > m.total()
          ? "; lower train.global_batch or use more data-parallel ranks (the loaders hold three "
            "steps of this rank's samples)"
          : "; lower train.micro_batch or data.seq_len, split the model over more ranks "
            "(parallel.tp, parallel.pp, parallel.zero1) or set train.recompute";
  auto check = [&](const char* what, const std::string& where, double need, double available,
                   int sharing, const std::string& detail) -> absl::Status {
    if (available <= 0 || need * sharing <= available) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "the run needs ", gib(need), " of ", what, " memory per rank (", detail, ") and ", where,
        " has ", gib(available), " available for its ", sharing, " rank(s)", fix));
  };
  if (device == Device::cpu)
    return check("host", absl::StrCat("host ", fs::host_name()), m.total() + data + saves,
                 budget.host_available, budget.ranks_on_host,
                 absl::StrCat(parts, ", data ", gib(data), saves_part));
  if (absl::Status st =
          check("host", absl::StrCat("host ", fs::host_name()), data + saves, budget.host_available,
                budget.ranks_on_host, absl::StrCat("data ", gib(data), saves_part));
      !st.ok())
    return st;
  return check("GPU", "this rank's GPU", m.total(), budget.device_available, budget.ranks_on_device,
               absl::StrCat(parts, ", workspaces ", gib(m.workspace + m.attention_workspace)));
}

}  // namespace tr
