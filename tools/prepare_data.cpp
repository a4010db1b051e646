// prepare_data: tokenizes text into a Megatron indexed dataset (PREFIX.bin + PREFIX.idx).
//
//   prepare_data --output PREFIX [--format jsonl|text] [--tokenizer byte|FILE] [--eod-token T]
//                [--threads N] INPUT...
//   prepare_data --output PREFIX --synthetic TOKENS --vocab V [--seed S]
//
// INPUT is a file or a directory (all regular files below it, recursively, in sorted order).
// text: each file is one document. jsonl: each non-blank line is a JSON object whose "text"
// string is one document. The tokenizer's end-of-document id is appended to every document;
// empty documents are skipped. Exit 0 on success, 2 on bad input or a write failure.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/fs_io.h"
#include "data/dataset_meta.h"
#include "data/tokenizer.h"
#include "data/writer.h"

namespace {

namespace fs = std::filesystem;
using tr::data::IndexedDatasetWriter;
using tr::data::Tokenizer;

constexpr const char* kUsage =
    "usage: prepare_data --output PREFIX [--format jsonl|text] [--tokenizer byte|FILE]\n"
    "                    [--eod-token TOKEN] [--threads N] INPUT...\n"
    "  Tokenizes INPUT files (or every regular file below an INPUT directory, sorted) into\n"
    "  the Megatron indexed dataset PREFIX.bin + PREFIX.idx.\n"
    "  --output PREFIX     output prefix; parent directories are created\n"
    "  --format jsonl      one document per line, from the \"text\" field (default)\n"
    "  --format text       one document per file\n"
    "  --tokenizer byte    bytes 0..255, end of document 256 (default)\n"
    "  --tokenizer FILE    a Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2,\n"
    "                      Qwen2/2.5, Llama 3); special tokens in the text are recognised\n"
    "  --eod-token TOKEN   the end-of-document token of FILE (default <|endoftext|>)\n"
    "  --threads N         tokenize on N threads (default 1); the output is the same\n"
    "  --synthetic TOKENS  instead of INPUTs: TOKENS uniform random ids in [0, V) in documents\n"
    "                      of 1..8192 tokens, for benchmarks (--vocab V, --seed S, default 1)\n"
    "  The end-of-document token is appended to every document; empty documents are skipped.\n";

struct Args {
  std::string output;
  std::string format = "jsonl";
  std::string tokenizer = "byte";
  std::string eod_token;
  std::vector<std::string> inputs;
  int64_t synthetic = 0, vocab = 0, seed = 1;
  int threads = 1;
  bool help = false;
};

struct Stats {
  int64_t documents = 0;
  int64_t skipped_empty = 0;
};

absl::StatusOr<Args> parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      args.help = true;
      return args;
    }
    if (arg.rfind("--", 0) != 0) {
      args.inputs.push_back(arg);
      continue;
    }
    std::string value;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value; see --help"));
    }
    if (arg == "--output") {
      args.output = value;
    } else if (arg == "--format") {
      args.format = value;
    } else if (arg == "--tokenizer") {
      args.tokenizer = value;
    } else if (arg == "--eod-token") {
      args.eod_token = value;
    } else if (arg == "--threads") {
      if (!absl::SimpleAtoi(value, &args.threads) || args.threads < 1 || args.threads > 1024)
        return absl::InvalidArgumentError(
            absl::StrCat("--threads '", value, "' is not a thread count (1..1024)"));
    } else if (arg == "--synthetic" || arg == "--vocab" || arg == "--seed") {
      int64_t n = 0;
      if (!absl::SimpleAtoi(value, &n) || n < (arg == "--seed" ? 0 : 1))
        return absl::InvalidArgumentError(
            absl::StrCat(arg, " '", value, "' is not a ",
                         arg == "--seed" ? "non-negative" : "positive", " integer"));
      (arg == "--synthetic" ? args.synthetic : arg == "--vocab" ? args.vocab : args.seed) = n;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg, "; see --help"));
    }
  }
  if (args.output.empty()) return absl::InvalidArgumentError("--output PREFIX is required");
  if (args.format != "jsonl" && args.format != "text")
    return absl::InvalidArgumentError(
        absl::StrCat("--format '", args.format, "' is unknown; use jsonl or text"));
  if (args.synthetic > 0) {
    if (args.vocab <= 0) return absl::InvalidArgumentError("--synthetic needs --vocab V");
    if (!args.inputs.empty()) return absl::InvalidArgumentError("--synthetic takes no INPUT files");
    return args;
  }
  if (args.inputs.empty())
    return absl::InvalidArgumentError("no INPUT files or directories given; see --help");
  return args;
}

// Inputs in the order given; a directory expands to its regular files, recursively, sorted.
absl::StatusOr<std::vector<std::string>> collect_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    if (fs::is_regular_file(input, ec)) {
      files.push_back(input);
    } else if (fs::is_directory(input, ec)) {
      std::vector<std::string> found;
      for (fs::recursive_directory_iterator it(input, ec), end; !ec && it != end; it.increment(ec))
        if (it->is_regular_file(ec)) found.push_back(it->path().string());
      if (ec)
        return absl::InvalidArgumentError(
            absl::StrCat("cannot list directory '", input, "': ", ec.message()));
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      return absl::NotFoundError(absl::StrCat("input '", input, "' is not a file or directory"));
    }
  }
  return files;
}

// Documents parsed (jsonl) and tokenized in batches on `threads` threads, and written in input
// order, so that the output (and the first error reported) does not depend on the thread count.
class Batcher {
 public:
  Batcher(const Tokenizer& tok, IndexedDatasetWriter& writer, Stats& stats, int threads)
      : tok_(tok), writer_(writer), stats_(stats), threads_(threads) {}

  // One document: a jsonl line (`json`) or a whole text file. `where` names it in an error
  // ("file:line").
  absl::Status add(std::string raw, std::string where, bool json) {
    bytes_ += raw.size();
    items_.push_back({std::move(raw), std::move(where), json});
    return bytes_ >= kBatchBytes ? flush() : absl::OkStatus();
  }

  absl::Status flush() {
    const size_t n = items_.size();
    std::vector<std::vector<int32_t>> ids(n);
    std::vector<std::string> errors(n);
    std::vector<char> empty(n, 0);
    auto work = [&](size_t first) {
      for (size_t i = first; i < n; i += static_cast<size_t>(threads_)) {
        const Item& item = items_[i];
        std::string text;
        if (item.json) {
          nlohmann::json doc;
          try {
            doc = nlohmann::json::parse(item.raw);
          } catch (const nlohmann::json::parse_error& e) {
            errors[i] = absl::StrCat("invalid JSON (", e.what(), ")");
            continue;
          }
          if (!doc.is_object() || !doc.contains("text") || !doc["text"].is_string()) {
            errors[i] = "expected a JSON object with a string field \"text\"";
            continue;
          }
          text = doc["text"].get<std::string>();
        }
        const std::string& t = item.json ? text : item.raw;
        if (t.empty())
          empty[i] = 1;
        else
          ids[i] = tok_.encode(t);
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads_; ++t) pool.emplace_back(work, static_cast<size_t>(t));
    work(0);
    for (std::thread& t : pool) t.join();
    for (size_t i = 0; i < n; ++i) {
      if (!errors[i].empty())
        return absl::InvalidArgumentError(absl::StrCat(items_[i].where, ": ", errors[i]));
      if (empty[i]) {
        ++stats_.skipped_empty;
        continue;
      }
      ids[i].push_back(tok_.eod_id());
      ++stats_.documents;
      if (absl::Status st = writer_.add_document(ids[i]); !st.ok())
        return absl::InvalidArgumentError(absl::StrCat(items_[i].where, ": ", st.message()));
    }
    items_.clear();
    bytes_ = 0;
    return absl::OkStatus();
  }

 private:
  struct Item {
    std::string raw, where;
    bool json;
  };
  static constexpr size_t kBatchBytes = size_t{16} << 20;
  const Tokenizer& tok_;
  IndexedDatasetWriter& writer_;
  Stats& stats_;
  const int threads_;
  std::vector<Item> items_;
  size_t bytes_ = 0;
};

absl::Status process_text(const std::string& path, Batcher& batch) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return batch.add(text.str(), path, false);
}

absl::Status process_jsonl(const std::string& path, Batcher& batch) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read '", path, "'"));
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (auto st = batch.add(std::move(line), absl::StrCat(path, ":", number), true); !st.ok())
      return st;
  }
  return absl::OkStatus();
}

// Uniform random tokens (splitmix64 of the seed and position) in documents of 1..8192 tokens.
absl::Status run_synthetic(const Args& args) {
  std::error_code ec;
  fs::remove(tr::data::dataset_meta_path(args.output), ec);
  auto writer = IndexedDatasetWriter::create(args.output, args.vocab);
  if (!writer.ok()) return writer.status();
  uint64_t state = static_cast<uint64_t>(args.seed) * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  std::vector<int32_t> doc;
  for (int64_t left = args.synthetic; left > 0;) {
    doc.resize(static_cast<size_t>(std::min<int64_t>(left, 1 + next() % 8192)));
    for (int32_t& t : doc) t = static_cast<int32_t>(next() % static_cast<uint64_t>(args.vocab));
    if (auto st = (*writer)->add_document(doc); !st.ok()) return st;
    left -= static_cast<int64_t>(doc.size());
  }
  if (auto st = (*writer)->finish(); !st.ok()) return st;
  if (auto st = tr::data::write_dataset_meta(args.output, {"synthetic", "", 0, 0, args.vocab, -1});
      !st.ok())
    return st;
  std::printf("prepare_data: wrote %lld synthetic documents, %lld tokens (vocab %lld) to %s\n",
              static_cast<long long>((*writer)->num_documents()),
              static_cast<long long>((*writer)->num_tokens()), static_cast<long long>(args.vocab),
              args.output.c_str());
  return absl::OkStatus();
}

absl::Status run(const Args& args) {
  if (args.synthetic > 0) return run_synthetic(args);
  auto tok = tr::data::make_tokenizer(args.tokenizer, args.eod_token);
  if (!tok.ok()) return tok.status();
  auto files = collect_files(args.inputs);
  if (!files.ok()) return files.status();
  const fs::path parent = fs::path(args.output).parent_path();
  std::error_code ec;
  if (!parent.empty() && !fs::create_directories(parent, ec) && ec)
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create output directory '", parent.string(), "': ", ec.message()));
  // Which tokenizer made the dataset (data/dataset_meta.h); an old one goes first, so that a
  // crash never pairs it with new data.
  tr::data::DatasetMeta meta{args.tokenizer == "byte" ? "byte" : "hf-bpe",
                             "",
                             0,
                             0,
                             (*tok)->vocab_size(),
                             (*tok)->eod_id()};
  if (args.tokenizer != "byte") {
    absl::StatusOr<tr::fs::FileDigest> d = tr::fs::digest_file(args.tokenizer);
    if (!d.ok()) return d.status();
    meta.source = args.tokenizer;
    meta.source_bytes = d->bytes;
    meta.source_crc32 = d->crc32;
  }
  fs::remove(tr::data::dataset_meta_path(args.output), ec);
  auto writer = IndexedDatasetWriter::create(args.output, (*tok)->vocab_size());
  if (!writer.ok()) return writer.status();
  Stats stats;
  Batcher batch(**tok, **writer, stats, args.threads);
  for (const std::string& file : *files) {
    absl::Status st =
        args.format == "text" ? process_text(file, batch) : process_jsonl(file, batch);
    if (!st.ok()) return st;
  }
  if (absl::Status st = batch.flush(); !st.ok()) return st;
  if (stats.documents == 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "no non-empty documents found in ", files->size(), " input file(s); nothing written"));
  if (auto st = (*writer)->finish(); !st.ok()) return st;
  if (auto st = tr::data::write_dataset_meta(args.output, meta); !st.ok()) return st;
  std::printf(
      "prepare_data: wrote %lld documents (%lld empty skipped), %lld tokens, %lld bytes to "
      "%s.bin + %s.idx (%s tokens, tokenizer %s)\n",
      static_cast<long long>(stats.documents), static_cast<long long>(stats.skipped_empty),
      static_cast<long long>((*writer)->num_tokens()),
      static_cast<long long>((*writer)->bytes_written()), args.output.c_str(), args.output.c_str(),
      tr::data::token_dtype_name((*writer)->dtype()), (*tok)->name().c_str());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  auto args = parse_args(argc, argv);
  if (args.ok() && args->help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  absl::Status st = args.ok() ? run(*args) : args.status();
  if (!st.ok()) {
    std::fprintf(stderr, "prepare_data: error: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  return 0;
}
