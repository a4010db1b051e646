#!/usr/bin/env python3
"""Writes the Hugging Face parity fixtures used by tests/model/test_model.cpp.

A tiny Qwen2ForCausalLM, or LlamaForCausalLM (GQA, vocabulary not a multiple of 128, random
weights in every tensor, biases and norms included) is run in float64 by `transformers`; the fixture holds its
weights, the input tokens and targets, the logits, the mean cross-entropy over the shifted
labels and the gradient of that loss for every parameter. Names follow the trainer's
checkpoint names: the Hugging Face name without "model.", with '/' for '.'.

A tiny Qwen3MoeForCausalLM (make_moe: layers 0 and 2 sparse, 8 experts, top 2; layer 1 a dense
SwiGLU MLP) is written the same way, with these differences. Its router runs entirely in float64:
transformers computes the router softmax in float32 even for a float64 model, the fixture's
router patches that softmax to float64 (the rest keeps transformers' float32 steps, as the
other fixtures do: inside RMSNorm, the attention softmax, the rotary tables). Its loss is the
mean cross-entropy plus router_aux_loss_coef times transformers' load-balancing loss
(load_balancing_loss_func, all sparse layers' router logits pooled, no attention mask), computed
here in float64 (transformers accumulates it in float32); the fixture also holds ce_loss and
aux_loss apart, and each sparse layer's chosen experts and their weights (router/<layer>/experts,
router/<layer>/weights).
Expert weights are written per expert, as Hugging Face checkpoints store them on disk
(layers/<i>/mlp/experts/<e>/{gate,up,down}_proj/weight), split from transformers' stacked
experts.gate_up_proj [E, 2I, H] (gate the first I rows) and experts.down_proj [E, H, I].

    pip install torch transformers h5py
    python3 tools/make_hf_fixture.py tests/fixtures        # every fixture
    python3 tools/make_hf_fixture.py tests/fixtures moe    # the Qwen3-MoE fixtures only
"""
import sys

import h5py
import numpy as np
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


# The tiny Qwen3-MoE: SHAPE with 3 layers, layer 1 dense (intermediate_size), layers 0 and 2
# sparse (8 experts of moe_intermediate_size, top 2).
MOE = dict(num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
           decoder_sparse_step=1, mlp_only_layers=[1], router_aux_loss_coef=0.02)


def _router_forward_fp64(self, hidden_states):
    """Qwen3MoeTopKRouter.forward with its softmax in the model's dtype (float64) where
    transformers computes it in float32: z = x W^T, p = softmax(z), the top k of p, divided by
    their sum when norm_topk_prob."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = torch.nn.functional.linear(hidden_states, self.weight)  # [tokens, E]
    assert router_logits.dtype == torch.float64
    router_probs = torch.softmax(router_logits, dim=-1)
    top_value, top_index = torch.topk(router_probs, self.top_k, dim=-1)  # [tokens, k]
    if self.norm_topk_prob:
        top_value = top_value / top_value.sum(dim=-1, keepdim=True)
    return router_logits, top_value, top_index


def load_balancing_fp64(router_logits, num_experts, top_k):
    """transformers' load_balancing_loss_func (no attention mask), in float64: over the L sparse
    layers' logits z_l [T, E] pooled (L*T rows), p = softmax(z), f_e = (1/LT) * #{(l, t, j):
    topk_j(p_lt) = e}, P_e = (1/LT) * sum_{l,t} p_lte, aux = E * sum_e f_e P_e. The counts carry
    no gradient."""
    counts = torch.zeros(num_experts, dtype=torch.float64)
    prob_sum = torch.zeros(num_experts, dtype=torch.float64)
    rows = 0
    for z in router_logits:
        p = torch.softmax(z, dim=-1)
        chosen = torch.topk(p, top_k, dim=-1).indices
        counts = counts + torch.bincount(chosen.reshape(-1), minlength=num_experts).double()
        prob_sum = prob_sum + p.sum(dim=0)
        rows += z.shape[0]
    return num_experts * torch.sum((counts / rows) * (prob_sum / rows))


def per_expert(hf_name, t):
    """(our name, tensor) pairs for a parameter or its gradient: the stacked experts of a sparse
    layer, gate_up_proj [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up: the forward chunks gate, up)
    and down_proj [E, H, I], become the per-expert nn.Linear weights of a checkpoint on disk."""
    for stacked in ("gate_up_proj", "down_proj"):
        if hf_name.endswith(f"mlp.experts.{stacked}"):
            base = our_name(hf_name.removesuffix(stacked))  # layers/<i>/mlp/experts/
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                if stacked == "down_proj":
                    yield f"{base}{e}/down_proj/weight", t[e]
                else:
                    yield f"{base}{e}/gate_proj/weight", t[e, :inter]
                    yield f"{base}{e}/up_proj/weight", t[e, inter:]
            return
    yield our_name(hf_name), t


def moe_reference(x, prefix, params, top_k, norm_topk_prob):
    """A sparse layer's MoE block, token by token in plain float64 torch, from the per-expert
    tensors of the fixture (params: our name -> tensor; prefix: layers/<i>/mlp)."""
    probs = torch.softmax(x @ params[f"{prefix}/gate/weight"].T, dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    rows = []
    for t in range(x.shape[0]):
        row = torch.zeros_like(x[t])
        for j in range(top_k):
            e = f"{prefix}/experts/{int(experts[t, j])}"
            gate = params[f"{e}/gate_proj/weight"] @ x[t]
            up = params[f"{e}/up_proj/weight"] @ x[t]
            row = row + weights[t, j] * (params[f"{e}/down_proj/weight"] @ (gate * torch.sigmoid(gate) * up))
        rows.append(row)
    return torch.stack(rows)


def make_moe(path, tied, seed, norm_topk_prob):
    """A tiny Qwen3MoeForCausalLM (see the module docstring) in float64: eager attention, the
    eager (per-expert loop) experts implementation, the router softmax patched to float64."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import (Qwen3MoeSparseMoeBlock,
                                                                  load_balancing_loss_func)
    torch.manual_seed(seed)
    shape = dict(SHAPE, num_hidden_layers=MOE["num_hidden_layers"])
    head_dim = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    num_experts, top_k = MOE["num_experts"], MOE["num_experts_per_tok"]
    cfg = Qwen3MoeConfig(**dict(shape, **MOE), tie_word_embeddings=tied, rope_theta=ROPE_THETA,
                         head_dim=head_dim, norm_topk_prob=norm_topk_prob,
                         output_router_logits=True, attention_dropout=0.0,
                         attention_bias=False, use_sliding_window=False)
    if getattr(cfg, "rope_parameters", None) is not None:
        cfg.rope_parameters["rope_theta"] = ROPE_THETA
    model = Qwen3MoeForCausalLM._from_config(cfg, attn_implementation="eager",
                                             experts_implementation="eager",
                                             dtype=torch.float64)
    model = model.double().eval()
    assert model.config._experts_implementation == "eager"
    sparse = [i for i, layer in enumerate(model.model.layers)
              if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock)]
    assert sparse == [0, 2], sparse
    for i in sparse:
        router = model.model.layers[i].mlp.gate
        router.forward = _router_forward_fp64.__get__(router)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    tokens = torch.randint(0, SHAPE["vocab_size"], (BATCH, SEQ + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    # Each sparse layer's MoE input and output, and its router's choice.
    seen = {}
    hooks = []
    for i in sparse:
        mlp = model.model.layers[i].mlp
        hooks.append(mlp.register_forward_hook(
            lambda m, a, o, i=i: seen.__setitem__(("mlp", i), (a[0].detach(), o.detach()))))
        hooks.append(mlp.gate.register_forward_hook(
            lambda m, a, o, i=i: seen.__setitem__(("router", i), tuple(v.detach() for v in o))))
    out = model(input_ids=inputs)
    for h in hooks:
        h.remove()
    logits = out.logits  # [B, S, V]
    assert len(out.router_logits) == len(sparse)
    for z, i in zip(out.router_logits, sparse):
        assert z.dtype == torch.float64 and torch.equal(z.detach(), seen[("router", i)][0])
        probs = torch.sort(torch.softmax(z.detach(), dim=-1), dim=-1, descending=True).values
        gap = (probs[:, top_k - 1] - probs[:, top_k]).min().item()
        assert gap > 1e-6, f"layer {i}: a top-{top_k} near-tie ({gap:.3g}); change the seed"
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, SHAPE["vocab_size"]), targets.reshape(-1))
    aux = load_balancing_fp64(out.router_logits, num_experts, top_k)
    hf_aux = load_balancing_loss_func(out.router_logits, num_experts, top_k)  # float32 sums
    assert abs(hf_aux.item() - aux.item()) <= 1e-6 * aux.item(), (hf_aux.item(), aux.item())
    assert abs(out.aux_loss.item() - aux.item()) <= 1e-6 * aux.item()
    loss = ce + MOE["router_aux_loss_coef"] * aux
    loss.backward()

    hf_params = dict(model.named_parameters())
    params = {n: t for name, p in hf_params.items() for n, t in per_expert(name, p.detach())}
    grads = {n: t for name, p in hf_params.items() for n, t in per_expert(name, p.grad)}
    # An independent check of the per-expert split: each sparse block, recomputed from the
    # fixture's per-expert tensors in plain torch, against transformers' module, on the
    # model's own input to it and on a random one; and the gradients of the random input's
    # product with a random cotangent, split the same way, against the plain recomputation's.
    for i in sparse:
        prefix = f"layers/{i}/mlp"
        block = model.model.layers[i].mlp
        x, y = seen[("mlp", i)]
        want = moe_reference(x.reshape(-1, SHAPE["hidden_size"]), prefix, params, top_k,
                             norm_topk_prob)
        assert (want - y.reshape(want.shape)).abs().max().item() < 1e-12
        gen = torch.Generator().manual_seed(100 + i)
        xr = torch.randn(BATCH, SEQ, SHAPE["hidden_size"], dtype=torch.float64, generator=gen)
        cot = torch.randn(BATCH * SEQ, SHAPE["hidden_size"], dtype=torch.float64, generator=gen)
        names = [f"{prefix}.experts.gate_up_proj", f"{prefix}.experts.down_proj", f"{prefix}.gate.weight"]
        names = ["model." + n.replace("/", ".") for n in names]
        yr = block(xr).reshape(-1, SHAPE["hidden_size"])
        got = torch.autograd.grad((yr * cot).sum(), [hf_params[n] for n in names])
        got = {k: v for n, g in zip(names, got) for k, v in per_expert(n, g)}
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()
                  if k.startswith(prefix + "/")}
        yw = moe_reference(xr.reshape(-1, SHAPE["hidden_size"]), prefix, leaves, top_k, norm_topk_prob)
        assert (yw - yr).abs().max().item() < 1e-12
        want_g = dict(zip(leaves, torch.autograd.grad((yw * cot).sum(), list(leaves.values()),
                                                      allow_unused=True)))
        assert set(got) == set(want_g)
        for k, g in got.items():
            w = want_g[k] if want_g[k] is not None else torch.zeros_like(g)
            assert (g - w).abs().max().item() < 1e-12, k
    with h5py.File(path, "w") as f:
        for k, v in shape.items():
            f.attrs[k] = v
        f.attrs["head_dim"] = head_dim
        f.attrs["rope_theta"] = ROPE_THETA
        f.attrs["model_type"] = "qwen3_moe"
        f.attrs["tie_word_embeddings"] = int(tied)
        for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "decoder_sparse_step"):
            f.attrs[k] = int(MOE[k])
        f.attrs["mlp_only_layers"] = np.asarray(MOE["mlp_only_layers"], dtype="int32")
        f.attrs["router_aux_loss_coef"] = float(MOE["router_aux_loss_coef"])
        f.attrs["norm_topk_prob"] = int(norm_topk_prob)
        f.attrs["batch"], f.attrs["seq_len"] = BATCH, SEQ
        f.attrs["transformers_version"] = __import__("transformers").__version__
        f["tokens"] = inputs.numpy().astype("int32")
        f["targets"] = targets.numpy().astype("int32")
        f["logits"] = logits.detach().reshape(-1, SHAPE["vocab_size"]).numpy()
        f["loss"] = loss.item()
        f["ce_loss"] = ce.item()
        f["aux_loss"] = aux.item()
        for i in sparse:
            _, weights, chosen = seen[("router", i)]
            f[f"router/{i}/experts"] = chosen.numpy().astype("int32")
            f[f"router/{i}/weights"] = weights.numpy()
        for name, t in params.items():
            f[f"params/{name}"] = t.contiguous().numpy()
            f[f"grads/{name}"] = grads[name].contiguous().numpy()
    print(f"{path}: loss {loss.item():.6f} (ce {ce.item():.6f}, aux {aux.item():.6f}), tied={tied}, "
          f"norm_topk_prob={norm_topk_prob}")

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    only = sys.argv[2] if len(sys.argv) > 2 else "all"
    if only not in ("all", "moe"):
        sys.exit(f"usage: {sys.argv[0]} [OUT_DIR] [all|moe]")
    if only == "moe":
        make_moe(f"{out}/qwen3_moe_tiny.h5", False, 9, norm_topk_prob=True)
        make_moe(f"{out}/qwen3_moe_tiny_tied.h5", True, 10, norm_topk_prob=False)
        sys.exit(0)
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
    # A tiny Qwen3-MoE (layers 0 and 2 sparse, layer 1 dense), untied with renormalised top-k
    # weights, tied without.
    make_moe(f"{out}/qwen3_moe_tiny.h5", False, 9, norm_topk_prob=True)
    make_moe(f"{out}/qwen3_moe_tiny_tied.h5", True, 10, norm_topk_prob=False)
