#include "kernels/core/check.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace tr {
namespace {
int g_rank = -1;
AbortHook g_abort_hook = nullptr;
}  // namespace

void set_error_rank(int rank) {
  g_rank = rank;
}
void set_abort_hook(AbortHook hook) {
  g_abort_hook = hook;
}

void fatal_error(const char* kind, const char* expr, const std::string& detail, const char* file,
                 int line) {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  std::fprintf(stderr, "[rank %d host %s] FATAL %s: `%s` failed: %s (%s:%d)\n", g_rank, host, kind,
               expr, detail.c_str(), file, line);
  std::fflush(stderr);
  if (g_abort_hook) g_abort_hook(1);
  std::abort();
}

}  // namespace tr
