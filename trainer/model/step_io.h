// A step's inputs and outputs on the device, owned by the step rather than the model: the token
// ids and targets of its micro-batches, and the step's scalars (the loss sum, this rank's squared
// gradient norm and a mixture of experts' router sums), which the step reads back together in its
// one host sync.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/ctx.h"
#include "core/tensor.h"
#include "trainer/model/model.h"

namespace tr {

class StepIO {
 public:
  explicit StepIO(Ctx ctx);
  // Bytes a step of `micro_batches` micro-batches of `tokens` tokens holds on `device` (the
  // staged ids and targets, `doc_arrays` more arrays per micro-batch for its documents, and the
  // scalars); the planner counts them.
  static size_t device_bytes(int64_t micro_batches, int64_t tokens, Device device,
                             int doc_arrays = 0);

  // The micro-batches' token ids and targets (`tokens` = batch * seq_len each) to where the ops
  // read them. On the CPU they are the host arrays themselves (which must outlive their use); on
  // a device they are copied into pinned host memory and uploaded with one asynchronous copy. The
  // previous upload from that memory has run by then: the last step's take() waited for the
  // stream, which holds every earlier copy.
  // `doc_starts` and `positions` (MicroBatchDocs' two arrays, one per micro-batch) may be empty;
  // the document starts stay readable on the host (DocStarts::host) until the next stage().
  void stage(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets,
             int64_t tokens, const std::vector<const int32_t*>& doc_starts = {},
             const std::vector<const int32_t*>& positions = {});
  Tensor inputs(size_t micro_batch) const { return inputs_.at(micro_batch); }    // i32 [tokens]
  Tensor targets(size_t micro_batch) const { return targets_.at(micro_batch); }  // i32 [tokens]
  // Its staged document arrays (each empty when none was staged).
  MicroBatchDocs docs(size_t micro_batch) const {
    MicroBatchDocs d;
    if (!doc_starts_.empty()) {
      d.doc_start = DocStarts{doc_starts_.at(micro_batch), doc_hosts_.at(micro_batch)};
    }
    if (!positions_.empty()) d.positions = positions_.at(micro_batch);
    return d;
  }

  // f64 [1] each on the device: the sum of the per-token losses the last stage has computed
  // since the last reset (DecoderModel::stage_loss adds to it), and this rank's share of the
  // squared gradient norm (DistributedOptimizer::accumulate_norm).
  // moe_sums: f64 [2], a mixture of experts' (DecoderModel::stage_loss): the load-balancing
  // loss's share of the loss sum, and the sum of its micro-batches' expert imbalance.
  Tensor loss_sum() const { return scalars_.slice(0, 1); }
  Tensor norm_squares() const { return scalars_.slice(1, 1); }
  Tensor moe_sums() const { return scalars_.slice(2, 2); }
  struct Scalars {
    double loss_sum = 0, norm_squares = 0, moe_aux_sum = 0, moe_imbalance_sum = 0;
  };
  void reset();    // all 0 (queued on the stream)
  Scalars take();  // all read (one host sync), then reset

 private:
  Ctx ctx_;
  Buffer scalars_buf_;
  Tensor scalars_;     // f64 [4]: loss_sum, norm_squares, moe_sums
  Buffer host_, dev_;  // the staged arrays: pinned on the host, and on the device
  std::vector<Tensor> inputs_, targets_, doc_starts_, positions_;
  std::vector<const int32_t*> doc_hosts_;  // each doc_starts_ array on the host
};

// One micro-batch through a whole (single-stage) model: forward, loss and backward, gradients
// ACCUMULATED into the model's buffer scaled by grad_scale; returns the sum of the per-token
// losses (a host sync). `doc_start` and `positions`: MicroBatchDocs' arrays, or null. For tests
// and tools, without sequence parallelism; the trainer's step runs the pipeline.
double forward_backward(DecoderModel& model, const int32_t* tokens, const int32_t* targets,
                        float grad_scale, const int32_t* doc_start = nullptr,
                        const int32_t* positions = nullptr);

}  // namespace tr
