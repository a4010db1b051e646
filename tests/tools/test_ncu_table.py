#!/usr/bin/env python3
"""Test for tools/ncu_table.py on a log laid out as ncu writes it (--csv --page raw --log-file):
banner lines, the header, the units row, kernels with thousands separators; the classes, the
ranking and the per-step division by hand; a log without kernels exits 1 naming the cause.

usage: test_ncu_table.py --tool tools/ncu_table.py --work DIR
"""
import argparse
import os
import re
import subprocess
import sys

HEAD = ['"ID"', '"Process ID"', '"Process Name"', '"Host Name"', '"Kernel Name"', '"Context"',
        '"Stream"', '"Block Size"', '"Grid Size"', '"Device"', '"CC"',
        '"gpu__time_duration.sum"']


def row(i, name, ns):
    cells = [str(i), "4242", "trainer", "127.0.0.1", name, "1", "7", "(256, 1, 1)",
             "(132, 1, 1)", "0", "9.0", ns]
    return ",".join(f'"{c}"' for c in cells)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    # Two captured steps: per step a GEMM of 3 ms twice, attention 2 ms, an NCCL reduce-scatter
    # 0.5 ms and our RMSNorm 0.25 ms (twice 0.125).
    kernels = [("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", "3,000,000"),
               ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "2,000,000"),
               ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "500,000"),
               ("rmsnorm_fwd_kernel", "125,000"), ("rmsnorm_fwd_kernel", "125,000"),
               ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", "3,000,000")] * 2
    lines = ["==PROF== Connected to process 4242 (/build/trainer/trainer)",
             ",".join(HEAD), ",".join(['""'] * 11 + ['"nsecond"'])]
    lines += [row(i, n, t) for i, (n, t) in enumerate(kernels)]
    lines.append("==PROF== Disconnected from process 4242")
    log = os.path.join(a.work, "ncu.csv")
    with open(log, "w") as f:
        f.write("\n".join(lines) + "\n")
    r = subprocess.run([sys.executable, a.tool, log, "--steps", "2", "--top", "2"],
                       capture_output=True, text=True)
    out = r.stdout
    assert r.returncode == 0, r.stderr + out
    assert "kernels: 12 calls, 8.75 ms of device time per step (2 steps captured)" in out, out
    expect = {"GEMMs (cuBLASLt)": ("2", "6.000", "68.6%"), "cuDNN attention": ("1", "2.000", "22.9%"),
              "NCCL collectives": ("1", "0.500", "5.7%"), "own kernels": ("2", "0.250", "2.9%")}
    for label, (calls, ms, share) in expect.items():
        assert f"| {label} | {calls} | {ms} | {share} |" in out, (label, out)
    ranked = re.findall(r"^\| (\S+) \| [^|]+ \| \d+ \| ([0-9.]+) \| ([0-9.]+) \|", out, re.M)
    assert ranked == [("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", "6.000", "3000.0"),
                      ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "2.000", "2000.0")], out
    assert "| 2 more kernels | | | 0.750 | | 8.6% |" in out, out
    # No kernel profiled (the capture never started): exit 1 and the cause.
    with open(log, "w") as f:
        f.write("==PROF== Connected to process 4242\n==WARNING== No kernels were profiled.\n")
    r = subprocess.run([sys.executable, a.tool, log], capture_output=True, text=True)
    assert r.returncode == 1 and "holds no profiled kernel" in r.stderr, (r.returncode, r.stderr)
    print("test_ncu_table: passed")


if __name__ == "__main__":
    main()
