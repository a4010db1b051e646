#!/usr/bin/env python3
"""The kernels of a captured training step, by their device time, from ncu's raw CSV.

    ncu --profile-from-start off --clock-control none --cache-control none --csv --page raw \
        --print-units base --print-kernel-base function --metrics gpu__time_duration.sum \
        --log-file ncu.csv build/trainer/trainer ... --set 'log.profile_steps=[4, 4]'
    python3 tools/ncu_table.py ncu.csv [--steps 1] [--top 25]

Prints two Markdown tables: the device time by class of kernel (cuBLASLt GEMMs, cuDNN
attention, NCCL collectives, this trainer's own kernels), and the kernels with the most time,
each with its calls, total and mean time and share, per captured step (--steps: how many the
capture held). ncu runs the kernels one at a time, so the sum is the step's kernel time, not
its wall time: the difference from the step time of an uncaptured run is what the device spent
idle or overlapped. Exit 1 when the file holds no profiled kernel (ncu exits 0 then); bad input
(a missing file, one that is not text, bad flags): one line, exit 2.
"""
import csv
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from tool_io import ArgumentParser, InputError, read_text, run  # noqa: E402
from collections import defaultdict

METRIC = "gpu__time_duration.sum"

# Kernel classes by name, first match wins: NCCL's collectives, cuDNN's attention, the GEMM
# libraries' products (cuBLASLt's sm90_xmma/nvjet kernels, CUTLASS), then everything else: the
# trainer's own (memory-bound) kernels.
CLASSES = [
    ("NCCL collectives", re.compile(r"nccl", re.I)),
    ("cuDNN attention", re.compile(r"cudnn|sdpa|fmha|flash_?attn", re.I)),
    ("GEMMs (cuBLASLt)", re.compile(r"gemm|nvjet|xmma|cutlass|cublas", re.I)),
    ("own kernels", re.compile(r"")),
]


def kernel_class(name):
    return next(label for label, pattern in CLASSES if pattern.search(name))


def read_kernels(path):
    """(kernel name, seconds) for each profiled kernel of an ncu raw-page CSV log."""
    text = read_text(path, "ncu --csv --page raw log")
    if "\0" in text:
        raise InputError(f"{path}: holds NUL bytes; pass ncu's --log-file (--csv --page raw)")
    # ==PROF==, ==WARNING== banners
    lines = [ln for ln in text.splitlines(keepends=True) if not ln.startswith("==")]
    rows = list(csv.reader(lines))
    header = next((i for i, r in enumerate(rows) if "Kernel Name" in r and METRIC in r), None)
    if header is None:
        return []
    name_at, time_at = rows[header].index("Kernel Name"), rows[header].index(METRIC)
    unit = "nsecond"
    kernels = []
    for r in rows[header + 1:]:
        if len(r) <= max(name_at, time_at):
            continue
        value = r[time_at].replace(",", "")
        try:
            t = float(value)
        except ValueError:
            unit = r[time_at] or unit  # the units row
            continue
        scale = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}.get(unit)
        if scale is None:
            raise InputError(f"{path}: unknown unit '{unit}' for {METRIC}; use --print-units base")
        kernels.append((r[name_at], t * scale))
    return kernels


def main():
    ap = ArgumentParser(prog="ncu_table", description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="ncu's --log-file (--csv --page raw)")
    ap.add_argument("--steps", type=int, default=1, help="steps the capture held (default 1)")
    ap.add_argument("--top", type=int, default=25, help="kernels listed (default 25)")
    a = ap.parse_args()
    if a.steps < 1 or a.top < 1:
        raise InputError("--steps and --top are counts >= 1")
    kernels = read_kernels(a.log)
    if not kernels:
        print(f"ncu_table: {a.log} holds no profiled kernel (no '{METRIC}' column with values): "
              "was log.profile_steps set and ncu run with --profile-from-start off?",
              file=sys.stderr)
        return 1
    total = sum(t for _, t in kernels)
    by_class, by_name = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    for name, t in kernels:
        for table, key in ((by_class, kernel_class(name)), (by_name, name)):
            table[key][0] += 1
            table[key][1] += t
    per = 1e3 / a.steps  # ms per step
    print(f"kernels: {len(kernels)} calls, {total * per:.2f} ms of device time per step "
          f"({a.steps} step{'s' if a.steps > 1 else ''} captured)\n")
    print("| class | calls per step | ms per step | share |\n|---|---|---|---|")
    for label, _ in CLASSES:
        if label in by_class:
            n, t = by_class[label]
            print(f"| {label} | {n / a.steps:.0f} | {t * per:.3f} | {100 * t / total:.1f}% |")
    print(f"\n| kernel | class | calls per step | ms per step | mean us | share |\n"
          "|---|---|---|---|---|---|")
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])
    for name, (n, t) in ranked[:a.top]:
        print(f"| {name[:100]} | {kernel_class(name)} | {n / a.steps:.0f} | {t * per:.3f} | "
              f"{1e6 * t / n:.1f} | {100 * t / total:.1f}% |")
    if len(ranked) > a.top:
        rest = sum(t for _, (_, t) in ranked[a.top:])
        print(f"| {len(ranked) - a.top} more kernels | | | {rest * per:.3f} | | "
              f"{100 * rest / total:.1f}% |")
    return 0


if __name__ == "__main__":
    run("ncu_table", main)
