// The command line: trainer --config FILE [--set section.key=value ...] [--resume auto|none|PATH]
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/exit_codes.h"

namespace tr {

struct CliOptions {
  std::string config;             // --config FILE
  std::vector<std::string> sets;  // --set section.key=value, in order
  std::string resume = "auto";    // --resume auto | none | PATH
  bool dry_run = false;           // --dry-run: validate, print the plan, exit
  // --dry-run --world N [--gpu G] [--gpus-per-node P]: the checks of a run of N ranks on that GPU
  // (config, layout, data, memory by the planner), in one process and without a device.
  int world = 0;
  bool gpu_given = false;  // --gpu or --gpus-per-node given (trainer plan, or with --world)
  // --force: with --resume none, start over in a checkpoint.dir that holds checkpoints (moved
  // aside); on resume, accept a checkpoint written by another run (seeds or data differ).
  bool force = false;
  bool help = false;           // --help
  bool version = false;        // --version: version, build and GPU libraries
  bool help_config = false;    // --help-config: the config reference (docs/config.md)
  bool help_switches = false;  // --help-switches: the debug switches (docs/debug.md)
  bool help_metrics = false;   // --help-metrics: the keys of metrics.jsonl (docs/metrics.md)
  // trainer plan ...: memory, FLOPs, communication and a predicted speed; no GPU needed.
  bool plan = false;
  std::string gpu = "h100";  // --gpu h100|h200|b200|b300
  int nodes = 1;             // --nodes N
  int gpus_per_node = 8;     // --gpus-per-node G
  // --hardware FILE, repeatable: YAML overrides of the GPU's numbers, each file over the last.
  std::vector<std::string> hardware;
  bool json = false;      // --json: the plan as one JSON object
  bool suggest = false;   // --suggest: the layouts that fit, ranked by predicted speed
  bool explain = false;   // --explain: the predicted step by op class, stage and part
  double mtbf_hours = 0;  // --mtbf-hours H: a node's mean time between failures (0: none)
  // trainer export-hf --checkpoint DIR --out DIR [--dtype bf16|fp32] [--tokenizer FILE]
  //                   [--max-shard-gib G]: a checkpoint as a Hugging Face model directory.
  bool export_hf = false;
  std::string checkpoint, out, dtype = "bf16", tokenizer;
  double max_shard_gib = 5;
};

absl::StatusOr<CliOptions> parse_cli(int argc, char** argv);
std::string usage();

}  // namespace tr
