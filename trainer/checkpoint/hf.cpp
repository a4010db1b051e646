#include "trainer/checkpoint/hf.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/checkpoint.h"
#include "core/check.h"
#include "nlohmann/json.hpp"
#include "trainer/checkpoint/ownership.h"
#include "trainer/family/family.h"

namespace tr {
namespace {

namespace sfs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

std::string shape_str(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

// The numbers of a config.json that decide the weights' shapes and the model's numerics.
struct HfShape {
  std::string family;  // model.family: model_type, a family's name
  int64_t hidden = 0, inter = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  double rope_theta = 10000, eps = 1e-6;
  RopeScaling rope_scaling;
  bool tied = false;
  // Mixture of experts (0 experts: none).
  int64_t experts = 0, experts_per_token = 0, moe_inter = 0, sparse_step = 1;
  bool norm_topk = true;
  std::vector<int64_t> mlp_only;
};

// A rope_scaling (transformers 4) or rope_parameters (transformers 5) object: default/none, or
// yarn or llama3 with their fields (make_rope_scaling checks them, as it does the YAML's); `where`
// names it in errors. rope_parameters also holds rope_theta, read by the caller.
absl::StatusOr<RopeScaling> read_rope_scaling(const json& r, const std::string& where) {
  const char* type_key = r.contains("rope_type") ? "rope_type" : "type";
  std::string type = "default";
  if (r.contains(type_key)) {
    if (!r[type_key].is_string())
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has rope type ", r[type_key].dump(),
                       "; the trainer supports plain RoPE (default), yarn and llama3"));
    type = r[type_key].get<std::string>();
  }
  if (type != "default" && type != "yarn" && type != "llama3")
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has rope type \"", type,
                     "\"; the trainer supports plain RoPE (default), yarn and llama3"));
  if (r.contains("mscale") || r.contains("mscale_all_dim"))
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has mscale or mscale_all_dim (DeepSeek's YaRN); not supported"));
  std::vector<std::pair<std::string, RopeValue>> keys;
  for (const auto& [key, v] : r.items()) {
    if (key == "rope_type" || key == "type" || key == "rope_theta" || v.is_null()) continue;
    RopeValue value;
    value.text = v.dump();
    if (v.is_number()) value.number = v.get<double>();
    if (v.is_boolean()) value.flag = v.get<bool>();
    keys.emplace_back(key, value);
  }
  return make_rope_scaling(type == "default" ? "none" : type, keys, where);
}

// The fields of a config.json object at `path` (read_hf_config's body: a value of another JSON
// type than asked for throws, and read_hf_config turns that into one error line).
absl::StatusOr<HfShape> read_hf_fields(const json& j, const std::string& path) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
  };
  const std::string type = j.value("model_type", "");
  const Family* family = find_family(type);
  if (family == nullptr)
    return bad(absl::StrCat("model_type is '", type, "'; the trainer imports ",
                            join_families(
                                [](const Family& f, size_t i) {
                                  return absl::StrCat(f.title, " (", i == 0 ? "model_type " : "",
                                                      f.name, ")");
                                },
                                " and "),
                            " models"));
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    return bad(absl::StrCat("hidden_act is ", j["hidden_act"].dump(), "; the trainer uses silu"));
  if (j.value("use_sliding_window", false))
    return bad("use_sliding_window is true; the trainer attends over the whole sequence");
  // What the family's own keys ask for that the trainer does not implement.
  if (absl::Status st = family->hf_refusal(j); !st.ok()) return bad(std::string(st.message()));
  HfShape s;
  s.family = type;
  // rope_scaling and rope_parameters: null (absent) or a block; anything else is refused.
  for (const char* key : {"rope_scaling", "rope_parameters"})
    if (j.contains(key) && !j[key].is_null() && !j[key].is_object())
      return bad(absl::StrCat("\"", key, "\" is ", j[key].dump(),
                              "; it must be null or an object such as {\"type\": \"yarn\", ...}"));
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    absl::StatusOr<RopeScaling> r = read_rope_scaling(j["rope_scaling"], path + ": rope_scaling");
    if (!r.ok()) return r.status();
    s.rope_scaling = *r;
  }
  auto int_field = [&](const char* key, int64_t* out, bool required) -> absl::Status {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) return bad(absl::StrCat("has no \"", key, "\""));
      return absl::OkStatus();
    }
    if (!j[key].is_number_integer()) return bad(absl::StrCat("\"", key, "\" is not an integer"));
    *out = j[key].get<int64_t>();
    return absl::OkStatus();
  };
  for (auto [key, out] : {std::pair{"hidden_size", &s.hidden},
                          {"intermediate_size", &s.inter},
                          {"num_hidden_layers", &s.layers},
                          {"num_attention_heads", &s.heads},
                          {"vocab_size", &s.vocab}})
    if (absl::Status st = int_field(key, out, true); !st.ok()) return st;
  s.kv_heads = s.heads;  // transformers' default
  if (absl::Status st = int_field("num_key_value_heads", &s.kv_heads, false); !st.ok()) return st;
  if (s.heads <= 0) return bad("num_attention_heads must be positive");
  s.head_dim = s.hidden / s.heads;
  if (absl::Status st = int_field("head_dim", &s.head_dim, false); !st.ok()) return st;
  // rope_theta at the top (transformers 4) or in rope_parameters (transformers 5).
  if (j.contains("rope_theta") && j["rope_theta"].is_number())
    s.rope_theta = j["rope_theta"].get<double>();
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const json& r = j["rope_parameters"];
    absl::StatusOr<RopeScaling> scaling = read_rope_scaling(r, path + ": rope_parameters");
    if (!scaling.ok()) return scaling.status();
    if (scaling->type != "none") s.rope_scaling = *scaling;
    if (r.contains("rope_theta") && r["rope_theta"].is_number())
      s.rope_theta = r["rope_theta"].get<double>();
  }
  if (j.contains("rms_norm_eps") && j["rms_norm_eps"].is_number())
    s.eps = j["rms_norm_eps"].get<double>();
  s.tied = j.value("tie_word_embeddings", false);
  // Mixture of experts: num_experts as released configs spell it, num_local_experts as
  // transformers 5 writes it.
  for (const char* key : {"num_experts", "num_local_experts"})
    if (absl::Status st = int_field(key, &s.experts, false); !st.ok()) return st;
  for (auto [key, out] : {std::pair{"num_experts_per_tok", &s.experts_per_token},
                          {"moe_intermediate_size", &s.moe_inter},
                          {"decoder_sparse_step", &s.sparse_step}})
    if (absl::Status st = int_field(key, out, false); !st.ok()) return st;
  s.norm_topk = j.value("norm_topk_prob", false);  // transformers' default
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null())
    s.mlp_only = j["mlp_only_layers"].get<std::vector<int64_t>>();
  return s;
}

absl::StatusOr<HfShape> read_hf_config(const std::string& dir) {
  const std::string path = fs::join(dir, "config.json");
  std::error_code ec;
  std::ifstream in;
  if (sfs::is_regular_file(path, ec)) in.open(path);
  if (!in.is_open() || !in)
    return absl::InvalidArgumentError(
        absl::StrCat("model.init_from: ", path,
                     " cannot be read (no such file, or not a file); pass a Hugging Face model "
                     "directory (save_pretrained's output: config.json and safetensors)"));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object"));
  try {
    return read_hf_fields(j, path);
  } catch (const json::exception& e) {  // a field of another type than the configs have
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": a field has the wrong JSON type (", e.what(), "); is it the config.json of a ",
        join_families([](const Family& f, size_t) { return std::string(f.title); }, " or "),
        " model?"));
  }
}

}  // namespace

absl::Status check_hf_config(const std::string& dir, const ModelConfig& m) {
  absl::StatusOr<HfShape> s = read_hf_config(dir);
  if (!s.ok()) return s.status();
  auto differ = [&](const char* hf, const std::string& hv, const char* ours,
                    const std::string& ov) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.init_from ", dir, ": config.json has ", hf, " ", hv, " but model.", ours, " is ", ov,
        "; set model.", ours, " to ", hv, " (or the model.preset of that model)"));
  };
  if (s->family != m.family) return differ("model_type", s->family, "family", m.family);
  const struct {
    const char *hf, *ours;
    int64_t hv, ov;
  } ints[] = {{"hidden_size", "hidden_size", s->hidden, m.hidden_size},
              {"intermediate_size", "intermediate_size", s->inter, m.intermediate_size},
              {"num_hidden_layers", "num_layers", s->layers, m.num_layers},
              {"num_attention_heads", "num_heads", s->heads, m.num_heads},
              {"num_key_value_heads", "num_kv_heads", s->kv_heads, m.num_kv_heads},
              {"head_dim", "head_dim", s->head_dim, m.head_dim},
              {"vocab_size", "vocab_size", s->vocab, m.vocab_size}};
  for (const auto& f : ints)
    if (f.hv != f.ov) return differ(f.hf, absl::StrCat(f.hv), f.ours, absl::StrCat(f.ov));
  auto same = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::abs(b); };
  if (!same(s->rope_theta, m.rope_theta))
    return differ("rope_theta", absl::StrFormat("%g", s->rope_theta), "rope_theta",
                  absl::StrFormat("%g", m.rope_theta));
  if (!(s->rope_scaling == m.rope_scaling))
    return differ("rope_scaling", s->rope_scaling.text(), "rope_scaling", m.rope_scaling.text());
  if (!same(s->eps, m.rms_norm_eps))
    return differ("rms_norm_eps", absl::StrFormat("%g", s->eps), "rms_norm_eps",
                  absl::StrFormat("%g", m.rms_norm_eps));
  if (s->tied != m.tie_embeddings)
    return differ("tie_word_embeddings", s->tied ? "true" : "false", "tie_embeddings",
                  m.tie_embeddings ? "true" : "false");
  if (s->experts != m.num_experts)
    return differ("num_experts", absl::StrCat(s->experts), "num_experts",
                  absl::StrCat(m.num_experts));
  if (m.num_experts == 0) return absl::OkStatus();
  const struct {
    const char *hf, *ours;
    int64_t hv, ov;
  } moe[] = {
      {"num_experts_per_tok", "experts_per_token", s->experts_per_token, m.experts_per_token},
      {"moe_intermediate_size", "moe_intermediate_size", s->moe_inter, m.moe_intermediate_size},
      {"decoder_sparse_step", "decoder_sparse_step", s->sparse_step, m.decoder_sparse_step}};
  for (const auto& f : moe)
    if (f.hv != f.ov) return differ(f.hf, absl::StrCat(f.hv), f.ours, absl::StrCat(f.ov));
  if (s->norm_topk != m.norm_topk_prob)
    return differ("norm_topk_prob", s->norm_topk ? "true" : "false", "norm_topk_prob",
                  m.norm_topk_prob ? "true" : "false");
  if (s->mlp_only != m.mlp_only_layers)
    return differ("mlp_only_layers", absl::StrCat("[", absl::StrJoin(s->mlp_only, ", "), "]"),
                  "mlp_only_layers",
                  absl::StrCat("[", absl::StrJoin(m.mlp_only_layers, ", "), "]"));
  return absl::OkStatus();
}

namespace {

// Tensors a model directory may hold that the model does not use.
bool ignorable(const std::string& hf, bool tied) {
  return hf.ends_with(".rotary_emb.inv_freq") || (tied && hf == "lm_head.weight");
}

// The model's tensors (global names and shapes) with tp = pp = dp = 1: what a checkpoint of
// `cfg` holds whatever layout wrote it.
std::vector<ckpt::TensorRef> whole_model_tensors(Config cfg) {
  cfg.parallel.tp = cfg.parallel.pp = cfg.parallel.dp = 1;
  cfg.parallel.pipeline_layers.clear();
  cfg.parallel.pipeline_schedule = "1f1b";
  cfg.parallel.virtual_stages = 1;
  cfg.parallel.sequence_parallel = false;
  absl::StatusOr<Topology> one = Topology::make(1, 0, 1, 1, 1);
  TR_ASSERT(one.ok(), "a 1-rank topology");
  return model_tensors(cfg, *one);
}

// "<|endoftext|>"'s id in a tokenizer.json; -1 when it has none.
int64_t end_of_text_id(const std::string& tokenizer_json) {
  std::ifstream in(tokenizer_json);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("added_tokens") || !j["added_tokens"].is_array()) return -1;
  for (const json& t : j["added_tokens"])
    if (t.is_object() && t.contains("content") && t["content"] == "<|endoftext|>" &&
        t.contains("id") && t["id"].is_number_integer())
      return t["id"].get<int64_t>();
  return -1;
}

}  // namespace

std::string hf_config_json(const ModelConfig& m, st::ElemType dtype, int64_t eos) {
  const Family& family = family_of(m.family);
  ordered_json j;
  j["architectures"] = {family.hf_architecture};
  j["model_type"] = family.name;
  j["hidden_size"] = m.hidden_size;
  j["intermediate_size"] = m.intermediate_size;
  j["num_hidden_layers"] = m.num_layers;
  j["num_attention_heads"] = m.num_heads;
  j["num_key_value_heads"] = m.num_kv_heads;
  j["head_dim"] = m.head_dim;
  j["vocab_size"] = m.vocab_size;
  j["max_position_embeddings"] = m.max_seq_len;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = m.rms_norm_eps;
  // Both spellings: transformers 4 reads rope_theta, transformers 5 rope_parameters.
  j["rope_theta"] = m.rope_theta;
  j["rope_parameters"] = {{"rope_theta", m.rope_theta}, {"rope_type", "default"}};
  j["rope_scaling"] = nullptr;
  if (const RopeScaling& r = m.rope_scaling; r.type == "yarn") {
    ordered_json y = {{"factor", r.factor},
                      {"original_max_position_embeddings", r.original_max_position_embeddings},
                      {"beta_fast", r.beta_fast},
                      {"beta_slow", r.beta_slow},
                      {"truncate", r.truncate}};
    if (r.attention_factor > 0) y["attention_factor"] = r.attention_factor;
    j["rope_scaling"] = y;
    j["rope_scaling"]["type"] = "yarn";
    j["rope_parameters"].update(y);
    j["rope_parameters"]["rope_type"] = "yarn";
  }
  if (const RopeScaling& r = m.rope_scaling; r.type == "llama3") {
    const ordered_json l = {
        {"factor", r.factor},
        {"low_freq_factor", r.low_freq_factor},
        {"high_freq_factor", r.high_freq_factor},
        {"original_max_position_embeddings", r.original_max_position_embeddings}};
    j["rope_scaling"] = l;
    j["rope_scaling"]["rope_type"] = "llama3";
    j["rope_parameters"].update(l);
    j["rope_parameters"]["rope_type"] = "llama3";
  }
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = m.init_std;
  j["use_cache"] = true;
  if (m.num_experts > 0) {
    j["num_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.experts_per_token;
    j["moe_intermediate_size"] = m.moe_intermediate_size;
    j["norm_topk_prob"] = m.norm_topk_prob;
    j["router_aux_loss_coef"] = m.router_aux_loss_coef;
    j["output_router_logits"] = false;  // transformers' default: no auxiliary loss in inference
    j["decoder_sparse_step"] = m.decoder_sparse_step;
    j["mlp_only_layers"] = m.mlp_only_layers;
  }
  family.hf_extra_keys(j);
  j["torch_dtype"] = dtype == st::ElemType::f32    ? "float32"
                     : dtype == st::ElemType::bf16 ? "bfloat16"
                                                   : "float16";
  if (eos >= 0) {
    j["bos_token_id"] = eos;
    j["eos_token_id"] = eos;
  }
  return j.dump(2) + "\n";
}

namespace {

std::string generation_config_json(int64_t eos) {
  ordered_json j;
  if (eos >= 0) j["bos_token_id"] = eos;
  j["do_sample"] = false;
  if (eos >= 0) j["eos_token_id"] = eos;
  j["max_new_tokens"] = 2048;
  return j.dump(2) + "\n";
}

// A failure to write an export's file (a full disk, a quota, permissions) is a failure of the
// run (exit 1), not bad input: the status as internal, with its message.
absl::Status written(absl::Status st) {
  return st.ok() ? st : absl::InternalError(st.message());
}

absl::Status write_text(const std::string& path, const std::string& text) {
  return written(fs::write_file_durable(path, text));
}

}  // namespace

std::string hf_name(const std::string& ours) {
  const std::string dotted = absl::StrReplaceAll(ours, {{"/", "."}});
  return ours.starts_with("lm_head/") ? dotted : "model." + dotted;
}

absl::StatusOr<st::Reader> open_hf_model(const std::string& dir, const Config& cfg,
                                         const Topology& topo) {
  if (absl::Status st = check_hf_config(dir, cfg.model); !st.ok()) return st;
  absl::StatusOr<st::Reader> r = st::Reader::open(dir);
  if (!r.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("model.init_from ", dir, ": ", r.status().message()));
  std::set<std::string> want;
  for (const ckpt::TensorRef& t : model_tensors(cfg, topo)) {
    const std::string name = hf_name(t.name);
    want.insert(name);
    const st::Entry* e = r->find(name);
    if (e == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("model.init_from ", dir, ": tensor ", name,
                                                     " is missing; the model needs it"));
    if (e->shape != t.shape)
      return absl::InvalidArgumentError(absl::StrCat(
          "model.init_from ", dir, ": tensor ", name, " has shape ", shape_str(e->shape), " in ",
          r->file_path(e->file), " but the model's is ", shape_str(t.shape)));
    if (!st::parse_elem_type(e->dtype).ok())
      return absl::InvalidArgumentError(absl::StrCat("model.init_from ", dir, ": tensor ", name,
                                                     " is ", e->dtype,
                                                     "; F32, BF16 or F16 can be imported"));
  }
  for (const st::Entry& e : r->tensors())
    if (!want.count(e.name) && !ignorable(e.name, cfg.model.tie_embeddings))
      return absl::InvalidArgumentError(
          absl::StrCat("model.init_from ", dir, ": tensor ", e.name, " in ", r->file_path(e.file),
                       " is not part of this model (is it another architecture?)"));
  return r;
}

absl::Status load_hf_rank_part(const st::Reader& model, const Config& cfg, const Topology& topo,
                               float* params) {
  const int64_t total = rank_layout(cfg, topo).total;
  std::fill(params, params + total, 0.0f);  // vocabulary padding rows stay zero
  for (const ckpt::TensorRef& b : rank_param_blocks(cfg, topo, params)) {
    const st::Entry* e = model.find(hf_name(b.name));
    TR_ASSERT(e != nullptr, "open_hf_model checked every tensor");
    if (absl::Status st = model.read_f32(*e, b.start, b.extent, b.data); !st.ok()) return st;
    if (const std::string bad = ckpt::non_finite(b); !bad.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("model.init_from ", cfg.model.init_from, ": tensor ", e->name, " in ",
                       model.file_path(e->file), " ", bad, "; training cannot start from it"));
  }
  return absl::OkStatus();
}

namespace {

// The export's safetensors files: their tensors in model order (embedding, layers, norm, head),
// cut before the tensor that would take a file past the limit; each file orders its own
// tensors as safetensors does.
struct ExportShards {
  std::vector<std::vector<st::WriteEntry>> files{1};
  std::map<std::string, std::string> ours_of;  // Hugging Face name -> checkpoint name
  int64_t total_bytes = 0;
};
ExportShards plan_export(const Config& cfg, const ExportOptions& o) {
  ExportShards out;
  int64_t in_shard = 0;
  const int64_t limit = static_cast<int64_t>(o.max_shard_gib * double(int64_t{1} << 30));
  for (const ckpt::TensorRef& t : whole_model_tensors(cfg)) {
    st::WriteEntry e{hf_name(t.name), o.dtype, t.shape};
    out.ours_of[e.name] = t.name;
    if (in_shard > 0 && in_shard + e.bytes() > limit) {
      out.files.emplace_back();
      in_shard = 0;
    }
    in_shard += e.bytes();
    out.total_bytes += e.bytes();
    out.files.back().push_back(std::move(e));
  }
  return out;
}

// Writes the weights into `dir` tensor by tensor (each read from the checkpoint on its own),
// and the index when there are several files. Returns the file of each tensor.
absl::StatusOr<std::map<std::string, std::string>> write_weights(const std::string& dir,
                                                                 const ExportShards& shards,
                                                                 const std::string& checkpoint) {
  std::map<std::string, std::string> where;
  const size_t n = shards.files.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string file = n == 1 ? std::string("model.safetensors")
                                    : absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n);
    absl::StatusOr<st::Writer> w =
        st::Writer::create(fs::join(dir, file), shards.files[i], {{"format", "pt"}});
    if (!w.ok()) return written(w.status());
    std::vector<float> buf;
    for (const st::WriteEntry& e : w->order()) {
      int64_t numel = 1;
      for (int64_t d : e.shape) numel *= d;
      buf.resize(static_cast<size_t>(numel));
      ckpt::TensorRef ref(shards.ours_of.at(e.name), e.shape, buf.data());
      ckpt::LoadTarget one{{&ref, 1}, {}, {}, /*subset=*/true, /*check_crc=*/false};
      if (absl::Status st = ckpt::load(checkpoint, one, nullptr, nullptr); !st.ok()) return st;
      if (absl::Status st = w->append(buf); !st.ok()) return written(st);
      where[e.name] = file;
    }
    if (absl::Status st = w->finish(); !st.ok()) return written(st);
  }
  if (n == 1) return where;
  ordered_json weight_map = ordered_json::object();
  for (const auto& [name, file] : where) weight_map[name] = file;
  ordered_json index;
  index["metadata"] = {{"total_size", shards.total_bytes}};
  index["weight_map"] = weight_map;
  if (absl::Status st =
          write_text(fs::join(dir, "model.safetensors.index.json"), index.dump(2) + "\n");
      !st.ok())
    return st;
  return where;
}

// tokenizer.json into `dir`, and the files transformers keeps beside it when they are there too.
absl::Status copy_tokenizer(const std::string& dir, const std::string& tokenizer) {
  std::error_code ec;
  const sfs::path from_dir = sfs::path(tokenizer).parent_path();
  std::vector<sfs::path> copies = {tokenizer};
  for (const char* extra :
       {"tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"})
    if (sfs::is_regular_file(from_dir / extra, ec)) copies.push_back(from_dir / extra);
  for (const sfs::path& from : copies) {
    const sfs::path to =
        sfs::path(dir) / (from == sfs::path(tokenizer) ? "tokenizer.json" : from.filename());
    if (!sfs::copy_file(from, to, sfs::copy_options::overwrite_existing, ec))
      return absl::InternalError(
          absl::StrCat("cannot copy ", from.string(), " to ", to.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

// Every file of the export into the directory `tmp`, made durable; the file of each tensor.
absl::StatusOr<std::map<std::string, std::string>> write_export(const std::string& tmp,
                                                                const ExportOptions& o,
                                                                const ModelConfig& m,
                                                                const ExportShards& shards,
                                                                int64_t eos) {
  absl::StatusOr<std::map<std::string, std::string>> where =
      write_weights(tmp, shards, o.checkpoint);
  if (!where.ok()) return where.status();
  if (absl::Status st = write_text(fs::join(tmp, "config.json"), hf_config_json(m, o.dtype, eos));
      !st.ok())
    return st;
  if (absl::Status st =
          write_text(fs::join(tmp, "generation_config.json"), generation_config_json(eos));
      !st.ok())
    return st;
  if (!o.tokenizer.empty())
    if (absl::Status st = copy_tokenizer(tmp, o.tokenizer); !st.ok()) return st;
  if (absl::Status st = fs::fsync_path(tmp); !st.ok()) return written(st);
  return where;
}

// A bad --out is bad input, refused before anything is read or written: an existing path that is
// not an empty directory, or a path under a file. `dest` is --out without a trailing '/', so that
// "FILE/" is FILE.
absl::Status check_out(const std::string& out, const std::string& dest) {
  std::error_code ec;
  if (sfs::exists(dest, ec) && !(sfs::is_directory(dest, ec) && sfs::is_empty(dest, ec)))
    return absl::InvalidArgumentError(absl::StrCat(
        "--out ", out, " exists and is not an empty directory; choose a new directory"));
  sfs::path up = sfs::path(dest).parent_path();
  while (!up.empty() && !sfs::exists(up, ec) && up != up.parent_path()) up = up.parent_path();
  if (!up.empty() && sfs::exists(up, ec) && !sfs::is_directory(up, ec))
    return absl::InvalidArgumentError(absl::StrCat("--out ", out, ": ", up.string(),
                                                   " is not a directory; choose a path in one"));
  return absl::OkStatus();
}

// Makes OUT.tmp afresh, where the export is written. A directory the export cannot be made in
// (read-only, forbidden) is bad input; any other failure (a full disk) fails the run.
absl::Status make_tmp(const std::string& out, const std::string& tmp) {
  std::error_code ec;
  sfs::remove_all(tmp, ec);
  if (!ec) sfs::create_directories(tmp, ec);
  if (!ec) return absl::OkStatus();
  const std::string why = absl::StrCat("--out ", out, ": cannot create ", tmp, ": ", ec.message());
  switch (ec.value()) {
    case EACCES:
    case EPERM:
    case EROFS:
    case ENOTDIR:
    case EEXIST:
    case ENAMETOOLONG:
    case ELOOP:
      return absl::InvalidArgumentError(absl::StrCat(why, "; choose a directory you can write"));
    default:
      return absl::InternalError(why);
  }
}

}  // namespace

absl::Status export_hf(const ExportOptions& o) {
  std::error_code ec;
  // Everything is written into OUT.tmp, then renamed: a failed export leaves no OUT, and removes
  // the OUT.tmp it began (OUT without a trailing '/', so that OUT.tmp is beside it).
  std::string dest = sfs::path(o.out).lexically_normal().string();
  if (dest.size() > 1 && dest.ends_with('/')) dest.pop_back();
  if (absl::Status st = check_out(o.out, dest); !st.ok()) return st;
  if (!o.tokenizer.empty() && !sfs::is_regular_file(o.tokenizer, ec))
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer ", o.tokenizer, ": no such file; pass a tokenizer.json"));
  if (absl::Status st = ckpt::verify(o.checkpoint); !st.ok()) return st;
  absl::StatusOr<Config> cfg = load_config(fs::join(o.checkpoint, "config.yaml"), {});
  if (!cfg.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", o.checkpoint, ": its config.yaml: ", cfg.status().message()));
  const ModelConfig& m = cfg->model;
  const int64_t eos = o.tokenizer.empty() ? -1 : end_of_text_id(o.tokenizer);
  const ExportShards shards = plan_export(*cfg, o);
  const std::string tmp = dest + ".tmp";
  if (absl::Status st = make_tmp(o.out, tmp); !st.ok()) return st;
  absl::StatusOr<std::map<std::string, std::string>> where = write_export(tmp, o, m, shards, eos);
  if (!where.ok()) {
    (void)fs::remove_all(tmp);
    return where.status();
  }
  if (sfs::exists(dest, ec)) sfs::remove(dest, ec);  // the empty directory checked above
  sfs::rename(tmp, dest, ec);
  if (ec) {
    (void)fs::remove_all(tmp);
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", dest, ": ", ec.message()));
  }
  if (absl::Status st = fs::fsync_parent(dest); !st.ok()) return written(st);
  const size_t n = shards.files.size();
  std::printf("exported %s to %s: %zu tensors in %zu file%s, %.3g GiB %s, vocabulary %lld\n",
              o.checkpoint.c_str(), o.out.c_str(), where->size(), n, n == 1 ? "" : "s",
              static_cast<double>(shards.total_bytes) / double(int64_t{1} << 30),
              st::elem_type_name(o.dtype), static_cast<long long>(m.vocab_size));
  return absl::OkStatus();
}

}  // namespace tr
