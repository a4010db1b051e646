#!/usr/bin/env python3
"""The trainer's TensorBoard event files against the `tensorboard` package (PyPI, in a venv kept
under --venv; without PyPI the test reports skipped, exit 77, never passed).

A tiny run of 12 steps is killed with kill -9 while step 9 hangs (steps 1-8 logged, the
checkpoint at 5 committed) and resumed with --resume auto to the end. TensorBoard's
EventAccumulator then reads log.dir/tb (two event files, one per process) and must give every
scalar of metrics.jsonl at every step, as the run's history keeps them (the resumed process's
steps 6-8, not the killed one's), to float32 precision, and the resolved config as text.

usage: test_tensorboard.py --trainer BIN --prepare-data BIN --venv DIR --work DIR
"""
import argparse
import json
import struct
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pypi  # noqa: E402
import tiny_run  # noqa: E402

PINS = ["tensorboard==2.20.0"]


def venv_python(venv):
    """A venv with tensorboard."""
    return pypi.venv_python(venv, "from tensorboard.backend.event_processing import "
                            "event_accumulator", PINS, "test_tensorboard", "tensorboard",
                            "tensorboard")


# Runs inside the venv: the event files as TensorBoard reads them, as JSON on stdout.
ORACLE = r"""
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
acc.Reload()
tags = acc.Tags()
out = {"scalars": {t: {str(e.step): e.value for e in acc.Scalars(t)} for t in tags["scalars"]},
       "text": {t: [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(t)]
                for t in tags["tensors"]}}
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--prepare-data", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    py = venv_python(a.venv)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    text = os.path.join(a.work, "text.txt")
    with open(text, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog. " * 400)
    subprocess.run([a.prepare_data, "--format", "text", "--output",
                    os.path.join(a.work, "data"), text], check=True, capture_output=True)
    cfg = tiny_run.write_config(a.work, steps=12, checkpoint_interval=5, log_interval=3)
    env = dict(os.environ, OMP_NUM_THREADS="1", TR_TEST_FAULT="hang:9")
    p = subprocess.Popen([a.trainer, "--config", cfg], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    stat = f"/proc/{p.pid}/stat"
    deadline = time.time() + 120
    while open(stat).read().split(") ")[1][0] != "T":  # stopped itself at step 9
        if time.time() > deadline or p.poll() is not None:
            raise SystemExit("test_tensorboard: the first run did not stop at step 9")
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    env.pop("TR_TEST_FAULT")
    r = subprocess.run([a.trainer, "--config", cfg], env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"test_tensorboard: the resumed run exited {r.returncode}:\n{r.stdout}"
                         f"{r.stderr}")

    # metrics.jsonl as the run's history keeps it: the last line of each step, a resume line
    # dropping the later steps logged before it.
    steps, evals = {}, {}
    for line in open(os.path.join(a.work, "log", "metrics.jsonl")):
        try:
            j = json.loads(line)
        except json.JSONDecodeError:
            continue
        if j.get("event") == "resume":
            steps = {s: v for s, v in steps.items() if s <= j["step"]}
            evals = {s: v for s, v in evals.items() if s <= j["step"]}
        elif "loss" in j:
            steps[j["step"]] = j
        elif "val_loss" in j:
            evals[j["step"]] = j
    files = sorted(os.listdir(os.path.join(a.work, "log", "tb")))
    tb = subprocess.run([py, "-c", ORACLE, os.path.join(a.work, "log", "tb")],
                        capture_output=True, text=True)
    if tb.returncode:
        raise SystemExit(f"test_tensorboard: EventAccumulator failed:\n{tb.stderr}")
    got = json.loads(tb.stdout)
    failures = []
    # Tags are grouped into four sections (trainer/obs/metrics.h tb_tag): section/key.
    sections = {t.split("/", 1)[0] for t in got["scalars"]}
    if not sections <= {"train", "perf", "memory", "time"} or any("/" not in t for t in got["scalars"]):
        failures.append(f"tags outside train/, perf/, memory/, time/: {sorted(got['scalars'])}")
    for tag in ("train/loss", "train/val_loss", "time/time_forward_s", "perf/tokens_per_s",
                "memory/peak_mem_mib"):
        if tag not in got["scalars"]:
            failures.append(f"no tag {tag}")
    scalars = {t.split("/", 1)[-1]: v for t, v in got["scalars"].items()}

    def same(tag, step, want):
        have = scalars.get(tag, {}).get(str(step))
        f32 = struct.unpack("f", struct.pack("f", want))[0]
        if have is None or have != f32:
            failures.append(f"{tag} at step {step}: tensorboard {have}, metrics.jsonl {want}")

    checked = 0
    for s, j in steps.items():
        for k, v in j.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time"):
                same(k, s, v)
                checked += 1
    for s, j in evals.items():
        same("val_loss", s, j["val_loss"])
        same("eval_time_s", s, j["eval_time_s"])
        checked += 2
    # No step that the history dropped: each tag has exactly the history's steps.
    for tag in ("loss", "grad_norm", "time_forward_s"):
        have = sorted(int(s) for s in scalars.get(tag, {}))
        if have != sorted(steps):
            failures.append(f"{tag}: steps {have}, the history's {sorted(steps)}")
    config = got["text"].get("config", [])
    if not config or "```yaml" not in config[0][1] or "num_layers: 2" not in config[0][1]:
        failures.append(f"the config text: {config}")
    print(f"event files: {files}")
    print(f"{len(steps)} steps, {len(evals)} evaluations, {checked} scalars compared")
    if len(files) != 2 or sorted(steps) != list(range(1, 13)) or checked < 12 * 20:
        failures.append(f"expected 2 files and steps 1-12, got {files}, {sorted(steps)}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures[:20]))
        return 1
    print("test_tensorboard: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
