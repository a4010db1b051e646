// DecoderModel's activation buffers, shared by its set-up (model.cpp) and its forward and
// backward (model_compute.cpp). Internal to trainer/.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "trainer/model/model.h"

namespace tr {

// Activations kept for backward (one Slot per micro-batch in flight), and scratch shared by
// all micro-batches. T = batch * seq_len.
struct DecoderModel::Acts {
  struct Layer {
    Tensor ln1;          // [T, H] input_layernorm output (all-gathered)
    Tensor rstd1;        // [Tl]
    AttentionActs attn;  // the attention block's (trainer/model/attention_block.h)
    Tensor x_mid;        // [Tl, H] residual after attention
    Tensor ln2;          // [T, H]
    Tensor rstd2;        // [Tl]
    MlpActs mlp;         // a dense layer's MLP block's (trainer/model/mlp_block.h)
    MoeActs moe;         // a sparse layer's (trainer/model/moe_block.h)
  };
  // [T, ...] buffers hold the whole micro-batch; [Tl, ...] ones this rank's tokens (Tl = T, or
  // T / tp with sequence parallelism).
  struct Slot {
    std::vector<Layer> layers;
    std::vector<Tensor> resid;  // L + 1 of [Tl, H]: resid[l] enters layer l
    Tensor lnf, rstdf;          // [T, H], [Tl] (last stage)
    MicroBatchDocs docs;        // its micro-batch's (forward_stage)
    // The load-balancing loss (stage_side_input): the router statistics [2, E] entering the
    // chunk and leaving it; on the last chunk of the last stage the loss's gradient per expert
    // [E] (stage_loss), which its backward uses and sends upstream.
    Tensor moe_in, moe_out, aux_grad;
  };
  std::vector<Slot> slots;
  Layer& layer(int slot, int64_t pos) { return slots[slot].layers[pos]; }  // pos: in its chunk
  // Activation recomputation: the buffers of the layers' recomputed activations, shared by all
  // layers and slots (every buffer for fully recomputed layers; ln1, ln2 and the MLP block's
  // act for selective recomputation). A slot's Layer views them instead of owning them.
  Layer rc;
  Tensor tmp;  // [T, H] projection outputs
  // backward scratch
  Tensor dres;       // [T, H] running gradient of the residual stream; after backward_stage, the
                     // stage input's gradient (sent to the previous stage)
  Tensor grad_in;    // [T, H] the next stage's gradient, received; swapped into dres
  Tensor dln, dlnf;  // [T, H]
  Tensor logits;     // [C, Vl] one loss chunk; overwritten by its gradient
  Tensor losses;     // [C]
  Tensor row_max, sums;     // [C], [C, 2] vocab-parallel cross-entropy statistics
  Tensor stats, all_stats;  // [C, 3], [tp * C * 3]: this rank's and every TP rank's
  // Sequence parallelism: the residual stream, norms and their gradients hold Tl = T / tp
  // tokens per rank; these are the full-sequence buffers around the TP regions.
  Tensor full;        // [T, H] all-gathered or not yet reduce-scattered
  Tensor ln_local;    // [Tl, H] norm output before its all-gather
  Tensor dlnf_local;  // [Tl, H]
  // Context parallelism (cp > 1): the positions in the sequence of this rank's S = seq_len / cp
  // tokens of each sequence (i32 [S], for RoPE).
  Tensor positions;
  // The load-balancing loss's gradient per expert [E], received from the next stage and sent to
  // the previous one; the micro-batch's loss value and expert imbalance [2] (statistics' dtype).
  Tensor aux_grad_in, aux_grad_out, aux_value;
};

}  // namespace tr
