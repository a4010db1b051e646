#include "trainer/cli.h"

#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tr {

std::string usage() {
  return "usage: trainer --config FILE [--set section.key=value ...] [--resume auto|none|PATH]\n"
         "               [--force] [--dry-run] [--help-config] [--help-switches]\n"
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
         "  --help-config     print every config key with its type, default and meaning\n"
         "  --help-switches   print the TR_* debug and bisect switches (docs/debug.md)\n"
         "\n"
         "       trainer plan --config FILE [--set K=V ...] [--gpu h100|h200|b200|b300]\n"
         "               [--nodes N] [--gpus-per-node G] [--hardware FILE] [--json]\n"
         "  per-GPU memory, FLOPs per token, pipeline bubble, communication per step and a\n"
         "  predicted step time, tokens/s/GPU and MFU, without a GPU (defaults: h100, 1 node,\n"
         "  8 GPUs per node; FILE overrides the GPU's numbers: peak_bf16_tflops, memory_gib,\n"
         "  hbm_tbps, nvlink_gbps, network_gbps, gemm_efficiency; --json prints one JSON object)\n"
         "\n"
         "       trainer export-hf --checkpoint STEP_DIR --out DIR [--dtype bf16|fp32]\n"
         "               [--tokenizer tokenizer.json] [--max-shard-gib G]\n"
         "  writes a committed checkpoint as a Hugging Face model directory (config.json,\n"
         "  generation_config.json, model.safetensors, or shards of at most G GiB (default 5)\n"
         "  with model.safetensors.index.json, and the tokenizer files) that transformers loads\n"
         "  with from_pretrained; DIR must not exist or be empty. Start a run from such a\n"
         "  directory with model.init_from: DIR.\n";
}

absl::StatusOr<CliOptions> parse_cli(int argc, char** argv) {
  CliOptions o;
  int first = 1;
  if (argc > 1 && std::string_view(argv[1]) == "plan") {
    o.plan = true;
    first = 2;
  } else if (argc > 1 && std::string_view(argv[1]) == "export-hf") {
    o.export_hf = true;
    first = 2;
  }
  auto count = [](std::string_view flag, const std::string& v) -> absl::StatusOr<int> {
    int n = 0;
    if (!absl::SimpleAtoi(v, &n) || n < 1)
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(flag), " '", v, "' is not a positive integer"));
    return n;
  };
  for (int i = first; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&](std::string_view flag) -> absl::StatusOr<std::string> {
      if (size_t eq = a.find('='); eq != std::string_view::npos)
        return std::string(a.substr(eq + 1));
      if (i + 1 >= argc)
        return absl::InvalidArgumentError(
            absl::StrCat(std::string(flag), " needs a value; see --help"));
      return std::string(argv[++i]);
    };
    auto is = [&](std::string_view flag) {
      return a == flag || a.starts_with(absl::StrCat(std::string(flag), "="));
    };
    if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (a == "--help-config") {
      o.help_config = true;
    } else if (a == "--help-switches") {
      o.help_switches = true;
    } else if (a == "--dry-run") {
      o.dry_run = true;
    } else if (a == "--force") {
      o.force = true;
    } else if (is("--config")) {
      absl::StatusOr<std::string> v = value("--config");
      if (!v.ok()) return v.status();
      o.config = *v;
    } else if (is("--set")) {
      // --set=a.b=c keeps everything after the first '=' as the assignment.
      std::string v;
      if (a.starts_with("--set=")) {
        v = std::string(a.substr(6));
      } else {
        absl::StatusOr<std::string> n = value("--set");
        if (!n.ok()) return n.status();
        v = *n;
      }
      o.sets.push_back(v);
    } else if (o.plan && a == "--json") {
      o.json = true;
    } else if (o.plan && is("--hardware")) {
      absl::StatusOr<std::string> v = value("--hardware");
      if (!v.ok()) return v.status();
      o.hardware = *v;
    } else if (o.plan && (is("--gpu") || is("--nodes") || is("--gpus-per-node"))) {
      const std::string_view flag = is("--gpu")     ? "--gpu"
                                    : is("--nodes") ? "--nodes"
                                                    : "--gpus-per-node";
      absl::StatusOr<std::string> v = value(flag);
      if (!v.ok()) return v.status();
      if (flag == "--gpu") {
        o.gpu = *v;
      } else {
        absl::StatusOr<int> n = count(flag, *v);
        if (!n.ok()) return n.status();
        (flag == "--nodes" ? o.nodes : o.gpus_per_node) = *n;
      }
    } else if (o.export_hf && (is("--checkpoint") || is("--out") || is("--dtype") ||
                               is("--tokenizer") || is("--max-shard-gib"))) {
      const std::string_view flag = a.substr(0, a.find('='));
      absl::StatusOr<std::string> v = value(flag);
      if (!v.ok()) return v.status();
      if (flag == "--checkpoint") {
        o.checkpoint = *v;
      } else if (flag == "--out") {
        o.out = *v;
      } else if (flag == "--tokenizer") {
        o.tokenizer = *v;
      } else if (flag == "--dtype") {
        if (*v != "bf16" && *v != "fp32")
          return absl::InvalidArgumentError(
              absl::StrCat("--dtype '", *v, "' is not one of bf16, fp32"));
        o.dtype = *v;
      } else if (!absl::SimpleAtod(*v, &o.max_shard_gib) || !(o.max_shard_gib > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--max-shard-gib '", *v, "' is not a positive number"));
      }
    } else if (is("--resume")) {
      absl::StatusOr<std::string> v = value("--resume");
      if (!v.ok()) return v.status();
      if (v->empty())
        return absl::InvalidArgumentError("--resume needs auto, none or a checkpoint path");
      o.resume = *v;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown argument '", std::string(a), "'; see --help"));
    }
  }
  if (o.export_hf && !o.help) {
    if (o.checkpoint.empty() || o.out.empty())
      return absl::InvalidArgumentError(
          "export-hf needs --checkpoint STEP_DIR and --out DIR; see --help");
    return o;
  }
  if (!o.help && !o.help_config && !o.help_switches && o.config.empty())
    return absl::InvalidArgumentError("--config FILE is required; see --help");
  return o;
}

}  // namespace tr
