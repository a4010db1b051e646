#include "data/loader.h"

#include <algorithm>
#include <exception>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tr::data {

absl::Status validate_loader_options(const LoaderOptions& o) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (o.paths.empty()) return bad("data: no data paths given");
  if (o.seq_len < 1) return bad("data: seq_len is ", o.seq_len, "; it must be >= 1");
  if (o.dp_size < 1) return bad("data: dp_size is ", o.dp_size, "; it must be >= 1");
  if (o.dp_rank < 0 || o.dp_rank >= o.dp_size)
    return bad("data: dp_rank ", o.dp_rank, " is outside [0, dp_size = ", o.dp_size, ")");
  if (o.global_batch < 1) return bad("data: global_batch is ", o.global_batch, "; must be >= 1");
  if (o.micro_batch < 1) return bad("data: micro_batch is ", o.micro_batch, "; must be >= 1");
  if (o.global_batch % o.dp_size != 0)
    return bad("data: global_batch ", o.global_batch, " is not divisible by dp_size ", o.dp_size,
               "; make it a multiple of ", o.dp_size);
  const int64_t per_rank = o.global_batch / o.dp_size;
  if (per_rank % o.micro_batch != 0)
    return bad("data: global_batch / dp_size = ", per_rank, " is not divisible by micro_batch ",
               o.micro_batch, "; global_batch must be a multiple of micro_batch * dp_size = ",
               o.micro_batch * o.dp_size);
  if (o.consumed_samples < 0)
    return bad("data: consumed_samples is ", o.consumed_samples, "; it must be >= 0");
  for (int64_t p : o.positions)
    if (p < 0 || p >= o.seq_len)
      return bad("data: position ", p, " is outside a sample of seq_len ", o.seq_len);
  if (o.prefetch_steps < 1)
    return bad("data: prefetch_steps is ", o.prefetch_steps, "; it must be >= 1");
  if ((o.doc_starts || o.reset_positions || o.mask_after_eod) && o.eod_id < 0)
    return bad(
        "data: document starts, reset positions or a masked loss need an end-of-document "
        "id; eod_id is ",
        o.eod_id);
  return absl::OkStatus();
}

void document_starts(const int32_t* inputs, int64_t n, int32_t eod, int32_t* doc_start) {
  for_each_document(inputs, n, eod, [&](int64_t begin, int64_t end) {
    std::fill(doc_start + begin, doc_start + end, static_cast<int32_t>(begin));
  });
}

namespace {

// One sample's document fields at row `row` of its micro-batch, from the sample's inputs
// `sample` (seq of them); `keep`: the positions this rank holds (empty: all of them, in order);
// `starts`: room for the whole sample's document starts. Documents are few, so the work is a
// scan for end-of-document tokens and a fill of each document's range.
void fill_documents(const LoaderOptions& o, const int32_t* sample, int64_t seq,
                    const std::vector<int64_t>& keep, int64_t row, int32_t* starts, MicroBatch& m) {
  const int64_t L = keep.empty() ? seq : static_cast<int64_t>(keep.size());
  int64_t masked = 0;
  for_each_document(sample, seq, o.eod_id, [&](int64_t begin, int64_t end) {
    const auto n = static_cast<double>(end - begin);
    m.docs.doc_len_sq += n * n;
    if (!keep.empty()) {
      std::fill(starts + begin, starts + end, static_cast<int32_t>(begin));
      return;
    }
    if (o.doc_starts)
      std::fill(m.doc_start.begin() + row + begin, m.doc_start.begin() + row + end,
                static_cast<int32_t>(begin));
    if (o.reset_positions)
      std::iota(m.positions.begin() + row + begin, m.positions.begin() + row + end, 0);
    if (o.mask_after_eod && sample[end - 1] == o.eod_id) {
      m.targets[row + end - 1] = kIgnoredTarget;
      ++masked;
    }
  });
  if (!keep.empty()) {  // a context-parallel rank's positions of the whole sample's documents
    for (int64_t i = 0; i < L; ++i) {
      const int64_t at = keep[i];
      if (o.doc_starts) m.doc_start[row + i] = starts[at];
      if (o.reset_positions) m.positions[row + i] = static_cast<int32_t>(at - starts[at]);
      if (o.mask_after_eod && sample[at] == o.eod_id) {
        m.targets[row + i] = kIgnoredTarget;
        ++masked;
      }
    }
  }
  m.docs.loss_targets += L - masked;
}

}  // namespace

absl::StatusOr<StepBatch> make_step_batch(const SampleSpace& space, const LoaderOptions& options,
                                          int64_t consumed) {
  const int64_t per_rank = options.global_batch / options.dp_size;
  const int64_t seq = options.seq_len;
  const int64_t mb = options.micro_batch;
  const std::vector<int64_t>& keep = options.positions;
  const int64_t L = keep.empty() ? seq : static_cast<int64_t>(keep.size());
  const bool documents = options.eod_id >= 0;
  StepBatch step;
  step.consumed_before = consumed;
  step.sample_ids.resize(per_rank);
  step.micro_batches.resize(per_rank / mb);
  std::vector<int32_t> sample(seq + 1);
  std::vector<int32_t> starts(documents && !keep.empty() ? seq : 0);  // the whole sample's
  for (int64_t j = 0; j < per_rank; ++j) {
    const int64_t k = consumed + options.dp_rank * per_rank + j;
    step.sample_ids[j] = k;
    if (auto st = space.read(k, sample, options.vocab_size); !st.ok()) return st;
    MicroBatch& m = step.micro_batches[j / mb];
    if (m.inputs.empty()) {
      m.inputs.resize(mb * L);
      m.targets.resize(mb * L);
      if (options.doc_starts) m.doc_start.resize(mb * L);
      if (options.reset_positions) m.positions.resize(mb * L);
    }
    const int64_t row = (j % mb) * L;
    for (int64_t i = 0; i < L; ++i) {
      const int64_t at = keep.empty() ? i : keep[i];
      m.inputs[row + i] = sample[at];
      m.targets[row + i] = sample[at + 1];
    }
    if (!documents) {
      m.docs.loss_targets += L;
      m.docs.doc_len_sq += static_cast<double>(seq) * static_cast<double>(seq);
      continue;
    }
    fill_documents(options, sample.data(), seq, keep, row, starts.data(), m);
  }
  return step;
}

absl::StatusOr<SampleSpace> open_sample_space(const LoaderOptions& options) {
  if (auto st = validate_loader_options(options); !st.ok()) return st;
  std::vector<WeightedSource> sources;
  for (const DataPath& p : options.paths) {
    auto src = TokenSource::open(p.path, options.format);
    if (!src.ok()) return src.status();
    sources.push_back({std::move(*src), p.weight});
  }
  return SampleSpace::create(std::move(sources), options.seq_len, options.seed, options.shuffle);
}

absl::StatusOr<std::unique_ptr<DataLoader>> DataLoader::create(const LoaderOptions& options) {
  absl::StatusOr<SampleSpace> space = open_sample_space(options);
  if (!space.ok()) return space.status();
  std::unique_ptr<DataLoader> loader(new DataLoader(options, std::move(*space)));
  loader->start(options.consumed_samples);
  return loader;
}

DataLoader::DataLoader(LoaderOptions options, SampleSpace space)
    : options_(std::move(options)), space_(std::move(space)) {}

DataLoader::~DataLoader() {
  stop();
}

void DataLoader::start(int64_t consumed) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
    consumed_ = consumed;
    next_produce_ = consumed;
    stopping_ = false;
  }
  thread_ = std::thread([this] { produce(); });
}

void DataLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DataLoader::reset(int64_t consumed) {
  stop();
  start(consumed);
}

void DataLoader::produce() {
  const size_t depth = static_cast<size_t>(options_.prefetch_steps);
  while (true) {
    int64_t at;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || queue_.size() < depth; });
      if (stopping_) return;
      at = next_produce_;
    }
    absl::StatusOr<StepBatch> step;
    try {
      step = make_step_batch(space_, options_, at);
    } catch (const std::exception& e) {
      step = absl::InternalError(absl::StrCat("data loader thread failed: ", e.what()));
    }
    const bool ok = step.ok();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      queue_.push_back(std::move(step));
      next_produce_ = at + options_.global_batch;
    }
    cv_.notify_all();
    if (!ok) return;  // the error stays at the back of the queue for next() to report
  }
}

absl::StatusOr<StepBatch> DataLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty(); });
  if (!queue_.front().ok()) return queue_.front().status();
  absl::StatusOr<StepBatch> step = std::move(queue_.front());
  queue_.pop_front();
  consumed_ += options_.global_batch;
  lock.unlock();
  cv_.notify_all();
  return step;
}

int64_t DataLoader::consumed_samples() const {
  std::lock_guard<std::mutex> lock(mu_);
  return consumed_;
}

}  // namespace tr::data
