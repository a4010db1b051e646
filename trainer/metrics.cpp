#include "trainer/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tr {

namespace fs = std::filesystem;

namespace {

std::string utc_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

}  // namespace

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
  path_ = (fs::path(dir) / "metrics.jsonl").string();
  const bool exists = fs::exists(path_) && fs::file_size(path_, ec) > 0;
  if (exists && resume_step == 0) {
    // A fresh run: the earlier run's file is kept under a name of its own, never replaced.
    const std::string stamp = fs::path(path_).string() + "." + utc_stamp();
    std::string aside = stamp;
    for (int n = 2; fs::exists(aside); ++n) aside = absl::StrCat(stamp, "-", n);
    fs::rename(path_, aside, ec);
    if (ec)
      return absl::InvalidArgumentError(
          absl::StrCat("cannot move ", path_, " aside to ", aside, ": ", ec.message()));
  }
  f_ = std::fopen(path_.c_str(), "a");
  if (!f_) return absl::InvalidArgumentError(absl::StrCat("cannot open ", path_, " for writing"));
  if (exists && resume_step > 0) {
    // Appended, never rewritten: a line cut short by a crash is ended here, and the resume line
    // tells readers that the lines of later steps before it are superseded.
    std::ifstream in(path_, std::ios::binary | std::ios::ate);
    char last = '\n';
    if (in && in.tellg() > 0) {
      in.seekg(-1, std::ios::end);
      in.get(last);
    }
    if (last != '\n') write_line("");
    write_line(nlohmann::json{{"event", "resume"}, {"step", resume_step}}.dump());
  }
  return absl::OkStatus();
}

void MetricsLog::write_line(const std::string& line) {
  if (f_ == nullptr) return;
  const bool ok = std::fprintf(f_, "%s\n", line.c_str()) >= 0 && std::fflush(f_) == 0;
  if (ok || failed_) return;
  failed_ = true;
  std::fprintf(stderr,
               "warning: cannot write %s (%s): metrics are being lost; training goes on and the "
               "run exits 1 at its end\n",
               path_.c_str(), std::strerror(errno));
  std::fflush(stderr);
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
  write_line(j.dump());
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
  write_line(j.dump());
  std::printf("eval step %lld | val_loss %.4f | %.2fs\n", static_cast<long long>(step), val_loss,
              seconds);
  std::fflush(stdout);
}

void MetricsLog::note(const std::string& fields) {
  write_line(absl::StrCat("{", fields, "}"));
}

}  // namespace tr
