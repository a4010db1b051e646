#!/usr/bin/env python3
"""The trainer against Hugging Face `transformers` (the oracle, from PyPI into a virtual
environment kept under --venv; without PyPI the test reports skipped, exit 77, never passed).

  --part import   Random Qwen2ForCausalLM models saved by `save_pretrained` (tied fp32 in one
                  file, untied fp32 in shards with an index, tied bf16; vocabulary 300, which
                  the trainer pads) start a run with model.init_from, on 1 rank and on
                  tp2 x pp2 (4 MPI ranks): the first step's loss equals transformers' loss on
                  the same batch to 1e-5; with packed documents (block-causal attention,
                  positions restarting, the loss masked after each end-of-document token)
                  transformers' loss of the documents run one by one.
  --part export   trainer export-hf of a checkpoint loads with from_pretrained, and its loss on
                  the data equals the trainer's loss at the next step to 1e-5 (fp32; bf16 to
                  2e-2); importing transformers' file and exporting it again after a step at
                  lr 0 gives the same model.safetensors, byte for byte.
  --part walkthrough
                  Runs the ```bash blocks of docs/hf.md in order in one directory, with the
                  trainer, prepare_data and the venv's python3 first on PATH (```sh blocks
                  are the reader's one-time set-up and are not run), and checks what the page
                  says they print.

  test_hf.py --part import|export|walkthrough --trainer BIN --prepare-data BIN
             --mpirun "mpirun ... -np" --venv DIR --work DIR
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap

import pypi

PINS = ["torch==2.15.0", "transformers==5.23.0", "safetensors==0.8.0"]
SHAPE = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-6)
THETA = 10000.0
SEQ, SAMPLES = 16, 4  # the data holds exactly one global batch: step k's loss covers all of it
# The trainer's model keys for the oracle's models of each family (llama: its LLAMA3 block).
FAMILY_MODEL = {
    "qwen2": "",
    "llama": (", family: llama, rope_scaling: {type: llama3, factor: 8.0, low_freq_factor: 1.0, "
              "high_freq_factor: 16.0, original_max_position_embeddings: 251}"),
    "qwen3": ", family: qwen3",
    "qwen3_moe": (", family: qwen3_moe, num_experts: 4, experts_per_token: 2, "
                  "moe_intermediate_size: 16, mlp_only_layers: [2], norm_topk_prob: true, "
                  "router_aux_loss_coef: 0.02")}
ARCHITECTURE = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "qwen3_moe": "Qwen3MoeForCausalLM"}


def venv_python(venv):
    """A venv with torch, transformers and safetensors."""
    return pypi.venv_python(venv, "import torch, transformers, safetensors", PINS, "test_hf",
                            "torch", "torch and transformers")


# The oracle runs inside the venv: this script is imported there with --oracle.
ORACLE = r'''
import json, sys
import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

# Llama 3's RoPE rule over a trained context of 251 positions (one pair kept, one blended, two
# slowed at head_dim 8): the llama requests' rope_parameters.
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=16.0,
              original_max_position_embeddings=251)
# The qwen3_moe requests' experts: layers 0, 1 and 3 sparse, layer 2 dense.
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, mlp_only_layers=[2],
           norm_topk_prob=True, router_aux_loss_coef=0.02, decoder_sparse_step=1)

def tokens(path):
    import struct
    with open(path, "rb") as f:
        head = struct.unpack("<256i", f.read(1024))
        return list(struct.unpack(f"<{head[2]}H", f.read(2 * head[2])))

def batch_loss(model, toks, seq, samples, micro=None):
    """The mean cross-entropy; for a mixture of experts plus router_aux_loss_coef times the
    load-balancing loss of each micro-batch of `micro` samples (the trainer's unit), averaged."""
    model = model.double().eval()
    t = torch.tensor(toks, dtype=torch.long)
    x = torch.stack([t[i * seq: i * seq + seq] for i in range(samples)])
    y = torch.stack([t[i * seq + 1: i * seq + seq + 1] for i in range(samples)])
    with torch.no_grad():
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1)).item()
        if model.config.model_type == "qwen3_moe":
            micro = micro or samples
            aux = [model(input_ids=x[i:i + micro], output_router_logits=True).aux_loss.item()
                   for i in range(0, samples, micro)]
            loss += model.config.router_aux_loss_coef * sum(aux) / len(aux)
    return loss

def make(out, shape, theta, tied, dtype, shard, seed, arch="qwen2"):
    torch.manual_seed(seed)
    if arch == "llama":  # no biases; Llama 3's RoPE rule
        cfg = LlamaConfig(**shape, tie_word_embeddings=tied, rope_theta=theta,
                          attention_dropout=0.0, attention_bias=False, mlp_bias=False)
        cfg.rope_parameters.update(LLAMA3)
    elif arch == "qwen3_moe":  # Qwen3's attention; experts in layers 0, 1 and 3
        cfg = Qwen3MoeConfig(**shape, **MOE, tie_word_embeddings=tied, rope_theta=theta,
                             head_dim=shape["hidden_size"] // shape["num_attention_heads"],
                             attention_dropout=0.0, attention_bias=False, use_sliding_window=False)
    elif arch == "qwen3":  # no biases; an RMSNorm over each q and k head
        cfg = Qwen3Config(**shape, tie_word_embeddings=tied, rope_theta=theta,
                          head_dim=shape["hidden_size"] // shape["num_attention_heads"],
                          attention_dropout=0.0, attention_bias=False, use_sliding_window=False)
    else:
        cfg = Qwen2Config(**shape, tie_word_embeddings=tied, rope_theta=theta,
                          attention_dropout=0.0, use_sliding_window=False)
    if getattr(cfg, "rope_parameters", None) is not None:
        cfg.rope_parameters["rope_theta"] = theta
    kind = {"llama": LlamaForCausalLM, "qwen3": Qwen3ForCausalLM,
            "qwen3_moe": Qwen3MoeForCausalLM}.get(arch, Qwen2ForCausalLM)
    model = kind(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    model = model.to(getattr(torch, dtype))
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(out, **kw)

def packed_loss(d, toks, seq, samples, eod):
    """Each sample's documents (each ends at its eod token) run alone, positions from 0; the
    mean cross-entropy over the targets whose input is not the eod token."""
    model = Qwen2ForCausalLM.from_pretrained(d, torch_dtype=torch.float32).double().eval()
    total, kept, docs = 0.0, 0, 0
    for i in range(samples):
        x, y = toks[i * seq: i * seq + seq], toks[i * seq + 1: i * seq + seq + 1]
        begin = 0
        for end in range(seq):
            if x[end] != eod and end + 1 < seq:
                continue
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([x[begin:end + 1]])).logits[0]
            losses = torch.nn.functional.cross_entropy(
                logits, torch.tensor(y[begin:end + 1]), reduction="none")
            keep = torch.tensor([t != eod for t in x[begin:end + 1]])
            total += losses[keep].sum().item()
            kept += int(keep.sum())
            docs += 1
            begin = end + 1
    return {"loss": total / kept, "documents": docs, "kept": kept}

def load(d):
    with open(d + "/config.json") as f:
        moe = json.load(f)["model_type"] == "qwen3_moe"
    # The experts one by one: the grouped kernel refuses float64.
    kw = {"experts_implementation": "eager"} if moe else {}
    return AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, **kw)

def load_loss(d, toks, seq, samples, micro=None):
    return batch_loss(load(d), toks, seq, samples, micro)

def answer(req):
    if req["op"] == "make":
        make(req["out"], req["shape"], req["theta"], req["tied"], req["dtype"], req["shard"],
             req["seed"], req.get("arch", "qwen2"))
        return {"loss": load_loss(req["out"], tokens(req["data"]), req["seq"], req["samples"])}
    if req["op"] == "packed":
        return packed_loss(req["dir"], tokens(req["data"]), req["seq"], req["samples"],
                           req["eod"])
    if req["op"] == "loss":
        return {"loss": load_loss(req["dir"], tokens(req["data"]), req["seq"], req["samples"],
                                  req.get("micro"))}
    raise SystemExit("unknown op " + req["op"])

# One request, or a list of them answered in one process (torch's import costs seconds).
req = json.loads(sys.argv[1])
print(json.dumps([answer(r) for r in req] if isinstance(req, list) else answer(req)))
'''


class Test:
    def __init__(self, args):
        self.args = args
        self.py = venv_python(args.venv)
        self.work = args.work
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.oracle = os.path.join(self.work, "oracle.py")
        with open(self.oracle, "w") as f:
            f.write(ORACLE)
        self.data = os.path.join(self.work, "tokens.bin")
        self.write_data()
        self.failures = []

    def write_data(self):
        """An llm.c shard of SAMPLES * SEQ + 1 pseudo-random ids below the vocabulary."""
        n = SAMPLES * SEQ + 1
        x, toks = 12345, []
        for _ in range(n):
            x = (1103515245 * x + 12345) % (1 << 31)
            toks.append((x >> 8) % SHAPE["vocab_size"])
        head = [20240520, 1, n] + [0] * 253
        with open(self.data, "wb") as f:
            f.write(struct.pack("<256i", *head))
            f.write(struct.pack(f"<{n}H", *toks))

    def ask(self, **req):
        return self.ask_all([req])[0]

    def ask_all(self, reqs):
        """Several requests answered by one oracle process, in order."""
        for req in reqs:
            req.update(data=self.data, seq=SEQ, samples=SAMPLES)
        out = subprocess.run([self.py, self.oracle, json.dumps(reqs)], capture_output=True,
                             text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
        if out.returncode:
            raise SystemExit(f"test_hf: the transformers oracle failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def config(self, name, init_from, tied, layout=(1, 1), steps=1, lr=1e-3, extra="",
               family="qwen2"):
        d = os.path.join(self.work, "run-" + name)
        os.makedirs(d, exist_ok=True)
        tp, pp = layout
        micro = 2 if tp * pp == 1 else 1
        text = textwrap.dedent(f"""\
            model: {{hidden_size: {SHAPE['hidden_size']}, intermediate_size: {SHAPE['intermediate_size']},
                    num_layers: {SHAPE['num_hidden_layers']}, num_heads: {SHAPE['num_attention_heads']},
                    num_kv_heads: {SHAPE['num_key_value_heads']}, head_dim: 8,
                    vocab_size: {SHAPE['vocab_size']}, max_seq_len: 64, rope_theta: {THETA},
                    rms_norm_eps: 1.0e-6, tie_embeddings: {'true' if tied else 'false'},
                    init_from: {init_from}{FAMILY_MODEL[family]}}}
            parallel: {{tp: {tp}, pp: {pp}}}
            data: {{train: [{{path: {self.data}}}], seq_len: {SEQ}}}
            train: {{steps: {steps}, global_batch: {SAMPLES}, micro_batch: {micro}, backend: cpu}}
            optim: {{lr: {lr}, min_lr: {lr}, warmup_steps: 0, schedule: constant, grad_clip: 0}}
            checkpoint: {{dir: {d}/ckpt, interval: 1}}
            log: {{dir: {d}/log}}
            """) + extra
        path = os.path.join(d, "config.yaml")
        with open(path, "w") as f:
            f.write(text)
        return d, path

    def train(self, name, init_from, tied, layout=(1, 1), steps=1, lr=1e-3, sets=(),
              family="qwen2"):
        d, cfg = self.config(name, init_from, tied, layout, steps, lr, family=family)
        ranks = layout[0] * layout[1]
        cmd = [self.args.trainer, "--config", cfg] + [a for kv in sets for a in ("--set", kv)]
        if ranks > 1:
            cmd = self.args.mpirun.split() + [str(ranks)] + cmd
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   OMPI_MCA_mpi_yield_when_idle="1")
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode:
            raise SystemExit(f"test_hf: trainer {name} exited {out.returncode}:\n"
                             f"{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        if "initialised from " + init_from not in out.stdout:
            self.failures.append(f"{name}: no 'initialised from' line:\n{out.stdout[-1500:]}")
        losses = []
        with open(os.path.join(d, "log", "metrics.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                if "loss" in rec and rec.get("step") is not None and "eval" not in rec.get("kind", ""):
                    losses.append(rec["loss"])
        return d, losses

    def export(self, ckpt, out, dtype):
        r = subprocess.run([self.args.trainer, "export-hf", "--checkpoint", ckpt, "--out", out,
                            "--dtype", dtype], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"test_hf: export-hf exited {r.returncode}: {r.stderr}")
        return r

    def expect_close(self, what, got, want, tol):
        ok = abs(got - want) <= tol
        print(f"{'ok  ' if ok else 'FAIL'} {what}: trainer {got:.8f} transformers {want:.8f} "
              f"(|diff| {abs(got - want):.2e}, tolerance {tol:g})")
        if not ok:
            self.failures.append(what)

    def expect(self, what, cond, detail=""):
        print(f"{'ok  ' if cond else 'FAIL'} {what}")
        if not cond:
            self.failures.append(f"{what} {detail}")


def part_import(t):
    models = [("tied-fp32", True, "float32", None),
              ("untied-fp32-sharded", False, "float32", "60KB"),
              ("tied-bf16", True, "bfloat16", None)]
    made = t.ask_all([dict(op="make", out=os.path.join(t.work, name), shape=SHAPE, theta=THETA,
                           tied=tied, dtype=dtype, shard=shard, seed=i + 1)
                      for i, (name, tied, dtype, shard) in enumerate(models)])
    for i, (name, tied, dtype, shard) in enumerate(models):
        d, ref = os.path.join(t.work, name), made[i]["loss"]
        if shard:
            t.expect(f"{name}: transformers wrote shards with an index",
                     os.path.exists(os.path.join(d, "model.safetensors.index.json")))
        for layout in [(1, 1), (2, 2)]:
            _, losses = t.train(f"{name}-tp{layout[0]}pp{layout[1]}", d, tied, layout)
            t.expect_close(f"{name} under tp{layout[0]} pp{layout[1]}: first-step loss",
                           losses[0], ref, 1e-5)
        if i == 0:
            part_import_packed(t, d, tied)


def part_import_packed(t, d, tied):
    """Packed documents (block-causal attention, positions restarting per document, the loss
    masked after each end-of-document token): the trainer's first-step loss equals transformers'
    loss of the documents run one by one. The end-of-document id is the data's most frequent
    input token, so that the samples hold several documents."""
    with open(t.data, "rb") as f:
        f.seek(1024)
        toks = list(struct.unpack(f"<{SAMPLES * SEQ}H", f.read(2 * SAMPLES * SEQ)))
    eod = max(set(toks), key=lambda v: (toks.count(v), -v))
    want = t.ask(op="packed", dir=d, eod=eod)
    t.expect(f"the samples hold several documents ({want['documents']} in {SAMPLES} samples, "
             f"{want['kept']} targets kept)", want["documents"] > SAMPLES + 1)
    _, losses = t.train("packed", d, tied, sets=(
        "data.document_mask=block_causal", "data.reset_position_ids=true",
        "data.eod_mask_loss=true", f"data.eod_id={eod}"))
    t.expect_close("packed documents: first-step loss against the documents run alone",
                   losses[0], want["loss"], 1e-5)


def part_export(t):
    # A step of training on imported weights, then export: transformers' loss of the export
    # equals the trainer's loss at step 2 (the weights after step 1, on the same samples).
    # The oracle's models in one process, and its losses of the exports in another.
    models = [("untied", False, 7), ("tied", True, 7), ("roundtrip", True, 9)]
    t.ask_all([dict(op="make", out=os.path.join(t.work, name + "-src"), shape=SHAPE, theta=THETA,
                    tied=tied, dtype="float32", shard=None, seed=seed)
               for name, tied, seed in models])
    checks = []
    for name, tied, _ in models[:2]:
        src = os.path.join(t.work, name + "-src")
        run, losses = t.train("export-" + name, src, tied, steps=2)
        ckpt = os.path.join(run, "ckpt", "step_00000001")
        for dtype, tol in [("fp32", 1e-5), ("bf16", 2e-2)]:
            out = os.path.join(t.work, f"exported-{name}-{dtype}")
            t.export(ckpt, out, dtype)
            checks.append((f"{name} exported as {dtype}: loss of from_pretrained vs trainer's "
                           "step 2", losses[1], out, tol))
    got = t.ask_all([dict(op="loss", dir=out) for _, _, out, _ in checks])
    for (what, want, _, tol), g in zip(checks, got):
        t.expect_close(what, want, g["loss"], tol)
    # Round trip: transformers' file -> init_from -> a step at lr 0 -> export: the same bytes.
    src = os.path.join(t.work, "roundtrip-src")
    run, _ = t.train("roundtrip", src, True, steps=1, lr=0.0)
    out = os.path.join(t.work, "roundtrip-out")
    t.export(os.path.join(run, "ckpt", "step_00000001"), out, "fp32")
    with open(os.path.join(src, "model.safetensors"), "rb") as a, \
            open(os.path.join(out, "model.safetensors"), "rb") as b:
        same = a.read() == b.read()
    t.expect("round trip: import -> export gives transformers' model.safetensors byte for byte",
             same)
    with open(os.path.join(src, "config.json")) as a, open(os.path.join(out, "config.json")) as b:
        x, y = json.load(a), json.load(b)
    keys = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "rms_norm_eps", "tie_word_embeddings",
            "model_type"]
    diff = [k for k in keys if x.get(k) != y.get(k)]
    t.expect("round trip: config.json has transformers' shape fields", not diff, str(diff))
    # Exporting into a directory that holds files is refused and touches nothing.
    r = subprocess.run([t.args.trainer, "export-hf", "--checkpoint",
                        os.path.join(run, "ckpt", "step_00000001"), "--out", out],
                       capture_output=True, text=True)
    t.expect("export-hf into a non-empty directory: exit 2, one error line, files kept",
             r.returncode == 2 and r.stderr.count("error:") == 1 and
             os.path.exists(os.path.join(out, "model.safetensors")), r.stderr)


def part_families(t):
    """Llama 3 (model.family llama), Qwen3 (qwen3) and Qwen3-MoE (qwen3_moe): transformers'
    LlamaForCausalLM, Qwen3ForCausalLM and Qwen3MoeForCausalLM imported under one rank and tp 2 x
    pp 2 give their first-step losses (Qwen3-MoE's with its load-balancing loss, per micro-batch
    as the trainer weighs it); after a step, each export loads in transformers (its architecture
    and model_type) with the trainer's step-2 loss."""
    families = ["llama", "qwen3", "qwen3_moe"]
    refs = t.ask_all([dict(op="make", out=os.path.join(t.work, f + "-src"), shape=SHAPE,
                           theta=THETA, tied=False, dtype="float32", shard=None, seed=11 + i,
                           arch=f) for i, f in enumerate(families)])
    outs = []
    for f, ref in zip(families, refs):
        src = os.path.join(t.work, f + "-src")
        # The load-balancing loss is a micro-batch's: on one rank the whole batch is one
        # micro-batch (which samples share one depends on the epoch's shuffle otherwise), under
        # tp 2 x pp 2 each sample is one (Test.config's micro_batch 1).
        one = ("train.micro_batch=4",) if f == "qwen3_moe" else ()
        for layout in [(1, 1), (2, 2)]:
            _, losses = t.train(f"{f}-tp{layout[0]}pp{layout[1]}", src, False, layout,
                                sets=one if layout == (1, 1) else (), family=f)
            want = ref["loss"] if f != "qwen3_moe" else t.ask(
                op="loss", dir=src, micro=SAMPLES if layout == (1, 1) else 1)["loss"]
            t.expect_close(f"{f} under tp{layout[0]} pp{layout[1]}: first-step loss", losses[0],
                           want, 1e-5)
        run, losses = t.train(f + "-export", src, False, steps=2, sets=one, family=f)
        out = os.path.join(t.work, f + "-exported")
        t.export(os.path.join(run, "ckpt", "step_00000001"), out, "fp32")
        with open(os.path.join(out, "config.json")) as fh:
            cfg = json.load(fh)
        t.expect(f"{f} export: config.json is {ARCHITECTURE[f]}",
                 cfg.get("architectures") == [ARCHITECTURE[f]] and cfg.get("model_type") == f,
                 str(cfg))
        if f == "llama":
            t.expect("llama export: Llama 3's rope",
                     cfg.get("rope_scaling", {}).get("rope_type") == "llama3", str(cfg))
        outs.append((f, out, losses[1]))
    got = t.ask_all([dict(op="loss", dir=out, micro=SAMPLES) for _, out, _ in outs])
    for (f, _, want), g in zip(outs, got):
        t.expect_close(f"{f} exported as fp32: loss of from_pretrained vs trainer's step 2", want,
                       g["loss"], 1e-5)


def part_walkthrough(t):
    doc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "hf.md")
    with open(doc) as f:
        blocks = re.findall(r"^```bash\n(.*?)^```", f.read(), re.S | re.M)
    t.expect("docs/hf.md has the walk-through's bash blocks", len(blocks) >= 5, str(len(blocks)))
    path = os.pathsep.join([os.path.dirname(os.path.abspath(t.args.trainer)),
                            os.path.dirname(os.path.abspath(t.args.prepare_data)),
                            os.path.join(os.path.abspath(t.args.venv), "bin"),
                            os.environ["PATH"]])
    env = dict(os.environ, PATH=path, OMP_NUM_THREADS="2")
    out = ""
    for i, block in enumerate(blocks):
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=t.work, env=env,
                           capture_output=True, text=True)
        out += r.stdout
        if r.returncode:
            t.failures.append(f"docs/hf.md bash block {i + 1} exited {r.returncode}:\n{block}\n"
                              f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
            return
    print(out[-3000:])
    t.expect("step 3 starts from the Hugging Face weights",
             "initialised from small-qwen (Hugging Face weights, 1 file)" in out)
    t.expect("step 4 exports", "exported run/checkpoints/step_00000020 to small-qwen-licences"
             in out)
    losses = dict(re.findall(r"^(small-qwen\S*): loss ([0-9.]+)", out, re.M))
    t.expect("step 5 loads both models", len(losses) == 2, str(losses))
    if len(losses) == 2:
        before, after = float(losses["small-qwen"]), float(losses["small-qwen-licences"])
        t.expect(f"the imported model knows nothing (loss {before} near ln 151936 = 11.93)",
                 abs(before - 11.93) < 0.3)
        t.expect(f"the trained one has learnt (loss {after} < 7.5)", after < 7.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=["import", "export", "families", "walkthrough"],
                    required=True)
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--prepare-data")
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    t = Test(args)
    {"import": part_import, "export": part_export, "families": part_families,
     "walkthrough": part_walkthrough}[args.part](t)
    if t.failures:
        print("FAILED:\n  " + "\n  ".join(t.failures))
        sys.exit(1)
    print("all passed")


if __name__ == "__main__":
    main()
