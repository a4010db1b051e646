// Causal GQA attention through cuDNN's fused scaled-dot-product attention (flash attention),
// built with the cuDNN frontend's graph API. Host code only: the graphs are built once per
// shape and cached; each call binds pointers into our packed layouts, no copies:
//   qkv [T, (nh + 2 nkv) hd] per token (T = batch * seq_len): Q heads, K heads, V heads, so
//       Q is the strided [batch, nh, seq, hd] view (strides seq*W, hd, W, 1; W = row width),
//       K and V the same at column offsets nh*hd and (nh + nkv)*hd;
//   out [T, nh hd]; lse [batch, nh, seq] f32 (cuDNN's softmax statistics, log-sum-exp of the
//       scaled scores) saved for the backward;
//   dqkv ASSIGNED through the same strided views.
// bf16 only (cuDNN's fused attention has no fp32 path). The backward uses cuDNN's
// deterministic algorithm when ctx.deterministic (train.deterministic: two runs give the same
// bits; its workspace grows with seq^2 on cuDNN < 9.25), else the faster one. cuDNN gets a
// workspace of its own, sized by the graphs built. A graph cuDNN cannot build is one line naming
// the cuDNN version, the mode and the shape; a backward that cannot be built in the mode asked
// for falls back to the other mode with one warning line, and the graph says which it is
// (attention_prepare returns it; the trainer logs it per step as attention_bwd).
//
// Block-causal attention (DocStarts) runs the same graphs over ragged batches: each document of
// the rows is an entry of its own, read from element offsets into the same packed tensors
// (attention_docs.h builds them on the device), padding-masked to its length and causal from its
// first row. The documents go in parts of a power-of-two count (kernels/ragged.h), one launch
// each, so no entry is ever empty; a graph's entry length is its part's longest document rounded
// up to a power of two (a handful of graphs per run). cuDNN's statistics are row-major there and
// moved into our lse layout.
#include <cudnn_frontend.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>

#include "core/exit_codes.h"
#include "kernels/cuda/attention_docs.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ragged.h"

#define CUDNN_FE_CHECK(expr)                                                            \
  do {                                                                                  \
    auto _e = (expr);                                                                   \
    if (_e.is_bad())                                                                    \
      ::tr::fatal_error("cuDNN frontend", #expr, _e.get_message(), __FILE__, __LINE__); \
  } while (0)

namespace tr::cuda {
namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// A graph's shape. The model's attention reads the packed qkv rows of `batch` sequences of
// `seq` tokens, causal. Context parallelism's blocks (`blocks`, batch 1) read a query block of
// `seq` tokens [seq, nh, hd] against a key block of `seq_kv` [seq_kv, nkv, hd], contiguous, with
// every key visible or (`causal`, seq == seq_kv) the causal diagonal. With `docs` > 0 the rows
// are a ragged batch of that many entries (documents) instead of `batch` sequences, each of at
// most `doc_len` rows (0: seq, and seq_kv keys).
struct AttnKey {
  int64_t batch, seq, nh, nkv, hd;
  bool backward;
  bool deterministic = true;  // backward only
  bool blocks = false;
  int64_t seq_kv = 0;  // blocks only
  bool causal = true;
  int64_t docs = 0;
  int64_t doc_len = 0;
  auto tie() const {
    return std::tie(batch, seq, nh, nkv, hd, backward, deterministic, blocks, seq_kv, causal, docs,
                    doc_len);
  }
  bool operator<(const AttnKey& o) const { return tie() < o.tie(); }
  int64_t rows() const { return batch * seq; }  // query rows (and key rows unless blocks)
  int64_t kv_rows() const { return blocks ? seq_kv : rows(); }
  // The graph's rows per batch entry: queries, and keys.
  int64_t entry_q() const { return doc_len > 0 ? doc_len : seq; }
  int64_t entry_kv() const { return doc_len > 0 ? doc_len : blocks ? seq_kv : seq; }
  std::string describe() const {
    const std::string heads = std::to_string(nh) + " heads, " + std::to_string(nkv) +
                              " KV heads of " + std::to_string(hd);
    const std::string in_docs = docs > 0 ? " in a ragged batch of " + std::to_string(docs) +
                                               " documents of up to " + std::to_string(entry_q()) +
                                               " tokens"
                                         : "";
    if (blocks)
      return "a block of " + std::to_string(seq) + " queries over " + std::to_string(seq_kv) +
             (causal ? " keys (causal), " : " keys (all visible), ") + heads + in_docs;
    return "batch " + std::to_string(batch) + ", seq " + std::to_string(seq) + ", " + heads +
           in_docs;
  }
};

struct AttnGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  TensorPtr q, k, v, o, stats, dout, dq, dk, dv;
  // A ragged batch's lengths and offsets (RaggedTable), else null.
  TensorPtr len_q, len_kv, off_q, off_k, off_v, off_o, off_stats;
  int64_t workspace = 0;
  bool deterministic = true;  // a backward built with cuDNN's deterministic algorithm
};

class Cudnn {
 public:
  static Cudnn& get() {
    static Cudnn c;
    return c;
  }
  cudnnHandle_t handle() const { return handle_; }
  // The graph of `key`, built on first use. A backward cuDNN cannot build in the mode asked for
  // falls back to the other mode (a warning, once per shape); a graph that cannot be built at
  // all ends the run with one line.
  const AttnGraph& graph(const AttnKey& key);
  // cuDNN's workspace for work on `stream`, grown to the largest graph built so far (the
  // deterministic backward needs O(batch * heads * seq^2) bytes: ~450 MiB for 0.5B at seq 4096).
  // The model prepares its one shape (training and evaluation share it) before the first step,
  // so it grows only then. A growth waits for the stream that last used the old buffer (attention
  // runs on one stream; NCCL's side stream never touches it), not for the whole device, and
  // counts as a host sync.
  void* workspace(int64_t bytes, cudaStream_t stream) { return workspace_.get(bytes, stream); }
  // Block-causal attention's ragged table of `slots` entries, the documents' first rows (up to
  // `rows` + 1) and row-major statistics of `rows` rows of nh heads, in memory of their own
  // grown the same way (the table is rebuilt by every call, so one region serves them all).
  struct Ragged {
    RaggedTable table;
    int64_t* first;
    float* stats;
  };
  Ragged ragged(int64_t slots, int64_t rows, int64_t nh, cudaStream_t stream);
  // The ragged key to run `want` with: a graph already built for the same rows and documents
  // whose entry length covers want's at no more than twice its work and, for a deterministic
  // backward, a dP workspace of at most `max_dp` bytes; else (or `exact`) `want` (built on first
  // use). Document lengths vary from micro-batch to micro-batch; this keeps the graphs a run
  // builds (each a cuDNN build, whose first run compiles its kernels) few.
  AttnKey covering(const AttnKey& want, int64_t max_dp, bool exact);
  // The graph of `key` if cuDNN builds it, else null (no warning, nothing ends): a graph built
  // only to size the workspace before the first step.
  const AttnGraph* try_graph(const AttnKey& key);

 private:
  Cudnn() { CUDNN_CHECK(cudnnCreate(&handle_)); }
  // Device memory that grows to the largest request: a growth waits for the stream that last
  // used the old buffer and counts as a host sync.
  struct StreamBuffer {
    Buffer buf;
    cudaStream_t last_stream = nullptr;
    void* get(int64_t bytes, cudaStream_t stream) {
      if (bytes > static_cast<int64_t>(buf.bytes())) {
        if (buf.data() != nullptr) {
          CUDA_CHECK(cudaStreamSynchronize(last_stream));
          count_host_sync();
        }
        buf = Buffer(static_cast<size_t>(bytes), Device::cuda);
      }
      last_stream = stream;
      return buf.data();
    }
  };
  cudnnHandle_t handle_ = nullptr;
  StreamBuffer workspace_, ragged_;
  // Builds the graph of `key` with the heuristics' first choice, else their fallback list; on
  // failure `error` says which step failed and why.
  std::optional<AttnGraph> build(const AttnKey& key, std::string* error);
  std::optional<AttnGraph> build(const AttnKey& key, fe::HeurMode_t mode, std::string* error);
  std::mutex mu_;
  std::map<AttnKey, AttnGraph> graphs_;
};

const AttnGraph& Cudnn::graph(const AttnKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = graphs_.find(key);
  if (it != graphs_.end()) return it->second;
  std::string error;
  std::optional<AttnGraph> built = build(key, &error);
  const auto version = static_cast<long long>(cudnnGetVersion());
  if (!built && key.backward) {
    std::fprintf(stderr,
                 key.deterministic
                     ? "warning: cuDNN %lld cannot build the deterministic attention backward for "
                       "%s (%s); using the fast one: GPU runs will not repeat bit for bit\n"
                     : "warning: cuDNN %lld cannot build the fast (non-deterministic) attention "
                       "backward for %s (%s); using the deterministic one\n",
                 version, key.describe().c_str(), error.c_str());
    AttnKey other = key;
    other.deterministic = !key.deterministic;
    std::string second;
    built = build(other, &second);
    if (!built) error += "; in the other mode: " + second;
  }
  if (!built) {
    const char* mode = !key.backward       ? "forward"
                       : key.deterministic ? "deterministic backward"
                                           : "backward";
    end_job(kExitFailure, "cuDNN " + std::to_string(version) + " cannot build the GQA attention " +
                              mode + " for " + key.describe() + " (" + error +
                              "); another cuDNN version, or another head count or sequence "
                              "length, may be supported");
  }
  return graphs_.emplace(key, std::move(*built)).first->second;
}

Cudnn::Ragged Cudnn::ragged(int64_t slots, int64_t rows, int64_t nh, cudaStream_t stream) {
  auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t lens = aligned(slots * int64_t{sizeof(int32_t)});
  const int64_t offs = aligned((slots + 1) * int64_t{sizeof(int64_t)});
  const int64_t firsts = aligned((rows + 1) * int64_t{sizeof(int64_t)});
  char* p = static_cast<char*>(
      ragged_.get(2 * lens + 4 * offs + firsts + rows * nh * int64_t{sizeof(float)}, stream));
  Ragged r;
  r.table.len_q = reinterpret_cast<int32_t*>(p);
  r.table.len_kv = reinterpret_cast<int32_t*>(p + lens);
  int64_t* off[4];
  for (int i = 0; i < 4; ++i) off[i] = reinterpret_cast<int64_t*>(p + 2 * lens + i * offs);
  r.table.off_q = off[0];
  r.table.off_kv = off[1];
  r.table.off_o = off[2];
  r.table.off_stats = off[3];
  r.first = reinterpret_cast<int64_t*>(p + 2 * lens + 4 * offs);
  r.stats = reinterpret_cast<float*>(p + 2 * lens + 4 * offs + firsts);
  return r;
}

const AttnGraph* Cudnn::try_graph(const AttnKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = graphs_.find(key);
  if (it != graphs_.end()) return &it->second;
  std::string error;
  std::optional<AttnGraph> built = build(key, &error);
  if (!built) return nullptr;
  return &graphs_.emplace(key, std::move(*built)).first->second;
}

std::optional<AttnGraph> Cudnn::build(const AttnKey& key, std::string* error) {
  std::optional<AttnGraph> a = build(key, fe::HeurMode_t::A, error);
  if (!a) {
    std::string second;
    a = build(key, fe::HeurMode_t::FALLBACK, &second);
    if (!a) *error += "; with the fallback heuristics: " + second;
  }
  return a;
}

std::optional<AttnGraph> Cudnn::build(const AttnKey& key, fe::HeurMode_t mode, std::string* error) {
  const bool ragged = key.docs > 0;
  const int64_t B = ragged ? key.docs : key.batch, S = key.entry_q(), nh = key.nh, nkv = key.nkv,
                hd = key.hd;
  const int64_t Sk = key.entry_kv();
  const int64_t W = (nh + 2 * nkv) * hd;  // qkv row width
  const std::vector<int64_t> q_dim{B, nh, S, hd}, kv_dim{B, nkv, Sk, hd};
  const std::vector<int64_t> o_stride{S * nh * hd, hd, nh * hd, 1};
  // Packed rows: Q, K and V (and their gradients) are strided views of one [T, W] row block;
  // blocks: q and its gradient as out, k and v [Sk, nkv, hd] contiguous.
  const std::vector<int64_t> q_stride =
      key.blocks ? o_stride : std::vector<int64_t>{S * W, hd, W, 1};
  const std::vector<int64_t> kv_stride =
      key.blocks ? std::vector<int64_t>{Sk * nkv * hd, hd, nkv * hd, 1} : q_stride;
  // Ours [B, nh, S]; a ragged batch's row-major [rows, nh] (the layout cuDNN offsets by row).
  const std::vector<int64_t> stats_dim{B, nh, S, 1};
  const std::vector<int64_t> stats_stride =
      ragged ? std::vector<int64_t>{nh * S, 1, nh, 1} : std::vector<int64_t>{nh * S, S, 1, 1};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  AttnGraph a;
  a.graph = std::make_shared<fe::graph::Graph>();
  fe::graph::Graph& g = *a.graph;
  g.set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto input = [&](const char* name, const std::vector<int64_t>& dim,
                   const std::vector<int64_t>& stride) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_dim(dim).set_stride(stride));
  };
  // A ragged batch's lengths (i32 [B]) and element offsets (i64 [B + 1]), one offset per tensor
  // (a gradient shares its tensor's).
  auto index = [&](const char* name, int64_t n, fe::DataType_t type) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(type));
  };
  // Token totals bound cuDNN's ragged workspaces (rounded up as its samples do).
  const int64_t total_q = (key.rows() + 63) / 64 * 64, total_kv = (key.kv_rows() + 63) / 64 * 64;
  if (ragged) {
    a.len_q = index("seq_len_q", B, fe::DataType_t::INT32);
    a.len_kv = index("seq_len_kv", B, fe::DataType_t::INT32);
    a.off_q = index("ragged_q", B + 1, fe::DataType_t::INT64);
    a.off_k = index("ragged_k", B + 1, fe::DataType_t::INT64);
    a.off_v = index("ragged_v", B + 1, fe::DataType_t::INT64);
    a.off_o = index("ragged_o", B + 1, fe::DataType_t::INT64);
    a.off_stats = index("ragged_stats", B + 1, fe::DataType_t::INT64);
  }
  a.q = input("Q", q_dim, q_stride);
  a.k = input("K", kv_dim, kv_stride);
  a.v = input("V", kv_dim, kv_stride);
  // A ragged batch's options, the same for the forward's and the backward's attributes: each
  // entry padding-masked to its length, the token totals bounding cuDNN's ragged workspaces.
  auto padded = [&](auto& opts) {
    if (!ragged) return;
    opts.set_padding_mask(true)
        .set_seq_len_q(a.len_q)
        .set_seq_len_kv(a.len_kv)
        .set_max_total_seq_len_q(total_q)
        .set_max_total_seq_len_kv(total_kv);
  };
  if (ragged) {
    a.q->set_ragged_offset(a.off_q);
    a.k->set_ragged_offset(a.off_k);
    a.v->set_ragged_offset(a.off_v);
  }
  if (!key.backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("sdpa_fwd")
                    .set_generate_stats(true)
                    .set_causal_mask(key.causal)
                    .set_attn_scale(scale);
    padded(opts);
    auto [o, stats] = g.sdpa(a.q, a.k, a.v, opts);
    o->set_output(true).set_dim(q_dim).set_stride(o_stride);
    stats->set_output(true)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim)
        .set_stride(stats_stride);
    if (ragged) {
      o->set_ragged_offset(a.off_o);
      stats->set_ragged_offset(a.off_stats);
    }
    a.o = o;
    a.stats = stats;
  } else {
    a.o = input("O", q_dim, o_stride);
    a.dout = input("dO", q_dim, o_stride);
    a.stats = g.tensor(fe::graph::Tensor_attributes()
                           .set_name("Stats")
                           .set_dim(stats_dim)
                           .set_stride(stats_stride)
                           .set_data_type(fe::DataType_t::FLOAT));
    if (ragged) {
      a.o->set_ragged_offset(a.off_o);
      a.dout->set_ragged_offset(a.off_o);
      a.stats->set_ragged_offset(a.off_stats);
    }
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_bwd")
                    .set_causal_mask(key.causal)
                    .set_attn_scale(scale)
                    .set_deterministic_algorithm(key.deterministic);
    padded(opts);
    auto [dq, dk, dv] = g.sdpa_backward(a.q, a.k, a.v, a.o, a.dout, a.stats, opts);
    dq->set_output(true).set_dim(q_dim).set_stride(q_stride);
    dk->set_output(true).set_dim(kv_dim).set_stride(kv_stride);
    dv->set_output(true).set_dim(kv_dim).set_stride(kv_stride);
    if (ragged) {
      dq->set_ragged_offset(a.off_q);
      dk->set_ragged_offset(a.off_k);
      dv->set_ragged_offset(a.off_v);
    }
    a.dq = dq;
    a.dk = dk;
    a.dv = dv;
  }
  // Each step's error is returned, not fatal: the caller falls back or names the failure.
  auto failed = [&](const char* step, fe::error_t e) -> std::optional<AttnGraph> {
    *error = std::string(step) + ": " + e.get_message();
    return std::nullopt;
  };
  if (auto e = g.validate(); e.is_bad()) return failed("validate", e);
  if (auto e = g.build_operation_graph(handle_); e.is_bad()) return failed("operation graph", e);
  if (auto e = g.create_execution_plans({mode}); e.is_bad()) return failed("execution plans", e);
  if (auto e = g.check_support(handle_); e.is_bad()) return failed("support", e);
  if (auto e = g.build_plans(handle_, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE); e.is_bad())
    return failed("plans", e);
  if (auto e = g.get_workspace_size(a.workspace); e.is_bad()) return failed("workspace", e);
  a.deterministic = key.deterministic;
  return a;
}

void check_bf16(const Tensor& qkv, const char* op) {
  TR_ASSERT(qkv.dtype == DType::bf16, std::string(op) +
                                          " on CUDA runs in bf16 (cuDNN fused attention), not " +
                                          dtype_name(qkv.dtype));
}

// Runs `a` with the given bindings on ctx's stream.
void run(Ctx& ctx, const AttnGraph& a, std::unordered_map<TensorPtr, void*>& pack) {
  Cudnn& c = Cudnn::get();
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  CUDNN_CHECK(cudnnSetStream(c.handle(), stream));
  CUDNN_FE_CHECK(a.graph->execute(c.handle(), pack, c.workspace(a.workspace, stream)));
}

}  // namespace

namespace {

// `n` rounded up to a power of two of at least `least`, at most `most`: a ragged graph's entry
// length (a few graphs per run).
int64_t bucket(int64_t n, int64_t least, int64_t most) {
  int64_t b = least;
  while (b < n) b *= 2;
  return std::min(b, most);
}

// Ragged GQA attention with 64-bit offsets and row-major statistics in the backward needs cuDNN
// 9.6 on a Hopper or newer GPU (the frontend refuses the rest): one line naming the fix.
void need_ragged_attention() {
  static const bool checked = [] {
    const auto version = static_cast<long long>(cudnnGetVersion());
    int device = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    const std::string what =
        "block-causal attention (data.document_mask: block_causal) on CUDA runs cuDNN's ragged "
        "batches, which need ";
    const std::string fix = ": set data.document_mask: none";
    if (version < 90600)
      end_job(kExitFailure, what + "cuDNN 9.6 or newer; this process loaded cuDNN " +
                                std::to_string(version) + ": install a newer one, or" + fix);
    if (major < 9)
      end_job(kExitFailure, what + "a Hopper (sm_90) or newer GPU; this one is sm_" +
                                std::to_string(major) + "x" + fix);
    return true;
  }();
  (void)checked;
}

// The deterministic backward's dP workspace for `key` on Hopper (the frontend's formula: batch x
// heads x s_q x s_kv x 2 bytes, padded to its tiles; a lower bound for ragged batches).
int64_t dp_workspace(const AttnKey& key) {
  const int64_t b = key.docs > 0 ? key.docs : key.batch;
  return b * key.nh * ((key.entry_q() + 63) / 64 * 64) * ((key.entry_kv() + 127) / 128 * 128) * 2;
}

// The dP workspace a ragged deterministic backward may take: no more than the same rows take as
// plain sequences (`plain`), or 256 MiB.
int64_t dp_cap(const AttnKey& plain) {
  return std::max(dp_workspace(plain), int64_t{256} << 20);
}

}  // namespace

AttnKey Cudnn::covering(const AttnKey& want, int64_t max_dp, bool exact) {
  // The graphs a process has built depend on its history: a resumed run would run some
  // micro-batch in another graph than the run never stopped. train.deterministic (`exact`)
  // keeps to the micro-batch's own buckets.
  if (want.docs == 0 || exact) return want;
  // Padded rows' tiles exit at once: the launch grows with documents x entry.
  auto work = [](const AttnKey& k) { return static_cast<double>(k.entry_q()); };
  // The key without its entry length (a copy: tie() refers into it).
  auto shape = [](AttnKey k) {
    k.doc_len = 0;
    return k;
  };
  const AttnKey want_shape = shape(want);
  std::lock_guard<std::mutex> lock(mu_);
  AttnKey best = want;
  double best_work = 2 * work(want);
  for (const auto& [k, g] : graphs_) {
    if (k.docs == 0 || shape(k).tie() != want_shape.tie() || k.doc_len < want.doc_len) continue;
    if (k.backward && k.deterministic && dp_workspace(k) > max_dp) continue;
    if (work(k) <= best_work) {
      best = k;
      best_work = work(k);
    }
  }
  return best;
}

AttentionPlan attention_prepare(Ctx& ctx, int batch, int seq_len, int n_heads, int n_kv_heads,
                                int head_dim, int cp_chunk, bool documents) {
  Cudnn& c = Cudnn::get();
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  int64_t bytes = 0;
  bool deterministic = true;
  for (bool causal : {true, false}) {
    for (bool backward : {false, true}) {
      AttnKey key{batch, seq_len, n_heads, n_kv_heads, head_dim, backward, ctx.deterministic};
      if (cp_chunk > 0) {
        key.batch = 1;
        key.seq = key.seq_kv = cp_chunk;
        key.blocks = true;
        key.causal = causal;
      }
      if (!backward) key.deterministic = true;  // the forward's key, as its callers spell it
      const AttnGraph& g = c.graph(key);
      bytes = std::max(bytes, g.workspace);
      if (backward) deterministic = deterministic && g.deterministic;
      if (!documents) continue;
      // The ragged graphs' workspace, so that no part grows it in a step (a host sync): their
      // fast backward's accumulators span the rows whatever the documents, so the extremes (one
      // document as long as the rows' sequence; as many documents as rows, of one row each)
      // bound it; a deterministic backward's dP workspace may reach dp_cap beyond the plain
      // graph's. A graph cuDNN refuses here is left to the step, which names it.
      need_ragged_attention();
      AttnKey one = key, many = key;
      one.docs = 1;
      if (key.causal) {
        one.doc_len = bucket(key.seq, 64, key.seq);
        many.docs = int64_t{1} << (63 - __builtin_clzll(static_cast<uint64_t>(key.rows())));
        many.doc_len = 64;
      }
      for (AttnKey k : {one, many}) {
        if (k.docs == 0) continue;
        if (k.backward) k.deterministic = false;
        if (const AttnGraph* r = c.try_graph(k)) bytes = std::max(bytes, r->workspace);
      }
      if (backward && ctx.deterministic)
        bytes = std::max(bytes, g.workspace + dp_cap(key) - dp_workspace(key));
    }
    if (cp_chunk == 0) break;  // the whole sequence's graphs are causal only
  }
  c.workspace(bytes, stream);
  if (documents) {
    const int64_t rows = cp_chunk > 0 ? cp_chunk : int64_t{batch} * seq_len;
    c.ragged(ragged_slots_bound(rows), rows, n_heads, stream);
  }
  return {static_cast<size_t>(bytes), deterministic};
}

bool attention_bwd_deterministic(Ctx& ctx, int batch, int seq_len, int n_heads, int n_kv_heads,
                                 int head_dim) {
  return Cudnn::get()
      .graph({batch, seq_len, n_heads, n_kv_heads, head_dim, /*backward=*/true, ctx.deterministic})
      .deterministic;
}

namespace {

// The device pointers a graph's tensors bind to (the backward's gradients and dout null in a
// forward).
struct Bindings {
  void *q, *k, *v, *o, *stats;
  void *dout = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
};
std::unordered_map<TensorPtr, void*> bind(const AttnGraph& a, const Bindings& b) {
  std::unordered_map<TensorPtr, void*> pack = {
      {a.q, b.q}, {a.k, b.k}, {a.v, b.v}, {a.o, b.o}, {a.stats, b.stats}};
  if (a.dq != nullptr) {
    pack[a.dout] = b.dout;
    pack[a.dq] = b.dq;
    pack[a.dk] = b.dk;
    pack[a.dv] = b.dv;
  }
  return pack;
}
// The packed qkv rows' pointers: Q, K and V heads at their column offsets.
Bindings packed(Tensor qkv, Tensor out, Tensor lse, int n_heads, int n_kv_heads, int head_dim) {
  char* base = static_cast<char*>(qkv.data);
  const size_t head_bytes = static_cast<size_t>(head_dim) * 2;
  return {base, base + n_heads * head_bytes, base + (n_heads + n_kv_heads) * head_bytes, out.data,
          lse.data};
}
void packed_grads(Bindings& b, Tensor dqkv, Tensor dout, int n_heads, int n_kv_heads,
                  int head_dim) {
  const Bindings d = packed(dqkv, dout, Tensor(), n_heads, n_kv_heads, head_dim);
  b.dout = dout.data;
  b.dq = d.q;
  b.dk = d.k;
  b.dv = d.v;
}

// A ragged backward runs deterministic only where its dP workspace is no larger than dp_cap:
// many documents of which one is long would need documents x longest^2. Otherwise the fast
// backward, with one warning. Then the graph that covers it (Cudnn::covering), within that cap.
void ragged_backward_mode(AttnKey& key, const AttnKey& plain, bool exact) {
  const int64_t cap = dp_cap(plain);
  if (!key.deterministic || dp_workspace(key) <= cap) {
    key = Cudnn::get().covering(key, cap, exact);
    return;
  }
  const AttnKey asked = key;
  key.deterministic = false;
  key = Cudnn::get().covering(key, cap, exact);
  static std::once_flag warned;
  std::call_once(warned, [&] {
    std::fprintf(stderr,
                 "warning: cuDNN's deterministic attention backward over %lld documents of up "
                 "to %lld tokens would need %.1f GiB of workspace (%.1f GiB as whole "
                 "sequences); such micro-batches use the fast backward: GPU runs will not "
                 "repeat bit for bit\n",
                 static_cast<long long>(asked.docs), static_cast<long long>(asked.entry_q()),
                 static_cast<double>(dp_workspace(asked)) / (1 << 30),
                 static_cast<double>(cap) / (1 << 30));
  });
}

// Runs the ragged graph of `key` (its documents set) over the table from `slot` on, the other
// tensors bound by `b` (statistics: the table's row-major ones).
void run_ragged(Ctx& ctx, const AttnKey& key, const Cudnn::Ragged& r, int64_t slot, Bindings b) {
  const AttnGraph& a = Cudnn::get().graph(key);
  if (ctx.deterministic && key.backward && !a.deterministic) note_attention_fast_fallback();
  b.stats = r.stats;
  std::unordered_map<TensorPtr, void*> pack = bind(a, b);
  pack[a.len_q] = r.table.len_q + slot;
  pack[a.len_kv] = r.table.len_kv + slot;
  pack[a.off_q] = r.table.off_q + slot;
  pack[a.off_k] = r.table.off_kv + slot;
  pack[a.off_v] = r.table.off_kv + slot;
  pack[a.off_o] = r.table.off_o + slot;
  pack[a.off_stats] = r.table.off_stats + slot;
  run(ctx, a, pack);
  note_attention_ragged_launch();
}

// Block-causal attention over the documents of `docs` (a sequence every `period` rows) as ragged
// batches: the table built on the device, then each part through the graph of `plain`'s shape
// with the part's documents, entries `limit` rows at most. The statistics move between cuDNN's
// rows and `lse` ([rows / period, nh, period]) after a forward, before a backward.
void run_documents(Ctx& ctx, const AttnKey& plain, const DocStarts& docs, int64_t period,
                   int64_t limit, RaggedRows w, Bindings b) {
  need_ragged_attention();
  const int64_t rows = docs.start.numel();
  const RaggedParts parts = ragged_parts(docs.host, rows, period);
  const Cudnn::Ragged r =
      Cudnn::get().ragged(parts.slots, rows, plain.nh, static_cast<cudaStream_t>(ctx.stream));
  ragged_documents(ctx, r.table, parts, r.first, docs.start.ptr<int32_t>(), rows, period, w);
  auto* lse = static_cast<float*>(b.stats);
  if (plain.backward) stats_layout(ctx, lse, r.stats, rows / period, period, plain.nh, false);
  for (int i = 0; i < parts.n; ++i) {
    AttnKey key = plain;
    key.docs = parts.part[i].count;
    key.doc_len = bucket(parts.part[i].longest, 64, limit);
    if (key.backward)
      ragged_backward_mode(key, plain, ctx.deterministic);
    else
      key = Cudnn::get().covering(key, std::numeric_limits<int64_t>::max(), ctx.deterministic);
    run_ragged(ctx, key, r, parts.part[i].slot, b);
  }
  if (!plain.backward) stats_layout(ctx, lse, r.stats, rows / period, period, plain.nh, true);
}

// The packed qkv rows' ragged strides: q, k and v rows of the full width, out rows of nh hd.
RaggedRows packed_rows(int64_t nh, int64_t nkv, int64_t hd) {
  return {(nh + 2 * nkv) * hd, (nh + 2 * nkv) * hd, nh * hd, nh};
}

}  // namespace

void attention_fwd(Ctx& ctx, Tensor out, Tensor lse, Tensor qkv, int batch, int seq_len,
                   int n_heads, int n_kv_heads, int head_dim, DocStarts docs) {
  check_bf16(qkv, "attention_fwd");
  const AttnKey key{batch, seq_len, n_heads, n_kv_heads, head_dim, /*backward=*/false};
  const Bindings b = packed(qkv, out, lse, n_heads, n_kv_heads, head_dim);
  if (!docs.empty())
    return run_documents(ctx, key, docs, seq_len, seq_len,
                         packed_rows(n_heads, n_kv_heads, head_dim), b);
  const AttnGraph& a = Cudnn::get().graph(key);
  std::unordered_map<TensorPtr, void*> pack = bind(a, b);
  run(ctx, a, pack);
}

void attention_bwd(Ctx& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv,
                   int batch, int seq_len, int n_heads, int n_kv_heads, int head_dim,
                   DocStarts docs) {
  check_bf16(qkv, "attention_bwd");
  const AttnKey key{batch,    seq_len,           n_heads,          n_kv_heads,
                    head_dim, /*backward=*/true, ctx.deterministic};
  Bindings b = packed(qkv, out, lse, n_heads, n_kv_heads, head_dim);
  packed_grads(b, dqkv, dout, n_heads, n_kv_heads, head_dim);
  if (!docs.empty())
    return run_documents(ctx, key, docs, seq_len, seq_len,
                         packed_rows(n_heads, n_kv_heads, head_dim), b);
  const AttnGraph& a = Cudnn::get().graph(key);
  if (ctx.deterministic && !a.deterministic) note_attention_fast_fallback();
  std::unordered_map<TensorPtr, void*> pack = bind(a, b);
  run(ctx, a, pack);
}

// Context parallelism's blocks (kernels/ops.h): one sequence's query block against a key block,
// through graphs of their own shape (the chunk length is the same for every block of a run, so
// a run builds at most four: forward and backward, causal and not; block-causal adds the
// ragged ones). Block-causal: the causal diagonal is the documents of its rows; a block of
// earlier keys is its first document's prefix, the other rows seeing none of its keys, and no
// launch at all where that document starts after the block.
namespace {
// `ctx.deterministic`: the backward's algorithm.
AttnKey block_key(const Ctx& ctx, const Tensor& q, const Tensor& k, bool backward, bool causal) {
  AttnKey key{
      1, q.shape[0], q.shape[1], k.shape[1], q.shape[2], backward, !backward || ctx.deterministic};
  key.blocks = true;
  key.seq_kv = k.shape[0];
  key.causal = causal;
  return key;
}
RaggedRows block_rows(const AttnKey& key) {
  return {key.nh * key.hd, key.nkv * key.hd, key.nh * key.hd, key.nh};
}
// Whether the first query document of a block of earlier keys (starting at position k_first)
// reaches back into it: the host's copy of the starts says so.
bool sees_keys(const DocStarts& q_docs, int64_t k_first, int64_t kv_rows) {
  return q_docs.host[0] - k_first < kv_rows;
}
// The block of earlier keys as its first document's prefix: one entry, in the whole block's
// shape, bound by `b`.
void run_prefix(Ctx& ctx, const AttnKey& plain, const DocStarts& q_docs, int64_t k_first,
                Bindings b) {
  need_ragged_attention();
  AttnKey key = plain;
  key.docs = 1;
  if (key.backward) ragged_backward_mode(key, plain, /*exact=*/true);
  const Cudnn::Ragged r = Cudnn::get().ragged(ragged_slots_bound(1), key.seq, key.nh,
                                              static_cast<cudaStream_t>(ctx.stream));
  ragged_prefix(ctx, r.table, q_docs.start.ptr<int32_t>(), key.seq, key.seq_kv, k_first,
                block_rows(key));
  auto* lse = static_cast<float*>(b.stats);
  if (key.backward) stats_layout(ctx, lse, r.stats, 1, key.seq, key.nh, /*to_lse=*/false);
  run_ragged(ctx, key, r, 0, b);
  if (!key.backward) stats_layout(ctx, lse, r.stats, 1, key.seq, key.nh, /*to_lse=*/true);
}
}  // namespace

void attention_block_fwd(Ctx& ctx, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                         bool causal, DocStarts q_docs, int64_t k_first) {
  check_bf16(q, "attention_block_fwd");
  const AttnKey key = block_key(ctx, q, k, /*backward=*/false, causal);
  const Bindings b{q.data, k.data, v.data, out.data, lse.data};
  if (q_docs.empty()) {
    const AttnGraph& a = Cudnn::get().graph(key);
    std::unordered_map<TensorPtr, void*> pack = bind(a, b);
    return run(ctx, a, pack);
  }
  if (causal) return run_documents(ctx, key, q_docs, key.seq, key.seq, block_rows(key), b);
  if (sees_keys(q_docs, k_first, key.seq_kv)) run_prefix(ctx, key, q_docs, k_first, b);
  hidden_rows_fwd(ctx, out, lse, q_docs.start.ptr<int32_t>(), k_first, key.seq_kv);
}

void attention_block_bwd(Ctx& ctx, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out,
                         Tensor lse, Tensor q, Tensor k, Tensor v, bool causal, DocStarts q_docs,
                         int64_t k_first) {
  check_bf16(q, "attention_block_bwd");
  const AttnKey key = block_key(ctx, q, k, /*backward=*/true, causal);
  const Bindings b{q.data,    k.data,  v.data,  out.data, lse.data,
                   dout.data, dq.data, dk.data, dv.data};
  if (q_docs.empty()) {
    const AttnGraph& a = Cudnn::get().graph(key);
    if (ctx.deterministic && !a.deterministic) note_attention_fast_fallback();
    std::unordered_map<TensorPtr, void*> pack = bind(a, b);
    return run(ctx, a, pack);
  }
  if (causal) return run_documents(ctx, key, q_docs, key.seq, key.seq, block_rows(key), b);
  if (sees_keys(q_docs, k_first, key.seq_kv)) run_prefix(ctx, key, q_docs, k_first, b);
  hidden_rows_bwd(ctx, dq, dk, dv, q_docs.start.ptr<int32_t>(), k_first);
}

}  // namespace tr::cuda
