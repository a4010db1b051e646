// Whole-model parity with Hugging Face transformers: logits, loss and every parameter
// gradient of a tiny Qwen2 (GQA, tied and untied, padded vocabulary) against fixtures made in
// float64 by tools/make_hf_fixture.py.
#include <hdf5.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/switches.h"
#include "data/loader.h"
#include "kernels/fp8.h"
#include "kernels/ops.h"
#include "tests/host_tensor.h"
#include "tests/model_util.h"
#include "tests/test_util.h"
#include "trainer/checkpoint/ownership.h"
#include "trainer/config/config.h"
#include "trainer/layout/run_layout.h"
#include "trainer/model/init.h"
#include "trainer/model/model.h"
#include "trainer/model/step_io.h"
#include "trainer/obs/step_timing.h"
#include "trainer/optim/optim.h"
#include "trainer/plan/memory_fit.h"
#include "trainer/plan/plan.h"
#include "trainer/plan/resilience.h"
#include "trainer/session/session.h"

namespace tr {
namespace {

using test::Built;
using test::rel_diff;
using test::small_config;

struct H5File {
  hid_t id;
  explicit H5File(const std::string& path)
      : id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)) {}
  ~H5File() {
    if (id >= 0) H5Fclose(id);
  }
};

template <class T>
std::vector<T> read_dataset(hid_t file, const std::string& name) {
  hid_t ds = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  REQUIRE(ds >= 0);
  hid_t space = H5Dget_space(ds);
  std::vector<T> out(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
  hid_t type = std::is_same_v<T, double> ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT32;
  REQUIRE(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0);
  H5Sclose(space);
  H5Dclose(ds);
  return out;
}

template <class T = int64_t>
T read_attr(hid_t file, const char* name) {
  hid_t a = H5Aopen(file, name, H5P_DEFAULT);
  REQUIRE(a >= 0);
  T v = 0;
  REQUIRE(H5Aread(a, std::is_same_v<T, double> ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT64, &v) >= 0);
  H5Aclose(a);
  return v;
}

std::vector<int32_t> read_attr_ints(hid_t file, const char* name) {
  hid_t a = H5Aopen(file, name, H5P_DEFAULT);
  REQUIRE(a >= 0);
  hid_t space = H5Aget_space(a);
  std::vector<int32_t> v(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
  REQUIRE(H5Aread(a, H5T_NATIVE_INT32, v.data()) >= 0);
  H5Sclose(space);
  H5Aclose(a);
  return v;
}

template <class T>
void check_parity(const std::string& fixture, DType dtype, double tol) {
  H5File f(tr::test::source_dir() + "/tests/fixtures/" + fixture);
  REQUIRE(f.id >= 0);
  ModelConfig mc;
  mc.hidden_size = read_attr(f.id, "hidden_size");
  mc.intermediate_size = read_attr(f.id, "intermediate_size");
  mc.num_layers = read_attr(f.id, "num_hidden_layers");
  mc.num_heads = read_attr(f.id, "num_attention_heads");
  mc.num_kv_heads = read_attr(f.id, "num_key_value_heads");
  mc.head_dim = read_attr(f.id, "head_dim");
  mc.vocab_size = read_attr(f.id, "vocab_size");
  mc.rope_theta = read_attr<double>(f.id, "rope_theta");
  mc.rms_norm_eps = read_attr<double>(f.id, "rms_norm_eps");
  mc.tie_embeddings = read_attr(f.id, "tie_word_embeddings") != 0;
  if (H5Aexists(f.id, "yarn_factor") > 0) {  // rope_scaling {type: yarn, ...}
    mc.rope_scaling.type = "yarn";
    mc.rope_scaling.factor = read_attr<double>(f.id, "yarn_factor");
    mc.rope_scaling.original_max_position_embeddings =
        read_attr(f.id, "yarn_original_max_position_embeddings");
  }
  // A LlamaForCausalLM fixture has no q, k, v biases: model.family llama; a Qwen3ForCausalLM
  // one has none either, and QK-norm weights.
  if (H5Lexists(f.id, "params/layers/0/self_attn/q_proj/bias", H5P_DEFAULT) <= 0)
    mc.family =
        H5Lexists(f.id, "params/layers/0/self_attn/q_norm", H5P_DEFAULT) > 0 ? "qwen3" : "llama";
  if (H5Aexists(f.id, "num_experts") > 0) {  // a Qwen3MoeForCausalLM
    mc.family = "qwen3_moe";
    mc.num_experts = read_attr(f.id, "num_experts");
    mc.experts_per_token = read_attr(f.id, "num_experts_per_tok");
    mc.moe_intermediate_size = read_attr(f.id, "moe_intermediate_size");
    mc.norm_topk_prob = read_attr(f.id, "norm_topk_prob") != 0;
    mc.router_aux_loss_coef = read_attr<double>(f.id, "router_aux_loss_coef");
    mc.decoder_sparse_step = read_attr(f.id, "decoder_sparse_step");
    for (int32_t l : read_attr_ints(f.id, "mlp_only_layers")) mc.mlp_only_layers.push_back(l);
  }
  if (H5Aexists(f.id, "llama3_factor") > 0) {  // rope_scaling {type: llama3, ...}
    mc.rope_scaling.type = "llama3";
    mc.rope_scaling.factor = read_attr<double>(f.id, "llama3_factor");
    mc.rope_scaling.low_freq_factor = read_attr<double>(f.id, "llama3_low_freq_factor");
    mc.rope_scaling.high_freq_factor = read_attr<double>(f.id, "llama3_high_freq_factor");
    mc.rope_scaling.original_max_position_embeddings =
        read_attr(f.id, "llama3_original_max_position_embeddings");
  }
  const int64_t B = read_attr(f.id, "batch"), S = read_attr(f.id, "seq_len"), V = mc.vocab_size;
  Topology topo;
  Built b(ModelDims::from(mc, topo), {.batch = B, .seq_len = S, .dtype = dtype});
  DecoderModel& model = b.model;
  REQUIRE(model.dims().vocab_padded == 384);  // 300 padded to a multiple of 128

  for (const ParamInfo& p : model.layout().tensors) {
    std::vector<double> w = read_dataset<double>(f.id, "params/" + p.name);
    T* dst = b.params.weight(p).template ptr<T>();
    for (size_t i = 0; i < w.size(); ++i) dst[i] = static_cast<T>(w[i]);  // padded rows stay 0
  }
  const std::vector<int32_t> tokens = read_dataset<int32_t>(f.id, "tokens");
  const std::vector<int32_t> targets = read_dataset<int32_t>(f.id, "targets");
  const double loss =
      forward_backward(model, tokens.data(), targets.data(), 1.0f / static_cast<float>(B * S)) /
      static_cast<double>(B * S);
  const double ref_loss = read_dataset<double>(f.id, "loss")[0];
  INFO(fixture << " loss " << loss << " vs " << ref_loss);
  CHECK(std::abs(loss - ref_loss) / ref_loss <= tol);

  std::vector<float> logits = model.logits(0, B * S);
  REQUIRE(logits.size() == static_cast<size_t>(B * S * V));
  CHECK(test::rel_err(logits, read_dataset<double>(f.id, "logits")) <= tol);

  for (const ParamInfo& p : model.layout().tensors) {
    std::vector<double> g = read_dataset<double>(f.id, "grads/" + p.name);
    const double e = test::rel_err(b.params.grad(p).template ptr<T>(), g.data(), g.size());
    INFO(fixture << " gradient of " << p.name << ": relative error " << e);
    CHECK(e <= tol);
  }
}

TEST_CASE("HF parity: tiny Qwen2, tied embeddings, fp32", "[model]") {
  check_parity<float>("qwen2_tiny_tied.h5", DType::f32, 1e-5);
}

TEST_CASE("HF parity: tiny Qwen2, untied embeddings, fp32", "[model]") {
  check_parity<float>("qwen2_tiny_untied.h5", DType::f32, 1e-5);
}

// In float64 the remaining difference (~2e-7) is Hugging Face's: its rotary tables are always
// computed in float32, ours in double.
TEST_CASE("HF parity: tiny Qwen2 in fp64 matches to 1e-6", "[model]") {
  check_parity<double>("qwen2_tiny_untied.h5", DType::f64, 1e-6);
}

// YaRN (rope_scaling type yarn, factor 4 over a trained context of 16): logits, loss and every
// gradient as transformers computes them, in fp64 and fp32. In fp64 the logits and loss agree to
// 1e-6; a gradient differs by up to 1.2e-6 (k_proj's bias), from transformers' float32 rotary
// tables, which YaRN's scale and slowed frequencies weigh more.
TEST_CASE("HF parity: tiny Qwen2 with YaRN rope scaling, fp64 and fp32", "[model]") {
  check_parity<double>("qwen2_tiny_yarn.h5", DType::f64, 2e-6);
  check_parity<float>("qwen2_tiny_yarn.h5", DType::f32, 1e-5);
}

// Llama 3's rope scaling (factor 8, low and high frequency factors 1 and 16, a trained context of
// 251: one pair kept, one blended, two slowed) on the tiny Qwen2: logits, loss and every gradient
// as transformers computes them.
TEST_CASE("HF parity: tiny Qwen2 with Llama 3 rope scaling, fp64 and fp32", "[model]") {
  check_parity<double>("qwen2_tiny_llama3_rope.h5", DType::f64, 1e-6);
  check_parity<float>("qwen2_tiny_llama3_rope.h5", DType::f32, 1e-5);
}

// Llama 3 (model.family llama: no q, k, v biases; Llama 3's RoPE rule), tied and untied, as
// transformers' LlamaForCausalLM computes it.
TEST_CASE("HF parity: tiny Llama 3 in fp64 and fp32", "[model]") {
  for (const char* name : {"llama_tiny_tied.h5", "llama_tiny_untied.h5"}) {
    INFO(name);
    check_parity<double>(name, DType::f64, 1e-6);
    check_parity<float>(name, DType::f32, 1e-5);
  }
}

// Qwen3 (model.family qwen3: no q, k, v biases; an RMSNorm over each q and k head before
// RoPE), tied and untied, as transformers' Qwen3ForCausalLM computes it, the QK-norm weights'
// gradients included.
TEST_CASE("HF parity: tiny Qwen3 in fp64 and fp32", "[model]") {
  for (const char* name : {"qwen3_tiny_tied.h5", "qwen3_tiny_untied.h5"}) {
    INFO(name);
    check_parity<double>(name, DType::f64, 1e-6);
    check_parity<float>(name, DType::f32, 1e-5);
  }
}

// Qwen3-MoE (model.family qwen3_moe): layers 0 and 2 sparse (8 experts, 2 chosen per token),
// layer 1 dense (mlp_only_layers), the load-balancing loss weighed 0.02 in the loss; the router's
// top-k renormalised (untied fixture) or not (tied). Logits, the loss with the auxiliary loss and
// every gradient, the router's and every expert's included, as transformers computes them with a
// float64 router softmax (tools/make_hf_fixture.py). Transformers' float32 norms and rotary
// tables leave up to 1.02e-6 in one expert's gradient, hence 2e-6 in fp64.
TEST_CASE("HF parity: tiny Qwen3-MoE in fp64 and fp32", "[model]") {
  for (const char* name : {"qwen3_moe_tiny.h5", "qwen3_moe_tiny_tied.h5"}) {
    INFO(name);
    check_parity<double>(name, DType::f64, 2e-6);
    check_parity<float>(name, DType::f32, 1e-5);
  }
}

TEST_CASE("the loss in chunks equals the loss in one piece", "[model]") {
  Topology topo;
  const ModelDims d = ModelDims::from(small_config(false), topo);
  Built whole(d, {.batch = 2, .seq_len = 8}),
      chunked(d, {.batch = 2, .seq_len = 8, .loss_chunk = 5});  // 16 tokens: 5+5+5+1
  whole.init_weights(11, 0.1);
  chunked.init_weights(11, 0.1);
  std::vector<int32_t> tok(16), tgt(16);
  for (int i = 0; i < 16; ++i) tok[i] = (7 * i + 3) % 50, tgt[i] = (5 * i + 1) % 50;
  const double a = forward_backward(whole.model, tok.data(), tgt.data(), 1.0f / 16);
  const double b = forward_backward(chunked.model, tok.data(), tgt.data(), 1.0f / 16);
  CHECK(std::abs(a - b) / a < 1e-6);
  CHECK(rel_diff(chunked.params.grads(), whole.params.grads()) < 1e-6);
}

TEST_CASE("two micro-batches of one sample give the gradients of one batch of two", "[model]") {
  Topology topo;
  const ModelDims d = ModelDims::from(small_config(true), topo);
  Built one(d, {.batch = 2, .seq_len = 8}), halves(d, {.batch = 1, .seq_len = 8});
  one.init_weights(5, 0.1);
  halves.init_weights(5, 0.1);
  std::vector<int32_t> tok(16), tgt(16);
  for (int i = 0; i < 16; ++i) tok[i] = (3 * i + 1) % 50, tgt[i] = (11 * i + 2) % 50;
  const float scale = 1.0f / 16;  // mean over the 16 tokens of the global batch
  const double a = forward_backward(one.model, tok.data(), tgt.data(), scale);
  const double b = forward_backward(halves.model, tok.data(), tgt.data(), scale) +
                   forward_backward(halves.model, tok.data() + 8, tgt.data() + 8, scale);
  CHECK(std::abs(a - b) / a < 1e-6);
  CHECK(rel_diff(halves.params.grads(), one.params.grads()) < 1e-6);
}

// The packed sample of the document tests: documents [1 5 9 0] [4 4 7 2 0] [11 3 6] ending at
// token 0, then the stream's next token; fp64 models with the seeded initial weights (f64 models
// are their own masters).
struct PackedSample {
  static constexpr int32_t kEod = 0;
  const ModelConfig mc = small_config(false);
  Topology topo;
  std::vector<int32_t> x = {1, 5, 9, 0, 4, 4, 7, 2, 0, 11, 3, 6}, y, starts;
  PackedSample() : y(x.begin() + 1, x.end()), starts(x.size()) {
    y.push_back(8);
    data::document_starts(x.data(), static_cast<int64_t>(x.size()), kEod, starts.data());
  }
  // A model of `seq_len` tokens per sequence with the seeded weights.
  std::unique_ptr<Built> model(int64_t seq_len) const {
    auto b =
        std::make_unique<Built>(ModelDims::from(mc, topo),
                                ModelOptions{.batch = 1, .seq_len = seq_len, .dtype = DType::f64});
    const std::vector<float> w = initial_weights(b->layout(), b->model.dims(), 3, 0.2);
    std::copy(w.begin(), w.end(), b->params.weights().ptr<double>());
    return b;
  }
  // The loss and every gradient of the pieces [lo, hi) of the sample, each run alone.
  std::pair<double, std::vector<double>> alone(
      std::initializer_list<std::pair<int64_t, int64_t>> pieces) const {
    std::pair<double, std::vector<double>> out{0.0, {}};
    for (const auto& [lo, hi] : pieces) {
      const std::unique_ptr<Built> b = model(hi - lo);
      out.first += forward_backward(b->model, x.data() + lo, y.data() + lo, 1.0f);
      const Tensor g = b->params.grads();
      out.second.resize(static_cast<size_t>(g.numel()), 0.0);
      for (size_t i = 0; i < out.second.size(); ++i) out.second[i] += g.ptr<double>()[i];
    }
    return out;
  }
};

// Block-causal attention (data.document_mask): a sample packing three documents gives the loss
// and every gradient of the three run as sequences of their own, in fp64 (RoPE depends only on
// relative positions, so the documents' offsets in the sample do not matter).
TEST_CASE("model: a packed sample under block-causal attention is its documents run alone",
          "[model]") {
  const PackedSample p;
  const std::unique_ptr<Built> packed = p.model(12);
  const double loss =
      forward_backward(packed->model, p.x.data(), p.y.data(), 1.0f, p.starts.data());
  const Tensor grads = packed->params.grads();
  const auto [want_loss, want] = p.alone({{0, 4}, {4, 9}, {9, 12}});
  CHECK(std::abs(loss / want_loss - 1) < 1e-12);
  CHECK(test::rel_err(grads.ptr<double>(), want.data(), grads.numel()) < 1e-12);
  // Plain causal attention reads across the documents: another loss.
  const std::unique_ptr<Built> across = p.model(12);
  CHECK(std::abs(forward_backward(across->model, p.x.data(), p.y.data(), 1.0f) / want_loss - 1) >
        1e-3);
}

// data.reset_position_ids and data.eod_mask_loss on the same packed sample: with block-causal
// attention, positions restarting in each document and the targets after each end-of-document
// token left out, the loss and every gradient are those of the documents run alone, each
// without its last position when it ends in the end-of-document token (causal attention: the
// other positions do not see it). Without block-causal attention, restarting the positions
// changes the loss (the documents see each other at other relative positions).
TEST_CASE("model: packed documents with reset positions and a masked loss are run alone",
          "[model]") {
  const PackedSample p;
  std::vector<int32_t> positions(p.x.size()), masked = p.y;
  for (size_t i = 0; i < p.x.size(); ++i) {
    positions[i] = static_cast<int32_t>(i) - p.starts[i];
    if (p.x[i] == PackedSample::kEod) masked[i] = data::kIgnoredTarget;
  }
  CHECK(positions == std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2});
  const std::unique_ptr<Built> packed = p.model(12);
  const double loss = forward_backward(packed->model, p.x.data(), masked.data(), 1.0f,
                                       p.starts.data(), positions.data());
  const Tensor grads = packed->params.grads();
  // The documents [1 5 9] 0, [4 4 7 2] 0 and [11 3 6]: the first two without their last position.
  const auto [want_loss, want] = p.alone({{0, 3}, {4, 8}, {9, 12}});
  CHECK(std::abs(loss / want_loss - 1) < 1e-12);
  CHECK(test::rel_err(grads.ptr<double>(), want.data(), grads.numel()) < 1e-12);
  // Across documents, restarted positions are another model input.
  auto plain_loss = [&](const int32_t* at) {
    const std::unique_ptr<Built> b = p.model(12);
    return forward_backward(b->model, p.x.data(), p.y.data(), 1.0f, nullptr, at);
  };
  CHECK(std::abs(plain_loss(positions.data()) / plain_loss(nullptr) - 1) > 1e-6);
}

TEST_CASE("gradients accumulate over micro-batches", "[model]") {
  const ModelConfig mc = small_config(true);
  Topology topo;
  Built b(ModelDims::from(mc, topo), {.batch = 1, .seq_len = 8});
  b.init_weights(7, 0.1);
  DecoderModel& model = b.model;
  std::vector<int32_t> tok = {1, 5, 9, 2, 44, 3, 7, 7}, tgt = {5, 9, 2, 44, 3, 7, 7, 0};
  forward_backward(model, tok.data(), tgt.data(), 1.0f);
  std::vector<float> once(b.params.grads().ptr<float>(),
                          b.params.grads().ptr<float>() + model.layout().total);
  forward_backward(model, tok.data(), tgt.data(), 1.0f);
  const float* twice = b.params.grads().ptr<float>();
  double num = 0, den = 0;
  for (size_t i = 0; i < once.size(); ++i) {
    num += (twice[i] - 2 * once[i]) * (twice[i] - 2 * once[i]);
    den += 4.0 * once[i] * once[i];
  }
  REQUIRE(den > 0);
  CHECK(std::sqrt(num / den) < 1e-6);
}

// Recomputation changes what backward keeps, not what it computes: two micro-batches in flight
// (as on a pipeline stage), every mode gives the gradients and losses of `none` bit for bit,
// and holds less.
TEST_CASE("model: activation recomputation gives the same gradients bit for bit and holds less",
          "[model]") {
  ModelConfig mc = small_config(false);
  mc.num_layers = 3;
  Topology topo;
  struct Mode {
    const char* name;
    bool selective;
    int64_t full;
  };
  std::vector<float> want;
  double want_loss = 0;
  size_t last_bytes = 0;
  for (const Mode& m : {Mode{"none", false, 0}, Mode{"selective", true, 0},
                        Mode{"full, 2 of 3 layers", false, 2}, Mode{"full", false, 3}}) {
    INFO(m.name);
    ModelDims d = ModelDims::from(mc, topo);
    d.recompute_selective = m.selective;
    d.recompute_full = m.full;
    Built b(d, {.batch = 2, .seq_len = 8, .slots = 2});
    b.init_weights(5, 0.2);
    DecoderModel& model = b.model;
    std::vector<int32_t> tok(16), tgt(16);
    for (int i = 0; i < 16; ++i) tok[i] = (7 * i + 3) % 50, tgt[i] = (11 * i + 1) % 50;
    StepIO io{Ctx{}};
    io.stage({tok.data(), tgt.data()}, {tgt.data(), tok.data()}, 16);
    model.forward_stage(0, io.inputs(0));
    model.stage_loss(0, io.targets(0), 0.03f, true, io.loss_sum());
    model.forward_stage(1, io.inputs(1));  // a second micro-batch in flight
    model.stage_loss(1, io.targets(1), 0.03f, true, io.loss_sum());
    model.backward_stage(0, io.inputs(0), false);
    model.backward_stage(1, io.inputs(1), true);
    const double loss = io.take().loss_sum;
    const float* g = b.params.grads().ptr<float>();
    std::vector<float> got(g, g + model.layout().total);
    if (want.empty()) {
      want = got, want_loss = loss, last_bytes = model.activation_bytes();
      continue;
    }
    CHECK(loss == want_loss);
    CHECK(got == want);
    CHECK(model.activation_bytes() < last_bytes);
    last_bytes = model.activation_bytes();
  }
}

TEST_CASE("initialisation is deterministic and layout-independent of buffers", "[model]") {
  const ModelConfig mc = small_config(false);
  Topology topo;
  Built a(ModelDims::from(mc, topo), {.batch = 1, .seq_len = 8}),
      b(ModelDims::from(mc, topo), {.batch = 2, .seq_len = 4});
  a.init_weights(3, 0.02);
  b.init_weights(3, 0.02);
  const ParamInfo& emb = a.layout().find("embed_tokens/weight");
  const float* e = a.params.weight(emb).ptr<float>();
  // Padded vocabulary rows (50..127) are zero; real rows are not.
  for (int64_t i = 50 * 32; i < 128 * 32; ++i) REQUIRE(e[i] == 0.0f);
  double sq = 0;
  for (int64_t i = 0; i < 50 * 32; ++i) sq += e[i] * e[i];
  CHECK(std::sqrt(sq / (50 * 32)) == Approx(0.02).epsilon(0.1));
  CHECK(std::memcmp(a.params.weights().data, b.params.weights().data,
                    a.params.weights().nbytes()) == 0);
  const float* ln =
      a.params.weight(a.layout().find("layers/1/input_layernorm/weight")).ptr<float>();
  CHECK(ln[0] == 1.0f);
  const float* qb = a.params.weight(a.layout().find("layers/0/self_attn/q_proj/bias")).ptr<float>();
  CHECK(qb[3] == 0.0f);
}

// The mixed-precision plumbing (masters, gradients and a separate compute copy the optimizer
// rewrites) run on the CPU with an f32 compute copy: bit-identical to the single-buffer model
// over several steps, so the GPU's bf16 layout only changes the rounding, not the data flow.
TEST_CASE("a separate compute copy of the weights trains bit-identically to the masters alone",
          "[model]") {
  const ModelConfig mc = small_config(true);
  Topology topo;
  const ModelDims d = ModelDims::from(mc, topo);
  Built plain(d, {.batch = 2, .seq_len = 8}),
      split(d, {.batch = 2, .seq_len = 8, .separate_compute_copy = true});
  REQUIRE_FALSE(plain.opt.separate_masters());
  REQUIRE(split.opt.separate_masters());
  plain.init_weights(3, 0.1);
  split.init_weights(3, 0.1);
  DistributedOptimizer &a = plain.opt, &b = split.opt;
  std::vector<int32_t> tok(16), tgt(16);
  for (int i = 0; i < 16; ++i) tok[i] = (7 * i + 3) % 50, tgt[i] = (5 * i + 1) % 50;
  for (int step = 1; step <= 3; ++step) {
    Ctx cpu;
    zero_(cpu, plain.params.grads());
    zero_(cpu, split.params.grads());
    const double la = forward_backward(plain.model, tok.data(), tgt.data(), 1.0f / 16);
    const double lb = forward_backward(split.model, tok.data(), tgt.data(), 1.0f / 16);
    CHECK(la == lb);
    CHECK(a.reduce_and_clip() == b.reduce_and_clip());
    a.update(1e-2, step);
    b.update(1e-2, step);
    const int64_t n = plain.layout().total;
    CHECK(std::memcmp(a.masters().data, b.masters().data, n * 4) == 0);
    CHECK(std::memcmp(split.params.weights().data, b.masters().data, n * 4) == 0);
    CHECK(split.params.weights().data != b.masters().data);
  }
  // Masters set from outside (a checkpoint load) reach the compute copy.
  std::vector<float> w = b.weights_to_host();
  for (float& x : w) x *= 0.5f;
  b.weights_from_host(w);
  CHECK(split.params.weights().ptr<float>()[7] == w[7]);
  CHECK(b.masters().ptr<float>()[7] == w[7]);
}

// Every CPU-visible kernel switch takes its other path when on (a counter says it ran) and
// never when off, and both paths compute the same step: the zeroing pass (TR_GRAD_ZERO), the
// per-tensor norm (TR_NORM_PER_TENSOR, to the summation order) and the per-tensor AdamW with its
// clipping pass (TR_ADAMW_PER_TENSOR, bit for bit on the CPU). The GPU-only switches
// (TR_ROPE_FP64, TR_XENT_3PASS's whole-vocabulary kernel) are counted by the gpu op tests, the
// vocab-parallel TR_XENT_3PASS by the tp test of the trainer (test_cli).
TEST_CASE("switches: each kernel switch changes the path taken, and both paths agree", "[model]") {
  Topology topo;
  const ModelDims d = ModelDims::from(small_config(true), topo);
  std::vector<int32_t> tok(16), tgt(16);
  for (int i = 0; i < 16; ++i) tok[i] = (5 * i + 2) % 50, tgt[i] = (13 * i + 1) % 50;
  struct Run {
    std::vector<float> grads, params;
    double loss = 0, norm = 0;
  };
  // Two steps (so the second step's first write meets the first step's gradients), clipped,
  // with `on` switched on (or none).
  auto train = [&](std::optional<Switch> on) {
    std::optional<ScopedSwitch> flip;
    if (on) flip.emplace(*on, true);
    OptimConfig oc;
    oc.grad_clip = 0.05;
    Built b(d, {.batch = 1, .seq_len = 8}, oc);
    b.init_weights(11, 0.1);
    DecoderModel& model = b.model;
    DistributedOptimizer& opt = b.opt;
    Run r;
    for (int step = 1; step <= 2; ++step) {
      model.begin_step_grads();
      r.loss = forward_backward(model, tok.data(), tgt.data(), 1.0f / 16) +
               forward_backward(model, tok.data() + 8, tgt.data() + 8, 1.0f / 16);
      r.grads.assign(b.params.grads().ptr<float>(),
                     b.params.grads().ptr<float>() + model.layout().total);
      r.norm = opt.reduce_and_clip();
      opt.update(1e-2, step);
    }
    r.params = opt.weights_to_host();
    return r;
  };
  const Switch kernel_switches[] = {Switch::grad_zero, Switch::norm_per_tensor,
                                    Switch::adamw_per_tensor};
  std::vector<int64_t> before;
  for (Switch s : kernel_switches) before.push_back(taken_count(s));
  const Run off = train(std::nullopt);
  CHECK(off.norm > 0.05);  // the clip ran
  for (size_t i = 0; i < before.size(); ++i) {
    const Switch s = kernel_switches[i];
    INFO(switch_info(s).env);
    CHECK(taken_count(s) == before[i]);
    const Run on = train(s);
    CHECK(taken_count(s) >= before[i] + 2);  // once per step at least
    CHECK(on.loss == off.loss);
    CHECK(on.grads == off.grads);
    if (s == Switch::norm_per_tensor) {  // the same norm but for the summation order
      CHECK(std::abs(on.norm - off.norm) <= 1e-9 * off.norm);
      CHECK(test::rel_err(on.params.data(), off.params.data(), off.params.size()) < 1e-6);
    } else {
      CHECK(on.norm == off.norm);
      CHECK(on.params == off.params);
    }
    for (size_t j = 0; j < before.size(); ++j)  // only the switch that is on was taken
      if (j != i) CHECK(taken_count(kernel_switches[j]) == before[j]);
    before[i] = taken_count(s);
  }
}

// Loss chunks from the 2 GiB logits budget: the whole micro-batch where it fits, never fewer
// than 4096 tokens (the LM head's weight gradient is then read a few times per micro-batch, not
// the 38 of 16M-logit chunks at Qwen2.5-1.5B, seq 4096).
TEST_CASE("model: loss chunks hold the whole micro-batch where 2 GiB of logits allow", "[model]") {
  const int64_t qwen = 151936;
  CHECK(loss_chunk_tokens(4096, qwen, DType::bf16) == 4096);  // 1.16 GiB: whole
  // 16384 tokens: 2 GiB / (151936 x 2 bytes) = 7067 rows per chunk.
  CHECK(loss_chunk_tokens(16384, qwen, DType::bf16) == 7067);
  // fp32 would fit 3533 rows; the floor of 4096 rows wins.
  CHECK(loss_chunk_tokens(16384, qwen, DType::f32) == 4096);
  CHECK(loss_chunk_tokens(100, qwen, DType::f32) == 100);           // a short micro-batch: whole
  CHECK(loss_chunk_tokens(65536, qwen / 8, DType::bf16) == 56536);  // tp 8: 18992 rows
  // The model and the planner take it: 1.5B at seq 4096, one micro-batch of 1 sample.
  const Config cfg = test::config_with({"parallel.tp=1", "parallel.pp=1", "parallel.dp=1",
                                        "parallel.zero1=false", "parallel.sequence_parallel=false",
                                        "model.preset=qwen2.5-1.5b", "train.global_batch=8"});
  absl::StatusOr<Plan> p = make_plan(cfg, *gpu_spec("h100"), 1, 1);
  INFO(p.status().message());
  REQUIRE(p.ok());
  CHECK(p->stages.back().loss_chunk_tokens == 4096);
  CHECK(format_plan(cfg, *p).find("loss: chunks of 4096 tokens of the 4096 in a micro-batch") !=
        std::string::npos);
}

// FP8 projections cast each weight once and reuse its codes until the weights change
// (trainer/model/layer_gemm.h): a forward after a weight moved and weights_changed() gives a
// fresh model's loss for the moved weights; without weights_changed() it still gives the old
// weights' loss (the cast is not repeated); and the FP8 loss is not the fp32 one.
TEST_CASE("model: FP8 weight codes serve until weights_changed", "[model]") {
  const ModelDims d = ModelDims::from(small_config(false), Topology{});
  const ModelOptions fp8{.batch = 2, .seq_len = 8, .gemm = {.fp8 = true}};
  std::vector<int32_t> tok(16), tgt(16);
  for (int i = 0; i < 16; ++i) tok[i] = (7 * i + 3) % 50, tgt[i] = (11 * i + 1) % 50;
  const auto loss = [&](Built& b) {
    StepIO io{Ctx{}};
    io.stage({tok.data()}, {tgt.data()}, 16);
    b.model.forward_stage(0, io.inputs(0));
    b.model.stage_loss(0, io.targets(0), 1.0f, false, io.loss_sum());
    return io.take().loss_sum;
  };
  // Moves layer 0's down projection (a weight of an FP8 product).
  const auto move = [&](Built& b) {
    const Tensor w = b.params.weights().at(b.layout().find("layers/0/mlp/down_proj/weight").offset,
                                           {d.hidden, d.inter});
    for (int64_t i = 0; i < w.numel(); ++i) w.ptr<float>()[i] *= 1.5f;
  };
  Built a(d, fp8), fresh(d, fp8), fp32(d, {.batch = 2, .seq_len = 8});
  for (Built* b : {&a, &fresh, &fp32}) b->init_weights(5, 0.2);
  const double before = loss(a);
  CHECK(before != loss(fp32));
  CHECK(before == Approx(loss(fp32)).epsilon(0.02));
  move(a);
  CHECK(loss(a) == before);  // the codes of the weights before the move
  a.model.weights_changed();
  move(fresh);
  const double moved = loss(fresh);
  CHECK(moved != before);
  CHECK(loss(a) == moved);
}

// One projection through LayerGemm in FP8 (trainer/model/layer_gemm.h) against a float64
// recomputation of the same quantized math: each operand cast by the host's scaled cast
// (kernels/fp8.h), its codes decoded and scaled back, and multiplied in float64. The forward
// with a bias, then a whole backward: din, dw added to a gradient already there, db from the
// unquantized output gradient; with E5M2 and with E4M3 output gradients.
TEST_CASE("model: an FP8 projection is the float64 product of its quantized operands", "[model]") {
  const int64_t T = 12, K = 16, O = 8;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  const auto filled = [&](std::initializer_list<int64_t> shape, double scale) {
    test::HostTensor t(DType::f32, shape);
    for (int64_t i = 0; i < t.size(); ++i) t.set(i, scale * u(rng));
    return t;
  };
  // x's values after the scaled cast to `f` and back, in float64.
  const auto quantized = [](const test::HostTensor& x, Fp8Format f) {
    std::vector<float> v(static_cast<size_t>(x.size()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(x.get(static_cast<int64_t>(i)));
    std::vector<uint8_t> codes(v.size());
    const Fp8Scaling s = fp8_cast_scaled(codes, v, f);
    std::vector<double> out(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      out[i] = static_cast<double>(fp8_decode(codes[i], f)) * s.scale_inv;
    return out;
  };
  for (const DType grad : {DType::f8e5m2, DType::f8e4m3}) {
    INFO("output gradients in " << dtype_name(grad));
    const Fp8Format gf = grad == DType::f8e5m2 ? Fp8Format::e5m2 : Fp8Format::e4m3;
    LayerGemm gemm({.fp8 = true, .grad = grad});
    Arena ar(1 << 20, Device::cpu);
    test::HostTensor w = filled({O, K}, 0.05), in = filled({T, K}, 3.0), b = filled({O}, 1.0),
                     dout = filled({T, O}, 1e-3), out(DType::f32, {T, O}), din(DType::f32, {T, K}),
                     dw = filled({O, K}, 1.0), db = filled({O}, 1.0);
    const std::vector<double> dw0 = dw.values(), db0 = db.values();
    gemm.alloc_scratch(ar, T * K, T * O);
    gemm.alloc_weight_codes(ar, w.t.data, O, K);
    gemm.new_weights();
    Ctx ctx;
    gemm.fwd(ctx, out.t, in.t, w.t, b.t);
    gemm.bwd(ctx, din.t, dw.t, db.t, dout.t, in.t, w.t, GradWrite::add);
    const std::vector<double> qw = quantized(w, Fp8Format::e4m3),
                              qin = quantized(in, Fp8Format::e4m3), qd = quantized(dout, gf);
    std::vector<double> want_out(T * O), want_din(T * K), want_dw(dw0), want_db(db0);
    double plain = 0;  // the largest gap from the unquantized product
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < O; ++o) {
        double sum = b.get(o), exact = b.get(o);
        for (int64_t k = 0; k < K; ++k) {
          sum += qin[t * K + k] * qw[o * K + k];
          exact += in.get(t * K + k) * w.get(o * K + k);
          want_din[t * K + k] += qd[t * O + o] * qw[o * K + k];
          want_dw[o * K + k] += qd[t * O + o] * qin[t * K + k];
        }
        want_out[t * O + o] = sum;
        want_db[o] += dout.get(t * O + o);
        plain = std::max(plain, std::abs(exact - sum) / std::max(1.0, std::abs(exact)));
      }
    CHECK(test::rel_err(out.values(), want_out) < 1e-6);
    CHECK(test::rel_err(din.values(), want_din) < 1e-6);
    CHECK(test::rel_err(dw.values(), want_dw) < 1e-6);
    CHECK(test::rel_err(db.values(), want_db) < 1e-6);
    CHECK(plain > 1e-3);  // and quantized: not the unquantized product
  }
}

}  // namespace
}  // namespace tr
