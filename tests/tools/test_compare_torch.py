#!/usr/bin/env python3
"""tools/compare_torch.sh end to end on the CPU, as the GPU window's `compare` stage runs it on a
GPU: ours (tools/bench.sh) and the PyTorch baseline (tools/torch_baseline.py: transformers'
Qwen2ForCausalLM of the same shapes) on configs/tiny.yaml, then the one table. Checks that both
sides trained (their rows' numbers), that the table compares them, and that the baseline names
the versions it ran. The venv is test_hf's (torch and transformers from PyPI); exit 77
(skipped) only when PyPI cannot be reached.

usage: test_compare_torch.py --source DIR --build DIR --venv DIR --work DIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

from test_hf import venv_python


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--source", "--build", "--venv", "--work"):
        ap.add_argument(flag, required=True)
    a = ap.parse_args()
    py = venv_python(a.venv)
    shutil.rmtree(a.work, ignore_errors=True)
    r = subprocess.run(
        ["bash", os.path.join(a.source, "tools/compare_torch.sh"), "--config",
         os.path.join(a.source, "configs/tiny.yaml"), "--seq-len", "64", "--global-batch", "2",
         "--steps", "4", "--warmup", "1", "--device", "cpu", "--no-compile", "--python", py,
         "--build", a.build, "--out", a.work], capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    table = open(os.path.join(a.work, "compare.md")).read()
    # preset, seq, micro, global, ours tokens/s, ours MFU, ours MiB, torch tokens/s, torch MFU,
    # torch MiB, torch alloc MiB, ours / torch.
    row = re.search(r"^\| tiny \| 64 \| 1 \| 2 \| ([0-9.]+) \| n/a \| [0-9]+ \(host\) \| "
                    r"([0-9.]+) \| n/a \| [0-9]+ \(host\) \| n/a \| ([0-9.]+)× \|$", table, re.M)
    assert row, table
    ours, torch, ratio = map(float, row.groups())
    assert ours > 0 and torch > 0, table
    assert abs(ratio - ours / torch) <= 0.01 + 0.01 * ratio, (ratio, ours, torch)
    assert re.search(r"PyTorch baseline: torch 2\.15\.0[^,]*, transformers 5\.23\.0", table), table
    # Both sides logged their losses, starting near ln(vocab) (257 padded ids: about 5.5).
    for side in ("tools/bench.sh", "tools/torch_baseline.py"):
        assert side in out, (side, out)
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+) ->", out)]
    assert len(losses) == 2 and all(4.5 < l < 6.5 for l in losses), out
    print("test_compare_torch: passed")


if __name__ == "__main__":
    sys.exit(main())
