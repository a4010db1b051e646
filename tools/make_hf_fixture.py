#!/usr/bin/env python3
"""Writes the Hugging Face parity fixtures used by tests/model/test_model.cpp.

A tiny Qwen2ForCausalLM, or LlamaForCausalLM (GQA, vocabulary not a multiple of 128, random
weights in every tensor, biases and norms included) is run in float64 by `transformers`; the fixture holds its
weights, the input tokens and targets, the logits, the mean cross-entropy over the shifted
labels and the gradient of that loss for every parameter. Names follow the trainer's
checkpoint names: the Hugging Face name without "model.", with '/' for '.'.

    pip install torch transformers h5py
    python3 tools/make_hf_fixture.py tests/fixtures
"""
import sys

import h5py
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

SHAPE = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-6)
ROPE_THETA = 10000.0
BATCH, SEQ = 2, 12


def our_name(hf_name):
    return hf_name.removeprefix("model.").replace(".", "/")


def make(path, tied, seed, yarn=None, llama3=None, arch="qwen2"):
    """yarn: None, or (factor, original_max_position_embeddings) for YaRN rope scaling;
    llama3: None, or (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
    for Llama 3's; arch: qwen2 (Qwen2ForCausalLM), llama (LlamaForCausalLM, no biases) or qwen3
    (Qwen3ForCausalLM: no biases, RMSNorm over each q and k head)."""
    torch.manual_seed(seed)
    if arch == "llama":
        cfg = LlamaConfig(**SHAPE, tie_word_embeddings=tied, rope_theta=ROPE_THETA,
                          attention_dropout=0.0, attention_bias=False, mlp_bias=False)
    elif arch == "qwen3":
        cfg = Qwen3Config(**SHAPE, tie_word_embeddings=tied, rope_theta=ROPE_THETA,
                          head_dim=SHAPE["hidden_size"] // SHAPE["num_attention_heads"],
                          attention_dropout=0.0, attention_bias=False, use_sliding_window=False)
    else:
        cfg = Qwen2Config(**SHAPE, tie_word_embeddings=tied, rope_theta=ROPE_THETA,
                          attention_dropout=0.0, use_sliding_window=False)
    scaling = {}
    if yarn:
        scaling = dict(rope_type="yarn", factor=yarn[0], original_max_position_embeddings=yarn[1])
    if llama3:
        scaling = dict(rope_type="llama3", factor=llama3[0], low_freq_factor=llama3[1],
                       high_freq_factor=llama3[2], original_max_position_embeddings=llama3[3])
    # transformers 5 keeps theta (and the scaling) in rope_parameters; set both spellings.
    if getattr(cfg, "rope_parameters", None) is not None:
        cfg.rope_parameters["rope_theta"] = ROPE_THETA
        cfg.rope_parameters.update(scaling)
    elif scaling:
        cfg.rope_scaling = dict(scaling, type=scaling["rope_type"])
    kind = {"llama": LlamaForCausalLM, "qwen3": Qwen3ForCausalLM}.get(arch, Qwen2ForCausalLM)
    model = kind._from_config(cfg, attn_implementation="eager", torch_dtype=torch.float64)
    model = model.double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    tokens = torch.randint(0, SHAPE["vocab_size"], (BATCH, SEQ + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(input_ids=inputs).logits  # [B, S, V]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, SHAPE["vocab_size"]), targets.reshape(-1))
    loss.backward()
    with h5py.File(path, "w") as f:
        for k, v in SHAPE.items():
            f.attrs[k] = v
        f.attrs["head_dim"] = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
        f.attrs["rope_theta"] = ROPE_THETA
        f.attrs["model_type"] = arch
        if yarn:
            f.attrs["yarn_factor"] = float(yarn[0])
            f.attrs["yarn_original_max_position_embeddings"] = int(yarn[1])
        if llama3:
            for i, k in enumerate(("llama3_factor", "llama3_low_freq_factor",
                                   "llama3_high_freq_factor")):
                f.attrs[k] = float(llama3[i])
            f.attrs["llama3_original_max_position_embeddings"] = int(llama3[3])
        f.attrs["tie_word_embeddings"] = int(tied)
        f.attrs["batch"], f.attrs["seq_len"] = BATCH, SEQ
        f.attrs["transformers_version"] = __import__("transformers").__version__
        f["tokens"] = inputs.numpy().astype("int32")
        f["targets"] = targets.numpy().astype("int32")
        f["logits"] = logits.detach().reshape(-1, SHAPE["vocab_size"]).numpy()
        f["loss"] = loss.item()
        for name, p in model.named_parameters():
            f[f"params/{our_name(name)}"] = p.detach().numpy()
            f[f"grads/{our_name(name)}"] = p.grad.numpy()
    print(f"{path}: loss {loss.item():.6f}, tied={tied}")


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    make(f"{out}/qwen2_tiny_tied.h5", True, 1)
    make(f"{out}/qwen2_tiny_untied.h5", False, 2)
    # YaRN over a trained context of 16: the ramp keeps pair 0 and slows pairs 1-3 fourfold.
    make(f"{out}/qwen2_tiny_yarn.h5", False, 3, yarn=(4.0, 16))
    # Llama 3's rule over a trained context of 251 positions (40 turns of pair 0): pair 0 keeps
    # its frequency (>= 16 turns), pair 1 (4 turns) blends, pairs 2 and 3 (< 1 turn) turn 8 times
    # slower.
    make(f"{out}/qwen2_tiny_llama3_rope.h5", False, 4, llama3=(8.0, 1.0, 16.0, 251))
    # A tiny Llama 3 (no q, k, v biases; Llama 3's RoPE rule as above), tied and untied.
    make(f"{out}/llama_tiny_tied.h5", True, 5, llama3=(8.0, 1.0, 16.0, 251), arch="llama")
    make(f"{out}/llama_tiny_untied.h5", False, 6, llama3=(8.0, 1.0, 16.0, 251), arch="llama")
    # A tiny Qwen3 (no biases, QK-norm with random weights), tied and untied.
    make(f"{out}/qwen3_tiny_tied.h5", True, 7, arch="qwen3")
    make(f"{out}/qwen3_tiny_untied.h5", False, 8, arch="qwen3")
