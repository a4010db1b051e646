#!/usr/bin/env python3
"""kernels/fp8.h against PyTorch's float8 casts, bit for bit. torch (test_hf's venv, from PyPI)
writes a table beside the build's tests: every code of E4M3 and E5M2 decoded; the encoding of
every representable value, every midpoint between neighbours (ties), the floats just above and
below each, ±max, beyond max, the midpoint above max, ±0, ±Inf, NaNs, fp32 subnormals and random
floats, each by the plain cast x.to(float8) and the saturated one x.clamp(-max, max).to(float8)
(torchao's); and the current-scaling recipe on a few tensors (amax, scale, inverse, codes). Then
test_kernels' hidden case [.fp8-torch] reads the table and checks ours against it. Exit 77
(skipped) only when PyPI cannot be reached to install torch.

  test_fp8_torch.py --test-kernels BIN --venv DIR
  test_fp8_torch.py --oracle TABLE     (in the venv: writes the table)
"""
import argparse
import os
import re
import subprocess
import sys

TABLE = "test-fp8-torch/torch_fp8.txt"  # under the build dir; tests/kernels/test_fp8.cpp reads it


def oracle(path):
    import torch

    torch.set_flush_denormal(False)
    formats = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}

    def bits(t):
        return [b & 0xFFFFFFFF for b in t.contiguous().view(torch.int32).tolist()]

    def floats(ints):
        return torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in ints],
                            dtype=torch.int32).view(torch.float32)

    codes = torch.arange(256, dtype=torch.uint8)
    lines = [f"# torch {torch.__version__}"]
    inputs = set()
    for name, dt in formats.items():
        values = codes.view(dt).float()
        lines += [f"decode {name} {c:02x} {b:08x}" for c, b in enumerate(bits(values))]
        finite = sorted({v for v in values.double().tolist() if v == v and abs(v) != float("inf")
                         and v >= 0})
        top = finite[-1] + (finite[-1] - finite[-2])  # the next binade's first value, beyond max
        points = finite + [top, 2 * top]
        points += [(a + b) / 2 for a, b in zip(points, points[1:])]  # ties, exact in fp32
        for b in bits(torch.tensor(points, dtype=torch.float32)):
            inputs.update({b, b + 1, max(b - 1, 0)})  # the point and its fp32 neighbours
    specials = [0x00000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000,
                0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x7149F2CA]  # ..., FLT_MAX, Inf, NaNs, 1e30
    inputs.update(specials)
    inputs |= {b | 0x80000000 for b in inputs}
    g = torch.Generator().manual_seed(8)
    inputs.update(b & 0xFFFFFFFF for b in
                  torch.randint(-2**31, 2**31, (20000,), generator=g).tolist())
    mags = torch.exp2(torch.empty(20000, dtype=torch.float64).uniform_(-20, 17, generator=g))
    signs = torch.randint(0, 2, (20000,), generator=g) * 2 - 1
    inputs.update(bits((mags * signs).float()))
    x = floats(sorted(inputs))
    for name, dt in formats.items():
        top = torch.finfo(dt).max
        plain = x.to(dt).view(torch.uint8).tolist()
        sat = x.clamp(-top, top).to(dt)
        lines += [f"encode {b:08x} {name} {p:02x} {s:02x} {d:08x}" for b, p, s, d in
                  zip(bits(x), plain, sat.view(torch.uint8).tolist(), bits(sat.float()))]
    lines += scaled_lines(torch, formats, g)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def scaled_lines(torch, formats, g):
    """Per-tensor current scaling as Transformer Engine defines it, in torch's fp32 arithmetic:
    scale = max / amax (1 when amax is 0, Inf or NaN; FLT_MAX when it overflows), scale_inv =
    1 / scale, codes = (x * scale).clamp(-max, max).to(float8)."""
    def randn(n, s):
        return torch.randn(n, generator=g) * s

    tensors = [randn(1000, 1.0), randn(1000, 1e-3), randn(1000, 1e4), randn(1000, 1e-30),
               randn(1000, 1.0) ** 3 * 100, torch.zeros(7), torch.tensor([2.5]),
               torch.tensor([1e-40, -3e-41, 0.0]), torch.cat([randn(9, 1.0), torch.zeros(3)]),
               torch.tensor([1.0, -float("inf"), 0.5]), torch.tensor([1.0, float("nan"), -2.0])]
    lines = []
    one = torch.tensor(1.0)
    for name, dt in formats.items():
        top = torch.finfo(dt).max
        for x in tensors:
            x = x.float()
            amax = x.abs().max()
            scale = one if amax == 0 or not torch.isfinite(amax) else torch.tensor(top) / amax
            if torch.isinf(scale):
                scale = torch.tensor(torch.finfo(torch.float32).max)
            scale_inv = one / scale
            q = (x * scale).clamp(-top, top).to(dt).view(torch.uint8).tolist()
            b = lambda t: f"{t.float().view(torch.int32).item() & 0xFFFFFFFF:08x}"
            xs = " ".join(f"{v & 0xFFFFFFFF:08x}" for v in x.view(torch.int32).tolist())
            lines.append(f"scaled {name} {len(q)} {b(amax)} {b(scale)} {b(scale_inv)} {xs} "
                         + " ".join(f"{c:02x}" for c in q))
    return lines


def main():
    if sys.argv[1:2] == ["--oracle"]:
        return oracle(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("--test-kernels", required=True)
    ap.add_argument("--venv", required=True)
    a = ap.parse_args()
    from test_hf import venv_python
    py = venv_python(a.venv)
    table = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(a.test_kernels))), TABLE)
    os.makedirs(os.path.dirname(table), exist_ok=True)
    if os.path.exists(table):
        os.remove(table)
    r = subprocess.run([py, os.path.abspath(__file__), "--oracle", table], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, "torch's table: " + r.stdout + r.stderr
    r = subprocess.run([a.test_kernels, "[.fp8-torch]"], capture_output=True, text=True,
                       timeout=300)
    out = r.stdout + r.stderr
    print(out)
    assert r.returncode == 0, "test_kernels [.fp8-torch] failed"
    assert re.search(r"fp8 vs torch: 512 decodes, [0-9]+ encodes \([1-9][0-9]* where", out), out
    print("test_fp8_torch: passed")


if __name__ == "__main__":
    sys.exit(main())
