#!/usr/bin/env python3
"""End-to-end test of tools/sweep on the tiny model and CPU ranks (about 15 s on 2 cores).

    tests/tools/test_sweep.py --trainer build/trainer/trainer \
        --prepare-data build/tools/prepare_data --work /tmp/test_sweep

1. tests/tools/sweep_tiny.yaml (tp {1,2} x pp {1,2} on 4 ranks): --dry-run lists 4 runs that
   fit and creates nothing; the sweep gives one ok row per layout, sorted by tokens/s/GPU, the
   first loss near ln(257), the same final loss in every layout; --collect rewrites the same CSV.
2. ranks {1,2} x micro_batch {2,3} without a plan: micro_batch 3 fails in the trainer and is
   listed with its error line and exit code; the ranks-2 point gets a scaling column.
3. A plan against a 0.1 GiB GPU: one point skipped as not fitting, one failed by the plan's
   error, nothing launched.
4. Bad input (unknown key, an output directory already holding runs): exit 2, one `sweep:`
   line, the earlier results untouched.
Exit 0 when every check passes, 1 with the failed check otherwise.
"""
import argparse
import csv
import math
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEP = os.path.join(ROOT, "tools", "sweep")
TINY = os.path.join(ROOT, "configs", "tiny.yaml")


class Failed(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failed(what + (f"\n{detail}" if detail else ""))


def sweep(args, expect_rc=0):
    p = subprocess.run([sys.executable, SWEEP, *args], capture_output=True, text=True)
    check(p.returncode == expect_rc, f"tools/sweep {' '.join(args)}: exit {p.returncode}, "
          f"expected {expect_rc}", p.stdout + p.stderr)
    return p


def rows_of(out):
    with open(os.path.join(out, "results.csv")) as f:
        return list(csv.DictReader(f))


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def tiny_layouts(work, common):
    """1: the 4-point tp x pp sweep of tests/tools/sweep_tiny.yaml on 4 ranks."""
    out = os.path.join(work, "tiny")
    args = [os.path.join(ROOT, "tests", "tools", "sweep_tiny.yaml"), "--out", out, *common]
    p = sweep(args + ["--dry-run"])
    listed = [l for l in p.stdout.splitlines() if l[:4].rstrip("-").isdigit()]
    check(len(listed) == 4, "--dry-run lists 4 runs", p.stdout)
    check(p.stdout.count("plan: fits:") == 4, "--dry-run: every layout fits by the plan", p.stdout)
    check(not os.path.exists(out), "--dry-run creates nothing")

    p = sweep(args)
    rows = rows_of(out)
    check(sorted((r["parallel.tp"], r["parallel.pp"]) for r in rows) ==
          [("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")], "one row per tp x pp layout", str(rows))
    for r in rows:
        check(r["status"] == "ok" and r["world"] == "4" and r["exit_code"] == "0" and
              r["steps"] == "6", f"{r['run']}: 6 steps on 4 ranks", str(r))
        check(float(r["tokens_per_s_per_gpu"]) > 0 and float(r["step_time_s"]) > 0,
              f"{r['run']}: tokens/s/GPU and step time measured", str(r))
        check(abs(float(r["first_loss"]) - math.log(257)) < 0.15,
              f"{r['run']}: first loss {r['first_loss']} near ln(257)")
        check(float(r["plan_memory_gib"]) > 0, f"{r['run']}: the plan's memory in the row")
    speeds = [float(r["tokens_per_s_per_gpu"]) for r in rows]
    check(speeds == sorted(speeds, reverse=True), "rows sorted by tokens/s/GPU", str(speeds))
    losses = [float(r["final_loss"]) for r in rows]
    check(max(losses) - min(losses) <= 1e-4 * abs(losses[0]),
          "every layout ends at the same loss (1e-4 relative)", str(losses))
    with open(os.path.join(out, "results.md")) as f:
        md = f.read()
    check(md in p.stdout, "the Markdown table is printed", p.stdout)
    table = [l for l in md.splitlines() if l.startswith("| 0")]
    check([l.split(" | ")[0][2:] for l in table] == [r["run"][:3] for r in rows],
          "the Markdown table has the CSV's rows in its order", md)
    check("Failed or skipped" not in md, "no failed runs in the tiny sweep", md)
    with open(os.path.join(out, "results.csv")) as f:
        before = f.read()
    sweep(args + ["--collect"])
    with open(os.path.join(out, "results.csv")) as f:
        check(f.read() == before, "--collect rewrites the same results.csv")
    return out, args, before


def failures_and_scaling(work, common, data):
    """2: a trainer failure with its reason, and the scaling column over ranks."""
    sweep_file = write(os.path.join(work, "fail.yaml"), f"""
base: {TINY}
set: ["data.train=[{{path: {data}, weight: 1.0}}]", "data.valid=[]", data.seq_len=32,
      train.steps=4, train.global_batch=8, train.eval_interval=0, optim.warmup_steps=1]
grid:
  ranks: [1, 2]
  train.micro_batch: [2, 3]
launch: {{timeout_s: 120}}
warmup: 1
""")
    out = os.path.join(work, "fail")
    p = sweep([sweep_file, "--out", out, *common])
    rows = {(r["ranks"], r["train.micro_batch"]): r for r in rows_of(out)}
    check(len(rows) == 4, "4 rows", str(rows))
    for ranks in ("1", "2"):
        ok, bad = rows[(ranks, "2")], rows[(ranks, "3")]
        check(ok["status"] == "ok", f"ranks {ranks}, micro_batch 2 runs", str(ok))
        check(bad["status"] == "failed" and bad["exit_code"] == "2",
              f"ranks {ranks}, micro_batch 3 fails with exit code 2", str(bad))
        check("is not divisible by train.micro_batch 3" in bad["reason"] and
              bad["reason"].endswith("(exit 2)"),
              "the failure's reason is the trainer's error line", bad["reason"])
        check(f"- {bad['run']}: failed: {bad['reason']}" in p.stdout, "the failure is listed",
              p.stdout)
    one, two = rows[("1", "2")], rows[("2", "2")]
    check(float(one["scaling"]) == 1.0, "scaling is 1 at the smallest rank count", str(one))
    expect = float(two["tokens_per_s_per_gpu"]) / float(one["tokens_per_s_per_gpu"])
    check(abs(float(two["scaling"]) - expect) < 1e-9, "scaling = tokens/s/GPU over the 1-rank run",
          str(two))
    check("Scaling: tokens/s/GPU against the smallest ranks" in p.stdout, "the scaling note",
          p.stdout)
    loss1, loss2 = float(one["final_loss"]), float(two["final_loss"])
    check(abs(loss1 - loss2) <= 1e-4 * loss1, "dp 2 ends at the 1-rank loss", f"{loss1} {loss2}")


def pruned_by_plan(work, common, data):
    """3: the plan against a 0.1 GiB GPU skips or fails every point; nothing is launched."""
    write(os.path.join(work, "small_gpu.yaml"), "memory_gib: 0.1\n")
    sweep_file = write(os.path.join(work, "plan.yaml"), f"""
base: {TINY}
set: ["data.train=[{{path: {data}, weight: 1.0}}]", "data.valid=[]", data.seq_len=32,
      train.steps=4, train.global_batch=8, train.eval_interval=0, optim.warmup_steps=1]
grid: {{train.micro_batch: [2, 3]}}
plan: {{hardware: small_gpu.yaml}}
""")
    out = os.path.join(work, "plan")
    p = sweep([sweep_file, "--out", out, "--dry-run", *common])
    check("does not fit: " in p.stdout and " GiB of 0.1 GiB (plan)" in p.stdout,
          "--dry-run shows the plan's verdict", p.stdout)
    sweep([sweep_file, "--out", out, *common])
    rows = rows_of(out)
    check([r["status"] for r in rows] == ["skipped", "failed"], "skipped and failed by the plan",
          str(rows))
    check(rows[0]["reason"].startswith("does not fit: ") and rows[0]["reason"].endswith(
        " GiB of 0.1 GiB (plan)"), "the skip's reason", rows[0]["reason"])
    check(rows[1]["reason"].startswith("error: ") and rows[1]["reason"].endswith("(plan)"),
          "the plan's error line is the reason", rows[1]["reason"])
    check(os.listdir(os.path.join(out, "runs")) == [], "nothing launched")


def bad_input(work, common, tiny_out, tiny_args, tiny_csv):
    """4: bad input is one line and exit 2, and leaves the earlier results alone."""
    bad = write(os.path.join(work, "bad.yaml"),
                f"base: {TINY}\ngrid: {{parallel.tp: [1, 2]}}\nbogus: 1\n")
    for args, what in (([bad, "--out", tiny_out, *common], "unknown key 'bogus'"),
                       (tiny_args, "already holds runs")):
        p = sweep(args, expect_rc=2)
        lines = p.stderr.splitlines()
        check(len(lines) == 1 and lines[0].startswith("sweep: ") and what in lines[0] and
              not p.stdout, f"one `sweep:` line naming {what!r}", p.stdout + p.stderr)
        with open(os.path.join(tiny_out, "results.csv")) as f:
            check(f.read() == tiny_csv, "the earlier results.csv is untouched")


def shipped_72b_layouts(work, trainer_args):
    """5: configs/sweeps/qwen2.5-72b-layouts.yaml (docs/sweep.md): on 16 x 8 H100 the planner
    keeps exactly tp 4 with pp 4 + zero1, and tp 8 with pp 1 + zero1, pp 2 + zero1, pp 4 and
    pp 4 + zero1, lists them first and fastest first, flags pp 1's 79.7 GiB of 80 as tight and
    names the best; the dry run launches nothing."""
    out = os.path.join(work, "72b")
    p = sweep([os.path.join(ROOT, "configs", "sweeps", "qwen2.5-72b-layouts.yaml"), "--dry-run",
               "--out", out, *trainer_args])
    names = re.findall(r"^(\d{3}-\S+)", p.stdout, re.M)
    verdicts = re.findall(r"^    plan: (\w+)", p.stdout, re.M)
    check(len(names) == 12 and len(verdicts) == 12, "72B sweep: 12 runs with a verdict each",
          p.stdout)
    fits = [n for n, v in zip(names, verdicts) if v == "fits"]
    check(sorted(fits) == ["006-tp4-pp4-zero1-true", "008-tp8-pp1-zero1-true",
                           "010-tp8-pp2-zero1-true", "011-tp8-pp4-zero1-false",
                           "012-tp8-pp4-zero1-true"],
          f"72B sweep: fitting layouts {fits}", p.stdout)
    # Those that fit first, fastest predicted first; the best named; a tight margin flagged.
    check(names[:len(fits)] == fits, "72B sweep: the fitting layouts are listed first", p.stdout)
    speeds = [float(x) for x in re.findall(r"predicted (\d+) tokens/s/GPU", p.stdout)]
    check(len(speeds) == 5 and speeds == sorted(speeds, reverse=True),
          f"72B sweep: sorted by predicted speed {speeds}", p.stdout)
    check(f"sweep: best by the plan: {fits[0]} ({speeds[0]:.0f} tokens/s/GPU predicted)"
          in p.stdout, "72B sweep: names the best point", p.stdout)
    check(re.search(r"008-tp8-pp1-zero1-true .*\n.*\n    plan: fits: 79.7 GiB of 80 GiB \(tight: "
                    r"0.4% to spare\)", p.stdout) is not None,
          "72B sweep: 79.7 GiB of 80 is flagged tight", p.stdout)
    check(all(v == "skipped" for v, n in zip(verdicts, names) if n not in fits),
          "72B sweep: every other layout skipped by the plan", p.stdout)
    check(not os.path.exists(out), "72B sweep: --dry-run created its output directory")


def srun_mode(work, common):
    """--srun (SLURM_CONF names the suite's local Slurm, one node of 2 CPUs): tp {1, 2} as srun
    job steps of 1 node x 2 tasks (launch.mode srun): both run, to the same loss."""
    out = os.path.join(work, "srun")
    yaml_path = os.path.join(work, "sweep_srun.yaml")
    with open(os.path.join(ROOT, "tests", "tools", "sweep_tiny.yaml")) as f:
        text = f.read()
    text = text[:text.index("grid:")]  # the same fixed settings, a grid and launch of its own
    text = text.replace("base: ../../configs/tiny.yaml",
                        "base: " + os.path.join(ROOT, "configs", "tiny.yaml"))
    text += ("grid: {parallel.tp: [1, 2]}\n"
             "launch: {mode: srun, nodes: 1, gpus_per_node: 2, timeout_s: 120,"
             " srun_args: [--overcommit]}\nwarmup: 2\n")
    write(yaml_path, text)
    p = sweep([yaml_path, "--out", out, *common])
    rows = rows_of(out)
    check(sorted(r["parallel.tp"] for r in rows) == ["1", "2"], "srun: one row per layout",
          p.stdout)
    check(all(r["status"] == "ok" and r["world"] == "2" for r in rows),
          "srun: both layouts ran on 2 tasks", str(rows))
    losses = [float(r["final_loss"]) for r in rows]
    check(abs(losses[0] - losses[1]) <= 1e-4 * abs(losses[0]),
          "srun: both layouts end at the same loss", str(losses))
    with open(os.path.join(out, "runs", rows[0]["run"], "trainer.log")) as f:
        first = f.readline()
        check("srun" in first, "srun: the run was launched by srun", first)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--prepare-data", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied first)")
    ap.add_argument("--srun", action="store_true",
                    help="only the srun-mode sweep (needs SLURM_CONF of a running Slurm)")
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "synthetic")
    subprocess.run([a.prepare_data, "--output", data, "--synthetic", "200000", "--vocab", "257"],
                   check=True, capture_output=True)
    common = ["--trainer", os.path.abspath(a.trainer),
              "--set", f"data.train=[{{path: {data}, weight: 1.0}}]"]
    try:
        if a.srun:
            srun_mode(work, common)
            print("PASS: tools/sweep through srun")
            return 0
        tiny_out, tiny_args, tiny_csv = tiny_layouts(work, common)
        failures_and_scaling(work, common[:2], data)
        pruned_by_plan(work, common[:2], data)
        bad_input(work, common, tiny_out, tiny_args, tiny_csv)
        shipped_72b_layouts(work, common[:2])
    except Failed as e:
        print(f"FAIL: {e}")
        return 1
    print("PASS: tools/sweep (tiny layouts, failures, scaling, plan pruning, bad input, "
          "the shipped 72B layout sweep)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
