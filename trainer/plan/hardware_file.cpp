#include "trainer/plan/hardware_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string_view>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/fs_io.h"
#include "trainer/config/config_fields.h"
#include "trainer/plan/collectives.h"
#include "yaml-cpp/yaml.h"

namespace tr {
namespace {

using V = HardwareValues;

// The ranges are wide (a CPU's measurements against a GPU's ceilings lie near their bottoms)
// but finite: with every key inside them, the plan's times and rates stay finite.
constexpr HardwareKey kKeys[] = {
    {"peak_bf16_tflops", 1e12, 1e-3, 1e5, false, false,
     [](V& v) -> double& { return v.gpu.peak_bf16_flops; }},
    {"memory_gib", kGiB, 1e-3, 1e6, false, false,
     [](V& v) -> double& { return v.gpu.memory_bytes; }},
    {"hbm_tbps", 1e12, 1e-6, 1e3, false, false, [](V& v) -> double& { return v.gpu.hbm_bw; }},
    {"nvlink_gbps", 1e9, 1e-6, 1e6, false, false, [](V& v) -> double& { return v.gpu.nvlink_bw; }},
    {"network_gbps", 1e9, 1e-6, 1e6, false, false,
     [](V& v) -> double& { return v.gpu.network_bw; }},
    {"gemm_tflops", 1e12, 1e-6, 1e5, false, false,
     [](V& v) -> double& { return v.gpu.gemm_flops; }},
    {"peak_fp8_tflops", 1e12, 0, 1e5, false, false,
     [](V& v) -> double& { return v.gpu.peak_fp8_flops; }},
    {"gemm_fp8_tflops", 1e12, 0, 1e5, false, false,
     [](V& v) -> double& { return v.gpu.gemm_fp8_flops; }},
    {"memory_gbps", 1e9, 1e-6, 1e6, false, false, [](V& v) -> double& { return v.gpu.copy_bw; }},
    {"node_latency_us", 1e-6, 1e-3, 1e7, false, false,
     [](V& v) -> double& { return v.gpu.nvlink_latency; }},
    {"network_latency_us", 1e-6, 1e-3, 1e7, false, false,
     [](V& v) -> double& { return v.network_smallest; }},
    {"network_hop_latency_us", 1e-6, 1e-3, 1e7, false, false,
     [](V& v) -> double& { return v.gpu.network_hop_latency; }},
    {"attention_fwd_hd64", 1, 1e-9, 1, false, false,
     [](V& v) -> double& { return v.gpu.attention_fwd_hd64; }},
    {"attention_bwd_hd64", 1, 1e-9, 1, false, false,
     [](V& v) -> double& { return v.gpu.attention_bwd_hd64; }},
    {"attention_fwd_hd128", 1, 1e-9, 1, false, false,
     [](V& v) -> double& { return v.gpu.attention_fwd_hd128; }},
    {"attention_bwd_hd128", 1, 1e-9, 1, false, false,
     [](V& v) -> double& { return v.gpu.attention_bwd_hd128; }},
    {"stream_fraction", 1, 1e-9, 1, false, false,
     [](V& v) -> double& { return v.gpu.stream_fraction; }},
    {"gemm_fill", 1, 1, 1e6, false, false, [](V& v) -> double& { return v.gpu.gemm_fill; }},
    {"host_copy_gbps", 1e9, 1e-6, 1e6, false, false,
     [](V& v) -> double& { return v.storage.host_copy_bw; }},
    {"local_disk_gbps", 1e9, 1e-6, 1e6, false, false,
     [](V& v) -> double& { return v.storage.local_disk_bw; }},
    {"storage_gbps", 1e9, 1e-6, 1e6, false, false,
     [](V& v) -> double& { return v.storage.storage_bw; }},
    {"restart_s", 1, 1e-3, 1e8, false, false, [](V& v) -> double& { return v.storage.restart_s; }},
    // preflight --json's: the links' all-reduce bus bandwidths stand in for the table's per-GPU
    // bandwidths; gemm_n is the size the GEMM ceiling was measured at, network_nodes the nodes
    // network_latency_us was measured across.
    {"node_busbw_gbps", 1e9, 1e-6, 1e6, false, true,
     [](V& v) -> double& { return v.gpu.nvlink_bw; }},
    {"network_busbw_gbps", 1e9, 1e-6, 1e6, false, true,
     [](V& v) -> double& { return v.gpu.network_bw; }},
    {"gemm_n", 1, 1, 1e6, true, true, [](V& v) -> double& { return v.gemm_n; }},
    {"network_nodes", 1, 2, 1e6, true, true, [](V& v) -> double& { return v.network_nodes; }},
};

// Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF) without C0
// control characters or DEL: text that prints on one line and that JSON can carry.
bool printable_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
    if (c < 0x80) {
      ++i;
      continue;
    }
    const int n = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc2 ? 1 : 0;
    if (n == 0 || c > 0xf4 || i + n >= s.size()) return false;
    uint32_t cp = c & (0x3f >> n);
    for (int k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xc0) != 0x80) return false;
      cp = cp << 6 | (b & 0x3f);
    }
    const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

// "--hardware PATH: MESSAGE" as an input error.
absl::Status file_error(const std::string& path, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("--hardware ", path, ": ", message));
}

// The file's text: refused unless a regular file that reads whole (a directory, a FIFO or a
// device would fail, or block, inside the YAML reader).
absl::StatusOr<std::string> read_hardware_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return file_error(path, absl::StrCat("cannot open (", std::strerror(errno), ")"));
  if (!S_ISREG(st.st_mode)) return file_error(path, "not a regular file");
  absl::StatusOr<std::string> text = fs::read_file(path);
  if (!text.ok()) return file_error(path, text.status().message());
  return text;
}

std::string key_list(bool measured) {
  std::vector<std::string> n;
  for (const HardwareKey& k : kKeys)
    if (k.measured == measured) n.emplace_back(k.name);
  return absl::StrJoin(n, ", ");
}

// The key named `name`, or the error naming it with the nearest known key (else all of them).
absl::StatusOr<const HardwareKey*> key_named(const std::string& path, const std::string& name) {
  std::vector<std::string> known = {"name", "measured_by"};
  for (const HardwareKey& k : kKeys) {
    if (name == k.name) return &k;
    known.emplace_back(k.name);
  }
  std::string hint = config_detail::suggest(name, known);
  if (hint.empty())
    hint = absl::StrCat("; known: name, measured_by, ", key_list(false),
                        ", and preflight --json's ", key_list(true));
  return file_error(path, absl::StrCat("unknown key '", absl::CHexEscape(name), "'", hint));
}

// One key's value, read as the config's numbers are (a number within the key's range; whole
// keys a whole one); sets it and records which key set the number.
absl::Status set_value(const std::string& path, const HardwareKey& k, const YAML::Node& node, V& v,
                       std::map<const double*, std::string>& set_by) {
  double* target = &k.at(v);
  if (auto [it, fresh] = set_by.emplace(target, k.name); !fresh)
    return file_error(
        path, absl::StrCat(it->second, " and ", k.name, " set the same number; give one of them"));
  double x = 0;
  const config_detail::ValueSpec spec{config_detail::Kind::Float, k.min, k.max};
  if (absl::Status st = config_detail::parse_value(spec, k.name, node, &x); !st.ok())
    return file_error(path, st.message());
  if (k.whole && x != std::floor(x))
    return file_error(
        path, absl::StrCat(k.name, " must be a whole number in [", config_detail::fmt_double(k.min),
                           ", ", config_detail::fmt_double(k.max), "] (got ",
                           config_detail::fmt_double(x), ")"));
  *target = x * k.unit;
  return absl::OkStatus();
}

// The checks between keys, once the file's keys are read.
absl::Status check_together(const std::string& path, V& v, const std::string& table_name,
                            const std::string& measured_by,
                            std::map<const double*, std::string>& set_by) {
  const GpuSpec& g = v.gpu;
  // A preflight file describes the GPU type it ran on: planning another with it would mix them.
  if (!measured_by.empty() && g.name != table_name)
    return file_error(path, absl::StrCat("measured on ", g.name, ", but the plan is for ",
                                         table_name, "; pass --gpu ", g.name,
                                         " (or remove its name to apply the numbers anyway)"));
  if (v.gemm_n != 0 && v.gemm_n != 8192)
    return file_error(path, absl::StrCat("gemm_tflops was measured at ", v.gemm_n,
                                         "^3; the GEMM ceiling is for 8192^3 (preflight --gemm "
                                         "8192)"));
  // A GEMM above the peak would predict an MFU above 1.
  if (g.gemm_flops > g.peak_bf16_flops)
    return file_error(path, absl::StrFormat("gemm_tflops %g is above peak_bf16_tflops %g; a GEMM "
                                            "reaches at most the peak",
                                            g.gemm_flops / 1e12, g.peak_bf16_flops / 1e12));
  if (set_by.count(&v.network_nodes) != 0 && v.network_smallest == 0)
    return file_error(path,
                      "network_nodes is the nodes network_latency_us was measured across; give "
                      "both, or neither");
  if (v.network_smallest > 0)
    set_network_latency(v.gpu, v.network_smallest, static_cast<int>(v.network_nodes));
  return absl::OkStatus();
}

}  // namespace

std::span<const HardwareKey> hardware_keys() {
  return kKeys;
}

absl::StatusOr<GpuSpec> override_gpu_spec(GpuSpec base, const std::string& path,
                                          StorageSpec* storage) {
  V v;
  v.gpu = std::move(base);
  if (storage != nullptr) v.storage = *storage;
  absl::StatusOr<std::string> text = read_hardware_file(path);
  if (!text.ok()) return text.status();
  YAML::Node root;
  try {
    root = YAML::Load(*text);
  } catch (const YAML::Exception& e) {
    return file_error(path, absl::StrCat("cannot read YAML (", absl::CHexEscape(e.what()), ")"));
  }
  if (!root.IsMap())
    return file_error(path, "expected a mapping of keys to values, e.g. gemm_tflops: 700");
  // Every key a plain name, none twice.
  if (absl::Status st = config_detail::map_keys(root, absl::StrCat("--hardware ", path)).status();
      !st.ok())
    return st;
  const std::string table_name = v.gpu.name;
  std::string measured_by;
  std::map<const double*, std::string> set_by;  // each number set by one key only
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& value = kv.second;
    if (key == "name" || key == "measured_by") {
      const std::string text = value.IsScalar() ? value.Scalar() : "";
      if (!value.IsScalar() || !printable_utf8(text))
        return file_error(path,
                          absl::StrCat(key, " must be UTF-8 text without control characters"));
      (key == "name" ? v.gpu.name : measured_by) = text;
      continue;
    }
    absl::StatusOr<const HardwareKey*> k = key_named(path, key);
    if (!k.ok()) return k.status();
    if (absl::Status st = set_value(path, **k, value, v, set_by); !st.ok()) return st;
  }
  if (absl::Status st = check_together(path, v, table_name, measured_by, set_by); !st.ok())
    return st;
  if (storage != nullptr) *storage = v.storage;
  return v.gpu;
}

}  // namespace tr
