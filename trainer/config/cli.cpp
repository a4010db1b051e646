#include "trainer/config/cli.h"

#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tr {

std::string usage() {
  return "usage: trainer --config FILE [--set section.key=value ...] [--resume auto|none|PATH]\n"
         "               [--force] [--dry-run] [--help-config] [--help-switches]\n"
         "               [--help-metrics] [--version]\n"
         "  --config FILE     YAML run config (see configs/ and docs/config.md)\n"
         "  --set K=V         override one config key, e.g. --set train.micro_batch=2 "
         "(repeatable)\n"
         "  --resume auto     continue from checkpoint.dir/latest (default); without `latest`,\n"
         "                    from the newest committed checkpoint there; fresh when there is "
         "none\n"
         "  --resume none     start fresh; refused when checkpoint.dir already holds checkpoints\n"
         "                    unless --force (they are moved to checkpoint.dir/abandoned-TIME/)\n"
         "  --resume PATH     continue from the committed checkpoint directory PATH; later steps\n"
         "                    in checkpoint.dir are moved to checkpoint.dir/abandoned-TIME/\n"
         "  --force           also resume a checkpoint of another run (train.seed, data.seed or\n"
         "                    data.train differ), and start over with --resume none\n"
         "  --dry-run         validate config and data, print the plan and memory, then exit\n"
         "  --dry-run --world N [--gpu G] [--gpus-per-node P]\n"
         "                    the same for a job of N ranks on GPUs of type G (default h100), in\n"
         "                    this one process and without a GPU (a login node): the layout, the\n"
         "                    data (every file and token id) and each stage's memory (the plan)\n"
         "  --help-config     print every config key with its type, default and meaning\n"
         "  --help-switches   print the TR_* debug and bisect switches (docs/debug.md)\n"
         "  --help-metrics    print every key of metrics.jsonl with its unit (docs/metrics.md)\n"
         "  --version         version (git describe), build type, backend and GPU library "
         "versions\n"
         "\n"
         "       trainer plan --config FILE [--set K=V ...] [--gpu h100|h200|b200|b300|a100]\n"
         "               [--nodes N] [--gpus-per-node G] [--hardware FILE ...] [--mtbf-hours H]\n"
         "               [--json] [--suggest] [--explain]\n"
         "  per-GPU memory, FLOPs per token, pipeline bubble, communication per step and a\n"
         "  predicted step time, tokens/s/GPU and MFU, without a GPU (defaults: h100, 1 node,\n"
         "  8 GPUs per node; each FILE overrides the GPU's numbers, the last over the first:\n"
         "  peak_bf16_tflops, memory_gib, hbm_tbps, nvlink_gbps, network_gbps, the ceilings\n"
         "  and latencies preflight --json measures and the op efficiencies bench_ops\n"
         "  --calibration measures (their files are read as they are), and the cluster's for\n"
         "  --mtbf-hours: host_copy_gbps, local_disk_gbps, storage_gbps, restart_s). With\n"
         "  --mtbf-hours (one node's mean time between failures) also the work a failure loses,\n"
         "  the goodput of the checkpoint intervals and Young/Daly's intervals for persistent\n"
         "  and node-local saves (docs/checkpoints.md); --json prints one JSON object). The\n"
         "  plan names what limits the step; --suggest adds the layouts (tp, pp, dp auto) of\n"
         "  these GPUs that fit, ranked by predicted tokens/s/GPU; --explain prints the\n"
         "  predicted step by op class (GEMMs, attention, memory-bound passes, loss, optimizer),\n"
         "  by where it runs (layers, LM head, embedding), per stage, and the communication it\n"
         "  waits for\n"
         "\n"
         "       trainer export-hf --checkpoint STEP_DIR --out DIR [--dtype bf16|fp32]\n"
         "               [--tokenizer tokenizer.json] [--max-shard-gib G]\n"
         "  writes a committed checkpoint as a Hugging Face model directory (config.json,\n"
         "  generation_config.json, model.safetensors, or shards of at most G GiB (default 5)\n"
         "  with model.safetensors.index.json, and the tokenizer files) that transformers loads\n"
         "  with from_pretrained; DIR must not exist or be empty. Start a run from such a\n"
         "  directory with model.init_from: DIR.\n";
}

namespace {

using absl::InvalidArgumentError;
using absl::Status;

Status positive_int(std::string_view flag, const std::string& v, int* out) {
  if (!absl::SimpleAtoi(v, out) || *out < 1)
    return InvalidArgumentError(
        absl::StrCat(std::string(flag), " '", v, "' is not a positive integer"));
  return absl::OkStatus();
}

// Which command takes a flag: any (the training run's flags; plan and export-hf read them too),
// or only `trainer plan` or `trainer export-hf`.
enum class Cmd { any, plan, export_hf };

// One flag: its command, and what it sets: a switch (no value), a string (--flag V or
// --flag=V), or through `set`, which checks the value.
struct Flag {
  std::string_view name;
  Cmd cmd;
  bool CliOptions::*on = nullptr;
  std::string CliOptions::*text = nullptr;
  Status (*set)(CliOptions& o, const std::string& value) = nullptr;
  bool takes_value() const { return on == nullptr; }
};

Status set_resume(CliOptions& o, const std::string& v) {
  if (v.empty()) return InvalidArgumentError("--resume needs auto, none or a checkpoint path");
  o.resume = v;
  return Status();
}
Status add_set(CliOptions& o, const std::string& v) {
  o.sets.push_back(v);  // --set=a.b=c keeps everything after the first '='
  return Status();
}
Status add_hardware(CliOptions& o, const std::string& v) {
  o.hardware.push_back(v);
  return Status();
}
Status set_world(CliOptions& o, const std::string& v) {
  return positive_int("--world", v, &o.world);
}
Status set_gpu(CliOptions& o, const std::string& v) {
  o.gpu = v;
  o.gpu_given = true;
  return Status();
}
Status set_nodes(CliOptions& o, const std::string& v) {
  return positive_int("--nodes", v, &o.nodes);
}
Status set_gpus_per_node(CliOptions& o, const std::string& v) {
  o.gpu_given = true;
  return positive_int("--gpus-per-node", v, &o.gpus_per_node);
}
Status set_mtbf_hours(CliOptions& o, const std::string& v) {
  if (!absl::SimpleAtod(v, &o.mtbf_hours) || !(o.mtbf_hours > 0))
    return InvalidArgumentError(absl::StrCat("--mtbf-hours '", v,
                                             "' is not a positive number of hours (one node's "
                                             "mean time between failures)"));
  return Status();
}
Status set_dtype(CliOptions& o, const std::string& v) {
  if (v != "bf16" && v != "fp32")
    return InvalidArgumentError(absl::StrCat("--dtype '", v, "' is not one of bf16, fp32"));
  o.dtype = v;
  return Status();
}
Status set_max_shard_gib(CliOptions& o, const std::string& v) {
  if (!absl::SimpleAtod(v, &o.max_shard_gib) || !(o.max_shard_gib > 0))
    return InvalidArgumentError(absl::StrCat("--max-shard-gib '", v, "' is not a positive number"));
  return Status();
}

// Every flag of every command.
const Flag kFlags[] = {
    {"--help", Cmd::any, &CliOptions::help},
    {"-h", Cmd::any, &CliOptions::help},
    {"--version", Cmd::any, &CliOptions::version},
    {"--help-config", Cmd::any, &CliOptions::help_config},
    {"--help-switches", Cmd::any, &CliOptions::help_switches},
    {"--help-metrics", Cmd::any, &CliOptions::help_metrics},
    {"--dry-run", Cmd::any, &CliOptions::dry_run},
    {"--force", Cmd::any, &CliOptions::force},
    {"--config", Cmd::any, nullptr, &CliOptions::config},
    {"--set", Cmd::any, nullptr, nullptr, add_set},
    {"--resume", Cmd::any, nullptr, nullptr, set_resume},
    {"--json", Cmd::plan, &CliOptions::json},
    {"--suggest", Cmd::plan, &CliOptions::suggest},
    {"--explain", Cmd::plan, &CliOptions::explain},
    {"--hardware", Cmd::plan, nullptr, nullptr, add_hardware},
    {"--world", Cmd::any, nullptr, nullptr, set_world},
    {"--gpu", Cmd::any, nullptr, nullptr, set_gpu},
    {"--nodes", Cmd::plan, nullptr, nullptr, set_nodes},
    {"--gpus-per-node", Cmd::any, nullptr, nullptr, set_gpus_per_node},
    {"--mtbf-hours", Cmd::plan, nullptr, nullptr, set_mtbf_hours},
    {"--checkpoint", Cmd::export_hf, nullptr, &CliOptions::checkpoint},
    {"--out", Cmd::export_hf, nullptr, &CliOptions::out},
    {"--tokenizer", Cmd::export_hf, nullptr, &CliOptions::tokenizer},
    {"--dtype", Cmd::export_hf, nullptr, nullptr, set_dtype},
    {"--max-shard-gib", Cmd::export_hf, nullptr, nullptr, set_max_shard_gib},
};

// Whether `flag` may be given to the command `o` is.
bool accepts(const CliOptions& o, const Flag& flag) {
  return flag.cmd == Cmd::any || (flag.cmd == Cmd::plan && o.plan) ||
         (flag.cmd == Cmd::export_hf && o.export_hf);
}

}  // namespace

absl::StatusOr<CliOptions> parse_cli(int argc, char** argv) {
  CliOptions o;
  int i = 1;
  if (argc > 1 && std::string_view(argv[1]) == "plan") {
    o.plan = true;
    ++i;
  } else if (argc > 1 && std::string_view(argv[1]) == "export-hf") {
    o.export_hf = true;
    ++i;
  }
  for (; i < argc; ++i) {
    const std::string_view a = argv[i];
    const size_t eq = a.find('=');
    const std::string_view name = a.substr(0, eq);
    const Flag* flag = nullptr;
    for (const Flag& f : kFlags)
      if (f.name == name && accepts(o, f) && (f.takes_value() || eq == std::string_view::npos))
        flag = &f;
    if (flag == nullptr)
      return InvalidArgumentError(
          absl::StrCat("unknown argument '", std::string(a), "'; see --help"));
    if (!flag->takes_value()) {
      o.*(flag->on) = true;
      continue;
    }
    std::string value;
    if (eq != std::string_view::npos) {
      value = std::string(a.substr(eq + 1));
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return InvalidArgumentError(
          absl::StrCat(std::string(flag->name), " needs a value; see --help"));
    }
    if (flag->text != nullptr) {
      o.*(flag->text) = value;
    } else if (Status st = flag->set(o, value); !st.ok()) {
      return st;
    }
  }
  if (o.export_hf && !o.help) {
    if (o.checkpoint.empty() || o.out.empty())
      return InvalidArgumentError(
          "export-hf needs --checkpoint STEP_DIR and --out DIR; see --help");
    return o;
  }
  if (!o.help && !o.version && !o.help_config && !o.help_switches && !o.help_metrics &&
      o.config.empty())
    return InvalidArgumentError("--config FILE is required; see --help");
  if (o.plan && o.suggest && o.json)
    return InvalidArgumentError("--suggest prints a table; give it without --json");
  if (o.plan && o.explain && o.json)
    return InvalidArgumentError(
        "--explain prints a table; give it without --json (the JSON holds the same numbers "
        "under \"compute\")");
  if (o.plan && o.world > 0)
    return InvalidArgumentError("trainer plan counts GPUs with --nodes and --gpus-per-node");
  if (!o.plan && o.world > 0 && !o.dry_run)
    return InvalidArgumentError(
        "--world N checks a job of N ranks without launching them; give it with --dry-run");
  if (!o.plan && o.world == 0 && o.gpu_given)
    return InvalidArgumentError(
        "--gpu and --gpus-per-node go with --dry-run --world N (or with trainer plan)");
  return o;
}

}  // namespace tr
