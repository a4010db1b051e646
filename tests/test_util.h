// Helpers shared by the integration tests: temp dirs, running the binaries, small datasets.
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "core/switches.h"

namespace tr::test {

// Where the tests find the project's files and programs. Found at run time, never baked in at
// configure time, so that a build moved elsewhere (tools/gpu_pack.sh's pack, unpacked on a GPU
// machine beside another checkout) runs as it does in place:
//   build_dir():  the build the running test belongs to; tests live in <build>/tests/;
//   source_dir(): TR_SOURCE_DIR, else the nearest directory above the test executable that
//                 holds configs/tiny.yaml and tests/fixtures/ (the checkout, from build/tests/
//                 or from build-packed/tests/), else, for a build outside the checkout, the
//                 checkout CMake configured it from (TR_SOURCE_DIR_CONFIGURED) if it is there;
//   the programs: where CMake lays them out in a build (<build>/trainer/trainer,
//                 <build>/tools/prepare_data, <build>/tools/preflight);
//   python3 and mpiexec: what CMake found (TR_PYTHON_FOUND, TR_MPIEXEC_FOUND) where that file
//                 exists, else the first on PATH.
inline const std::filesystem::path& build_dir() {
  static const std::filesystem::path dir =
      std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path();
  return dir;
}

inline const std::string& source_dir() {
  static const std::string dir = [] {
    if (std::string set = setting(Setting::test_source_dir); !set.empty()) return set;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe");
    auto is_checkout = [](const std::filesystem::path& d) {
      std::error_code ec;
      return std::filesystem::exists(d / "configs/tiny.yaml", ec) &&
             std::filesystem::is_directory(d / "tests/fixtures", ec);
    };
    for (std::filesystem::path d = exe.parent_path(); d != d.parent_path(); d = d.parent_path())
      if (is_checkout(d)) return d.string();
#ifdef TR_SOURCE_DIR_CONFIGURED
    if (is_checkout(TR_SOURCE_DIR_CONFIGURED)) return std::string(TR_SOURCE_DIR_CONFIGURED);
#endif
    std::fprintf(stderr, "test: no source tree (configs/tiny.yaml) above %s; set TR_SOURCE_DIR\n",
                 exe.c_str());
    std::exit(2);
  }();
  return dir;
}

inline const std::string& trainer_bin() {
  static const std::string bin = (build_dir() / "trainer/trainer").string();
  return bin;
}
inline const std::string& prepare_data_bin() {
  static const std::string bin = (build_dir() / "tools/prepare_data").string();
  return bin;
}
inline const std::string& preflight_bin() {
  static const std::string bin = (build_dir() / "tools/preflight").string();
  return bin;
}

// `found` if that file exists, else the first of `names` on PATH, else `found` (whose failure to
// start then names it).
inline std::string program(const std::string& found, std::initializer_list<const char*> names) {
  std::error_code ec;
  if (std::filesystem::exists(found, ec)) return found;
  const std::string path = launcher_env("PATH").value_or("/usr/bin:/bin");
  for (const char* name : names)
    for (size_t at = 0; at <= path.size();) {
      const size_t end = std::min(path.find(':', at), path.size());
      const std::filesystem::path candidate =
          std::filesystem::path(path.substr(at, end - at)) / name;
      if (end > at && std::filesystem::exists(candidate, ec)) return candidate.string();
      at = end + 1;
    }
  return found;
}

inline const std::string& python_bin() {
  static const std::string bin = program(TR_PYTHON_FOUND, {"python3"});
  return bin;
}

// mpiexec with the flags every multi-rank test launch uses, ending in the rank-count flag:
// append " N program ...".
inline const std::string& mpirun() {
  static const std::string cmd =
      program(TR_MPIEXEC_FOUND, {"mpiexec", "mpirun", "mpiexec.openmpi"}) +
      " --oversubscribe --allow-run-as-root -n";
  return cmd;
}

// ‖a − b‖ / ‖b‖ over n elements: the relative error every numeric test bounds (STYLE.md).
// NaN when b is all zeros, so that no bound passes by accident.
template <class A, class B>
double rel_err(const A* a, const B* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  // A zero reference (an expert no token chose) is matched by zeros only.
  return den > 0 ? std::sqrt(num / den) : num == 0 ? 0.0 : std::nan("");
}
template <class A, class B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
  return a.size() == b.size() ? rel_err(a.data(), b.data(), a.size()) : std::nan("");
}

// A fresh directory under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "trtest-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

struct CmdResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line, capturing its combined output.
inline CmdResult run_cmd(const std::string& cmd) {
  CmdResult r;
  std::FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = pclose(p);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc | std::ios::binary);
  f << text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  return lines;
}

}  // namespace tr::test
