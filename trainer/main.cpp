// trainer: one binary, one YAML config. See README.md and docs/config.md.
#include <cstdio>

#include "core/switches.h"
#include "trainer/config/cli.h"
#include "trainer/config/config.h"
#include "trainer/obs/metrics.h"
#include "trainer/obs/version.h"
#include "trainer/run/run.h"

int main(int argc, char** argv) {
  if (const absl::Status s = tr::validate_switches(); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return tr::kExitBadInput;
  }
  absl::StatusOr<tr::CliOptions> opts = tr::parse_cli(argc, argv);
  if (!opts.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(opts.status().message()).c_str());
    return tr::kExitBadInput;
  }
  if (opts->help) {
    std::fputs(tr::usage().c_str(), stdout);
    return tr::kExitOk;
  }
  if (opts->version) {
    std::fputs(tr::version_text().c_str(), stdout);
    return tr::kExitOk;
  }
  if (opts->help_config) {
    std::fputs(tr::config_docs_markdown().c_str(), stdout);
    return tr::kExitOk;
  }
  if (opts->help_metrics) {
    std::fputs(tr::metrics_docs_markdown().c_str(), stdout);
    return tr::kExitOk;
  }
  if (opts->help_switches) {
    std::fputs(tr::switch_docs_markdown().c_str(), stdout);
    return tr::kExitOk;
  }
  if (opts->plan) return tr::run_plan(*opts);
  if (opts->export_hf) return tr::run_export_hf(*opts);
  return tr::run(*opts);
}
