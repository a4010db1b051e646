// prepare_data: tokenizes text into a Megatron indexed dataset (PREFIX.bin + PREFIX.idx).
//
//   prepare_data --output PREFIX [--format jsonl|text] [--tokenizer byte|FILE] [--eod-token T]
//                [--threads N] INPUT...
//   prepare_data --output PREFIX --synthetic TOKENS --vocab V [--seed S]
//
// INPUT is a file or a directory (all regular files below it, recursively, in sorted order).
// text: each file is one document. jsonl: each non-blank line is a JSON object whose "text"
// string is one document. The tokenizer's end-of-document id is appended to every document;
// empty documents are skipped. Exit 0 on success, 2 on bad input or a write failure. --help lists
// the flags (tools/flags.h reads them).
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/fs_io.h"
#include "data/dataset_meta.h"
#include "data/tokenizer.h"
#include "data/utf8.h"
#include "data/writer.h"
#include "tools/flags.h"

// The flags, read by tools/flags.h's parser; --help lists them from these definitions.
ABSL_FLAG(std::string, output, "",
          "output prefix: PREFIX.bin and PREFIX.idx; parent directories are created (required)");
ABSL_FLAG(std::string, format, "jsonl",
          "jsonl: one document per non-blank line, from its \"text\" field; text: one document "
          "per file");
ABSL_FLAG(std::string, tokenizer, "byte",
          "byte: bytes 0..255, end of document 256; or FILE: a Hugging Face tokenizer.json of the "
          "byte-level BPE kind (GPT-2, Qwen2/2.5, Llama 3), special tokens in the text recognised");
ABSL_FLAG(std::string, eod_token, "",
          "the end-of-document token of a tokenizer FILE (empty: <|endoftext|>)");
ABSL_FLAG(int32_t, threads, 1, "tokenize on N threads (1..1024); the output is the same");
ABSL_FLAG(std::optional<tr::tools::Positive>, synthetic, std::nullopt,
          "instead of INPUTs: this many uniform random ids in [0, --vocab) in documents of "
          "1..8192 tokens, for benchmarks");
ABSL_FLAG(std::optional<tr::tools::Positive>, vocab, std::nullopt,
          "the ids' range of --synthetic (required with it)");
ABSL_FLAG(tr::tools::Count, seed, tr::tools::Count{1}, "the random seed of --synthetic");

namespace {

namespace fs = std::filesystem;
using tr::data::IndexedDatasetWriter;
using tr::data::Tokenizer;

const tr::tools::Usage kUsage{
    .tool = "prepare_data",
    .file = __FILE__,
    .synopsis =
        "prepare_data --output PREFIX [--format jsonl|text] [--tokenizer byte|FILE] "
        "[--eod-token TOKEN] [--threads N] INPUT...\n"
        "prepare_data --output PREFIX --synthetic TOKENS --vocab V [--seed S]",
    .about =
        "Tokenizes INPUT files (or every regular file below an INPUT directory, sorted) into "
        "the Megatron indexed dataset PREFIX.bin + PREFIX.idx. The end-of-document token is "
        "appended to every document; empty documents are skipped.\n"
        "Exit 0 on success, 2 on bad input or a write failure.",
    .positionals = true,
    .error_prefix = "prepare_data: error: "};

struct Args {
  std::string output, format, tokenizer, eod_token;
  std::vector<std::string> inputs;
  int64_t synthetic = 0, vocab = 0, seed = 1;
  int threads = 1;
};

struct Stats {
  int64_t documents = 0;
  int64_t skipped_empty = 0;
};

// The flags and INPUTs, checked together.
absl::StatusOr<Args> parse_args(int argc, char** argv) {
  Args args;
  args.inputs = tr::tools::parse_or_exit(argc, argv, kUsage);
  args.output = absl::GetFlag(FLAGS_output);
  args.format = absl::GetFlag(FLAGS_format);
  args.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  args.eod_token = absl::GetFlag(FLAGS_eod_token);
  args.threads = absl::GetFlag(FLAGS_threads);
  args.synthetic = tr::tools::value_or(absl::GetFlag(FLAGS_synthetic), 0);
  args.vocab = tr::tools::value_or(absl::GetFlag(FLAGS_vocab), 0);
  args.seed = absl::GetFlag(FLAGS_seed).value;
  if (args.threads < 1 || args.threads > 1024)
    return absl::InvalidArgumentError(
        absl::StrCat("--threads '", args.threads, "' is not a thread count (1..1024)"));
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

// The input as chunks of documents in order: jsonl lines or whole text files, about kChunkBytes
// each. A file that cannot be read ends the input with its error, in its place.
class Reader {
 public:
  struct Item {
    std::string raw, where;  // the line or file; "file:line" or "file" in an error
  };
  struct Chunk {
    std::vector<Item> items;
    absl::Status error;  // the input ends here with this error
  };
  Reader(std::vector<std::string> files, bool json) : files_(std::move(files)), json_(json) {}

  // The next chunk; false at the end of the input.
  bool next(Chunk& chunk) {
    size_t bytes = 0;
    while (bytes < kChunkBytes && chunk.error.ok()) {
      if (!in_.is_open()) {
        if (file_ == files_.size()) break;
        const std::string& path = files_[file_];
        in_.open(path, std::ios::binary);
        line_ = 0;
        if (!in_) {
          chunk.error = absl::InvalidArgumentError(absl::StrCat("cannot read '", path, "'"));
          file_ = files_.size();
          break;
        }
      }
      const std::string& path = files_[file_];
      std::string raw;
      if (!json_) {
        std::ostringstream text;
        text << in_.rdbuf();
        raw = text.str();
      } else if (!std::getline(in_, raw)) {
        in_.close();
        ++file_;
        continue;
      } else {
        ++line_;
        if (raw.find_first_not_of(" \t\r") == std::string::npos) continue;
      }
      bytes += raw.size();
      chunk.items.push_back({std::move(raw), json_ ? absl::StrCat(path, ":", line_) : path});
      if (!json_) {
        in_.close();
        ++file_;
      }
    }
    return !chunk.items.empty() || !chunk.error.ok();
  }

 private:
  // Small enough that every thread has work until the end, large enough that handing chunks
  // over costs nothing.
  static constexpr size_t kChunkBytes = size_t{1} << 20;
  const std::vector<std::string> files_;
  const bool json_;
  size_t file_ = 0;
  int64_t line_ = 0;
  std::ifstream in_;
};

// Documents read, parsed (jsonl), tokenized and written in input order on `threads` threads, so
// that the output (and the first error reported) does not depend on the thread count. Each
// thread takes whichever step is ready, in this order: tokenizing the oldest parsed chunk, parsing
// a chunk read, reading the next one (one reader at a time); the thread that finishes the
// oldest chunk writes every finished chunk in order (one writer at a time). So reading, parsing
// and writing overlap the tokenizing, no thread waits at a batch boundary, and the pool reads and
// parses ahead while the tokenizer loads (start() before run()).
class Pipeline {
 public:
  // `json`: each item is a jsonl line whose "text" is the document (else the document itself).
  Pipeline(Stats& stats, Reader& reader, bool json, int threads)
      : stats_(stats), reader_(reader), json_(json), threads_(threads) {}
  ~Pipeline() {
    stop(absl::CancelledError("stopped"));
    for (std::thread& t : pool_) t.join();
  }

  // Starts threads - 1 workers: they read and parse until run() gives them the tokenizer.
  void start() {
    for (int t = 1; t < threads_; ++t) pool_.emplace_back([this] { work(); });
  }
  // Ends the workers without output: `why` is the run's error.
  void stop(absl::Status why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = std::move(why);
    ready_.notify_all();
  }
  // Tokenizes and writes everything on this thread and the workers; the first error in input
  // order, or OK.
  absl::Status run(const Tokenizer& tok, IndexedDatasetWriter& writer) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tok_ = &tok;
      writer_ = &writer;
      ready_.notify_all();
    }
    work();
    for (std::thread& t : pool_) t.join();
    pool_.clear();
    return status_;
  }

 private:
  struct Chunk {
    Reader::Chunk in;
    std::vector<std::string> texts;  // parsed: each item's document
    std::vector<std::vector<int32_t>> ids;
    std::vector<std::string> errors;
    std::vector<char> empty;
    bool parsed = false, tokenized = false;
  };

  // A worker's loop; an exception (out of memory) ends the run with its message, not the process
  // mid-write.
  void work() {
    try {
      steps();
    } catch (const std::exception& e) {
      stop(absl::InternalError(absl::StrCat("prepare_data stopped: ", e.what())));
    }
  }

  void steps() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (!status_.ok()) return;
      const size_t held = written_ + chunks_.size();  // chunks read so far
      if (tok_ != nullptr && next_tok_ < held && chunks_[next_tok_ - written_]->parsed) {
        Chunk& c = *chunks_[next_tok_ - written_];
        ++next_tok_;
        lock.unlock();
        tokenize(c);
        lock.lock();
        c.tokenized = true;
        write_finished(lock);
        continue;
      }
      if (next_parse_ < held) {
        Chunk& c = *chunks_[next_parse_ - written_];
        ++next_parse_;
        lock.unlock();
        parse(c);
        lock.lock();
        c.parsed = true;
        ready_.notify_all();
        continue;
      }
      if (!reading_ && !end_ && chunks_.size() < in_flight()) {
        reading_ = true;
        lock.unlock();
        auto c = std::make_unique<Chunk>();
        const bool more = reader_.next(c->in);
        lock.lock();
        reading_ = false;
        if (more) chunks_.push_back(std::move(c));
        end_ = !more || !chunks_.back()->in.error.ok();
        ready_.notify_all();
        continue;
      }
      if (tok_ != nullptr && end_ && !reading_ && chunks_.empty()) return;
      ready_.wait(lock);
    }
  }

  void parse(Chunk& c) {
    const size_t n = c.in.items.size();
    c.texts.resize(n);
    c.errors.resize(n);
    for (size_t i = 0; i < n; ++i) {
      std::string& raw = c.in.items[i].raw;
      if (!json_) {
        c.texts[i] = std::move(raw);
        continue;
      }
      // JSON is UTF-8: malformed bytes become U+FFFD first, as the tokenizer does for text.
      tr::data::replace_malformed_utf8(raw);
      nlohmann::json doc;
      try {
        doc = nlohmann::json::parse(raw);
      } catch (const nlohmann::json::exception& e) {  // a syntax error, a number overflow
        c.errors[i] = absl::StrCat("invalid JSON (", e.what(), ")");
        continue;
      }
      if (!doc.is_object() || !doc.contains("text") || !doc["text"].is_string()) {
        c.errors[i] = "expected a JSON object with a string field \"text\"";
        continue;
      }
      c.texts[i] = std::move(doc["text"].get_ref<std::string&>());
      std::string().swap(raw);
    }
  }

  void tokenize(Chunk& c) {
    const size_t n = c.texts.size();
    c.ids.resize(n);
    c.empty.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
      if (!c.errors[i].empty()) continue;
      if (c.texts[i].empty())
        c.empty[i] = 1;
      else
        c.ids[i] = tok_->encode(c.texts[i]);
      std::string().swap(c.texts[i]);
    }
  }

  // Writes the finished chunks at the front, in order, unless another thread is writing (it
  // will find them). Called and returns with `lock` held.
  void write_finished(std::unique_lock<std::mutex>& lock) {
    if (writing_) return;
    writing_ = true;
    while (status_.ok() && !chunks_.empty() && chunks_.front()->tokenized) {
      std::unique_ptr<Chunk> c = std::move(chunks_.front());
      chunks_.pop_front();
      ++written_;
      lock.unlock();
      absl::Status st = write(*c);
      lock.lock();
      if (!st.ok() && status_.ok()) status_ = st;
    }
    writing_ = false;
    ready_.notify_all();
  }

  absl::Status write(Chunk& c) {
    for (size_t i = 0; i < c.in.items.size(); ++i) {
      if (!c.errors[i].empty())
        return absl::InvalidArgumentError(absl::StrCat(c.in.items[i].where, ": ", c.errors[i]));
      if (c.empty[i]) {
        ++stats_.skipped_empty;
        continue;
      }
      c.ids[i].push_back(tok_->eod_id());
      ++stats_.documents;
      if (absl::Status st = writer_->add_document(c.ids[i]); !st.ok())
        return absl::InvalidArgumentError(absl::StrCat(c.in.items[i].where, ": ", st.message()));
    }
    return c.in.error;
  }

  // Chunks read ahead: 16 per thread, enough for the workers to parse ahead while the tokenizer
  // loads (about 0.2 s for Qwen2.5's), and 64 MB at most.
  size_t in_flight() const { return std::min<size_t>(16 * static_cast<size_t>(threads_), 64); }
  Stats& stats_;
  Reader& reader_;
  const bool json_;
  const int threads_;
  std::vector<std::thread> pool_;
  std::mutex mu_;
  std::condition_variable ready_;
  const Tokenizer* tok_ = nullptr;  // set by run()
  IndexedDatasetWriter* writer_ = nullptr;
  std::deque<std::unique_ptr<Chunk>> chunks_;  // read and not yet written, in input order
  size_t written_ = 0;                         // chunks written (the front's number)
  size_t next_parse_ = 0, next_tok_ = 0;       // the next chunk to parse, to tokenize
  bool reading_ = false, writing_ = false, end_ = false;
  absl::Status status_;
};

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
  // The workers read and parse the input while this thread loads the tokenizer.
  auto files = collect_files(args.inputs);
  Stats stats;
  const bool json = args.format != "text";
  Reader reader(files.ok() ? *files : std::vector<std::string>{}, json);
  Pipeline pipeline(stats, reader, json, args.threads);
  if (files.ok()) pipeline.start();
  auto tok = tr::data::make_tokenizer(args.tokenizer, args.eod_token);
  if (!tok.ok()) return tok.status();
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
  if (absl::Status st = pipeline.run(**tok, **writer); !st.ok()) return st;
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
  absl::Status st = args.ok() ? run(*args) : args.status();
  if (!st.ok()) {
    std::fprintf(stderr, "prepare_data: error: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  return 0;
}
