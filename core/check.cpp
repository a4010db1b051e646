#include "core/check.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/fs_io.h"

namespace tr {
namespace {
int g_rank = -1;
AbortHook g_abort_hook = nullptr;
constexpr int kMaxCleanups = 8;
CleanupHook g_cleanups[kMaxCleanups] = {};
int g_num_cleanups = 0;

void run_cleanups() {
  for (int i = 0; i < g_num_cleanups; ++i) g_cleanups[i]();
}
}  // namespace

void add_fatal_cleanup(CleanupHook hook) {
  for (int i = 0; i < g_num_cleanups; ++i)
    if (g_cleanups[i] == hook) return;
  if (g_num_cleanups < kMaxCleanups) g_cleanups[g_num_cleanups++] = hook;
}

void set_error_rank(int rank) {
  g_rank = rank;
}
void set_abort_hook(AbortHook hook) {
  g_abort_hook = hook;
}

namespace {
std::string where() {
  return "[rank " + std::to_string(g_rank) + " host " + fs::host_name() + "]";
}
}  // namespace

void end_job(int exit_code, const std::string& line) {
  std::fprintf(stderr, "%s error: %s\n", where().c_str(), line.c_str());
  std::fflush(stderr);
  run_cleanups();
  if (g_abort_hook) g_abort_hook(exit_code);
  std::_Exit(exit_code);
}

void fatal_error(const char* kind, const char* expr, const std::string& detail, const char* file,
                 int line) {
  std::fprintf(stderr, "%s FATAL %s: `%s` failed: %s (%s:%d)\n", where().c_str(), kind, expr,
               detail.c_str(), file, line);
  std::fflush(stderr);
  run_cleanups();
  if (g_abort_hook) g_abort_hook(1);
  std::abort();
}

}  // namespace tr
