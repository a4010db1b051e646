// DataLoader: the per-data-parallel-rank view of the blended, shuffled sample stream, with a
// background thread that prepares the next steps.
//
// Step layout: the global batch of a step is samples [consumed, consumed + global_batch).
// Rank r of dp_size takes samples consumed + r * (global_batch / dp_size) + j,
// j < global_batch / dp_size, cut in order into micro-batches of micro_batch samples. After
// the step, consumed += global_batch. A step is a pure function of (sources, seed, consumed),
// so resuming from consumed_samples() (even with another dp_size) reproduces the order.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/sampling.h"
#include "data/token_source.h"

namespace tr::data {

struct DataPath {
  std::string path;     // Megatron prefix or llm.c shard
  double weight = 1.0;  // relative; normalised over all paths
};

struct LoaderOptions {
  std::vector<DataPath> paths;
  SourceFormat format = SourceFormat::auto_detect;
  int64_t seq_len = 0;   // tokens per sample input (each sample reads seq_len + 1)
  uint64_t seed = 1234;  // shuffle seed
  bool shuffle = true;   // false: samples in file order (e.g. validation)
  int dp_rank = 0;
  int dp_size = 1;
  int64_t global_batch = 0;      // samples per step over all dp ranks
  int64_t micro_batch = 0;       // samples per micro-batch on one rank
  int64_t consumed_samples = 0;  // resumable state: global samples already trained on
  int64_t vocab_size = 0;        // > 0: token ids must be < vocab_size (checked on read)
  // Context parallelism: the positions of each sample this rank keeps, in the order it holds
  // them (parallel/context_parallel.h); its micro-batches hold those tokens of every sample.
  // Empty = all seq_len of them.
  std::vector<int64_t> positions;
  int prefetch_steps = 2;  // steps prepared ahead by the background thread (>= 1)
  // Documents packed in a sample (data.document_mask, reset_position_ids, eod_mask_loss): with
  // eod_id >= 0 they end at this token, and each micro-batch carries what the flags below ask
  // for and its DocumentStats.
  int32_t eod_id = -1;
  bool doc_starts = false;       // MicroBatch::doc_start (block-causal attention)
  bool reset_positions = false;  // MicroBatch::positions restart at 0 in each document
  bool mask_after_eod = false;   // a target whose input token is eod_id is kIgnoredTarget
};

// A target the loss leaves out (the kernels ignore any negative target).
constexpr int32_t kIgnoredTarget = -1;

// Checks the batch arithmetic; errors name the offending option.
absl::Status validate_loader_options(const LoaderOptions& options);

// What the step needs of a micro-batch's documents beside its tokens (without an eod_id: every
// target, and one document per sample).
struct DocumentStats {
  int64_t loss_targets = 0;  // targets not ignored (all of them without mask_after_eod)
  // The sum over its samples of their documents' lengths squared (a document cut by the
  // sample's edge counts its part in the sample; whole samples, also for a CP rank): attention's
  // causal FLOPs are proportional to it (seq_len squared per sample without documents).
  double doc_len_sq = 0;
};

// L = seq_len, or the number of LoaderOptions::positions.
struct MicroBatch {
  std::vector<int32_t> inputs;   // [micro_batch * L]: sample tokens t[:-1] (at the positions)
  std::vector<int32_t> targets;  // [micro_batch * L]: sample tokens t[1:] (at the positions)
  // With LoaderOptions::doc_starts: [micro_batch * L], for each input token the position in its
  // sample where its document begins (0, or just after an end-of-document token); else empty.
  std::vector<int32_t> doc_start;
  // With LoaderOptions::reset_positions: [micro_batch * L], each input token's position in its
  // document (RoPE's position); else empty.
  std::vector<int32_t> positions;
  DocumentStats docs;
};

// The documents of one sample's `n` input tokens, in order: f(begin, end) for each [begin, end);
// a document begins at 0 and after each `eod`, and ends with it (or at n). The one scan behind
// document_starts and the loader's document fields.
template <class F>
void for_each_document(const int32_t* inputs, int64_t n, int32_t eod, F&& f) {
  int64_t begin = 0;
  for (int64_t end = 0; end < n; ++end) {
    if (inputs[end] != eod && end + 1 < n) continue;
    f(begin, end + 1);
    begin = end + 1;
  }
}

// doc_start of one sample's `n` input tokens: each token's document's first position.
void document_starts(const int32_t* inputs, int64_t n, int32_t eod, int32_t* doc_start);

struct StepBatch {
  int64_t consumed_before = 0;            // consumed samples at the start of this step
  std::vector<int64_t> sample_ids;        // [global_batch / dp_size]: global sample indices
  std::vector<MicroBatch> micro_batches;  // [global_batch / dp_size / micro_batch]
};

// The options' sources opened and blended into their sample space (the options checked first).
absl::StatusOr<SampleSpace> open_sample_space(const LoaderOptions& options);

// Builds rank `dp_rank`'s share of the step starting at `consumed` (no thread; used by the
// loader and by evaluation).
absl::StatusOr<StepBatch> make_step_batch(const SampleSpace& space, const LoaderOptions& options,
                                          int64_t consumed);

class DataLoader {
 public:
  // Opens and validates every source, builds the sample space and starts the prefetch thread
  // at options.consumed_samples.
  static absl::StatusOr<std::unique_ptr<DataLoader>> create(const LoaderOptions& options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next step's micro-batches for this rank; blocks until prefetched. An error (e.g. a
  // bad token found while reading) is returned here and again on every later call.
  absl::StatusOr<StepBatch> next();
  // Samples consumed by the steps handed out so far: save it; pass it back to resume.
  int64_t consumed_samples() const;
  // Drops prefetched steps and restarts at `consumed`. Evaluation: a loader over the
  // validation paths with shuffle = false; reset(0) before each evaluation, then eval_steps
  // calls of next() read the same validation samples in file order every time.
  void reset(int64_t consumed);

  const SampleSpace& space() const { return space_; }
  const LoaderOptions& options() const { return options_; }

 private:
  DataLoader(LoaderOptions options, SampleSpace space);
  void start(int64_t consumed);
  void stop();
  void produce();

  LoaderOptions options_;
  SampleSpace space_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<absl::StatusOr<StepBatch>> queue_;  // prepared steps, oldest first
  int64_t consumed_ = 0;                         // handed out to the caller
  int64_t next_produce_ = 0;                     // start of the next step the thread prepares
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tr::data
