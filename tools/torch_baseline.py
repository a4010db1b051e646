#!/usr/bin/env python3
"""PyTorch baseline for the trainer's benchmark (tools/bench.sh): the same model shapes, sequence
length, micro-batch and global batch, trained with Hugging Face `transformers`'
Qwen2ForCausalLM (SDPA attention), torch.compile, bf16 and fused AdamW, on synthetic tokens.

  tools/torch_baseline.py [--preset qwen2.5-1.5b | --config configs/tiny.yaml] [--seq-len 4096]
                          [--trainer build/trainer/trainer]
                          [--micro-batch 1] [--global-batch 8] [--steps 20] [--warmup 3]
                          [--precision autocast|bf16] [--no-compile] [--device cuda|cpu]
                          [--peak-tflops T] [--json-out FILE] [--describe]

No network is needed: the model is built from a Qwen2Config with the shapes the trainer resolves
from configs/<preset>.yaml or --config (`trainer plan --json`, so presets and defaults have one
home, trainer/config/config.cpp) and random weights (normal, std
model.init_std = 0.02), and the tokens are uniform random ids (seeded). Each step runs
global/micro micro-batches (gradient accumulation), clips the global gradient norm to 1.0 and
takes a fused AdamW step (lr 3e-4, betas 0.9/0.95, weight decay 0.1 on matrices only, as ours).

Precision:
  autocast (default)  fp32 parameters, gradients and Adam states; forward under
                      torch.autocast(bfloat16). The usual PyTorch mixed precision.
  bf16                bf16 parameters (the compute copy) + fp32 master weights: each
                      micro-batch's bf16 gradients are added into fp32 gradients, AdamW updates
                      the fp32 master and the result is copied into the bf16 parameters (the
                      trainer's own scheme).

Timing: each step is bracketed by device synchronisation; the first --warmup steps (compilation,
allocator warm-up) are left out and the rest summarised by their median, as tools/bench.sh does.
MFU = flops_per_token x tokens/s / peak with OUR counting (docs/PERFORMANCE.md):
flops_per_token = 6 N_matmul + 6 L s (nh hd), N_matmul = parameters of every matrix product, LM
head included, input embedding excluded; peak = dense bf16 peak of the device (the trainer's GPU
table, core/hardware.cpp, read through `trainer plan --json`) or --peak-tflops.

Attention: transformers' "sdpa" path, with the causal mask tensor dropped so that SDPA runs
is_causal=True (its flash kernel) under torch.compile as it does in eager mode: see causal_sdpa()
(--hf-sdpa-mask keeps transformers' own behaviour). Before timing, one short eager forward checks
the SDPA call (mask, is_causal, GQA); after timing, on cuda, one more step runs under
torch.profiler and its top kernels and the attention kernels that ran are printed (--no-profile).

--describe prints the resolved shapes, N_matmul and FLOPs per token as JSON and exits (no torch
needed). --overfit trains every step on the first batch: the loss must fall (on the random
tokens of a benchmark it stays near ln(vocab)).
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from tool_io import ArgumentParser  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODEL_KEYS = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
              "head_dim", "vocab_size", "max_seq_len", "rope_theta", "rms_norm_eps",
              "tie_embeddings", "init_std")


def die(msg, code=2):
    print(f"torch_baseline.py: {msg}", file=sys.stderr)
    sys.exit(code)


def trainer_plan(args):
    """The trainer's own resolution of the config or preset: `trainer plan --json` gives the
    model section (presets and defaults applied) and the GPU table, so that neither is copied
    here. The layout is set to one rank: only the model matters."""
    if args.config:
        cfg, name = args.config, os.path.splitext(os.path.basename(args.config))[0]
    else:
        cfg, name = os.path.join(ROOT, "configs", f"{args.preset}.yaml"), args.preset
        if not os.path.exists(cfg):
            known = sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, "configs"))
                           if f.startswith("qwen2.5-") and f.endswith(".yaml"))
            die(f"unknown --preset '{args.preset}' (known: {', '.join(known)})")
    if not os.access(args.trainer, os.X_OK):
        die(f"--trainer {args.trainer}: not an executable; build the trainer first "
            f"(cmake --build build) or pass --trainer PATH")
    one_rank = ["parallel.tp=1", "parallel.pp=1", "parallel.dp=1", "parallel.pipeline_layers=[]",
                "parallel.sequence_parallel=false", "train.recompute=none",
                "train.recompute_layers=[]", "train.global_batch=1", "train.micro_batch=1",
                f"data.seq_len={args.seq_len}"]
    cmd = [args.trainer, "plan", "--config", cfg, "--nodes", "1", "--gpus-per-node", "1", "--json"]
    for kv in one_rank:
        cmd += ["--set", kv]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        die(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip() or out.stdout.strip()}")
    plan = json.loads(out.stdout)
    return name, plan["model"], plan["hardware"], f"model resolved by {args.trainer} plan --json"


def peak_of(device_name, hardware):
    """The dense bf16 peak of the GPU table row whose key the device name contains (the longest
    such key, as the trainer matches), or 0."""
    rows = [r for r in hardware if r["device_key"] in device_name]
    return max(rows, key=lambda r: len(r["device_key"]))["peak_bf16_flops"] if rows else 0.0


def flops(m, seq_len):
    """N_matmul and the causal FLOPs per token, our counting (docs/PERFORMANCE.md)."""
    H, I, L = m["hidden_size"], m["intermediate_size"], m["num_layers"]
    q, kv = m["num_heads"] * m["head_dim"], m["num_kv_heads"] * m["head_dim"]
    per_layer = H * q + 2 * H * kv + q * H + 3 * H * I  # q, k, v, o; gate, up, down
    n_matmul = L * per_layer + m["vocab_size"] * H       # + LM head (tied or not)
    attn = 6 * L * seq_len * q
    return n_matmul, 6 * n_matmul + attn, 6 * n_matmul + 2 * attn


# ---------------------------------------------------------------------------------------------

def main():
    ap = ArgumentParser(prog="torch_baseline.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--preset", default="qwen2.5-0.5b", help="configs/PRESET.yaml, e.g. qwen2.5-1.5b")
    src.add_argument("--config", help="a trainer YAML config (its model section is used)")
    ap.add_argument("--trainer", default=os.path.join(ROOT, "build", "trainer", "trainer"),
                    help="the trainer binary: it resolves the model and has the GPU table")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20, help="all steps, warm-up included")
    ap.add_argument("--warmup", type=int, default=3, help="leading steps left out of the medians")
    ap.add_argument("--precision", choices=("autocast", "bf16"), default="autocast")
    ap.add_argument("--no-compile", action="store_true", help="eager mode (no torch.compile)")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode (default: torch's default; e.g. max-autotune-no-cudagraphs)")
    ap.add_argument("--compile-backend", default=None,
                    help="torch.compile backend (default inductor; eager/aot_eager for debugging)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--peak-tflops", type=float, default=0.0,
                    help="dense bf16 peak for MFU when the device is not in the table")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--overfit", action="store_true",
                    help="every step trains on the first step's batch (a check that the loss falls)")
    ap.add_argument("--no-profile", action="store_true",
                    help="skip the profiled extra step (on by default on cuda)")
    ap.add_argument("--profile", action="store_true", help="profile one extra step on the CPU too")
    ap.add_argument("--hf-sdpa-mask", action="store_true",
                    help="leave transformers' sdpa function as it is (see causal_sdpa)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--json-out", help="write the results as JSON here")
    ap.add_argument("--describe", action="store_true",
                    help="print shapes, N_matmul and FLOPs per token as JSON and exit")
    args = ap.parse_args()

    if args.steps <= args.warmup:
        die(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    if args.micro_batch < 1 or args.global_batch % args.micro_batch:
        die(f"--micro-batch {args.micro_batch} must divide --global-batch {args.global_batch}")
    name, m, hardware, note = trainer_plan(args)
    if m["max_seq_len"] and args.seq_len > m["max_seq_len"]:
        die(f"--seq-len {args.seq_len} exceeds model.max_seq_len {m['max_seq_len']}")
    n_matmul, fpt, fpt_full = flops(m, args.seq_len)
    if args.describe:
        print(json.dumps(dict(name=name, model=m, seq_len=args.seq_len, n_matmul=n_matmul,
                              flops_per_token_causal=fpt, flops_per_token_full=fpt_full),
                         indent=1))
        return 0
    print(f"config: {note}")
    print(f"model: {name}: " + ", ".join(f"{k}={m[k]}" for k in MODEL_KEYS))
    print(f"flops: N_matmul = {n_matmul} ({n_matmul / 1e9:.4f}B); flops_per_token = 6 N_matmul + "
          f"6 L s nh hd = {fpt:.6e} (causal, seq_len {args.seq_len}); {fpt_full:.6e} counting full "
          f"attention")
    sys.stdout.flush()
    return train(args, name, m, n_matmul, fpt, hardware)


def build_model(torch, m, device, precision):
    import transformers
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(
        vocab_size=m["vocab_size"], hidden_size=m["hidden_size"],
        intermediate_size=m["intermediate_size"], num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_heads"], num_key_value_heads=m["num_kv_heads"],
        head_dim=m["head_dim"], hidden_act="silu",
        max_position_embeddings=m["max_seq_len"] or 32768, initializer_range=m["init_std"],
        rms_norm_eps=m["rms_norm_eps"], tie_word_embeddings=m["tie_embeddings"],
        rope_theta=m["rope_theta"], use_cache=False, use_sliding_window=False,
        attention_dropout=0.0, attn_implementation="sdpa")
    cfg.head_dim = m["head_dim"]
    cfg._attn_implementation = "sdpa"
    # transformers >= 5 keeps theta in rope_parameters, older ones in rope_theta.
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = m["rope_theta"]
    else:
        cfg.rope_theta = m["rope_theta"]
    torch.manual_seed(1234)
    with torch.device(device):  # initialise on the device: seconds instead of minutes on the CPU
        model = Qwen2ForCausalLM(cfg)
    model.config.use_cache = False
    if precision == "bf16":  # parameters only: buffers (RoPE's inv_freq) stay fp32
        with torch.no_grad():
            for p in model.parameters():
                p.data = p.data.to(torch.bfloat16)
    model.train()

    # The model must have exactly our shapes: check every parameter, the tie and RoPE's theta.
    H, I, L = m["hidden_size"], m["intermediate_size"], m["num_layers"]
    q, kv, V = m["num_heads"] * m["head_dim"], m["num_kv_heads"] * m["head_dim"], m["vocab_size"]
    want = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not m["tie_embeddings"]:
        want["lm_head.weight"] = (V, H)
    for l in range(L):
        p = f"model.layers.{l}."
        want.update({p + "self_attn.q_proj.weight": (q, H), p + "self_attn.q_proj.bias": (q,),
                     p + "self_attn.k_proj.weight": (kv, H), p + "self_attn.k_proj.bias": (kv,),
                     p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.v_proj.bias": (kv,),
                     p + "self_attn.o_proj.weight": (H, q), p + "mlp.gate_proj.weight": (I, H),
                     p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I),
                     p + "input_layernorm.weight": (H,),
                     p + "post_attention_layernorm.weight": (H,)})
    have = {n: tuple(t.shape) for n, t in model.named_parameters()}
    if have != want:
        diff = sorted(set(have.items()) ^ set(want.items()))[:6]
        die(f"the transformers model's parameters differ from our shapes: {diff}", 1)
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    if tied != m["tie_embeddings"]:
        die(f"lm_head tied = {tied}, the preset says {m['tie_embeddings']}", 1)
    inv_freq = getattr(getattr(model.model, "rotary_emb", None), "inv_freq", None)
    if inv_freq is not None:
        hd = m["head_dim"]
        expect = m["rope_theta"] ** (-2.0 / hd)  # inv_freq[1]
        if not math.isclose(float(inv_freq[1]), expect, rel_tol=1e-4):
            die(f"RoPE inv_freq[1] = {float(inv_freq[1])}, theta {m['rope_theta']} gives {expect}", 1)
    n_matmul = sum(t.numel() for n, t in model.named_parameters() if t.dim() == 2)
    if not m["tie_embeddings"]:
        n_matmul -= V * H  # the input embedding is not a matrix product
    return model, cfg, n_matmul, transformers.__version__


def causal_sdpa():
    """Makes transformers' "sdpa" attention call F.scaled_dot_product_attention(is_causal=True)
    without a mask tensor, also under torch.compile.

    Our batches have no padding, and transformers itself drops the causal mask for them and sets
    is_causal=True (so that SDPA can pick its flash kernel) -- but only in eager mode. Under
    torch.compile (masking_utils._ignore_causal_mask_sdpa), transformers 5.17 -- the GPU
    machine's -- builds the [s, s] mask, repeats K/V for GQA and calls
    scaled_dot_product_attention(attn_mask=mask, is_causal=False), seen in the compiled graph
    (TORCH_LOGS=graph_code); 5.23 skips the mask only with torch >= 2.14. A mask rules out the
    flash kernel. Registering this wrapper as "sdpa" (the documented AttentionInterface.register)
    gives the compiled model the call the eager one makes; the unused mask is dead code the
    compiler removes. --hf-sdpa-mask leaves transformers alone."""
    try:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError:
        return "transformers' sdpa unchanged (no transformers.integrations.sdpa_attention)"

    def sdpa_no_mask(module, query, key, value, attention_mask, *args, **kwargs):
        return sdpa_attention_forward(module, query, key, value, None, *args, **kwargs)

    try:
        from transformers import AttentionInterface
        AttentionInterface.register("sdpa", sdpa_no_mask)
    except ImportError:  # transformers < 4.50: a plain dict
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa_no_mask
    return "transformers' sdpa_attention_forward with the mask dropped (is_causal=True)"


def check_sdpa(torch, model, device, amp, vocab):
    """One short eager forward with F.scaled_dot_product_attention watched: causal, no mask?"""
    F = torch.nn.functional
    real, seen = F.scaled_dot_product_attention, []

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *a, **kw):
        seen.append((attn_mask is None, bool(is_causal), kw.get("enable_gqa", False), q.dtype,
                     tuple(q.shape), tuple(k.shape)))
        return real(q, k, v, attn_mask, dropout_p, is_causal, *a, **kw)

    F.scaled_dot_product_attention = spy
    try:
        with torch.no_grad(), amp():
            model(input_ids=torch.randint(0, vocab, (1, 16), device=device))
    finally:
        F.scaled_dot_product_attention = real
    if not seen:
        return "sdpa NOT called (check attn_implementation)"
    no_mask, causal, gqa, dt, qs, ks = seen[0]
    return (f"F.scaled_dot_product_attention x{len(seen)} per forward: attn_mask="
            f"{'None' if no_mask else 'TENSOR (no flash kernel!)'}, is_causal={causal}, "
            f"enable_gqa={gqa}, q {qs} k {ks}, called with {str(dt).replace('torch.', '')} "
            f"(CUDA autocast runs it in bf16)")


def train(args, name, m, n_matmul, fpt, hardware):
    import contextlib
    import torch

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        die("--device cuda but torch.cuda.is_available() is False", 1)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(args.seed)

    sdpa_note = ("transformers' sdpa_attention_forward unchanged" if args.hf_sdpa_mask
                 else causal_sdpa())
    t0 = time.perf_counter()
    model, cfg, n_model, tf_version = build_model(torch, m, dev, args.precision)
    if n_model != n_matmul:
        die(f"N_matmul from the model's parameters ({n_model}) != from the shapes ({n_matmul})", 1)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"versions: torch {torch.__version__}, transformers {tf_version}, python "
          f"{sys.version.split()[0]}" + (f", CUDA {torch.version.cuda}, cuDNN "
                                          f"{torch.backends.cudnn.version()}" if cuda else ""))
    devname = torch.cuda.get_device_name(dev) if cuda else _cpu_name()
    print(f"device: {devname}")
    print(f"model built in {time.perf_counter() - t0:.1f}s: {n_params} parameters "
          f"(N_matmul {n_model} from the model's matrices, equal to the shapes'), "
          f"precision {args.precision}, {'eager' if args.no_compile else 'torch.compile'}")

    if args.precision == "autocast":
        amp = lambda: torch.autocast(device_type=dev.type, dtype=torch.bfloat16)  # noqa: E731
    else:
        amp = contextlib.nullcontext
    print(f"attention: {sdpa_note}; {check_sdpa(torch, model, dev, amp, m['vocab_size'])}")

    class LossModel(torch.nn.Module):
        """Forward + causal LM loss (mean over tokens), so that compile sees the loss too."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, y):
            with amp():
                logits = self.inner(input_ids=x).logits
            return torch.nn.functional.cross_entropy(
                logits.float().view(-1, logits.size(-1)), y.reshape(-1))

    step_fn = LossModel(model)
    if not args.no_compile:
        kw = {"mode": args.compile_mode} if args.compile_mode else {}
        if args.compile_backend:
            kw["backend"] = args.compile_backend
        step_fn = torch.compile(step_fn, **kw)

    params = [p for p in model.parameters()]  # shared (tied) tensors once
    if args.precision == "bf16":  # fp32 master weights and gradients beside the bf16 model
        master = [p.detach().float().clone() for p in params]
        for mp in master:
            mp.grad = torch.zeros_like(mp)
        opt_params = master
    else:
        opt_params = params
    decay = [p for p in opt_params if p.dim() >= 2]  # no weight decay on norms and biases (ours)
    no_decay = [p for p in opt_params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=cuda)

    accum = args.global_batch // args.micro_batch
    gen = torch.Generator().manual_seed(args.seed)
    data = torch.randint(0, m["vocab_size"], (args.steps, accum, args.micro_batch, args.seq_len + 1),
                         generator=gen, dtype=torch.int64)
    if cuda:
        data = data.pin_memory()
    tokens_per_step = args.global_batch * args.seq_len

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)

    def one_step(batch):
        """accum micro-batches, clipping, AdamW; returns (loss sum, grad norm, optimizer time)."""
        loss_sum = torch.zeros((), device=dev)
        for i in range(accum):
            sample = data[batch, i].to(dev, non_blocking=True)
            loss = step_fn(sample[:, :-1], sample[:, 1:])
            (loss / accum).backward()
            loss_sum += loss.detach()
            if args.precision == "bf16":
                mg = [mp.grad for mp in master]
                torch._foreach_add_(mg, [p.grad for p in params])  # bf16 into fp32
                for p in params:
                    p.grad = None
        if cuda:
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
        t_opt = time.perf_counter()
        gnorm = torch.nn.utils.clip_grad_norm_(opt_params, 1.0)
        opt.step()
        if args.precision == "bf16":
            with torch.no_grad():
                torch._foreach_copy_(params, master)  # fp32 master -> bf16 compute copy
            for mp in master:
                mp.grad.zero_()
        else:
            opt.zero_grad(set_to_none=True)
        if cuda:
            ev1.record()
        sync()
        optim_s = ev0.elapsed_time(ev1) / 1e3 if cuda else time.perf_counter() - t_opt
        return loss_sum, gnorm, optim_s

    results, device_used = [], 0.0
    print(f"training: {args.steps} steps of {accum} micro-batches of {args.micro_batch} x "
          f"{args.seq_len} tokens ({tokens_per_step} tokens per step), first {args.warmup} "
          f"not timed" + ("; step 1 includes compilation" if not args.no_compile else ""))
    sys.stdout.flush()
    for step in range(args.steps):
        sync()
        t_start = time.perf_counter()
        loss_sum, gnorm, optim_s = one_step(0 if args.overfit else step)  # ends synchronised
        dt = time.perf_counter() - t_start
        if cuda:
            free, total = torch.cuda.mem_get_info(dev)
            device_used = max(device_used, (total - free) / 2**20)
        r = dict(step=step + 1, loss=float(loss_sum) / accum, grad_norm=float(gnorm),
                 step_time_s=dt, optimizer_s=optim_s, tokens_per_s=tokens_per_step / dt)
        results.append(r)
        print(f"step {r['step']}/{args.steps} | loss {r['loss']:.4f} | grad-norm {r['grad_norm']:.3f}"
              f" | tok/s {r['tokens_per_s']:.0f} | step {dt:.3f}s | optim {optim_s:.3f}s")
        sys.stdout.flush()
        if not math.isfinite(r["loss"]):
            die(f"non-finite loss at step {r['step']}", 1)

    kernels = None
    if args.profile or (cuda and not args.no_profile):  # one more step, not timed: its kernels
        kernels = profile_step(torch, cuda, lambda: one_step(args.steps - 1))

    timed = results[args.warmup:]
    med = lambda k: statistics.median(r[k] for r in timed)  # noqa: E731
    tps = med("tokens_per_s")
    peak = args.peak_tflops * 1e12
    if not peak and cuda:
        peak = peak_of(devname, hardware)
    mfu = fpt * tps / peak if peak else None
    if cuda and not peak:
        print(f"MFU: '{devname}' is not in the peak table: give --peak-tflops (dense bf16)")
    if cuda:
        alloc = torch.cuda.max_memory_allocated(dev) / 2**20
        reserved = torch.cuda.max_memory_reserved(dev) / 2**20
    else:
        import resource
        alloc = reserved = None
        device_used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # host peak
    graph_breaks = None
    if not args.no_compile:
        try:
            from torch._dynamo.utils import counters
            graph_breaks = sum(counters["graph_break"].values())
        except Exception:  # noqa: BLE001 — diagnostics only
            pass

    backend = f"torch {dev.type} x1 {args.precision}{'' if args.no_compile else '+compile'}"
    fmt = lambda v: "n/a" if v is None else f"{v:.0f}"  # noqa: E731
    print()
    print("| model | backend | seq | micro | global | tokens/s | tokens/s/GPU | MFU | step s | "
          "optim s | peak alloc MiB | peak reserved MiB | device MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {name} | {backend} | {args.seq_len} | {args.micro_batch} | {args.global_batch} | "
          f"{tps:.0f} | {tps:.0f} | {'n/a' if mfu is None else f'{100 * mfu:.1f}%'} | "
          f"{med('step_time_s'):.3f} | {med('optimizer_s'):.3f} | {fmt(alloc)} | {fmt(reserved)} | "
          f"{device_used:.0f}{'' if cuda else ' (host)'} |")
    print(f"({len(timed)} timed steps after {args.warmup} warm-up; loss {results[0]['loss']:.3f} -> "
          f"{results[-1]['loss']:.3f}; ln(vocab) = {math.log(m['vocab_size']):.3f}; step 1 took "
          f"{results[0]['step_time_s']:.1f}s"
          + ("" if graph_breaks is None else f"; {graph_breaks} graph breaks") + ")")
    if args.json_out:
        out = dict(name=name, backend=backend, device=devname, device_type=dev.type,
                   torch=torch.__version__, transformers=tf_version,
                   cuda=torch.version.cuda if cuda else None, seq_len=args.seq_len,
                   micro_batch=args.micro_batch, global_batch=args.global_batch, steps=args.steps,
                   warmup=args.warmup, precision=args.precision, compile=not args.no_compile,
                   compile_mode=args.compile_mode, model=m, n_params=n_params,
                   n_matmul=n_matmul, flops_per_token=fpt, peak_flops=peak or None,
                   tokens_per_s=tps, tokens_per_s_per_gpu=tps, step_time_s=med("step_time_s"),
                   optimizer_s=med("optimizer_s"), mfu=mfu, peak_alloc_mib=alloc,
                   peak_reserved_mib=reserved, device_mem_mib=device_used,
                   device_mem_is_host=not cuda, first_step_s=results[0]["step_time_s"],
                   loss_first=results[0]["loss"], loss_last=results[-1]["loss"],
                   graph_breaks=graph_breaks, sdpa=sdpa_note, profile=kernels, steps_log=results)
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def profile_step(torch, cuda, fn):
    """Runs fn under torch.profiler; prints the kernels (or ops) taking most device time and
    which attention kernels ran. Diagnostics only: a failure is reported, not fatal."""
    try:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            fn()
        from torch.autograd import DeviceType
        rows = []
        for e in prof.key_averages():
            if cuda:  # device-side events only (a CPU op's self device time repeats its kernels')
                if e.device_type == DeviceType.CPU:
                    continue
                t = (e.self_device_time_total if hasattr(e, "self_device_time_total")
                     else e.self_cuda_time_total)
            else:
                t = e.self_cpu_time_total
            if t > 0:
                rows.append((t, e.count, e.key))
        rows.sort(reverse=True)
        total = sum(r[0] for r in rows) or 1
        print(f"profile of one step ({'GPU kernels' if cuda else 'CPU ops'}, self time; "
              f"total {total / 1e3:.1f} ms):")
        for t, n, k in rows[:15]:
            print(f"  {100 * t / total:5.1f}% {t / 1e3:9.2f} ms {n:6d}x  {k[:110]}")
        att = sorted({k for _, _, k in rows if re.search(
            r"flash|fmha|attention|attn|sdpa|cutlassF|cutlassB|mem_eff", k, re.I)})
        kinds = sorted({"flash" if re.search("flash", k, re.I) else
                        "cudnn" if re.search("cudnn|sdpa_|cask", k, re.I) else
                        "mem-efficient" if re.search("fmha|cutlass|mem_eff|efficient", k, re.I)
                        else "other" for k in att})
        print(f"attention kernels: {', '.join(kinds) or 'none found'}"
              + "".join(f"\n  {k[:140]}" for k in att[:6]))
        return dict(total_ms=total / 1e3, attention=kinds,
                    top=[dict(ms=t / 1e3, count=n, name=k[:200]) for t, n, k in rows[:25]])
    except Exception as e:  # noqa: BLE001
        print(f"profile: failed ({type(e).__name__}: {e})")
        return None


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


if __name__ == "__main__":
    sys.exit(main())
