// Public entry points of the op set: check every precondition (shapes, dtypes, devices,
// non-empty tensors), then run the backend of ctx.device.
#include "kernels/ops.h"

#include "core/hardware.h"

#include <cstdlib>
#include <cstring>

#include <array>
#include <atomic>
#include <initializer_list>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_log.h"
#include "kernels/ragged.h"
#ifdef TRAINER_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace tr {
namespace {

// One tensor argument of an op call, named for error messages; optional ones may be empty.
struct Arg {
  const char* name;
  Tensor t;
  bool optional = false;
};
Arg optional(const char* name, Tensor t) {
  return {name, t, true};
}

// Precondition checks of one op call. describe() names the op, every tensor argument with
// its shape and the device, e.g. "rmsnorm_fwd(out=f32[4,8], rstd=f32[4], ...) on cpu"; it is
// only evaluated when a check fails.
class OpCheck {
 public:
  OpCheck(const Ctx& ctx, const char* op, std::initializer_list<Arg> args)
      : op_(op), device_(ctx.device), log_(ctx.log) {
    TR_ASSERT(args.size() <= args_.size(), std::string(op) + ": too many arguments to check");
    for (const Arg& a : args) args_[n_++] = a;
    for (int i = 0; i < n_; ++i) {
      const Arg& a = args_[i];
      TR_ASSERT(a.optional || (!a.t.empty() && a.t.numel() > 0),
                describe(std::string(a.name) + " is empty"));
      TR_ASSERT(a.t.empty() || a.t.device == device_,
                describe(std::string(a.name) + " is not on the context's device"));
    }
  }

  // All non-empty tensors share one floating dtype.
  void same_float_dtype(std::initializer_list<Tensor> tensors) const {
    DType dt = DType::f32;
    for (const Tensor& t : tensors) {
      if (t.empty()) continue;
      dt = t.dtype;
      break;
    }
    TR_ASSERT(dt == DType::f32 || dt == DType::f64 || dt == DType::bf16,
              describe(std::string("floating tensors expected, got ") + dtype_name(dt)));
    for (const Tensor& t : tensors)
      TR_ASSERT(t.empty() || t.dtype == dt, describe("floating tensors differ in dtype"));
  }

  // A parameter gradient `g` of an op computing in `act`'s dtype: the same dtype, or f32
  // (the gradient buffers) when the op computes in bf16.
  void grad_dtype(const Tensor& g, const Tensor& act) const {
    TR_ASSERT(g.dtype == act.dtype || (act.dtype == DType::bf16 && g.dtype == DType::f32),
              describe("a parameter gradient is the activations' dtype or f32"));
  }

  // The call as Ctx::log records it (kernels/op_log.h), when the entry point's shape is not its
  // first tensor's rows x the rest: once per product it runs (linear_bwd's two). Without a note
  // the call is recorded at its end by its first tensor.
  // `part` names one of several products ("din": "linear_bwd.din").
  void note(int64_t m, int64_t n, int64_t k = 1, const char* part = nullptr) const {
    noted_ = true;
    if (log_ != nullptr)
      log_->note({part == nullptr ? std::string(op_) : std::string(op_) + "." + part, m, n, k});
  }
  ~OpCheck() {
    if (log_ == nullptr || noted_ || n_ == 0) return;
    const Tensor& t = args_[0].t;
    const int64_t rows = t.ndim > 0 ? t.shape[0] : 1;
    log_->note({op_, rows, rows > 0 ? t.numel() / rows : 0});
  }
  OpCheck(const OpCheck&) = delete;
  OpCheck& operator=(const OpCheck&) = delete;

  std::string describe(const std::string& detail = "") const {
    std::string s = std::string(op_) + "(";
    for (int i = 0; i < n_; ++i)
      s += std::string(i ? ", " : "") + args_[i].name + "=" +
           (args_[i].t.empty() ? "empty" : args_[i].t.shape_str());
    s += std::string(") on ") + device_name(device_);
    return detail.empty() ? s : s + ": " + detail;
  }

 private:
  const char* op_;
  Device device_;
  std::array<Arg, 10> args_{};
  int n_ = 0;
  OpLog* log_;
  mutable bool noted_ = false;
};

bool is_matrix(const Tensor& t, int64_t rows, int64_t cols) {
  return t.ndim == 2 && t.shape[0] == rows && t.shape[1] == cols;
}
bool is_vector(const Tensor& t, int64_t n) {
  return t.ndim == 1 && t.shape[0] == n;
}

}  // namespace

DType stat_dtype(DType dtype) {
  return dtype == DType::f64 ? DType::f64 : DType::f32;
}

// Every backend defines every op of kernels/backend_ops.inc: taking each one's address makes a
// missing definition a link error here, not a failure when some path first calls it.
// (External linkage, so that the tables are emitted.)
#define TR_BACKEND_OP(ret, name, params) reinterpret_cast<const void*>(&cpu::name),
extern const void* const kCpuBackendOps[];
const void* const kCpuBackendOps[] = {
#include "kernels/backend_ops.inc"
};
#undef TR_BACKEND_OP
#ifdef TRAINER_HAVE_CUDA
#define TR_BACKEND_OP(ret, name, params) reinterpret_cast<const void*>(&cuda::name),
extern const void* const kCudaBackendOps[];
const void* const kCudaBackendOps[] = {
#include "kernels/backend_ops.inc"
};
#undef TR_BACKEND_OP
#endif

// A failed precondition names the op and its arguments' shapes.
#define OP_CHECK(chk, cond) TR_ASSERT(cond, (chk).describe())

// Runs `op` on the backend of ctx.device.
#ifdef TRAINER_HAVE_CUDA
#define TR_DISPATCH(op, ...)                                           \
  do {                                                                 \
    if (ctx.device == Device::cuda) return cuda::op(ctx, __VA_ARGS__); \
    return cpu::op(ctx, __VA_ARGS__);                                  \
  } while (0)
#else
#define TR_DISPATCH(op, ...)                                                                    \
  do {                                                                                          \
    TR_ASSERT(ctx.device == Device::cpu, "op " #op " on cuda: this build has no CUDA backend"); \
    return cpu::op(ctx, __VA_ARGS__);                                                           \
  } while (0)
#endif

void embedding_fwd(Ctx& ctx, Tensor out, Tensor tokens, Tensor table, int64_t vocab_offset) {
  const OpCheck c(ctx, "embedding_fwd", {{"out", out}, {"tokens", tokens}, {"table", table}});
  c.same_float_dtype({out, table});
  OP_CHECK(c, tokens.dtype == DType::i32 && tokens.ndim == 1 && table.ndim == 2);
  OP_CHECK(c, is_matrix(out, tokens.shape[0], table.shape[1]));
  OP_CHECK(c, vocab_offset >= 0);
  TR_DISPATCH(embedding_fwd, out, tokens, table, vocab_offset);
}

void embedding_bwd(Ctx& ctx, Tensor dtable, Tensor dout, Tensor tokens, int64_t vocab_offset) {
  const OpCheck c(ctx, "embedding_bwd", {{"dtable", dtable}, {"dout", dout}, {"tokens", tokens}});
  c.same_float_dtype({dout});
  c.grad_dtype(dtable, dout);
  OP_CHECK(c, tokens.dtype == DType::i32 && tokens.ndim == 1 && dtable.ndim == 2);
  OP_CHECK(c, is_matrix(dout, tokens.shape[0], dtable.shape[1]));
  OP_CHECK(c, vocab_offset >= 0);
  c.note(dout.shape[0], dout.shape[1]);
  TR_DISPATCH(embedding_bwd, dtable, dout, tokens, vocab_offset);
}

void rmsnorm_fwd(Ctx& ctx, Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps) {
  const OpCheck c(ctx, "rmsnorm_fwd",
                  {{"out", out}, {"rstd", rstd}, {"in", in}, {"weight", weight}});
  c.same_float_dtype({out, in, weight});
  OP_CHECK(c, rstd.dtype == stat_dtype(in.dtype));
  OP_CHECK(c, in.ndim == 2 && out.same_shape(in));
  OP_CHECK(c, is_vector(rstd, in.shape[0]) && is_vector(weight, in.shape[1]));
  OP_CHECK(c, eps >= 0.0f);
  TR_DISPATCH(rmsnorm_fwd, out, rstd, in, weight, eps);
}

void rmsnorm_bwd(Ctx& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight,
                 Tensor rstd, bool accumulate_din, GradWrite dw) {
  const OpCheck c(ctx, "rmsnorm_bwd",
                  {{"din", din},
                   {"dweight", dweight},
                   {"dout", dout},
                   {"in", in},
                   {"weight", weight},
                   {"rstd", rstd}});
  c.same_float_dtype({din, dout, in, weight});
  c.grad_dtype(dweight, in);
  OP_CHECK(c, rstd.dtype == stat_dtype(in.dtype));
  OP_CHECK(c, in.ndim == 2 && din.same_shape(in) && dout.same_shape(in));
  OP_CHECK(c, is_vector(rstd, in.shape[0]) && is_vector(weight, in.shape[1]));
  OP_CHECK(c, dweight.same_shape(weight));
  TR_DISPATCH(rmsnorm_bwd, din, dweight, dout, in, weight, rstd, accumulate_din,
              dw == GradWrite::assign);
}

void add_rmsnorm_fwd(Ctx& ctx, Tensor sum, Tensor out, Tensor rstd, Tensor a, Tensor b,
                     Tensor weight, float eps) {
  const OpCheck c(
      ctx, "add_rmsnorm_fwd",
      {{"sum", sum}, {"out", out}, {"rstd", rstd}, {"a", a}, {"b", b}, {"weight", weight}});
  c.same_float_dtype({sum, out, a, b, weight});
  OP_CHECK(c, rstd.dtype == stat_dtype(a.dtype));
  OP_CHECK(c, a.ndim == 2 && b.same_shape(a) && sum.same_shape(a) && out.same_shape(a));
  OP_CHECK(c, is_vector(rstd, a.shape[0]) && is_vector(weight, a.shape[1]));
  OP_CHECK(c, eps >= 0.0f);
  TR_DISPATCH(add_rmsnorm_fwd, sum, out, rstd, a, b, weight, eps);
}

void linear_fwd(Ctx& ctx, Tensor out, Tensor in, Tensor weight, Tensor bias) {
  const OpCheck c(ctx, "linear_fwd",
                  {{"out", out}, {"in", in}, {"weight", weight}, optional("bias", bias)});
  c.same_float_dtype({out, in, weight, bias});
  OP_CHECK(c, in.ndim == 2 && weight.ndim == 2 && weight.shape[1] == in.shape[1]);
  OP_CHECK(c, is_matrix(out, in.shape[0], weight.shape[0]));
  OP_CHECK(c, bias.empty() || is_vector(bias, weight.shape[0]));
  c.note(in.shape[0], weight.shape[0], in.shape[1]);
  TR_DISPATCH(linear_fwd, out, in, weight, bias);
}

void linear_bwd(Ctx& ctx, Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in,
                Tensor weight, GradWrite dw) {
  const OpCheck c(ctx, "linear_bwd",
                  {optional("din", din),
                   optional("dweight", dweight),
                   optional("dbias", dbias),
                   {"dout", dout},
                   {"in", in},
                   {"weight", weight}});
  c.same_float_dtype({din, dout, in, weight});
  if (!dweight.empty()) c.grad_dtype(dweight, in);
  if (!dbias.empty()) c.grad_dtype(dbias, in);
  OP_CHECK(c, in.ndim == 2 && weight.ndim == 2 && weight.shape[1] == in.shape[1]);
  OP_CHECK(c, is_matrix(dout, in.shape[0], weight.shape[0]));
  OP_CHECK(c, dweight.empty() ? dbias.empty() && !din.empty() : dweight.same_shape(weight));
  OP_CHECK(c, din.empty() || din.same_shape(in));
  OP_CHECK(c, dbias.empty() || is_vector(dbias, weight.shape[0]));
  if (!din.empty()) c.note(in.shape[0], in.shape[1], weight.shape[0], "din");
  if (!dweight.empty()) c.note(weight.shape[0], weight.shape[1], in.shape[0], "dweight");
  TR_DISPATCH(linear_bwd, din, dweight, dbias, dout, in, weight, dw == GradWrite::assign);
}

void bias_grad(Ctx& ctx, Tensor dbias, Tensor dout, GradWrite dw) {
  const OpCheck c(ctx, "bias_grad", {{"dbias", dbias}, {"dout", dout}});
  c.same_float_dtype({dout});
  c.grad_dtype(dbias, dout);
  OP_CHECK(c, dout.ndim == 2 && is_vector(dbias, dout.shape[1]));
  c.note(dout.shape[0], dout.shape[1]);
  TR_DISPATCH(bias_grad, dbias, dout, dw == GradWrite::assign);
}

void fp8_cast(Ctx& ctx, Tensor out, Tensor out_t, Tensor scale_inv, Tensor in) {
  const OpCheck c(
      ctx, "fp8_cast",
      {{"in", in}, optional("out", out), optional("out_t", out_t), {"scale_inv", scale_inv}});
  OP_CHECK(c, (in.dtype == DType::f32 || in.dtype == DType::f64 || in.dtype == DType::bf16) &&
                  in.ndim == 2);
  OP_CHECK(c, !out.empty() || !out_t.empty());
  OP_CHECK(c, out.empty() || (is_fp8(out.dtype) && out.same_shape(in)));
  OP_CHECK(c, out_t.empty() || (is_fp8(out_t.dtype) && is_matrix(out_t, in.shape[1], in.shape[0])));
  OP_CHECK(c, out.empty() || out_t.empty() || out.dtype == out_t.dtype);
  OP_CHECK(c, scale_inv.dtype == DType::f32 && scale_inv.numel() == 1);
  TR_ASSERT(ctx.device != Device::cuda || in.dtype != DType::f64,
            c.describe("the CUDA backend casts f32 or bf16, not f64"));
  c.note(in.shape[0], in.shape[1]);
  TR_DISPATCH(fp8_cast, out, out_t, scale_inv, in);
}

namespace {
// cuBLASLt's FP8 GEMMs read operands at 16-byte aligned addresses with leading dimensions of
// multiples of 16 bytes: K and N multiples of 16 (a's and b's rows of K codes; b's N rows are
// op(A)'s, which cuBLASLt's FP8 kernels want aligned too, as torch's _scaled_mm checks). M is
// free.
void check_fp8_gemm_cuda(const OpCheck& c, const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t K = a.shape[1], N = b.shape[0];
  TR_ASSERT(K % kFp8GemmAlign == 0 && N % kFp8GemmAlign == 0,
            c.describe("on CUDA, K (" + std::to_string(K) + ") and N (" + std::to_string(N) +
                       ") must be multiples of " + std::to_string(kFp8GemmAlign) +
                       " for cuBLASLt's FP8 GEMMs; pad them"));
  for (const Tensor* t : {&a, &b, &out})
    TR_ASSERT(reinterpret_cast<uintptr_t>(t->data) % kFp8GemmAlign == 0,
              c.describe("on CUDA, a, b and out must start at " + std::to_string(kFp8GemmAlign) +
                         "-byte aligned addresses for cuBLASLt's FP8 GEMMs"));
  TR_ASSERT(out.dtype != DType::f64, c.describe("the CUDA backend writes f32 or bf16, not f64"));
}
}  // namespace

void linear_fp8(Ctx& ctx, Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv,
                Tensor bias, bool accumulate) {
  const OpCheck c(ctx, "linear_fp8",
                  {{"out", out},
                   {"a", a},
                   {"a_scale_inv", a_scale_inv},
                   {"b", b},
                   {"b_scale_inv", b_scale_inv},
                   optional("bias", bias)});
  OP_CHECK(c, is_fp8(a.dtype) && is_fp8(b.dtype) &&
                  !(a.dtype == DType::f8e5m2 && b.dtype == DType::f8e5m2));
  OP_CHECK(c, a.ndim == 2 && b.ndim == 2 && a.shape[1] == b.shape[1]);
  OP_CHECK(c, (out.dtype == DType::f32 || out.dtype == DType::f64 || out.dtype == DType::bf16) &&
                  is_matrix(out, a.shape[0], b.shape[0]));
  OP_CHECK(c, a_scale_inv.dtype == DType::f32 && a_scale_inv.numel() == 1 &&
                  b_scale_inv.dtype == DType::f32 && b_scale_inv.numel() == 1);
  OP_CHECK(c, bias.empty() || (bias.dtype == out.dtype && is_vector(bias, b.shape[0])));
  if (ctx.device == Device::cuda) check_fp8_gemm_cuda(c, out, a, b);
  c.note(a.shape[0], b.shape[0], a.shape[1]);
  TR_DISPATCH(linear_fp8, out, a, a_scale_inv, b, b_scale_inv, bias, accumulate);
}

namespace {
void check_rope(const OpCheck& c, const Tensor& x, int n_rope_heads, int seq_len, const Rope& rope,
                const Tensor& positions) {
  c.same_float_dtype({x});
  if (!positions.empty()) {
    TR_ASSERT(positions.dtype == DType::i32 && positions.ndim == 1 && positions.numel() > 0 &&
                  x.ndim == 3 && x.shape[0] % positions.numel() == 0,
              c.describe("positions must be i32 [L] with L dividing the tokens"));
    if (positions.device == Device::cpu)
      for (int64_t i = 0; i < positions.numel(); ++i)
        TR_ASSERT(positions.ptr<int32_t>()[i] >= 0 && positions.ptr<int32_t>()[i] < seq_len,
                  c.describe("positions must lie in [0, seq_len)"));
  }
  TR_ASSERT(x.ndim == 3 && x.shape[2] % 2 == 0, c.describe("x must be [T, heads, even hd]"));
  TR_ASSERT(
      n_rope_heads >= 0 && n_rope_heads <= x.shape[1] && seq_len > 0 &&
          (!positions.empty() || x.shape[0] % seq_len == 0) && rope.theta > 0 &&
          rope.attention_factor > 0 &&
          (!rope.yarn || (rope.factor >= 1 && rope.original_max_position > 0)),
      c.describe("n_rope_heads=" + std::to_string(n_rope_heads) +
                 " seq_len=" + std::to_string(seq_len) + " theta=" + std::to_string(rope.theta) +
                 (rope.yarn
                      ? " yarn factor=" + std::to_string(rope.factor) +
                            " original_max_position=" + std::to_string(rope.original_max_position)
                      : "")));
  c.note(x.shape[0], int64_t{n_rope_heads} * x.shape[2]);
}
}  // namespace

void rope_fwd(Ctx& ctx, Tensor x, int n_rope_heads, int seq_len, const Rope& rope,
              Tensor positions) {
  check_rope(OpCheck(ctx, "rope_fwd", {{"x", x}, optional("positions", positions)}), x,
             n_rope_heads, seq_len, rope, positions);
  TR_DISPATCH(rope_fwd, x, n_rope_heads, seq_len, rope, positions);
}

void rope_bwd(Ctx& ctx, Tensor dx, int n_rope_heads, int seq_len, const Rope& rope,
              Tensor positions) {
  check_rope(OpCheck(ctx, "rope_bwd", {{"dx", dx}, optional("positions", positions)}), dx,
             n_rope_heads, seq_len, rope, positions);
  TR_DISPATCH(rope_bwd, dx, n_rope_heads, seq_len, rope, positions);
}

namespace {
// qkv [B*S, (nh + 2*nkv) * hd], out [B*S, nh*hd], lse [B, nh, S].
void check_attention(const OpCheck& c, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                     int batch, int seq_len, int nh, int nkv, int hd) {
  TR_ASSERT(batch > 0 && seq_len > 0 && nh > 0 && nkv > 0 && hd > 0 && nh % nkv == 0,
            c.describe("batch=" + std::to_string(batch) + " seq_len=" + std::to_string(seq_len) +
                       " n_heads=" + std::to_string(nh) + " n_kv_heads=" + std::to_string(nkv) +
                       " head_dim=" + std::to_string(hd)));
  const int64_t tokens = static_cast<int64_t>(batch) * seq_len;
  OP_CHECK(c, is_matrix(qkv, tokens, static_cast<int64_t>(nh + 2 * nkv) * hd));
  OP_CHECK(c, is_matrix(out, tokens, static_cast<int64_t>(nh) * hd));
  OP_CHECK(c, lse.ndim == 3 && lse.shape[0] == batch && lse.shape[1] == nh &&
                  lse.shape[2] == seq_len && lse.dtype == stat_dtype(qkv.dtype));
}
// `docs` empty, or one i32 start per row, on the device and on the host.
bool are_docs(const DocStarts& docs, int64_t rows) {
  return docs.empty() ||
         (docs.start.dtype == DType::i32 && docs.start.numel() == rows && docs.host != nullptr);
}
}  // namespace

namespace {
std::atomic<int64_t> g_attention_fast_fallbacks{0};
std::atomic<int64_t> g_attention_ragged_launches{0};
}  // namespace

int64_t attention_ragged_launches() {
  return g_attention_ragged_launches.load(std::memory_order_relaxed);
}
void note_attention_ragged_launch() {
  g_attention_ragged_launches.fetch_add(1, std::memory_order_relaxed);
}

int64_t attention_fast_fallbacks() {
  return g_attention_fast_fallbacks.load(std::memory_order_relaxed);
}
void note_attention_fast_fallback() {
  g_attention_fast_fallbacks.fetch_add(1, std::memory_order_relaxed);
}

DocCount count_documents(const int32_t* start, int64_t tokens, int64_t rows) {
  DocCount c;
  for_each_document(start, tokens, rows, [&](int64_t, int64_t len) {
    ++c.count;
    c.longest = std::max(c.longest, len);
  });
  return c;
}

void attention_fwd(Ctx& ctx, Tensor out, Tensor lse, Tensor qkv, int batch, int seq_len,
                   int n_heads, int n_kv_heads, int head_dim, DocStarts docs) {
  const OpCheck c(ctx, "attention_fwd",
                  {{"out", out}, {"lse", lse}, {"qkv", qkv}, optional("doc_start", docs.start)});
  c.same_float_dtype({out, qkv});
  check_attention(c, out, lse, qkv, batch, seq_len, n_heads, n_kv_heads, head_dim);
  OP_CHECK(c, are_docs(docs, int64_t{batch} * seq_len));
  c.note(int64_t{batch} * seq_len, int64_t{n_heads} * head_dim, seq_len);
  TR_DISPATCH(attention_fwd, out, lse, qkv, batch, seq_len, n_heads, n_kv_heads, head_dim, docs);
}

void attention_bwd(Ctx& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv,
                   int batch, int seq_len, int n_heads, int n_kv_heads, int head_dim,
                   DocStarts docs) {
  const OpCheck c(ctx, "attention_bwd",
                  {{"dqkv", dqkv},
                   {"dout", dout},
                   {"out", out},
                   {"lse", lse},
                   {"qkv", qkv},
                   optional("doc_start", docs.start)});
  c.same_float_dtype({dqkv, dout, out, qkv});
  check_attention(c, out, lse, qkv, batch, seq_len, n_heads, n_kv_heads, head_dim);
  OP_CHECK(c, dqkv.same_shape(qkv) && dout.same_shape(out));
  OP_CHECK(c, are_docs(docs, int64_t{batch} * seq_len));
  c.note(int64_t{batch} * seq_len, int64_t{n_heads} * head_dim, seq_len);
  TR_DISPATCH(attention_bwd, dqkv, dout, out, lse, qkv, batch, seq_len, n_heads, n_kv_heads,
              head_dim, docs);
}

namespace {
// q [C, nh, hd], k and v [Ck, nkv, hd] with nkv dividing nh; a causal block is square.
void check_block(const OpCheck& c, const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  OP_CHECK(c, q.ndim == 3 && k.ndim == 3 && v.same_shape(k) && q.shape[2] == k.shape[2] &&
                  k.shape[1] > 0 && q.shape[1] % k.shape[1] == 0 &&
                  (!causal || q.shape[0] == k.shape[0]));
}
bool is_block_lse(const Tensor& lse, const Tensor& q) {
  return lse.dtype == stat_dtype(q.dtype) && lse.numel() == q.shape[0] * q.shape[1];
}
}  // namespace

void attention_block_fwd(Ctx& ctx, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                         bool causal, DocStarts q_docs, int64_t k_first) {
  const OpCheck c(ctx, "attention_block_fwd",
                  {{"out", out},
                   {"lse", lse},
                   {"q", q},
                   {"k", k},
                   {"v", v},
                   optional("q_doc_start", q_docs.start)});
  c.same_float_dtype({out, q, k, v});
  check_block(c, q, k, v, causal);
  OP_CHECK(c, out.same_shape(q) && is_block_lse(lse, q));
  OP_CHECK(c, are_docs(q_docs, q.shape[0]));
  TR_DISPATCH(attention_block_fwd, out, lse, q, k, v, causal, q_docs, k_first);
}

void attention_block_bwd(Ctx& ctx, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out,
                         Tensor lse, Tensor q, Tensor k, Tensor v, bool causal, DocStarts q_docs,
                         int64_t k_first) {
  const OpCheck c(ctx, "attention_block_bwd",
                  {{"dq", dq},
                   {"dk", dk},
                   {"dv", dv},
                   {"dout", dout},
                   {"out", out},
                   {"lse", lse},
                   {"q", q},
                   {"k", k},
                   optional("q_doc_start", q_docs.start)});
  c.same_float_dtype({dq, dk, dv, dout, out, q, k, v});
  check_block(c, q, k, v, causal);
  OP_CHECK(c, dq.same_shape(q) && dout.same_shape(q) && out.same_shape(q) && dk.same_shape(k) &&
                  dv.same_shape(k) && is_block_lse(lse, q));
  OP_CHECK(c, are_docs(q_docs, q.shape[0]));
  TR_DISPATCH(attention_block_bwd, dq, dk, dv, dout, out, lse, q, k, v, causal, q_docs, k_first);
}

void attention_merge(Ctx& ctx, Tensor out, Tensor lse, Tensor out2, Tensor lse2) {
  const OpCheck c(ctx, "attention_merge",
                  {{"out", out}, {"lse", lse}, {"out2", out2}, {"lse2", lse2}});
  c.same_float_dtype({out, out2});
  OP_CHECK(c, out.ndim == 3 && out.same_shape(out2) && is_block_lse(lse, out) &&
                  is_block_lse(lse2, out));
  TR_DISPATCH(attention_merge, out, lse, out2, lse2);
}

namespace {
// q [L, nh, hd], k and v [L, nkv, hd] as the heads of packed rows [L, (nh + 2 nkv) hd].
void check_qkv_parts(const OpCheck& c, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& packed) {
  c.same_float_dtype({q, k, v, packed});
  OP_CHECK(c, q.ndim == 3 && k.ndim == 3 && v.same_shape(k) && k.shape[0] == q.shape[0] &&
                  k.shape[2] == q.shape[2] &&
                  is_matrix(packed, q.shape[0], (q.shape[1] + 2 * k.shape[1]) * q.shape[2]));
  c.note(packed.shape[0], packed.shape[1]);
}
}  // namespace

void qkv_split(Ctx& ctx, Tensor q, Tensor k, Tensor v, Tensor qkv) {
  check_qkv_parts(OpCheck(ctx, "qkv_split", {{"q", q}, {"k", k}, {"v", v}, {"qkv", qkv}}), q, k, v,
                  qkv);
  TR_DISPATCH(qkv_split, q, k, v, qkv);
}

void qkv_join(Ctx& ctx, Tensor dqkv, Tensor dq, Tensor dk, Tensor dv) {
  check_qkv_parts(OpCheck(ctx, "qkv_join", {{"dqkv", dqkv}, {"dq", dq}, {"dk", dk}, {"dv", dv}}),
                  dq, dk, dv, dqkv);
  TR_DISPATCH(qkv_join, dqkv, dq, dk, dv);
}

void swiglu_fwd(Ctx& ctx, Tensor out, Tensor gateup) {
  const OpCheck c(ctx, "swiglu_fwd", {{"out", out}, {"gateup", gateup}});
  c.same_float_dtype({out, gateup});
  OP_CHECK(c, out.ndim == 2 && is_matrix(gateup, out.shape[0], 2 * out.shape[1]));
  TR_DISPATCH(swiglu_fwd, out, gateup);
}

void swiglu_bwd(Ctx& ctx, Tensor dgateup, Tensor dout, Tensor gateup) {
  const OpCheck c(ctx, "swiglu_bwd", {{"dgateup", dgateup}, {"dout", dout}, {"gateup", gateup}});
  c.same_float_dtype({dgateup, dout, gateup});
  OP_CHECK(c, dout.ndim == 2 && is_matrix(gateup, dout.shape[0], 2 * dout.shape[1]));
  OP_CHECK(c, dgateup.same_shape(gateup));
  c.note(dout.shape[0], dout.shape[1]);
  TR_DISPATCH(swiglu_bwd, dgateup, dout, gateup);
}

void moe_router_fwd(Ctx& ctx, Tensor probs, Tensor experts, Tensor weights, Tensor prob_sums,
                    Tensor routed, Tensor logits, bool normalize) {
  const OpCheck c(ctx, "moe_router_fwd",
                  {{"probs", probs},
                   {"experts", experts},
                   {"weights", weights},
                   {"prob_sums", prob_sums},
                   {"routed", routed},
                   {"logits", logits}});
  c.same_float_dtype({weights, logits});
  const DType sd = stat_dtype(logits.dtype);
  OP_CHECK(c, probs.dtype == sd && prob_sums.dtype == sd && routed.dtype == sd);
  OP_CHECK(c, logits.ndim == 2 && probs.same_shape(logits) && experts.dtype == DType::i32);
  const int64_t T = logits.shape[0], E = logits.shape[1];
  OP_CHECK(c, experts.ndim == 2 && experts.shape[0] == T && experts.shape[1] <= E);
  OP_CHECK(c, weights.same_shape(experts));
  OP_CHECK(c, is_vector(prob_sums, E) && is_vector(routed, E));
  c.note(T, E, experts.shape[1]);
  TR_DISPATCH(moe_router_fwd, probs, experts, weights, prob_sums, routed, logits, normalize);
}

void moe_router_bwd(Ctx& ctx, Tensor dlogits, Tensor dweights, Tensor probs, Tensor experts,
                    bool normalize, Tensor aux_counts, double aux_scale) {
  const OpCheck c(ctx, "moe_router_bwd",
                  {{"dlogits", dlogits},
                   {"dweights", dweights},
                   {"probs", probs},
                   {"experts", experts},
                   optional("aux_counts", aux_counts)});
  c.same_float_dtype({dlogits, dweights});
  OP_CHECK(c, probs.dtype == stat_dtype(dlogits.dtype) && dlogits.same_shape(probs));
  OP_CHECK(c, probs.ndim == 2 && experts.dtype == DType::i32 && dweights.same_shape(experts));
  OP_CHECK(c, experts.ndim == 2 && experts.shape[0] == probs.shape[0]);
  OP_CHECK(c, aux_counts.empty() ||
                  (aux_counts.dtype == probs.dtype && is_vector(aux_counts, probs.shape[1])));
  c.note(probs.shape[0], probs.shape[1], experts.shape[1]);
  TR_DISPATCH(moe_router_bwd, dlogits, dweights, probs, experts, normalize, aux_counts, aux_scale);
}

void moe_dispatch(Ctx& ctx, Tensor counts, Tensor rows, Tensor experts, Tensor weights,
                  int64_t capacity) {
  const OpCheck c(ctx, "moe_dispatch",
                  {{"counts", counts}, {"rows", rows}, {"experts", experts}, {"weights", weights}});
  c.same_float_dtype({weights});
  OP_CHECK(c, counts.dtype == DType::i32 && rows.dtype == DType::i32);
  OP_CHECK(c, experts.dtype == DType::i32 && experts.ndim == 2 && counts.ndim == 1);
  OP_CHECK(c, rows.same_shape(experts) && weights.same_shape(experts) && capacity >= 0);
  c.note(experts.shape[0], experts.shape[1], counts.shape[0]);
  TR_DISPATCH(moe_dispatch, counts, rows, experts, weights, capacity);
}

void moe_permute(Ctx& ctx, Tensor xs, Tensor in, Tensor rows) {
  const OpCheck c(ctx, "moe_permute", {{"xs", xs}, {"in", in}, {"rows", rows}});
  c.same_float_dtype({xs, in});
  OP_CHECK(c, in.ndim == 2 && rows.dtype == DType::i32 && rows.ndim == 2);
  OP_CHECK(c, rows.shape[0] == in.shape[0] && is_matrix(xs, rows.numel(), in.shape[1]));
  TR_DISPATCH(moe_permute, xs, in, rows);
}

void moe_permute_bwd(Ctx& ctx, Tensor din, Tensor dxs, Tensor rows, bool accumulate) {
  const OpCheck c(ctx, "moe_permute_bwd", {{"din", din}, {"dxs", dxs}, {"rows", rows}});
  c.same_float_dtype({din, dxs});
  OP_CHECK(c, din.ndim == 2 && rows.dtype == DType::i32 && rows.ndim == 2);
  OP_CHECK(c, rows.shape[0] == din.shape[0] && is_matrix(dxs, rows.numel(), din.shape[1]));
  TR_DISPATCH(moe_permute_bwd, din, dxs, rows, accumulate);
}

void moe_unpermute(Ctx& ctx, Tensor out, Tensor ys, Tensor weights, Tensor rows) {
  const OpCheck c(ctx, "moe_unpermute",
                  {{"out", out}, {"ys", ys}, {"weights", weights}, {"rows", rows}});
  c.same_float_dtype({out, ys, weights});
  OP_CHECK(c, out.ndim == 2 && rows.dtype == DType::i32 && rows.ndim == 2);
  OP_CHECK(c, rows.shape[0] == out.shape[0] && weights.same_shape(rows));
  OP_CHECK(c, is_matrix(ys, rows.numel(), out.shape[1]));
  TR_DISPATCH(moe_unpermute, out, ys, weights, rows);
}

void moe_unpermute_bwd(Ctx& ctx, Tensor dys, Tensor dweights, Tensor dout, Tensor ys,
                       Tensor weights, Tensor rows) {
  const OpCheck c(ctx, "moe_unpermute_bwd",
                  {{"dys", dys},
                   optional("dweights", dweights),
                   {"dout", dout},
                   optional("ys", ys),
                   {"weights", weights},
                   {"rows", rows}});
  c.same_float_dtype({dys, dweights, dout, ys, weights});
  OP_CHECK(c, dout.ndim == 2 && rows.dtype == DType::i32 && rows.ndim == 2);
  OP_CHECK(c, rows.shape[0] == dout.shape[0] && weights.same_shape(rows));
  OP_CHECK(c, dweights.empty() == ys.empty());
  OP_CHECK(c, dweights.empty() || (dweights.same_shape(rows) && dys.same_shape(ys)));
  OP_CHECK(c, is_matrix(dys, rows.numel(), dout.shape[1]));
  c.note(dout.shape[0], dout.shape[1], rows.shape[1]);
  TR_DISPATCH(moe_unpermute_bwd, dys, dweights, dout, ys, weights, rows);
}

void moe_aux_loss_fwd(Ctx& ctx, Tensor value, Tensor grad, Tensor stats, double value_scale,
                      double grad_scale) {
  const OpCheck c(ctx, "moe_aux_loss_fwd", {{"value", value}, {"grad", grad}, {"stats", stats}});
  OP_CHECK(c, stats.dtype == DType::f32 || stats.dtype == DType::f64);
  OP_CHECK(c, value.dtype == stats.dtype && grad.dtype == stats.dtype);
  OP_CHECK(c, stats.ndim == 2 && stats.shape[0] == 2 && is_vector(grad, stats.shape[1]));
  OP_CHECK(c, is_vector(value, 2));
  c.note(2, stats.shape[1]);
  TR_DISPATCH(moe_aux_loss_fwd, value, grad, stats, value_scale, grad_scale);
}

// Logged as the rows x width it reads: R x I.
void moe_row_dots(Ctx& ctx, Tensor dots, Tensor a, Tensor b) {
  const OpCheck c(ctx, "moe_row_dots", {{"dots", dots}, {"a", a}, {"b", b}});
  c.same_float_dtype({a, b});
  OP_CHECK(c, a.ndim == 2 && b.same_shape(a));
  OP_CHECK(c, dots.dtype == stat_dtype(a.dtype) && is_vector(dots, a.shape[0]));
  c.note(a.shape[0], a.shape[1]);
  TR_DISPATCH(moe_row_dots, dots, a, b);
}

// Logged as the rows x width it writes: T x k.
void moe_choice_grads(Ctx& ctx, Tensor dweights, Tensor dots, Tensor weights, Tensor rows) {
  const OpCheck c(ctx, "moe_choice_grads",
                  {{"dweights", dweights}, {"dots", dots}, {"weights", weights}, {"rows", rows}});
  c.same_float_dtype({dweights, weights});
  OP_CHECK(c, rows.dtype == DType::i32 && rows.ndim == 2);
  OP_CHECK(c, weights.same_shape(rows) && dweights.same_shape(rows));
  OP_CHECK(c, dots.dtype == stat_dtype(weights.dtype) && is_vector(dots, rows.numel()));
  c.note(rows.shape[0], rows.shape[1]);
  TR_DISPATCH(moe_choice_grads, dweights, dots, weights, rows);
}

namespace {
// A grouped linear's groups: one weight [N, K] each (of one dtype, on the op's device), their
// rows summing to at most R.
void check_groups(const OpCheck& c, const Device device, std::span<const Tensor> weights,
                  std::span<const int64_t> group_rows, int64_t R, int64_t N, int64_t K,
                  DType dtype) {
  OP_CHECK(c, !weights.empty() && weights.size() == group_rows.size());
  int64_t sum = 0;
  for (size_t g = 0; g < weights.size(); ++g) {
    const Tensor& w = weights[g];
    OP_CHECK(c, is_matrix(w, N, K) && w.dtype == dtype && w.device == device);
    OP_CHECK(c, group_rows[g] >= 0);
    sum += group_rows[g];
  }
  OP_CHECK(c, sum <= R);
}
}  // namespace

void grouped_linear_fwd(Ctx& ctx, Tensor out, Tensor in, std::span<const Tensor> weights,
                        std::span<const int64_t> group_rows) {
  const OpCheck c(ctx, "grouped_linear_fwd", {{"out", out}, {"in", in}});
  c.same_float_dtype({out, in});
  OP_CHECK(c, in.ndim == 2 && out.ndim == 2 && out.shape[0] == in.shape[0]);
  check_groups(c, ctx.device, weights, group_rows, in.shape[0], out.shape[1], in.shape[1],
               in.dtype);
  // Recorded at its buffers' shape (every routed row), whatever the routing: the op list's key.
  c.note(in.shape[0], out.shape[1], in.shape[1]);
  TR_DISPATCH(grouped_linear_fwd, out, in, weights, group_rows);
}

void grouped_linear_bwd(Ctx& ctx, Tensor din, std::span<const Tensor> dweights, Tensor dout,
                        Tensor in, std::span<const Tensor> weights,
                        std::span<const int64_t> group_rows, GradWrite dw) {
  const OpCheck c(ctx, "grouped_linear_bwd", {optional("din", din), {"dout", dout}, {"in", in}});
  c.same_float_dtype({din, dout, in});
  OP_CHECK(c, in.ndim == 2 && dout.ndim == 2 && dout.shape[0] == in.shape[0]);
  OP_CHECK(c, din.empty() || din.same_shape(in));
  const int64_t R = in.shape[0], N = dout.shape[1], K = in.shape[1];
  check_groups(c, ctx.device, weights, group_rows, R, N, K, in.dtype);
  OP_CHECK(c, !din.empty() || !dweights.empty());
  if (!dweights.empty()) {
    OP_CHECK(c, dweights.size() == weights.size());
    for (const Tensor& g : dweights) {
      c.grad_dtype(g, in);
      OP_CHECK(c, is_matrix(g, N, K) && g.device == ctx.device);
    }
  }
  if (!din.empty()) c.note(R, K, N, "din");
  if (!dweights.empty()) c.note(N, K, R, "dweight");
  TR_DISPATCH(grouped_linear_bwd, din, dweights, dout, in, weights, group_rows,
              dw == GradWrite::assign);
}

void add(Ctx& ctx, Tensor out, Tensor a, Tensor b) {
  const OpCheck c(ctx, "add", {{"out", out}, {"a", a}, {"b", b}});
  c.same_float_dtype({out, a, b});
  OP_CHECK(c, out.same_shape(a) && out.same_shape(b));
  TR_DISPATCH(add, out, a, b);
}

void scale_(Ctx& ctx, Tensor x, float s) {
  const OpCheck c(ctx, "scale_", {{"x", x}});
  c.same_float_dtype({x});
  TR_DISPATCH(scale_, x, s);
}

void zero_(Ctx& ctx, Tensor x) {
  const OpCheck c(ctx, "zero_", {{"x", x}});
  TR_DISPATCH(zero_, x);
}

void cast(Ctx& ctx, Tensor out, Tensor in) {
  const OpCheck c(ctx, "cast", {{"out", out}, {"in", in}});
  c.same_float_dtype({out});
  c.same_float_dtype({in});
  OP_CHECK(c, out.numel() == in.numel());
  TR_DISPATCH(cast, out, in);
}

double sum_squares(Ctx& ctx, Tensor x) {
  const OpCheck c(ctx, "sum_squares", {{"x", x}});
  c.same_float_dtype({x});
  count_host_sync();
  TR_DISPATCH(sum_squares, x);
}

void accumulate_sum(Ctx& ctx, Tensor acc, Tensor x) {
  const OpCheck c(ctx, "accumulate_sum", {{"acc", acc}, {"x", x}});
  c.same_float_dtype({x});
  OP_CHECK(c, acc.dtype == DType::f64 && acc.numel() == 1);
  c.note(x.numel(), 1);
  TR_DISPATCH(accumulate_sum, acc, x, /*squares=*/false);
}

void accumulate_sum_squares(Ctx& ctx, Tensor acc, Tensor x) {
  const OpCheck c(ctx, "accumulate_sum_squares", {{"acc", acc}, {"x", x}});
  c.same_float_dtype({x});
  OP_CHECK(c, acc.dtype == DType::f64 && acc.numel() == 1);
  TR_DISPATCH(accumulate_sum, acc, x, /*squares=*/true);
}

void accumulate_sum_squares_pieces(Ctx& ctx, Tensor acc, Tensor x, Tensor pieces, int64_t base) {
  const OpCheck c(ctx, "accumulate_sum_squares_pieces",
                  {{"acc", acc}, {"x", x}, {"pieces", pieces}});
  c.same_float_dtype({x});
  OP_CHECK(c, acc.dtype == DType::f64 && acc.numel() == 1 && pieces.dtype == DType::i64 &&
                  pieces.ndim == 2 && pieces.shape[1] == 3);
  TR_DISPATCH(accumulate_sum_squares_pieces, acc, x, pieces, base);
}

void read_f64(Ctx& ctx, Tensor src, double* out) {
  TR_ASSERT(src.dtype == DType::f64 && src.device == ctx.device, "read_f64: f64 on ctx's device");
  count_host_sync();
#ifdef TRAINER_HAVE_CUDA
  if (ctx.device == Device::cuda) return cuda::read_f64(ctx, src, out);
#endif
  std::memcpy(out, src.data, src.nbytes());
}

void upload_async(Ctx& ctx, Tensor dst, Tensor src) {
  TR_ASSERT(dst.dtype == src.dtype && dst.numel() == src.numel() && src.device == Device::cpu &&
                dst.device == ctx.device,
            "upload_async: " + src.shape_str() + " from the host into " + dst.shape_str());
#ifdef TRAINER_HAVE_CUDA
  if (ctx.device == Device::cuda) return cuda::upload_async(ctx, dst, src);
#endif
  std::memcpy(dst.data, src.data, src.nbytes());
}

void cross_entropy_fwd_bwd(Ctx& ctx, Tensor losses, Tensor logits, Tensor targets,
                           int64_t vocab_valid, float grad_scale, bool compute_grad) {
  const OpCheck c(ctx, "cross_entropy_fwd_bwd",
                  {{"losses", losses}, {"logits", logits}, {"targets", targets}});
  c.same_float_dtype({logits});
  OP_CHECK(c, losses.dtype == stat_dtype(logits.dtype) && targets.dtype == DType::i32);
  OP_CHECK(c, logits.ndim == 2 && is_vector(losses, logits.shape[0]) &&
                  is_vector(targets, logits.shape[0]));
  TR_ASSERT(vocab_valid > 0 && vocab_valid <= logits.shape[1],
            c.describe("vocab_valid=" + std::to_string(vocab_valid)));
  c.note(logits.shape[0], logits.shape[1]);
  TR_DISPATCH(cross_entropy_fwd_bwd, losses, logits, targets, vocab_valid, grad_scale,
              compute_grad);
}

void xent_row_max(Ctx& ctx, Tensor row_max, Tensor logits, int64_t vocab_valid) {
  const OpCheck c(ctx, "xent_row_max", {{"row_max", row_max}, {"logits", logits}});
  c.same_float_dtype({logits});
  OP_CHECK(c, row_max.dtype == stat_dtype(logits.dtype));
  OP_CHECK(c, logits.ndim == 2 && is_vector(row_max, logits.shape[0]));
  TR_ASSERT(vocab_valid >= 0 && vocab_valid <= logits.shape[1],
            c.describe("vocab_valid=" + std::to_string(vocab_valid)));
  c.note(logits.shape[0], logits.shape[1]);
  TR_DISPATCH(xent_row_max, row_max, logits, vocab_valid);
}

void xent_sums(Ctx& ctx, Tensor sums, Tensor logits, Tensor targets, Tensor row_max,
               int64_t vocab_offset, int64_t vocab_valid) {
  const OpCheck c(ctx, "xent_sums",
                  {{"sums", sums}, {"logits", logits}, {"targets", targets}, {"row_max", row_max}});
  c.same_float_dtype({logits});
  OP_CHECK(c, sums.dtype == stat_dtype(logits.dtype) && row_max.dtype == sums.dtype);
  OP_CHECK(c, logits.ndim == 2 && is_matrix(sums, logits.shape[0], 2) &&
                  is_vector(row_max, logits.shape[0]) && targets.dtype == DType::i32 &&
                  is_vector(targets, logits.shape[0]));
  TR_ASSERT(vocab_offset >= 0 && vocab_valid >= 0 && vocab_valid <= logits.shape[1],
            c.describe("vocab_valid=" + std::to_string(vocab_valid)));
  c.note(logits.shape[0], logits.shape[1]);
  TR_DISPATCH(xent_sums, sums, logits, targets, row_max, vocab_offset, vocab_valid);
}

void xent_loss_grad(Ctx& ctx, Tensor losses, Tensor logits, Tensor targets, Tensor row_max,
                    Tensor sums, int64_t vocab_offset, int64_t vocab_valid, float grad_scale,
                    bool compute_grad) {
  const OpCheck c(ctx, "xent_loss_grad",
                  {{"losses", losses},
                   {"logits", logits},
                   {"targets", targets},
                   {"row_max", row_max},
                   {"sums", sums}});
  c.same_float_dtype({logits});
  OP_CHECK(c, losses.dtype == stat_dtype(logits.dtype) && row_max.dtype == losses.dtype &&
                  sums.dtype == losses.dtype);
  OP_CHECK(c, logits.ndim == 2 && is_vector(losses, logits.shape[0]) &&
                  is_matrix(sums, logits.shape[0], 2) && is_vector(row_max, logits.shape[0]) &&
                  targets.dtype == DType::i32 && is_vector(targets, logits.shape[0]));
  TR_ASSERT(vocab_offset >= 0 && vocab_valid >= 0 && vocab_valid <= logits.shape[1],
            c.describe("vocab_valid=" + std::to_string(vocab_valid)));
  c.note(logits.shape[0], logits.shape[1]);
  TR_DISPATCH(xent_loss_grad, losses, logits, targets, row_max, sums, vocab_offset, vocab_valid,
              grad_scale, compute_grad);
}

void xent_shard_stats(Ctx& ctx, Tensor stats, Tensor logits, Tensor targets, int64_t vocab_offset,
                      int64_t vocab_valid) {
  const OpCheck c(ctx, "xent_shard_stats",
                  {{"stats", stats}, {"logits", logits}, {"targets", targets}});
  c.same_float_dtype({logits});
  OP_CHECK(c, stats.dtype == stat_dtype(logits.dtype) && targets.dtype == DType::i32);
  OP_CHECK(c, logits.ndim == 2 && is_matrix(stats, logits.shape[0], 3) &&
                  is_vector(targets, logits.shape[0]));
  TR_ASSERT(vocab_offset >= 0 && vocab_valid >= 0 && vocab_valid <= logits.shape[1],
            c.describe("vocab_valid=" + std::to_string(vocab_valid)));
  c.note(logits.shape[0], logits.shape[1]);
  TR_DISPATCH(xent_shard_stats, stats, logits, targets, vocab_offset, vocab_valid);
}

void xent_combine(Ctx& ctx, Tensor row_max, Tensor sums, Tensor all_stats) {
  const OpCheck c(ctx, "xent_combine",
                  {{"row_max", row_max}, {"sums", sums}, {"all_stats", all_stats}});
  OP_CHECK(c, (row_max.dtype == DType::f32 || row_max.dtype == DType::f64) &&
                  sums.dtype == row_max.dtype && all_stats.dtype == row_max.dtype);
  OP_CHECK(c, all_stats.ndim == 3 && all_stats.shape[2] == 3 &&
                  is_vector(row_max, all_stats.shape[1]) && is_matrix(sums, all_stats.shape[1], 2));
  TR_DISPATCH(xent_combine, row_max, sums, all_stats);
}

void adamw_update(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p,
                  Tensor compute_copy) {
  const OpCheck c(ctx, "adamw_update",
                  {{"param", param},
                   {"grad", grad},
                   {"m", m},
                   {"v", v},
                   optional("compute_copy", compute_copy)});
  c.same_float_dtype({param, grad, m, v});
  OP_CHECK(c, param.same_shape(grad) && param.same_shape(m) && param.same_shape(v));
  OP_CHECK(c, compute_copy.empty() || compute_copy.numel() == param.numel());
  TR_ASSERT(p.step >= 1 && p.beta1 >= 0.0f && p.beta1 < 1.0f && p.beta2 >= 0.0f && p.beta2 < 1.0f &&
                p.eps > 0.0f,
            c.describe("step=" + std::to_string(p.step) + " beta1=" + std::to_string(p.beta1) +
                       " beta2=" + std::to_string(p.beta2) + " eps=" + std::to_string(p.eps)));
  TR_DISPATCH(adamw_update, param, grad, m, v, p, compute_copy);
}

void adamw_update_pieces(Ctx& ctx, Tensor param, Tensor grad, Tensor m, Tensor v,
                         Tensor compute_copy, Tensor pieces, AdamWIndex index, const AdamWParams& p,
                         float grad_scale) {
  const OpCheck c(ctx, "adamw_update_pieces",
                  {{"param", param},
                   {"grad", grad},
                   {"m", m},
                   {"v", v},
                   optional("compute_copy", compute_copy),
                   {"pieces", pieces}});
  c.same_float_dtype({param, grad, m, v});
  OP_CHECK(c, pieces.dtype == DType::i64 && pieces.ndim == 2 && pieces.shape[1] == 4);
  TR_ASSERT(p.step >= 1 && p.beta1 >= 0.0f && p.beta1 < 1.0f && p.beta2 >= 0.0f && p.beta2 < 1.0f &&
                p.eps > 0.0f,
            c.describe("step=" + std::to_string(p.step)));
  TR_DISPATCH(adamw_update_pieces, param, grad, m, v, compute_copy, pieces, index, p, grad_scale);
}

AttentionPlan attention_prepare(Ctx& ctx, int batch, int seq_len, int n_heads, int n_kv_heads,
                                int head_dim, int cp_chunk, bool documents) {
#ifdef TRAINER_HAVE_CUDA
  if (ctx.device == Device::cuda)
    return cuda::attention_prepare(ctx, batch, seq_len, n_heads, n_kv_heads, head_dim, cp_chunk,
                                   documents);
#endif
  (void)ctx, (void)batch, (void)seq_len, (void)n_heads, (void)n_kv_heads, (void)head_dim,
      (void)cp_chunk, (void)documents;
  return {};
}

DeviceInfo device_info(const Ctx& ctx) {
#ifdef TRAINER_HAVE_CUDA
  if (ctx.device == Device::cuda) {
    DeviceInfo info = cuda::device_info();
    // The GPU table's dense bf16 peak; a part not in it gives 0 (no MFU).
    if (const GpuSpec* g = gpu_of_device(info.name)) info.peak_bf16_flops = g->peak_bf16_flops;
    return info;
  }
#endif
  (void)ctx;
  return {"cpu", 0.0, 0.0, 0.0};
}

void synchronize(const Ctx& ctx) {
  count_host_sync();
#ifdef TRAINER_HAVE_CUDA
  if (ctx.device == Device::cuda) cuda::synchronize(ctx);
#endif
  (void)ctx;
}

}  // namespace tr
