#!/usr/bin/env python3
"""Tokenizer benchmark: prepare_data --tokenizer (Qwen2.5's tokenizer.json) against the
`tokenizers` package (one thread, and encode_batch on every core), the PyPI package `bpe-qwen`
and `tiktoken` (an Encoding built from tokenizer.json's vocabulary as ranks and its
pre-tokenizer's pattern), on one corpus (the licence texts, CJK, code and emoji, about --mb MB of jsonl).
Prints a Markdown table (MB/s of UTF-8 input, M tokens/s) and checks that every tokenizer's ids
equal the `tokenizers` ones. prepare_data's time is the whole process: reading the 7 MB
tokenizer.json (about 0.3 s), tokenizing and writing the dataset. Numbers go to
docs/PERFORMANCE.md.

  tools/bench_tokenizer.py --prepare-data build/tools/prepare_data --work /tmp/tokbench [--mb 20]
"""
import argparse
import glob
import importlib.util
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "tools"))
import test_tokenizer  # noqa: E402  (its set-up: the venv and Qwen2.5's tokenizer.json)

ORACLE = r"""
import glob, importlib.util, json, os, site, sys, time
from tokenizers import Tokenizer
tok_json, corpus = sys.argv[1:3]
docs = [json.loads(l)["text"] for l in open(corpus, encoding="utf-8")]
mb = sum(len(d.encode()) for d in docs) / 1e6
t = Tokenizer.from_file(tok_json)
t0 = time.perf_counter(); one = [t.encode(d, add_special_tokens=False).ids for d in docs]
t1 = time.perf_counter(); batch = t.encode_batch(docs, add_special_tokens=False)
t2 = time.perf_counter()
rows = [("tokenizers", "1", t1 - t0, True), ("tokenizers encode_batch", str(os.cpu_count()),
        t2 - t1, [e.ids for e in batch] == one)]
so = glob.glob(os.path.join(site.getsitepackages()[0], "bpe_qwen", "bpe_qwen.cpython-*.so"))
if so:  # the compiled module alone: its package imports transformers
    spec = importlib.util.spec_from_file_location("bpe_qwen", so[0])
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    q = m.QwenTokenizer(os.path.dirname(tok_json))
    t3 = time.perf_counter(); ids = [q.encode(d) for d in docs]; t4 = time.perf_counter()
    rows.append(("bpe-qwen", "1", t4 - t3, ids == one))
try:  # tiktoken with Qwen2.5's vocabulary as mergeable ranks and its pre-tokenizer's pattern
    import tiktoken
except ImportError:
    tiktoken = None
if tiktoken is not None:
    spec = json.load(open(tok_json, encoding="utf-8"))
    # The byte-level alphabet (GPT-2's): each byte is one printable character in the vocabulary.
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    byte_of = {chr(c): b for b, c in zip(bs, cs)}
    ranks = {bytes(byte_of[ch] for ch in tok): i for tok, i in spec["model"]["vocab"].items()}
    pattern = next(p["pattern"]["Regex"] for p in spec["pre_tokenizer"]["pretokenizers"]
                   if p["type"] == "Split")
    enc = tiktoken.Encoding("qwen2.5", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    t5 = time.perf_counter(); ids = [enc.encode_ordinary(d) for d in docs]
    t6 = time.perf_counter()
    rows.append((f"tiktoken {tiktoken.__version__}", "1", t6 - t5, ids == one))
tokens = sum(map(len, one))
json.dump({"mb": mb, "tokens": tokens, "ids": one, "rows": rows}, sys.stdout)
"""


def corpus(path, mb):
    random.seed(1)
    texts = [open(p, encoding="utf-8").read() for p in sorted(glob.glob("/usr/share/common-licenses/*"))
             if os.path.isfile(p)]
    texts += ["中文测试，日本語のテキスト、한국어 텍스트。" * 50, "def f(x):\n    return x**2\n" * 200,
              "emoji 😀👍🏽 and 🇩🇪 " * 300]
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        while n < mb * 1e6:
            for para in random.choice(texts).split("\n\n"):
                if para.strip():
                    f.write(json.dumps({"text": para}) + "\n")
                    n += len(para.encode())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prepare-data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mb", type=float, default=20)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    py, qwen = test_tokenizer.setup(a.work)
    subprocess.run([py, "-m", "pip", "install", "-q", "bpe-qwen", "tiktoken==0.14.0"], check=False)
    src = os.path.join(a.work, "bench.jsonl")
    corpus(src, a.mb)
    o = json.loads(subprocess.run([py, "-c", ORACLE, qwen, src], check=True, capture_output=True,
                                  text=True).stdout)
    rows = [tuple(r) for r in o["rows"]]
    for threads in sorted({1, 2, os.cpu_count() or 1}):
        prefix = os.path.join(a.work, f"out-t{threads}")
        t0 = time.perf_counter()
        subprocess.run([a.prepare_data, "--output", prefix, "--tokenizer", qwen, "--threads",
                        str(threads), src], check=True, capture_output=True)
        dt = time.perf_counter() - t0
        ours = [d[:-1] for d in test_tokenizer.read_dataset(prefix)]
        rows.append(("prepare_data --tokenizer", str(threads), dt, ours == o["ids"]))
    print(f"corpus: {o['mb']:.1f} MB of UTF-8 in {len(o['ids'])} documents, {o['tokens']} tokens "
          f"(Qwen2.5), {os.cpu_count()} cores")
    print("| tokenizer | threads | MB/s | M tokens/s | ids equal to tokenizers |")
    print("|---|---|---|---|---|")
    for name, threads, seconds, same in rows:
        print(f"| {name} | {threads} | {o['mb'] / seconds:.2f} | {o['tokens'] / seconds / 1e6:.2f} "
              f"| {'yes' if same else 'NO'} |")
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
