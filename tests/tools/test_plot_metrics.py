#!/usr/bin/env python3
"""Test for tools/plot_metrics: PNGs, the summary numbers, and the errors.

usage: test_plot_metrics.py --tool tools/plot_metrics --work DIR
Runs the tool with this interpreter (which must have matplotlib). Exit 0: pass; 1: fail.
"""
import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys

PNG_W, PNG_H = 800, 500  # the tool's promise: 8 x 5 inches at 100 dpi
CHARTS = ["loss.png", "lr.png", "tokens_per_s.png", "grad_norm.png"]


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def step_line(step, loss, tps, mfu=None):
    d = {"data_wait_s": 1e-4, "grad_norm": 2.0 / step, "loss": loss, "lr": 1e-3 * min(1, step / 10),
         "optimizer_s": 0.01, "peak_mem_mib": 80.0, "step": step, "step_time_s": 0.5,
         "tflops_per_rank": 0.1, "tokens": 2048, "tokens_per_s": 2 * tps,
         "tokens_per_s_per_rank": tps}
    if mfu is not None:  # a GPU run's line: with the step-time breakdown too
        d["mfu"] = mfu
        d.update(time_forward_s=0.15, time_backward_s=0.25, time_pipeline_wait_s=0.02,
                 time_tp_comm_s=0.03, time_dp_wait_s=0.01, time_optimizer_s=0.02,
                 time_other_s=0.0199)
    return d


def write_alpha(path):
    """40 steps with mfu; crashed after logging 42 and part of a line, resumed from the
    checkpoint at 30 (the trainer's resume line), so 31-40 repeat with other values and 41-42
    are superseded. Returns the values the tool must keep: {step: line}, {step: val_loss}."""
    lines = [{"event": "start", "world": 2, "step": 0}]
    for s in range(1, 43):
        lines.append(step_line(s, 5.0 - 0.1 * s, 1000.0 + 10 * s, 0.30 + 0.001 * s))
        if s % 20 == 0:
            lines.append({"step": s, "val_loss": 4.0 - 0.05 * s, "eval_time_s": 0.3})
        if s % 10 == 0:
            lines.append({"step": s, "event": "checkpoint", "seconds": 0.05})
    crashed = len(lines)
    lines.append({"event": "resume", "step": 30})
    for s in range(31, 41):  # the re-run: lower loss, faster
        lines.append(step_line(s, 4.9 - 0.1 * s, 3000.0 + 7 * s, 0.50 + 0.002 * s))
    lines.append({"step": 40, "val_loss": 1.75, "eval_time_s": 0.3})
    text = [json.dumps(d) + "\n" for d in lines]
    text.insert(crashed, '{"step": 43, "loss": 0.1, "l\n')  # cut short by the crash
    with open(path, "w") as f:
        f.writelines(text)
    keep, val = {}, {}
    for d in lines:
        if d.get("event") == "resume":
            keep = {k: v for k, v in keep.items() if k <= d["step"]}
            val = {k: v for k, v in val.items() if k <= d["step"]}
        elif "loss" in d:
            keep[d["step"]] = d
        elif "val_loss" in d:
            val[d["step"]] = d["val_loss"]
    return keep, val


def write_beta(path):
    """25 steps, no mfu, irregular throughput, a null loss, an unknown line, a blank line."""
    lines = [step_line(s, 6.0 / s, 500.0 + (s * 37) % 11 * 13) for s in range(1, 26)]
    lines[11]["loss"] = None  # the trainer writes a NaN loss as null
    lines.insert(3, {"note": "an unknown line the tool ignores"})
    lines.append({"step": 25, "val_loss": 0.5, "eval_time_s": 0.2})
    with open(path, "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in lines)
        f.write("\n")
    keep = {d["step"]: d for d in lines if "loss" in d}
    return keep, {25: 0.5}


def expected_row(label, keep, val):
    steps = sorted(keep)
    skip = len(steps) // 10  # the tool's medians skip the first 10% of steps
    tps = statistics.median(keep[s]["tokens_per_s_per_rank"] for s in steps[skip:])
    mfu = [keep[s]["mfu"] for s in steps[skip:] if "mfu" in keep[s]]
    return [label, str(len(steps)), str(steps[-1]),
            f"{keep[steps[0]]['loss']:.4f} -> {keep[steps[-1]]['loss']:.4f}",
            f"{val[max(val)]:.4f}", f"{tps:.1f}",
            f"{100 * statistics.median(mfu):.2f}%" if mfu else "n/a"]


def run(tool, args, env=None):
    p = subprocess.run([sys.executable, tool] + args, capture_output=True, text=True, env=env,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    check(head[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: no PNG signature")
    check(head[12:16] == b"IHDR", f"{path}: first chunk is not IHDR")
    return struct.unpack(">II", head[16:24])


def check_pngs(out, stdout, names):
    for name in names:
        path = os.path.join(out, name)
        check(os.path.isfile(path), f"{path} was not written\n{stdout}")
        check(f"wrote {path} ({PNG_W}x{PNG_H})" in stdout, f"no 'wrote' line for {path}\n{stdout}")
        size = png_size(path)
        check(size == (PNG_W, PNG_H), f"{path} is {size[0]}x{size[1]}, not {PNG_W}x{PNG_H}")


def check_rows(stdout, expected):
    rows = {}
    for ln in stdout.splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if len(cells) == 7:
            rows[cells[0]] = cells
    for row in expected:
        check(rows.get(row[0]) == row, f"summary row for {row[0]}: got {rows.get(row[0])}, "
              f"expected {row}\n{stdout}")
    return rows


def test_sweep(tool, work, alpha, beta):
    """A sweep dir: the two runs with steps, labels from the run dirs, PNGs in the sweep dir,
    mfu.png; a failed run (empty metrics.jsonl) and a skipped one (none) are noted."""
    sweep = os.path.join(work, "sweep")
    rc, out, err = run(tool, [sweep])
    check(rc == 0, f"sweep: exit {rc}\n{out}{err}")
    plots = os.path.join(sweep, "plots")  # a folder of their own, by default
    check_pngs(plots, out, CHARTS + ["mfu.png", "breakdown-alpha.png"])
    check(not os.path.exists(os.path.join(plots, "breakdown-beta.png")),
          f"sweep: beta has no breakdown, yet a plot\n{out}")
    check("| tokens/s/GPU (median) |" in out, f"sweep: a GPU run's table says per GPU\n{out}")
    check("loss.png: alpha resumed at step 30 (dotted)" in out, f"sweep: no resume mark\n{out}")
    check("breakdown-alpha.png leaves out what took no time: CP exchange" in out,
          f"sweep: the unused CP phase is drawn\n{out}")
    rows = check_rows(out, [expected_row("alpha", *alpha), expected_row("beta", *beta)])
    check(sorted(rows) == ["---", "alpha", "beta", "run"], f"sweep: rows {sorted(rows)}\n{out}")
    runs = os.path.join(sweep, "runs")
    for note in (f"skipped {runs}/gamma/metrics.jsonl: is empty",
                 f"skipped {runs}/delta: no metrics.jsonl"):
        check(note in out, f"sweep: no note {note!r}\n{out}")


def test_single(tool, work, beta):
    """One file, --label, --smooth, --out: no mfu, so no mfu.png and a line saying so."""
    out_dir = os.path.join(work, "single")
    path = os.path.join(work, "sweep", "runs", "beta", "metrics.jsonl")
    rc, out, err = run(tool, ["--out", out_dir, "--label", "B", "--smooth", "5", path])
    check(rc == 0, f"single: exit {rc}\n{out}{err}")
    check_pngs(out_dir, out, CHARTS)
    check(sorted(os.listdir(out_dir)) == sorted(CHARTS), f"single: {os.listdir(out_dir)}")
    check("mfu.png not written" in out, f"single: no line about the missing mfu\n{out}")
    check("breakdown-*.png not written" in out, f"single: no line about the breakdown\n{out}")
    check("| tokens/s/rank (median) |" in out, f"single: a CPU run's table says per rank\n{out}")
    check_rows(out, [expected_row("B", *beta)])


def snapshot(d):
    """Names, sizes and mtimes in d: an error must neither add nor rewrite a file."""
    if not os.path.isdir(d):
        return None
    return sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(d))


def expect_error(tool, args, out_dir, needle, env=None):
    before = snapshot(out_dir)
    rc, out, err = run(tool, args, env)
    lines = err.strip().splitlines()
    check(rc == 2, f"{args}: exit {rc}, expected 2\n{out}{err}")
    check(len(lines) == 1 and lines[0].startswith("plot_metrics: ") and needle in lines[0],
          f"{args}: expected one stderr line with {needle!r}, got:\n{err}")
    check(out == "", f"{args}: wrote to stdout:\n{out}")
    after = snapshot(out_dir)
    check(after == before, f"{args}: {out_dir} changed: {before} -> {after}")


def test_errors(tool, work):
    bad = os.path.join(work, "bad")
    os.makedirs(bad)
    good = os.path.join(work, "sweep", "runs", "beta", "metrics.jsonl")
    with open(good) as f:
        lines = f.readlines()
    lines[6] = '{"step": 6, "loss": 1.0, "lr"\n'  # a line cut short: line 7
    malformed = os.path.join(bad, "metrics.jsonl")
    with open(malformed, "w") as f:
        f.writelines(lines)
    out_dir = os.path.join(work, "sweep")  # holds the PNGs from test_sweep: must stay as is
    expect_error(tool, ["--out", out_dir, good, malformed], out_dir, f"{malformed}:7: ")
    fresh = os.path.join(work, "never")
    expect_error(tool, ["--out", fresh, malformed], work, f"{malformed}:7: ")
    check(not os.path.exists(fresh), f"{fresh} was created on error")
    empty = os.path.join(bad, "empty.jsonl")
    open(empty, "w").close()
    expect_error(tool, ["--out", out_dir, empty], out_dir, f"{empty}: is empty")
    no_steps = os.path.join(bad, "events.jsonl")
    with open(no_steps, "w") as f:
        f.write('{"step": 0, "event": "start"}\n{"step": 10, "val_loss": 2.0}\n')
    expect_error(tool, ["--out", out_dir, no_steps], out_dir, f"{no_steps}: has no step lines")
    missing = os.path.join(bad, "nope.jsonl")
    expect_error(tool, ["--out", out_dir, missing], out_dir, f"{missing}: does not exist")
    expect_error(tool, ["--out", out_dir, "--label", "x", os.path.join(work, "sweep")], out_dir,
                 "--label: 1 given for 2 runs")
    failed = os.path.join(bad, "failed_sweep")
    os.makedirs(os.path.join(failed, "runs", "000-a"))
    shutil.copy(empty, os.path.join(failed, "runs", "000-a", "metrics.jsonl"))
    expect_error(tool, [failed], failed, f"{failed}: none of its runs has logged a step")


def test_no_matplotlib(tool, work):
    """A matplotlib that fails to import gives the install hint."""
    fake = os.path.join(work, "fake_site", "matplotlib")
    os.makedirs(fake)
    with open(os.path.join(fake, "__init__.py"), "w") as f:
        f.write("raise ImportError('fake: not installed')\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(fake))
    out_dir = os.path.join(work, "sweep")
    expect_error(tool, ["--out", out_dir, os.path.join(work, "sweep")], out_dir,
                 "matplotlib is missing; apt-get install python3-matplotlib", env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    try:
        import matplotlib  # the tool runs under this interpreter
        del matplotlib
    except ImportError:
        print(f"FAIL: {sys.executable} has no matplotlib; run this test with /usr/bin/python3 "
              "or apt-get install python3-matplotlib")
        return 1
    work = os.path.abspath(os.path.join(args.work, "plot_metrics_test"))
    shutil.rmtree(work, ignore_errors=True)
    for name in ("alpha", "beta", "gamma", "delta"):
        os.makedirs(os.path.join(work, "sweep", "runs", name))
    open(os.path.join(work, "sweep", "runs", "gamma", "metrics.jsonl"), "w").close()  # failed
    alpha = write_alpha(os.path.join(work, "sweep", "runs", "alpha", "metrics.jsonl"))
    beta = write_beta(os.path.join(work, "sweep", "runs", "beta", "metrics.jsonl"))
    try:
        test_sweep(args.tool, work, alpha, beta)
        test_single(args.tool, work, beta)
        test_errors(args.tool, work)
        test_no_matplotlib(args.tool, work)
    except (Fail, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}")
        return 1
    print("PASS: plot_metrics writes 800x500 PNGs, the right summary, and one-line errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
