#include "trainer/metrics.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tr {

namespace fs = std::filesystem;

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%dh%02dm%02ds", t / 3600, t / 60 % 60, t % 60);
  if (t >= 60) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%ds", t);
}

absl::Status MetricsLog::open(const std::string& dir, int64_t resume_step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return absl::InvalidArgumentError(
        absl::StrCat("log.dir '", dir, "' cannot be created: ", ec.message()));
  const fs::path path = fs::path(dir) / "metrics.jsonl";
  if (fs::exists(path)) {
    if (resume_step > 0) {
      // Keep the lines of steps the checkpoint covers; rewrite via a temp file + rename.
      std::ifstream in(path);
      const fs::path tmp = path.string() + ".tmp";
      std::ofstream out(tmp, std::ios::trunc);
      std::string line;
      while (std::getline(in, line)) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        const bool later = !j.is_discarded() && j.is_object() && j.contains("step") &&
                           j["step"].is_number_integer() && j["step"].get<int64_t>() > resume_step;
        if (!later) out << line << "\n";
      }
      out.close();
      fs::rename(tmp, path, ec);
    } else {
      fs::rename(path, path.string() + ".prev", ec);
    }
    if (ec)
      return absl::InvalidArgumentError(
          absl::StrCat("cannot rewrite ", path.string(), ": ", ec.message()));
  }
  f_ = std::fopen(path.c_str(), "a");
  if (!f_)
    return absl::InvalidArgumentError(absl::StrCat("cannot open ", path.string(), " for writing"));
  return absl::OkStatus();
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::step(const StepMetrics& m, bool print) {
  const double tok_s = m.tokens / m.step_time_s;
  const double flops = m.flops_per_token * tok_s;
  const double eta = m.steps_done_here > 0 ? m.elapsed_s / static_cast<double>(m.steps_done_here) *
                                                 static_cast<double>(m.total_steps - m.step)
                                           : 0;
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"tokens_per_s", tok_s},
                      {"tokens_per_s_per_rank", tok_s / m.world},
                      {"step_time_s", m.step_time_s},
                      {"data_wait_s", m.data_wait_s},
                      {"optimizer_s", m.optimizer_s},
                      {"host_syncs", m.host_syncs},
                      {"tflops_per_rank", flops / m.world / 1e12},
                      {"peak_mem_mib", m.peak_mem_mib},
                      {"tokens", m.tokens},
                      {"skipped_steps", m.skipped_total}};
  if (*m.skipped != '\0') j["skipped"] = m.skipped;
  if (m.slowest_rank >= 0) {
    j["slowest_rank"] = m.slowest_rank;
    j["slowest_busy_s"] = m.slowest_busy_s;
    j["median_busy_s"] = m.median_busy_s;
  }
  if (m.peak_flops > 0) j["mfu"] = flops / m.world / m.peak_flops;
  if (m.device_mem_mib > 0) j["device_mem_mib"] = m.device_mem_mib;
  if (*m.attention_bwd != '\0') j["attention_bwd"] = m.attention_bwd;
  if (f_) {
    std::fprintf(f_, "%s\n", j.dump().c_str());
    std::fflush(f_);
  }
  if (!print) return;
  std::string mfu = m.peak_flops > 0
                        ? absl::StrFormat(" | mfu %.1f%%", 100 * flops / m.world / m.peak_flops)
                        : absl::StrFormat(" | %.1f GFLOP/s", flops / 1e9);
  const std::string skipped =
      *m.skipped != '\0' ? absl::StrCat(" | skipped (", m.skipped, ")") : std::string();
  std::printf(
      "step %*lld/%lld | loss %.4f | lr %.3e | grad-norm %.3f | tok/s %.0f%s | step %.3fs | eta "
      "%s%s\n",
      static_cast<int>(std::to_string(m.total_steps).size()), static_cast<long long>(m.step),
      static_cast<long long>(m.total_steps), m.loss, m.lr, m.grad_norm, tok_s, mfu.c_str(),
      m.step_time_s, format_duration(eta).c_str(), skipped.c_str());
  std::fflush(stdout);
}

void MetricsLog::eval(int64_t step, double val_loss, double seconds) {
  nlohmann::json j = {{"step", step}, {"val_loss", val_loss}, {"eval_time_s", seconds}};
  if (f_) {
    std::fprintf(f_, "%s\n", j.dump().c_str());
    std::fflush(f_);
  }
  std::printf("eval step %lld | val_loss %.4f | %.2fs\n", static_cast<long long>(step), val_loss,
              seconds);
  std::fflush(stdout);
}

void MetricsLog::note(const std::string& fields) {
  if (f_) {
    std::fprintf(f_, "{%s}\n", fields.c_str());
    std::fflush(f_);
  }
}

}  // namespace tr
