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
#include <cudnn_frontend.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>

#include "core/exit_codes.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"

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
// every key visible or (`causal`, seq == seq_kv) the causal diagonal.
struct AttnKey {
  int64_t batch, seq, nh, nkv, hd;
  bool backward;
  bool deterministic = true;  // backward only
  bool blocks = false;
  int64_t seq_kv = 0;  // blocks only
  bool causal = true;
  auto tie() const {
    return std::tie(batch, seq, nh, nkv, hd, backward, deterministic, blocks, seq_kv, causal);
  }
  bool operator<(const AttnKey& o) const { return tie() < o.tie(); }
  std::string describe() const {
    const std::string heads = std::to_string(nh) + " heads, " + std::to_string(nkv) +
                              " KV heads of " + std::to_string(hd);
    if (blocks)
      return "a block of " + std::to_string(seq) + " queries over " + std::to_string(seq_kv) +
             (causal ? " keys (causal), " : " keys (all visible), ") + heads;
    return "batch " + std::to_string(batch) + ", seq " + std::to_string(seq) + ", " + heads;
  }
};

struct AttnGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  TensorPtr q, k, v, o, stats, dout, dq, dk, dv;
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
  void* workspace(int64_t bytes, cudaStream_t stream) {
    if (bytes > static_cast<int64_t>(workspace_.bytes())) {
      if (workspace_.data() != nullptr) {
        CUDA_CHECK(cudaStreamSynchronize(last_stream_));
        count_host_sync();
      }
      workspace_ = Buffer(static_cast<size_t>(bytes), Device::cuda);
    }
    last_stream_ = stream;
    return workspace_.data();
  }

 private:
  Cudnn() { CUDNN_CHECK(cudnnCreate(&handle_)); }
  cudnnHandle_t handle_ = nullptr;
  Buffer workspace_;
  cudaStream_t last_stream_ = nullptr;
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
  const int64_t B = key.batch, S = key.seq, nh = key.nh, nkv = key.nkv, hd = key.hd;
  const int64_t Sk = key.blocks ? key.seq_kv : S;
  const int64_t W = (nh + 2 * nkv) * hd;  // qkv row width
  const std::vector<int64_t> q_dim{B, nh, S, hd}, kv_dim{B, nkv, Sk, hd};
  const std::vector<int64_t> o_stride{S * nh * hd, hd, nh * hd, 1};
  // Packed rows: Q, K and V (and their gradients) are strided views of one [T, W] row block;
  // blocks: q and its gradient as out, k and v [Sk, nkv, hd] contiguous.
  const std::vector<int64_t> q_stride =
      key.blocks ? o_stride : std::vector<int64_t>{S * W, hd, W, 1};
  const std::vector<int64_t> kv_stride =
      key.blocks ? std::vector<int64_t>{Sk * nkv * hd, hd, nkv * hd, 1} : q_stride;
  const std::vector<int64_t> stats_dim{B, nh, S, 1}, stats_stride{nh * S, S, 1, 1};
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
  a.q = input("Q", q_dim, q_stride);
  a.k = input("K", kv_dim, kv_stride);
  a.v = input("V", kv_dim, kv_stride);
  if (!key.backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("sdpa_fwd")
                    .set_generate_stats(true)
                    .set_causal_mask(key.causal)
                    .set_attn_scale(scale);
    auto [o, stats] = g.sdpa(a.q, a.k, a.v, opts);
    o->set_output(true).set_dim(q_dim).set_stride(o_stride);
    stats->set_output(true)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim)
        .set_stride(stats_stride);
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
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_bwd")
                    .set_causal_mask(key.causal)
                    .set_attn_scale(scale)
                    .set_deterministic_algorithm(key.deterministic);
    auto [dq, dk, dv] = g.sdpa_backward(a.q, a.k, a.v, a.o, a.dout, a.stats, opts);
    dq->set_output(true).set_dim(q_dim).set_stride(q_stride);
    dk->set_output(true).set_dim(kv_dim).set_stride(kv_stride);
    dv->set_output(true).set_dim(kv_dim).set_stride(kv_stride);
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

AttentionPlan attention_prepare(Ctx& ctx, int batch, int seq_len, int n_heads, int n_kv_heads,
                                int head_dim, int cp_chunk) {
  Cudnn& c = Cudnn::get();
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
    }
    if (cp_chunk == 0) break;  // the whole sequence's graphs are causal only
  }
  c.workspace(bytes, static_cast<cudaStream_t>(ctx.stream));
  return {static_cast<size_t>(bytes), deterministic};
}

bool attention_bwd_deterministic(Ctx& ctx, int batch, int seq_len, int n_heads, int n_kv_heads,
                                 int head_dim) {
  return Cudnn::get()
      .graph({batch, seq_len, n_heads, n_kv_heads, head_dim, /*backward=*/true, ctx.deterministic})
      .deterministic;
}

void attention_fwd(Ctx& ctx, Tensor out, Tensor lse, Tensor qkv, int batch, int seq_len,
                   int n_heads, int n_kv_heads, int head_dim, Tensor doc_start) {
  check_bf16(qkv, "attention_fwd");
  TR_ASSERT(doc_start.empty(), "block-causal attention (doc_start) has no CUDA path yet");
  const AttnGraph& a =
      Cudnn::get().graph({batch, seq_len, n_heads, n_kv_heads, head_dim, /*backward=*/false});
  char* base = static_cast<char*>(qkv.data);
  const size_t head_bytes = static_cast<size_t>(head_dim) * 2;
  std::unordered_map<TensorPtr, void*> pack = {{a.q, base},
                                               {a.k, base + n_heads * head_bytes},
                                               {a.v, base + (n_heads + n_kv_heads) * head_bytes},
                                               {a.o, out.data},
                                               {a.stats, lse.data}};
  run(ctx, a, pack);
}

void attention_bwd(Ctx& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv,
                   int batch, int seq_len, int n_heads, int n_kv_heads, int head_dim,
                   Tensor doc_start) {
  check_bf16(qkv, "attention_bwd");
  TR_ASSERT(doc_start.empty(), "block-causal attention (doc_start) has no CUDA path yet");
  const AttnGraph& a = Cudnn::get().graph(
      {batch, seq_len, n_heads, n_kv_heads, head_dim, /*backward=*/true, ctx.deterministic});
  char* base = static_cast<char*>(qkv.data);
  char* dbase = static_cast<char*>(dqkv.data);
  const size_t head_bytes = static_cast<size_t>(head_dim) * 2;
  const size_t k_at = n_heads * head_bytes, v_at = (n_heads + n_kv_heads) * head_bytes;
  std::unordered_map<TensorPtr, void*> pack = {
      {a.q, base},     {a.k, base + k_at},   {a.v, base + v_at},
      {a.o, out.data}, {a.dout, dout.data},  {a.stats, lse.data},
      {a.dq, dbase},   {a.dk, dbase + k_at}, {a.dv, dbase + v_at}};
  run(ctx, a, pack);
}

// Context parallelism's blocks (kernels/ops.h): one sequence's query block against a key block,
// through graphs of their own shape (the chunk length is the same for every block of a run, so
// a run builds at most four: forward and backward, causal and not).
void attention_block_fwd(Ctx& ctx, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                         bool causal, Tensor q_doc_start, int64_t) {
  check_bf16(q, "attention_block_fwd");
  TR_ASSERT(q_doc_start.empty(), "block-causal attention (q_doc_start) has no CUDA path yet");
  AttnKey key{1, q.shape[0], q.shape[1], k.shape[1], q.shape[2], /*backward=*/false};
  key.blocks = true;
  key.seq_kv = k.shape[0];
  key.causal = causal;
  const AttnGraph& a = Cudnn::get().graph(key);
  std::unordered_map<TensorPtr, void*> pack = {
      {a.q, q.data}, {a.k, k.data}, {a.v, v.data}, {a.o, out.data}, {a.stats, lse.data}};
  run(ctx, a, pack);
}

void attention_block_bwd(Ctx& ctx, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out,
                         Tensor lse, Tensor q, Tensor k, Tensor v, bool causal, Tensor q_doc_start,
                         int64_t) {
  check_bf16(q, "attention_block_bwd");
  TR_ASSERT(q_doc_start.empty(), "block-causal attention (q_doc_start) has no CUDA path yet");
  AttnKey key{1,          q.shape[0],        q.shape[1],       k.shape[1],
              q.shape[2], /*backward=*/true, ctx.deterministic};
  key.blocks = true;
  key.seq_kv = k.shape[0];
  key.causal = causal;
  const AttnGraph& a = Cudnn::get().graph(key);
  std::unordered_map<TensorPtr, void*> pack = {
      {a.q, q.data},       {a.k, k.data},   {a.v, v.data},   {a.o, out.data}, {a.dout, dout.data},
      {a.stats, lse.data}, {a.dq, dq.data}, {a.dk, dk.data}, {a.dv, dv.data}};
  run(ctx, a, pack);
}

}  // namespace tr::cuda
