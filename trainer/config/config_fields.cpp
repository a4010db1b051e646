#include "trainer/config/config_fields.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "trainer/family/family.h"

namespace tr::config_detail {
namespace {

// A rule's error: its parts as one line.
template <class... A>
absl::Status err(const A&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// The (virtual) stages that hold layers, and how a message names their count.
int64_t layer_stages(const ParallelConfig& p) {
  return p.pp * p.virtual_stages;
}
std::string layer_stages_text(const ParallelConfig& p) {
  return p.pipeline_schedule == "interleaved"
             ? absl::StrCat("parallel.pp x parallel.virtual_stages = ", layer_stages(p), " virtual")
             : absl::StrCat("parallel.pp ", layer_stages(p));
}

// log.trace_steps and log.profile_steps: [] or [first, last] with first <= last.
absl::Status check_step_window(const char* key, const std::vector<int64_t>& w) {
  if (!w.empty() && (w.size() != 2 || w[1] < w[0]))
    return err(key, " is [first, last] with first <= last, e.g. [10, 11]; got ", w.size(), " value",
               w.size() == 1 ? "" : "s", w.size() == 2 ? absl::StrCat(" ", w[0], " > ", w[1]) : "");
  return absl::OkStatus();
}

}  // namespace

#define TR_FIELD(sec, name, kind, lo, hi, doc, ...)                                \
  Field {                                                                          \
#sec, #name, Kind::kind, lo, hi, doc,                                          \
        [](Config & c) -> void* { return &c.sec.name; } __VA_OPT__(, ) __VA_ARGS__ \
  }

namespace {

// model.family's doc line, from the table of families: "the architecture: qwen2 (Qwen2 / Qwen2.5:
// biases on q, k and v), llama (...) or qwen3 (...); the rest of the shape is ...".
const char* family_doc() {
  static const std::string doc =
      absl::StrCat("the architecture: ",
                   join_families(
                       [](const Family& f, size_t) {
                         return absl::StrCat(f.name, " (", f.title, ": ", f.layer_doc, ")");
                       },
                       " or "),
                   "; the rest of the shape is the fields below");
  return doc.c_str();
}

}  // namespace

// Each entry's .rule() is its rules with other keys, run in this table's order once every key is
// parsed (validate() in config.cpp); the first broken one is the error.
const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      TR_FIELD(model, preset, String, 0, 0,
               "a released model (a family's preset, configs/<preset>.yaml) filling every model "
               "field (explicit fields override); '' = none"),
      TR_FIELD(model, family, String, 0, 0, family_doc(), family_names()),
      TR_FIELD(model, hidden_size, Int, 1, 1 << 20, "hidden size H"),
      TR_FIELD(model, intermediate_size, Int, 1, 1 << 22, "MLP intermediate size"),
      TR_FIELD(model, num_layers, Int, 1, 4096, "decoder layers"),
      TR_FIELD(model, num_heads, Int, 1, 4096, "query heads"),
      TR_FIELD(model, num_kv_heads, Int, 1, 4096, "key/value heads (GQA); divides num_heads")
          .rule([](const Config& c) {
            const ModelConfig& m = c.model;
            if (m.num_heads % m.num_kv_heads != 0)
              return err("model.num_heads ", m.num_heads,
                         " is not a multiple of model.num_kv_heads ", m.num_kv_heads);
            return absl::OkStatus();
          }),
      TR_FIELD(model, head_dim, Int, 2, 1024, "per-head dimension (even)")
          .rule([](const Config& c) {
            if (c.model.head_dim % 2 != 0)
              return err("model.head_dim must be even for RoPE (got ", c.model.head_dim, ")");
            return absl::OkStatus();
          }),
      TR_FIELD(model, vocab_size, Int, 2, 1 << 26,
               "vocabulary size (padded to a multiple of 128*tp internally)"),
      TR_FIELD(model, max_seq_len, Int, 1, 1 << 24, "longest sequence the model accepts (tokens)"),
      TR_FIELD(model, rope_theta, Float, 1e-300, kInf, "RoPE base theta"),
      TR_FIELD(model, rope_scaling, RopeScaling, 0, 0,
               "none, or Hugging Face's YaRN block: {type: yarn, factor: F, "
               "original_max_position_embeddings: N} (and optionally beta_fast 32, beta_slow 1, "
               "attention_factor 0.1 ln F + 1, truncate true), or Llama 3's: {type: llama3, "
               "factor: F, low_freq_factor: L, high_freq_factor: H, "
               "original_max_position_embeddings: N}; every number finite and in its range, "
               "another type's keys refused (trainer/config/rope_scaling.cpp lists them)"),
      TR_FIELD(model, rms_norm_eps, Float, 1e-30, 1, "RMSNorm epsilon (used in fp32)"),
      TR_FIELD(model, tie_embeddings, Bool, 0, 0, "LM head shares the input embedding"),
      TR_FIELD(model, init_std, Float, 0, 10,
               "std of the normal init of matrices and the embedding"),
      TR_FIELD(model, init_from, String, 0, 0,
               "Hugging Face model directory (config.json + model.safetensors or its shards) "
               "whose weights start a fresh run, under any layout; must match model.*; a resumed "
               "run ignores it; '' = random init"),
      TR_FIELD(model, num_experts, Int, 0, 4096,
               "experts of each sparse layer's mixture-of-experts MLP (model.family qwen3_moe; "
               "0 = dense MLPs, the other families)")
          .rule([](const Config& c) {
            const ModelConfig& m = c.model;
            const Family& f = family_of(m.family);
            const bool moe = f.mlp == MlpKind::mixture_of_experts;
            if (moe && m.num_experts == 0)
              return err("model.family ", f.name,
                         " has mixture-of-experts layers: set "
                         "model.num_experts (and experts_per_token, moe_intermediate_size)");
            if (!moe && m.num_experts > 0)
              return err("model.num_experts ", m.num_experts, " needs model.family qwen3_moe (",
                         f.name, " has dense MLPs); set num_experts: 0 or the family");
            if (m.num_experts == 0) return absl::OkStatus();
            if (m.experts_per_token < 1 || m.experts_per_token > m.num_experts)
              return err("model.experts_per_token ", m.experts_per_token,
                         " must be between 1 and model.num_experts ", m.num_experts);
            if (m.moe_intermediate_size < 1)
              return err("model.moe_intermediate_size is not set: the experts' intermediate size");
            for (int64_t l : m.mlp_only_layers)
              if (l >= m.num_layers)
                return err("model.mlp_only_layers names layer ", l, " but the model has ",
                           m.num_layers, " (0 to ", m.num_layers - 1, ")");
            if (m.sparse_layers() == 0)
              return err("model.num_experts ", m.num_experts,
                         " but no layer is sparse (model.mlp_only_layers and "
                         "decoder_sparse_step leave every layer dense); set num_experts: 0 and "
                         "another family, or change them");
            return absl::OkStatus();
          }),
      TR_FIELD(model, experts_per_token, Int, 0, 4096,
               "experts each token is routed to (top-k; Hugging Face's num_experts_per_tok)"),
      TR_FIELD(model, moe_intermediate_size, Int, 0, 1 << 22, "each expert's intermediate size")
          .rule([](const Config& c) {
            const int64_t tp = c.parallel.tp, n = c.model.moe_intermediate_size;
            if (c.model.num_experts > 0 && n % tp != 0)
              return err("model.moe_intermediate_size ", n, " is not divisible by parallel.tp ",
                         tp);
            return absl::OkStatus();
          }),
      TR_FIELD(model, norm_topk_prob, Bool, 0, 0,
               "the chosen experts' router probabilities renormalised to sum to 1 per token"),
      TR_FIELD(model, router_aux_loss_coef, Float, 0, 1e6,
               "weight of the load-balancing loss (Hugging Face's, over all sparse layers) added "
               "to the loss; 0 = none"),
      TR_FIELD(model, decoder_sparse_step, Int, 1, 4096,
               "layer i is sparse when (i + 1) is a multiple of it (and i not in "
               "mlp_only_layers)"),
      TR_FIELD(model, mlp_only_layers, IntList, 0, 4096,
               "layers that keep the dense MLP (intermediate_size) in a mixture-of-experts model"),
      TR_FIELD(model, capacity_factor, Float, 0, 1e6,
               "0 = dropless (every token reaches its experts); else each expert takes at most "
               "ceil(factor x tokens x experts_per_token / num_experts) tokens of a micro-batch, "
               "its highest-weight ones, and the others skip it"),
      TR_FIELD(parallel, tp, Int, 1, 1024, "tensor-parallel ranks").rule([](const Config& c) {
        const ModelConfig& m = c.model;
        const int64_t tp = c.parallel.tp;
        if (m.num_heads % tp != 0)
          return err("model.num_heads ", m.num_heads, " is not divisible by parallel.tp ", tp);
        if (m.num_kv_heads % tp != 0)
          return err("model.num_kv_heads ", m.num_kv_heads, " is not divisible by parallel.tp ", tp,
                     "; use a tp that divides it");
        if (m.intermediate_size % tp != 0)
          return err("model.intermediate_size ", m.intermediate_size,
                     " is not divisible by parallel.tp ", tp);
        return absl::OkStatus();
      }),
      TR_FIELD(parallel, pp, Int, 1, 1024, "pipeline-parallel stages"),
      TR_FIELD(parallel, cp, Int, 1, 1024,
               "context-parallel ranks: each sequence is cut into 2*cp chunks and each rank of a "
               "CP group holds two of them (chunks r and 2*cp-1-r, for equal causal work); "
               "data.seq_len must divide by 2*cp"),
      TR_FIELD(parallel, ep, Int, 1, 4096,
               "expert-parallel ranks: each holds num_experts / ep of every sparse layer's "
               "experts, carved from the dp x cp ranks that share its weights (Megatron's "
               "order: tp, cp, ep, dp, pp); tokens travel to their experts' ranks and back")
          .rule([](const Config& c) {
            const int64_t ep = c.parallel.ep, e = c.model.num_experts;
            if (ep == 1) return absl::OkStatus();
            if (e == 0)
              return err("parallel.ep ", ep,
                         " splits experts, but the model has none "
                         "(model.num_experts 0); set parallel.ep: 1");
            if (e % ep != 0)
              return err("model.num_experts ", e, " is not divisible by parallel.ep ", ep,
                         "; use an ep that divides it");
            return absl::OkStatus();
          }),
      TR_FIELD(parallel, cp_comm, String, 0, 0,
               "how a CP group's attention meets the other ranks' keys and values: allgather "
               "(K and V gathered once per layer; cheap under GQA) or ring (K and V passed "
               "around the group, cp-1 times)",
               {"allgather", "ring"}),
      TR_FIELD(parallel, dp, IntOrAuto, 0, 1 << 20,
               "data-parallel ranks, or auto = world / (tp*cp*pp)"),
      // Its counts against model.num_layers: parallel.virtual_stages' rule.
      TR_FIELD(parallel, pipeline_layers, IntList, 1, 4096,
               "layers of each pipeline stage, e.g. [18, 22, 22, 18] (under interleaved, of each "
               "virtual stage: pp x virtual_stages counts in virtual-stage order); [] = an even "
               "split"),
      TR_FIELD(parallel, pipeline_schedule, String, 0, 0,
               "the pipeline's schedule: 1f1b; interleaved (each rank holds virtual_stages "
               "chunks of layers, bubble (pp-1)/(v m + pp-1) for m micro-batches, micro-batches a "
               "multiple of pp); zero_bubble (ZB-H1: backward split into input and weight "
               "gradients, the weight passes filling the bubbles: about a third of 1f1b's "
               "bubble at 1f1b's peak of micro-batches in flight)",
               {"1f1b", "interleaved", "zero_bubble"})
          .rule([](const Config& c) {
            const ParallelConfig& p = c.parallel;
            if (p.pipeline_schedule == "interleaved" && (p.pp < 2 || p.virtual_stages < 2))
              return err(
                  "parallel.pipeline_schedule interleaved needs parallel.pp >= 2 and "
                  "parallel.virtual_stages >= 2 (got pp ",
                  p.pp, ", virtual_stages ", p.virtual_stages, "); use 1f1b otherwise");
            return absl::OkStatus();
          }),
      // Its rules also split model.num_layers over the stages, after the schedule's rule above
      // (parallel.pipeline_layers' counts or an even split).
      TR_FIELD(parallel, virtual_stages, Int, 1, 64,
               "layer chunks per pipeline rank under pipeline_schedule interleaved (>= 2 there, "
               "1 otherwise); chunk c of rank r is virtual stage c x pp + r, as Megatron places "
               "them")
          .rule([](const Config& c) {
            const ParallelConfig& p = c.parallel;
            const int64_t layers = c.model.num_layers, stages = layer_stages(p);
            const bool interleaved = p.pipeline_schedule == "interleaved";
            if (!interleaved && p.virtual_stages != 1)
              return err("parallel.virtual_stages ", p.virtual_stages,
                         " needs parallel.pipeline_schedule: interleaved (it is ",
                         p.pipeline_schedule,
                         "); set virtual_stages: 1 or the schedule to interleaved");
            if (!p.pipeline_layers.empty()) {
              int64_t sum = 0;
              for (int64_t l : p.pipeline_layers) sum += l;
              if (static_cast<int64_t>(p.pipeline_layers.size()) != stages || sum != layers)
                return err("parallel.pipeline_layers has ", p.pipeline_layers.size(),
                           " stages summing to ", sum, " layers; it needs ", layer_stages_text(p),
                           " stages summing to model.num_layers ", layers);
            } else if (layers % stages != 0) {
              return err("model.num_layers ", layers, " is not divisible by ", layer_stages_text(p),
                         interleaved ? " stages" : "",
                         "; set parallel.pipeline_layers to split them unevenly");
            }
            return absl::OkStatus();
          }),
      TR_FIELD(parallel, sequence_parallel, Bool, 0, 0,
               "shard norms and residuals along the sequence within TP"),
      TR_FIELD(parallel, zero1, Bool, 0, 0,
               "distributed optimizer: each DP rank keeps the Adam states and (on GPUs) the fp32 "
               "master weights of its 1/dp of every bucket of the parameters (1/(dp*cp) with "
               "context parallelism); gradients are reduce-scattered, the updated bf16 weights "
               "all-gathered, bucket by bucket"),
      TR_FIELD(parallel, dp_bucket_elems, Int, 1, kMaxI,
               "parameter elements per data-parallel bucket (gradient reduction; with zero1 also "
               "the weight all-gather, rounded up to a multiple of 4*dp*cp)"),
      TR_FIELD(parallel, overlap_dp, Bool, 0, 0,
               "start each bucket's reduction as soon as backward has finished its gradients "
               "(with sequence_parallel, each layer's norm gradients are summed over TP as "
               "backward finishes the layer)"),
      TR_FIELD(parallel, overlap_param_gather, Bool, 0, 0,
               "with zero1: all-gather the updated weights bucket by bucket during the next "
               "forward, each layer waiting only for the buckets that hold its weights (false: "
               "all of them at the end of the update)"),
      TR_FIELD(parallel, overlap_tp, Bool, 0, 0,
               "in backward, reduce each column-parallel layer's input gradient over TP (the "
               "reduce-scatter under sequence_parallel, else the all-reduce) beside the layer's "
               "weight-gradient GEMM (Megatron's bulk overlap); not in a zero-bubble schedule's "
               "input-only pass"),
      TR_FIELD(parallel, grad_reduce_dtype, String, 0, 0,
               "type of the data-parallel gradient reduction: fp32 (exact sums of the fp32 "
               "gradients), or bf16 (each bucket rounded to bf16 and summed in bf16: half the "
               "traffic; the accumulation over micro-batches stays fp32)",
               {"fp32", "bf16"}),
      TR_FIELD(parallel, comm, String, 0, 0,
               "GPU communication: nccl (one rank per GPU), or mpi (device tensors staged through "
               "host memory; lets several ranks share one GPU, for tests)",
               {"nccl", "mpi"}),
      TR_FIELD(parallel, timeout_s, Float, 0, kInf,
               "a collective or pipeline exchange unfinished after this many seconds (a rank "
               "hung, stopped or died) ends the job with exit code 5, on NCCL and MPI; 0 = wait "
               "forever"),
      TR_FIELD(data, train, Sources, 0, 0, "training datasets: list of {path: PREFIX, weight: W}")
          .rule([](const Config& c) {
            if (c.data.train.empty())
              return err("data.train is empty: give at least one {path: PREFIX}");
            return absl::OkStatus();
          }),
      TR_FIELD(data, valid, Sources, 0, 0,
               "validation datasets: list of {path: PREFIX, weight: W}"),
      TR_FIELD(data, seq_len, Int, 1, 1 << 24,
               "tokens per sample fed to the model (each sample reads seq_len+1)")
          .rule([](const Config& c) {
            const int64_t seq = c.data.seq_len, cp = c.parallel.cp;
            if (seq == 0) return err("data.seq_len is not set");
            if (seq > c.model.max_seq_len)
              return err("data.seq_len ", seq, " exceeds model.max_seq_len ", c.model.max_seq_len);
            if (cp > 1 && seq % (2 * cp) != 0)
              return err("data.seq_len ", seq, " does not split into 2 x parallel.cp = ", 2 * cp,
                         " equal chunks; make it a multiple of ", 2 * cp, " or change parallel.cp");
            return absl::OkStatus();
          }),
      TR_FIELD(data, seed, Int, 0, kMaxI, "seed of the sample shuffle"),
      TR_FIELD(data, format, String, 0, 0, "token file format", {"auto", "megatron", "llmc"}),
      TR_FIELD(data, allow_byte_tokenizer, Bool, 0, 0,
               "accept data made by prepare_data's byte tokenizer under a model.preset (refused "
               "by default: a Qwen model wants its own tokenizer's ids)"),
      TR_FIELD(data, document_mask, String, 0, 0,
               "block_causal: each token attends only to the earlier tokens of its own document "
               "(documents packed in a sample end at the end-of-document token, data.eod_id), as "
               "Llama 3 was pretrained; none: to every earlier token of the sample (Megatron's "
               "default). On CUDA it needs cuDNN 9.6 or newer",
               {"none", "block_causal"}),
      TR_FIELD(data, eod_id, Int, -1, kMaxI,
               "the end-of-document token id for data.document_mask, reset_position_ids and "
               "eod_mask_loss, below model.vocab_size; -1 = the one prepare_data recorded in the "
               "datasets' metadata")
          .rule([](const Config& c) {
            const int64_t vocab = c.model.vocab_size;
            if (c.data.eod_id >= vocab)
              return err("data.eod_id ", c.data.eod_id,
                         " is not a token of the model's vocabulary (model.vocab_size ", vocab,
                         ": ids 0 to ", vocab - 1,
                         "); set the data's end-of-document id, or -1 for the one prepare_data "
                         "recorded");
            return absl::OkStatus();
          }),
      TR_FIELD(data, reset_position_ids, Bool, 0, 0,
               "RoPE positions restart at 0 in each document of a sample (Megatron's "
               "--reset-position-ids; with block_causal each document is as if alone)"),
      TR_FIELD(data, eod_mask_loss, Bool, 0, 0,
               "the loss leaves out each target whose input is the end-of-document token (the "
               "first token of the next document), and the mean is over the targets kept "
               "(Megatron's --eod-mask-loss)"),
      TR_FIELD(train, steps, Int, 1, kMaxI, "optimizer steps to run in total"),
      // Against micro_batch x dp it needs the world size (parallel.dp auto): run_layout()
      // (trainer/layout/run_layout.h) checks that.
      TR_FIELD(train, global_batch, Int, 1, kMaxI, "samples per optimizer step over all DP ranks")
          .rule([](const Config& c) {
            if (c.train.global_batch == 0) return err("train.global_batch is not set");
            return absl::OkStatus();
          }),
      TR_FIELD(train, micro_batch, Int, 1, kMaxI, "samples per forward/backward on one rank"),
      TR_FIELD(train, backend, String, 0, 0,
               "compute backend: cpu, or cuda (bf16, one GPU per rank; see parallel.comm); "
               "auto = cpu",
               {"auto", "cpu", "cuda"}),
      TR_FIELD(train, deterministic, Bool, 0, 0,
               "GPU: bit-identical runs (cuDNN's deterministic attention backward, slower); "
               "false uses the fast non-deterministic one (the CPU is always deterministic)"),
      TR_FIELD(train, precision, String, 0, 0,
               "the transformer layers' GEMMs (QKV, output, gate and up, down; forward and both "
               "gradients): bf16 (the compute dtype: bf16 on GPUs, f32 on the CPU), or fp8 "
               "(per-tensor current scaling, train.fp8_format; needs FP8 tensor cores: H100, "
               "H200, B200, B300). Masters, gradients and checkpoints are the same either way",
               {"bf16", "fp8"})
          .rule([](const Config& c) {
            // Hopper's FP8 GEMMs read rows of 16-byte multiples: every projection's widths on a
            // rank, and the tokens a weight gradient sums over.
            if (c.train.precision == "fp8" && c.model.num_experts > 0)
              return err(
                  "train.precision=fp8 is not implemented for mixture-of-experts models "
                  "(model.num_experts ",
                  c.model.num_experts, "); set train.precision=bf16");
            if (c.train.precision != "fp8" || c.train.backend != "cuda") return absl::OkStatus();
            const ModelConfig& m = c.model;
            const int64_t tp = c.parallel.tp;
            const std::pair<const char*, int64_t> widths[] = {
                {"model.hidden_size", m.hidden_size},
                {"model.num_heads x head_dim / parallel.tp", m.num_heads * m.head_dim / tp},
                {"model.num_kv_heads x head_dim / parallel.tp", m.num_kv_heads * m.head_dim / tp},
                {"model.intermediate_size / parallel.tp", m.intermediate_size / tp},
                {"train.micro_batch x data.seq_len / parallel.cp",
                 c.train.micro_batch * c.data.seq_len / c.parallel.cp}};
            for (const auto& [what, n] : widths)
              if (n % 16 != 0)
                return err("train.precision=fp8 on cuda needs ", what,
                           " to be a multiple of 16 (FP8 GEMM rows of 16 bytes), and it is ", n,
                           "; change it or set train.precision=bf16");
            return absl::OkStatus();
          }),
      TR_FIELD(train, fp8_format, String, 0, 0,
               "fp8: hybrid (E4M3 weights and activations, E5M2 output gradients, as Transformer "
               "Engine's and torchao's default) or e4m3 (E4M3 for all three)",
               {"hybrid", "e4m3"}),
      TR_FIELD(train, recompute, String, 0, 0,
               "activation recomputation: none; selective (norm and SwiGLU outputs are "
               "recomputed in backward, the GEMM and attention results kept); full (a layer keeps "
               "only its input and runs its forward again in backward)",
               {"none", "selective", "full"}),
      TR_FIELD(train, recompute_layers, IntList, 0, 4096,
               "full: layers recomputed per pipeline stage, the first of each stage's layers; "
               "[] = all; [n] = n on every stage; or one count per stage")
          .rule([](const Config& c) {
            const TrainConfig& t = c.train;
            const ParallelConfig& p = c.parallel;
            if (t.recompute_layers.empty()) return absl::OkStatus();
            if (t.recompute != "full")
              return err("train.recompute_layers is set but train.recompute is ", t.recompute,
                         "; it counts the layers of train.recompute: full");
            const auto n = static_cast<int64_t>(t.recompute_layers.size());
            if (n != 1 && n != p.pp)
              return err("train.recompute_layers has ", n,
                         " counts; give one (every stage) or parallel.pp ", p.pp,
                         " (one per stage)");
            for (int64_t s = 0; s < p.pp; ++s) {
              int64_t have = 0;  // the layers of every chunk of rank s
              for (int64_t v = 0; v < p.virtual_stages; ++v)
                have += p.pipeline_layers.empty() ? c.model.num_layers / layer_stages(p)
                                                  : p.pipeline_layers[v * p.pp + s];
              const int64_t want = t.recompute_layers[n == 1 ? 0 : s];
              if (want > have)
                return err("train.recompute_layers asks for ", want, " layers on pipeline stage ",
                           s, ", which has ", have);
            }
            return absl::OkStatus();
          }),
      TR_FIELD(train, seed, Int, 0, kMaxI, "seed of the weight initialisation"),
      TR_FIELD(train, eval_interval, Int, 0, kMaxI, "steps between validation runs; 0 = never")
          .rule([](const Config& c) {
            if (c.train.eval_interval > 0 && c.data.valid.empty())
              return err("train.eval_interval is ", c.train.eval_interval,
                         " but data.valid is empty; add data.valid or set train.eval_interval=0");
            return absl::OkStatus();
          }),
      TR_FIELD(train, eval_steps, Int, 1, 1000000, "validation batches per evaluation"),
      TR_FIELD(
          train, exit_interval, Int, 0, kMaxI,
          "save a checkpoint and exit (code 3) after a step divisible by this (time-sliced jobs); "
          "0 = off"),
      TR_FIELD(train, max_skipped_steps, Int, 1, kMaxI,
               "steps skipped in a row (non-finite loss or gradient norm, loss spike, no target "
               "left by data.eod_mask_loss) after which the run stops with exit code 4; 1 = stop "
               "at the first"),
      TR_FIELD(train, spike_factor, Float, 0, kInf,
               "skip a step whose loss exceeds this times the mean loss of the previous 20 "
               "accepted steps (of those there are, from the second step on); 0 = off"),
      TR_FIELD(optim, lr, Float, 0, 10,
               "peak learning rate (used in fp32); 0 leaves the weights as they are"),
      TR_FIELD(optim, min_lr, Float, 0, 10, "learning rate at the end of the decay")
          .rule([](const Config& c) {
            const OptimConfig& o = c.optim;
            if (o.min_lr > o.lr)
              return err("optim.min_lr ", fmt_double(o.min_lr), " exceeds optim.lr ",
                         fmt_double(o.lr));
            return absl::OkStatus();
          }),
      TR_FIELD(optim, warmup_steps, Int, 0, kMaxI, "linear warm-up steps from 0 to lr")
          .rule([](const Config& c) {
            const int64_t warmup = c.optim.warmup_steps, steps = c.train.steps;
            if (warmup > steps)
              return err("optim.warmup_steps ", warmup, " exceeds train.steps ", steps,
                         "; set optim.warmup_steps to at most ", steps, " (a tenth, ",
                         std::max<int64_t>(steps / 10, 1), ", is common) or raise train.steps");
            return absl::OkStatus();
          }),
      TR_FIELD(optim, schedule, String, 0, 0, "decay after warm-up",
               {"cosine", "linear", "constant", "wsd"}),
      TR_FIELD(optim, decay_fraction, Float, 1e-300, 1,
               "wsd: final fraction of steps decaying linearly to min_lr"),
      TR_FIELD(optim, weight_decay, Float, 0, 10,
               "AdamW decoupled weight decay (not on norms and biases)"),
      TR_FIELD(optim, beta1, Float, 0, 0.999999, "AdamW beta1"),
      TR_FIELD(optim, beta2, Float, 0, 0.999999999, "AdamW beta2"),
      TR_FIELD(optim, eps, Float, 1e-30, 1, "AdamW epsilon (used in fp32)"),
      TR_FIELD(optim, grad_clip, Float, 0, kInf, "clip the global gradient norm to this; 0 = off"),
      TR_FIELD(checkpoint, dir, String, 0, 0,
               "directory of step_NNNNNNNN/ checkpoints and `latest`")
          .rule([](const Config& c) {
            if (c.checkpoint.dir.empty()) return err("checkpoint.dir must not be empty");
            return absl::OkStatus();
          }),
      TR_FIELD(checkpoint, interval, Int, 0, kMaxI,
               "steps between checkpoints; 0 = none before the end (save_at_end)"),
      TR_FIELD(checkpoint, save_at_end, Bool, 0, 0,
               "save when the run reaches train.steps; benchmarks turn it off (tools/bench.sh): "
               "a stop signal and train.exit_interval still save"),
      TR_FIELD(checkpoint, keep_last, Int, 2, 1 << 20, "committed checkpoints kept (>= 2)"),
      TR_FIELD(checkpoint, save_timeout_s, Float, 1, kInf,
               "seconds a save or the start-up load may take (ranks waiting for the slowest disk "
               "get this long before parallel.timeout_s ends the job); a slower save is warned "
               "about, as it may not fit a stop signal's grace period"),
      TR_FIELD(checkpoint, async, Bool, 0, 0,
               "copy each save to host memory and write it in a background thread while training "
               "goes on; committed (made latest) at the first step boundary after every rank has "
               "written its part"),
      TR_FIELD(checkpoint, local_interval, Int, 0, kMaxI,
               "steps between node-local checkpoints (each rank's own part in local_dir, for a "
               "restart that loses minutes; --resume auto takes the newest one every rank has); "
               "0 = none"),
      TR_FIELD(checkpoint, local_dir, String, 0, 0,
               "node-local directory (tmpfs or NVMe) of the local checkpoints, one subdirectory "
               "per checkpoint.dir"),
      TR_FIELD(checkpoint, local_keep, Int, 1, 1 << 20, "local checkpoints each rank keeps"),
      TR_FIELD(checkpoint, local_replicas, Int, 0, 64,
               "copies of each rank's local part held on other nodes (the next ones in the ring "
               "of nodes), so that losing that many nodes in a row loses no part; at most the "
               "job's nodes - 1 (more is lowered to that, with a note); 0 = none"),
      TR_FIELD(log, dir, String, 0, 0, "run directory: metrics.jsonl and the resolved config")
          .rule([](const Config& c) {
            if (c.log.dir.empty()) return err("log.dir must not be empty");
            return absl::OkStatus();
          }),
      TR_FIELD(log, interval, Int, 1, kMaxI,
               "steps between console log lines (and straggler reports)"),
      TR_FIELD(log, straggler_percent, Float, 0, kInf,
               "name a rank whose own work per step (step time minus time waiting for other "
               "ranks) is more than this % over the median rank's; 0 = never"),
      TR_FIELD(log, tensorboard, Bool, 0, 0,
               "write TensorBoard event files to log.dir/tb (rank 0): every scalar of "
               "metrics.jsonl and the resolved config as text (docs/metrics.md)"),
      TR_FIELD(log, tensorboard_all_ranks, Bool, 0, 0,
               "with log.tensorboard, every other rank also writes its own event file to "
               "log.dir/tb/rank_<r>: its step time, breakdown and memory"),
      TR_FIELD(log, trace_steps, IntList, 1, kMaxI,
               "[first, last]: every rank's phases in those steps (forward and backward per "
               "micro-batch, collectives, waits, optimizer) as a Chrome trace, "
               "log.dir/trace.json (chrome://tracing, ui.perfetto.dev); [] = none")
          .rule([](const Config& c) {
            return check_step_window("log.trace_steps", c.log.trace_steps);
          }),
      TR_FIELD(log, profile_steps, IntList, 1, kMaxI,
               "[first, last]: those steps run between cudaProfilerStart and cudaProfilerStop, "
               "so a profiler started with capture off records only them (ncu "
               "--profile-from-start off, nsys --capture-range=cudaProfilerApi); [] = none")
          .rule([](const Config& c) {
            return check_step_window("log.profile_steps", c.log.profile_steps);
          }),
  };
  return f;
}
#undef TR_FIELD

const std::vector<std::string>& section_names() {
  static const std::vector<std::string> s = {"model", "parallel",   "data", "train",
                                             "optim", "checkpoint", "log"};
  return s;
}

}  // namespace tr::config_detail
