// bench_data: the data loader's time per step, plain and with packed documents' fields
// (data.document_mask block_causal, reset_position_ids, eod_mask_loss), on a synthetic Megatron
// dataset of Qwen2.5's vocabulary written to a temporary directory (documents of random lengths,
// each ending in the end-of-document id). Prints a Markdown table: per step the time to build
// one data-parallel rank's micro-batches (data::make_step_batch, what the loader's background
// thread runs), tokens/s, and the documents' extra time as a fraction of the plain time.
//
//   bench_data [--seq-len 4096] [--samples 64] [--doc-len 1000] [--steps 20] [--dir DIR]
// (--help lists the flags; tools/flags.h reads them.) Exit 0 on success, 1 when the dataset
// cannot be written or read, 2 on bad input.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "data/loader.h"
#include "data/sampling.h"
#include "data/token_source.h"
#include "data/writer.h"
#include "tools/flags.h"

// The flags, read by tools/flags.h's parser; --help lists them from these definitions.
ABSL_FLAG(tr::tools::Positive, seq_len, tr::tools::Positive{4096}, "N: tokens per sample");
ABSL_FLAG(tr::tools::Positive, samples, tr::tools::Positive{64},
          "N: samples per step (one data-parallel rank's global batch)");
ABSL_FLAG(tr::tools::Positive, doc_len, tr::tools::Positive{1000},
          "N: the documents' mean length in tokens (exponentially distributed)");
ABSL_FLAG(tr::tools::Positive, steps, tr::tools::Positive{20},
          "N: timed steps per option set; the median counts");
ABSL_FLAG(
    std::string, dir, "",
    "DIR: where the synthetic dataset (docs.bin, docs.idx) is written and removed at the end; "
    "nothing else in DIR is touched (default: the temporary directory's bench_data)");

namespace {

const tr::tools::Usage kUsage{
    .tool = "bench_data",
    .file = __FILE__,
    .synopsis = "bench_data [--seq-len N] [--samples N] [--doc-len N] [--steps N] [--dir DIR]",
    .about =
        "Times the data loader's step (data::make_step_batch) on a synthetic Megatron dataset, "
        "plain and with packed documents' fields (block-causal mask, reset position ids, "
        "end-of-document loss mask), and prints a Markdown table.\n"
        "Exit 0 on success, 1 when the dataset cannot be written or read, 2 on bad input.",
    .positionals = false,
    .error_prefix = "bench_data: "};

constexpr int32_t kVocab = 151936, kEod = 151643;  // Qwen2.5's <|endoftext|>

int fail(const std::string& what) {
  std::fprintf(stderr, "bench_data: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tr::tools::parse_or_exit(argc, argv, kUsage);
  const int64_t seq = absl::GetFlag(FLAGS_seq_len).value;
  const int64_t samples = absl::GetFlag(FLAGS_samples).value;
  const int64_t doc_len = absl::GetFlag(FLAGS_doc_len).value;
  const int64_t steps = absl::GetFlag(FLAGS_steps).value;
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) dir = (std::filesystem::temp_directory_path() / "bench_data").string();
  std::filesystem::create_directories(dir);
  const std::string prefix = dir + "/docs";
  for (const char* ext : {".bin", ".idx"})
    if (std::filesystem::exists(prefix + ext)) {
      std::fprintf(stderr,
                   "bench_data: --dir %s already holds docs%s; name a directory without it\n",
                   dir.c_str(), ext);
      return 2;
    }
  {
    auto w = tr::data::IndexedDatasetWriter::create(prefix, kVocab);
    if (!w.ok()) return fail(std::string(w.status().message()));
    std::mt19937 rng(1);
    std::uniform_int_distribution<int32_t> token(0, kEod - 1);
    std::exponential_distribution<double> length(1.0 / static_cast<double>(doc_len));
    const int64_t total = (steps + 1) * samples * (seq + 1) + seq;
    std::vector<int32_t> doc;
    for (int64_t written = 0; written < total;) {
      doc.resize(static_cast<size_t>(std::max<int64_t>(1, static_cast<int64_t>(length(rng)))));
      for (int32_t& t : doc) t = token(rng);
      doc.push_back(kEod);
      if (auto st = (*w)->add_document(doc); !st.ok()) return fail(std::string(st.message()));
      written += static_cast<int64_t>(doc.size());
    }
    if (auto st = (*w)->finish(); !st.ok()) return fail(std::string(st.message()));
  }
  auto source = tr::data::TokenSource::open(prefix, tr::data::SourceFormat::auto_detect);
  if (!source.ok()) return fail(std::string(source.status().message()));
  std::vector<tr::data::WeightedSource> sources;
  sources.push_back({std::move(*source), 1.0});
  auto space = tr::data::SampleSpace::create(std::move(sources), seq, 1234, true);
  if (!space.ok()) return fail(std::string(space.status().message()));

  tr::data::LoaderOptions plain;
  plain.seq_len = seq;
  plain.global_batch = samples;
  plain.micro_batch = 1;
  plain.vocab_size = kVocab;
  tr::data::LoaderOptions docs = plain;
  docs.eod_id = kEod;
  docs.doc_starts = docs.reset_positions = docs.mask_after_eod = true;
  // Median over `steps` steps of one step's build time, each option set taking turns.
  auto median_s = [&](const tr::data::LoaderOptions& o) {
    std::vector<double> t;
    for (int64_t k = 0; k < steps; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      auto b = tr::data::make_step_batch(*space, o, k * samples);
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      if (!b.ok()) std::exit(fail(std::string(b.status().message())));
    }
    std::nth_element(t.begin(), t.begin() + static_cast<int64_t>(t.size()) / 2, t.end());
    return t[t.size() / 2];
  };
  median_s(plain);  // page the dataset in
  const double a = median_s(plain), b = median_s(docs);
  const double tokens = static_cast<double>(samples * seq);
  std::printf(
      "seq_len %lld, %lld samples per step, mean document %lld tokens, median of %lld "
      "steps\n\n",
      static_cast<long long>(seq), static_cast<long long>(samples), static_cast<long long>(doc_len),
      static_cast<long long>(steps));
  std::printf(
      "| loader | ms per step | Mtokens/s | extra | extra ns per token |\n"
      "| --- | ---: | ---: | ---: | ---: |\n");
  std::printf("| plain | %.3f | %.1f | | |\n", 1e3 * a, tokens / a / 1e6);
  std::printf("| documents (all three fields) | %.3f | %.1f | %+.1f%% | %.2f |\n", 1e3 * b,
              tokens / b / 1e6, 100 * (b - a) / a, 1e9 * (b - a) / tokens);
  for (const char* ext : {".bin", ".idx"}) std::filesystem::remove(prefix + ext);
  return 0;
}
