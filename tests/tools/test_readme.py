#!/usr/bin/env python3
"""Every shell block of the README, run as written in a sandbox, so that its commands stay true.

The sandbox holds what the commands expect to find: `build` (a link to the suite's build),
`tools` (a link to the source's), a copy of `configs`, the user's inputs the examples name
(corpus.jsonl, held-out.jsonl, docs/*.txt, qwen/tokenizer.json: a small byte-level BPE in
Qwen's format standing in for Qwen's), and the demo's data (runs/data/licenses_*). Each command
runs with bash in the sandbox, HOME inside it, `export` lines carried to the next. Two rules
change what runs, and say so in the output:
  - a run of configs/tiny.yaml trains 12 steps, not 300 (--set train.steps=12 and
    optim.warmup_steps=2 appended);
  - a command is skipped, with its reason, when it needs what a test machine has not (a GPU
    cluster, Slurm's srun and sbatch: tests/run/test_jobs.cpp and test_cli.cpp run those on a local
    Slurm), is what runs this test (the suite's build, run_tests.sh, the demo, which
    tools/check_fresh_machine.sh runs), or names the user's own files (my.yaml, a checkpoint).
Everything else must exit 0, and a few outputs are checked.

usage: test_readme.py --source DIR --build DIR --work DIR --python PYTHON3
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

# (pattern, reason): commands not run here.
SKIP = [
    (r"^bash tools/(demo|run_tests|install_deps)\.sh", "what this test runs within (CI), or "
     "tools/check_fresh_machine.sh"),
    (r"^cmake -S|^cmake --build|^\[-D", "builds the build this test runs"),
    (r"^srun |^sbatch |^scancel ", "needs Slurm (the local-Slurm tests run srun and sbatch)"),
    (r"--backend cuda", "needs GPUs"),
    (r"my\.yaml|my-sweep\.yaml|ckpt/step_", "names the user's own files"),
]
TINY = "configs/tiny.yaml"
# Outputs that show a command did what the README says.
EXPECT = [
    (r"^trainer plan --config configs/qwen2.5-72b.yaml", "verdict: fits"),
    (r"--dry-run --world 128 --gpu h100", "dry run for 128 ranks of h100: config, layout, data "
     "and memory check out"),
    (r"^tools/sweep .* --dry-run", "sweep: best by the plan: "),
    (r"^tools/plot_metrics runs/tiny", "wrote runs/tiny/plots/loss.png"),
    (r"^trainer --help-config", "| `model.preset` |"),
]


def commands(readme):
    """Each command of each ```bash block: continuation lines joined, comments dropped."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", readme, re.S):
        cmd = ""
        for line in block.split("\n"):
            cmd = (cmd + " " + line.strip()) if cmd else line.strip()
            if cmd.endswith("\\"):
                cmd = cmd[:-1].rstrip()
                continue
            cmd = re.sub(r"\s+#.*$", "", cmd).strip()
            if cmd:
                out.append(cmd)
            cmd = ""
    return out


def byte_bpe():
    """A byte-level BPE tokenizer.json in the format of Qwen's, small: bytes, two merges, and
    <|endoftext|> as the end of document."""
    chars, n = [], 256
    for b in range(256):
        keep = 33 <= b <= 126 or 161 <= b <= 172 or b >= 174
        chars.append(chr(b if keep else n))
        n += 0 if keep else 1
    vocab = {c: i for i, c in enumerate(chars)}
    vocab["th"], vocab["the"] = 256, 257
    return {"normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
            "model": {"type": "BPE", "vocab": vocab, "merges": [["t", "h"], ["th", "e"]]},
            "added_tokens": [{"id": 258, "content": "<|endoftext|>", "special": True}]}


def sandbox(source, build, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "home"))
    os.symlink(os.path.abspath(build), os.path.join(work, "build"))
    os.symlink(os.path.join(source, "tools"), os.path.join(work, "tools"))
    shutil.copytree(os.path.join(source, "configs"), os.path.join(work, "configs"))
    text = "the quick brown fox jumps over the lazy dog, then the dog sleeps. " * 40
    for name, docs in (("corpus.jsonl", 60), ("held-out.jsonl", 30)):
        with open(os.path.join(work, name), "w") as f:
            for i in range(docs):
                f.write(json.dumps({"text": f"{i}: {text}"}) + "\n")
    os.makedirs(os.path.join(work, "docs"))
    for name in ("a.txt", "b.txt"):
        with open(os.path.join(work, "docs", name), "w") as f:
            f.write(text)
    os.makedirs(os.path.join(work, "qwen"))
    with open(os.path.join(work, "qwen", "tokenizer.json"), "w") as f:
        json.dump(byte_bpe(), f)
    os.makedirs(os.path.join(work, "runs", "data"))
    prepare = os.path.join(build, "tools", "prepare_data")
    for part, copies in (("train", 8), ("valid", 2)):
        path = os.path.join(work, f"{part}.txt")
        with open(path, "w") as f:
            f.write(text * copies)
        subprocess.run([prepare, "--format", "text", "--output",
                        os.path.join(work, "runs", "data", f"licenses_{part}"), path],
                       check=True, capture_output=True)


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--source", "--build", "--work", "--python"):
        ap.add_argument(flag, required=True)
    a = ap.parse_args()
    source, work = os.path.abspath(a.source), os.path.abspath(a.work)
    sandbox(source, a.build, work)
    with open(os.path.join(source, "README.md"), encoding="utf-8") as f:
        cmds = commands(f.read())
    # A machine where python3 has python3-yaml and matplotlib (the Debian python, --python), and
    # mpirun may run as root and oversubscribe the cores (as the suite's own launches do).
    env = dict(os.environ, HOME=os.path.join(work, "home"), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
               PATH=os.path.dirname(a.python) + os.pathsep + os.environ.get("PATH", ""))
    failures, ran, skipped = [], 0, 0
    for cmd in cmds:
        reason = next((why for pattern, why in SKIP if re.search(pattern, cmd)), None)
        if reason:
            print(f"skipped: {cmd}\n    ({reason})")
            skipped += 1
            continue
        if cmd.startswith("export "):
            # Carried to the commands after it, as a shell session would.
            r = subprocess.run(["bash", "-c", f"{cmd}; env -0"], cwd=work, env=env,
                               capture_output=True, text=True)
            env = dict(kv.split("=", 1) for kv in r.stdout.split("\0") if "=" in kv)
            print(f"ran: {cmd}")
            ran += 1
            continue
        run = cmd
        if TINY in cmd and "--dry-run" not in cmd and re.match(r"^(trainer|build/trainer/trainer|"
                                                               r"mpirun)", cmd):
            run += " --set train.steps=12 --set optim.warmup_steps=2"
        r = subprocess.run(["bash", "-c", run], cwd=work, env=env, capture_output=True,
                           text=True, timeout=300)
        ran += 1
        out = r.stdout + r.stderr
        print(f"ran: {run} (exit {r.returncode})")
        if r.returncode != 0:
            failures.append(f"{run}: exit {r.returncode}\n{out[-1500:]}")
            continue
        for pattern, want in EXPECT:
            if re.search(pattern, cmd) and want not in out:
                failures.append(f"{run}: no {want!r} in its output\n{out[-1500:]}")
    if ran < 15:
        failures.append(f"only {ran} commands ran")
    if failures:
        print("\n".join(f"FAIL: {f}" for f in failures))
        return 1
    print(f"test_readme: passed: {ran} commands ran, {skipped} skipped with their reasons")
    return 0


if __name__ == "__main__":
    sys.exit(main())
