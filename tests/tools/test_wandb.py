#!/usr/bin/env python3
"""tools/wandb_log against the `wandb` package (PyPI, in a venv kept under --venv; without PyPI
the test reports skipped, exit 77, never passed), offline: no network.

A tiny run of 8 steps (an evaluation every 4) trains while `tools/wandb_log --follow --mode
offline` follows its metrics.jsonl; the follower must end by itself at the trainer's exit. The
W&B run file it leaves (run-*.wandb, read here independently of wandb: a LevelDB-style log of
protobuf records) must hold every number of every step and evaluation line under the tag
`trainer --help-metrics` gives it (TensorBoard's), equal to metrics.jsonl's.

usage: test_wandb.py --trainer BIN --prepare-data BIN --tool tools/wandb_log --venv DIR --work DIR
"""
import argparse
import glob
import importlib.machinery
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pypi  # noqa: E402
import tiny_run  # noqa: E402

PINS = ["wandb==0.31.0"]

# Runs inside the venv: the history rows of a W&B run file, as JSON on stdout.
ORACLE = r"""
import json, struct, sys
from wandb.proto import wandb_internal_pb2 as pb

def records(path):
    # A 7-byte header (':W&B', magic, version), then blocks of 32 KiB holding records of a
    # 7-byte header (crc32c, length, type: 1 full, 2 first, 3 middle, 4 last) and their data.
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:7]
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        payload = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield payload
        elif kind == 2:
            parts = payload
        elif kind == 3:
            parts += payload
        elif kind == 4:
            yield parts + payload

rows = []
for payload in records(sys.argv[1]):
    rec = pb.Record()
    rec.ParseFromString(payload)
    if rec.WhichOneof("record_type") == "history":
        rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in rec.history.item})
print(json.dumps(rows))
"""


def fail(what):
    raise SystemExit(f"test_wandb: {what}")


def load_tool(path):
    loader = importlib.machinery.SourceFileLoader("wandb_log", path)
    spec = importlib.util.spec_from_loader("wandb_log", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--trainer", "--prepare-data", "--tool", "--venv", "--work"):
        ap.add_argument(flag, required=True)
    a = ap.parse_args()
    py = pypi.venv_python(a.venv, "import wandb", PINS, "test_wandb", "wandb", "wandb")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    subprocess.run([a.prepare_data, "--output", os.path.join(a.work, "data"), "--synthetic",
                    "20000", "--vocab", "257"], check=True, capture_output=True)
    cfg = tiny_run.write_config(a.work, steps=8, checkpoint_interval=0, log_interval=4,
                                tensorboard=False)
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_SILENT="true")
    trainer = subprocess.Popen([a.trainer, "--config", cfg], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    metrics = os.path.join(a.work, "log", "metrics.jsonl")
    deadline = time.time() + 60
    while not os.path.exists(metrics):
        if time.time() > deadline:
            fail("the trainer wrote no metrics.jsonl")
        time.sleep(0.02)
    follower = subprocess.Popen([py, a.tool, os.path.join(a.work, "log"), "--project", "trainer",
                                 "--mode", "offline", "--follow", "--dir", a.work],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    if trainer.wait(timeout=120) != 0:
        fail(f"the trainer exited {trainer.returncode}")
    try:
        out, _ = follower.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        follower.kill()
        fail("wandb_log --follow did not end at the trainer's exit")
    if follower.returncode != 0 or "lines of" not in out:
        fail(f"wandb_log exited {follower.returncode}:\n{out}")

    files = glob.glob(os.path.join(a.work, "wandb", "offline-run-*", "run-*.wandb"))
    if len(files) != 1:
        fail(f"expected one offline run file, found {files}")
    r = subprocess.run([py, "-c", ORACLE, files[0]], capture_output=True, text=True)
    if r.returncode:
        fail(f"reading the run file failed:\n{r.stderr}")
    logged = {}  # step -> every tag logged for it
    for row in json.loads(r.stdout):
        logged.setdefault(row.get("step"), {}).update(row)

    tool = load_tool(a.tool)
    table = subprocess.run([a.trainer, "--help-metrics"], capture_output=True, text=True).stdout
    tags = {}
    for line in table.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[3] and "/" in cells[3]:
            tags[cells[0]] = cells[3]
    failures = []
    if len(tags) < 20:
        failures.append(f"only {len(tags)} tagged keys in trainer --help-metrics")
    for key, tag in tags.items():
        if tool.section(key) + key != tag:
            failures.append(f"{key}: wandb_log tags it {tool.section(key) + key}, the trainer {tag}")
    checked = 0
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if "event" in j or "step" not in j:
                continue
            for k, v in j.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or k in ("step", "time"):
                    continue
                have = logged.get(j["step"], {}).get(tags.get(k, f"?/{k}"))
                if have != v:
                    failures.append(f"{k} at step {j['step']}: W&B {have}, metrics.jsonl {v}")
                checked += 1
    if checked < 8 * 15:
        failures.append(f"only {checked} numbers compared")
    if failures:
        fail("\n".join(failures[:20]))
    print(f"test_wandb: passed: {checked} numbers of {len(logged)} steps, {len(tags)} tags")


if __name__ == "__main__":
    main()
