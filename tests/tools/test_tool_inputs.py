#!/usr/bin/env python3
"""The Python tools' promise (docs/operations.md) on damaged files: one line on stderr, never
a traceback, exit 2 for bad input, 1 for an output the machine cannot write, 130 for Ctrl-C;
and tools/wandb_log --follow's ends: the exit event, the trainer's lock holder gone (kill -9),
--idle-timeout, Ctrl-C (the W&B run finished), and started before metrics.jsonl exists.

wandb_log runs against a stand-in `wandb` module (put first on PYTHONPATH) that records every
call in a JSON file: no PyPI, no network. Nothing waits a fixed time: each step waits for a
condition (a line on the tool's stdout, a record in that file) under a generous deadline.

usage: test_tool_inputs.py --tools DIR --work DIR     (DIR: the tools/ folder; exit 0: pass)
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

DEADLINE_S = 60  # only a hang reaches it

FAKE_WANDB = r'''
import json, os
class Run:
    name = "fake"
    def __init__(self, **kw):
        self.rec = {"init": kw, "logs": [], "finished": None}
        self._dump()
    def define_metric(self, *a, **k):
        pass
    def log(self, d):
        self.rec["logs"].append(d)
        self._dump()
    def finish(self, exit_code=None):
        self.rec["finished"] = 0 if exit_code is None else exit_code
        self._dump()
    def _dump(self):
        out = os.environ["FAKE_WANDB_OUT"]
        with open(out + ".tmp", "w") as f:
            json.dump(self.rec, f)
        os.replace(out + ".tmp", out)
def init(**kw):
    return Run(**kw)
'''


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


class Env:
    def __init__(self, tools, work):
        self.tools, self.work = tools, work
        fake = os.path.join(work, "fake_site", "wandb")
        os.makedirs(fake, exist_ok=True)
        with open(os.path.join(fake, "__init__.py"), "w") as f:
            f.write(FAKE_WANDB)
        self.record = os.path.join(work, "wandb_record.json")
        self.env = dict(os.environ, PYTHONPATH=os.path.dirname(fake),
                        FAKE_WANDB_OUT=self.record, MPLBACKEND="Agg")

    def cmd(self, tool, args):
        return [sys.executable, os.path.join(self.tools, tool)] + args

    def run(self, tool, args):
        if os.path.exists(self.record):
            os.remove(self.record)
        p = subprocess.run(self.cmd(tool, args), capture_output=True, text=True, env=self.env,
                           timeout=DEADLINE_S)
        return p.returncode, p.stdout, p.stderr

    def recorded(self):
        try:
            with open(self.record) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None


def expect(env, tool, args, codes, needle=""):
    """The tool exits with one of codes; a non-zero exit says one line, `<tool>: ...`."""
    rc, out, err = env.run(tool, args)
    what = f"{tool} {' '.join(args)[:200]}"
    check("Traceback" not in err + out, f"{what}: a traceback (exit {rc}):\n{err[-3000:]}")
    check(rc in codes, f"{what}: exit {rc}, expected {codes}\n{err[-2000:]}")
    if rc:
        lines = err.strip().splitlines()
        prog = os.path.basename(tool).removesuffix(".py")
        check(len(lines) == 1 and lines[0].startswith((f"{prog}: ", f"{prog}.py: "))
              and needle in lines[0],
              f"{what}: expected one stderr line `{prog}: ...{needle}...`, got:\n{err[-2000:]}")
    return rc, out


def good_lines(steps=3, exit_event=True):
    lines = [{"event": "start", "step": 0, "time": 1000.0, "startup_s": 0.5}]
    for s in range(1, steps + 1):
        lines.append({"step": s, "loss": 5.0 - s / 10, "lr": 1e-3, "grad_norm": 1.0,
                      "step_time_s": 0.1, "time": 1000.0 + s / 10, "tokens_per_s_per_rank": 10.0})
    if exit_event:
        lines.append({"event": "exit", "code": 0, "step": steps, "time": 1001.0})
    return "".join(json.dumps(d) + "\n" for d in lines).encode()


def damaged(work):
    """name -> a log dir whose metrics.jsonl is damaged so; and the exits each may give."""
    good = good_lines()
    rnd = random.Random(56)
    cases = {
        "invalid UTF-8": good + b'{"step": 4, "loss": 1.0, "note": "\xff\xfe"}\n',
        "binary garbage": rnd.randbytes(8192),
        "nested 50,000 deep": good + b"[" * 50000 + b"]" * 50000 + b"\n",
        "nested object 50,000 deep": good + b'{"a":' * 50000 + b"1" + b"}" * 50000 + b"\n",
        "truncated line": good[:40] + b"\n" + good[40:] + good[:25],
        "empty": b"",
    }
    dirs = {}
    for name, data in cases.items():
        d = os.path.join(work, "damaged", name.replace(" ", "_").replace(",", ""))
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "metrics.jsonl"), "wb") as f:
            f.write(data)
        dirs[name] = d
    d = os.path.join(work, "damaged", "directory")
    os.makedirs(os.path.join(d, "metrics.jsonl"), exist_ok=True)  # a directory, not a file
    dirs["a directory for metrics.jsonl"] = d
    return dirs


def unwritable(work):
    """A directory path that cannot be created (EPERM/EACCES/EROFS), also as root."""
    ro = os.path.join(work, "read_only")
    os.makedirs(ro, exist_ok=True)
    os.chmod(ro, 0o555)
    if not os.access(ro, os.W_OK):
        return os.path.join(ro, "out")
    for parent in ("/sys", "/proc"):  # root: a kernel file system refuses a new directory
        try:
            os.mkdir(os.path.join(parent, "tr_test_tool_inputs"))
            os.rmdir(os.path.join(parent, "tr_test_tool_inputs"))
        except OSError:
            return os.path.join(parent, "tr_test_tool_inputs")
    raise Fail("no unwritable directory found to test with")


def test_damaged(env, work):
    dirs = damaged(work)
    ok_or_bad = (0, 2)  # truncated lines: the trainer's crash leaves them; skipped or refused
    for name, d in dirs.items():
        codes = ok_or_bad if name == "truncated line" else (2,)
        expect(env, "wandb_log", [d, "--project", "p", "--mode", "offline"], codes)
        expect(env, "plot_metrics", ["--out", os.path.join(work, "plots"), d], codes)
        expect(env, "goodput", [d], codes)
        expect(env, "goodput", [os.path.join(d, "metrics.jsonl"), "--json"], codes)
        check(env.recorded() is None or name == "truncated line",
              f"wandb_log logged the {name} file")
    nested = dirs["nested 50,000 deep"]
    expect(env, "plot_metrics", [nested], (2,), "nested too deeply")
    expect(env, "wandb_log", [nested, "--project", "p"], (2,), "nested too deeply")
    expect(env, "wandb_log", [dirs["invalid UTF-8"], "--project", "p"], (2,), "not UTF-8")
    # A config.yaml not UTF-8, or a directory.
    for name, make in (("config_latin1", lambda p: open(p, "wb").write(b"model: caf\xe9\n")),
                       ("config_dir", os.makedirs)):
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "metrics.jsonl"), "wb") as f:
            f.write(good_lines())
        make(os.path.join(d, "config.yaml"))
        expect(env, "wandb_log", [d, "--project", "p"], (2,), "config.yaml")
        check(env.recorded() is None, f"wandb_log logged with a bad config.yaml ({name})")
    # LOG_DIR a file; a bad flag: one line, not argparse's usage and error.
    expect(env, "wandb_log", [os.path.join(nested, "metrics.jsonl"), "--project", "p"], (2,))
    expect(env, "wandb_log", [nested, "--project", "p", "--bogus"], (2,), "--bogus")
    expect(env, "plot_metrics", ["--smooth", "x", nested], (2,), "--smooth")
    expect(env, "goodput", [nested, "--bogus"], (2,), "--bogus")


def test_outputs(env, work):
    """An output the machine cannot write: exit 1, one line naming it."""
    run = os.path.join(work, "good")
    os.makedirs(run, exist_ok=True)
    with open(os.path.join(run, "metrics.jsonl"), "wb") as f:
        f.write(good_lines(steps=12))
    out = unwritable(work)
    expect(env, "plot_metrics", ["--out", out, run], (1,), "tr_test_tool_inputs"
           if out.startswith(("/sys", "/proc")) else "out")
    expect(env, "goodput", [run, "--plot", os.path.join(out, "g.png")], (1,))
    expect(env, "plot_metrics", ["--out", os.path.join(run, "metrics.jsonl"), run], (2,),
           "not a directory")


def test_sweep_ncu(env, work):
    d = os.path.join(work, "files")
    os.makedirs(d, exist_ok=True)
    files = {"latin1.yaml": b"base: caf\xe9.yaml\n", "garbage.yaml": bytes(range(256)) * 8,
             "nested.yaml": b"[" * 50000 + b"]" * 50000 + b"\n",
             "garbage.csv": random.Random(1).randbytes(4096),
             "header_only.csv": b'"ID","Kernel Name","gpu__time_duration.sum"\n'}
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    for name in ("latin1.yaml", "garbage.yaml", "nested.yaml"):
        expect(env, "sweep", [os.path.join(d, name), "--dry-run"], (2,))
    expect(env, "sweep", [d, "--dry-run"], (2,))  # a directory
    expect(env, "sweep", [os.path.join(d, "latin1.yaml"), "--bogus"], (2,), "--bogus")
    expect(env, "ncu_table.py", [os.path.join(d, "garbage.csv")], (2,), "not UTF-8")
    expect(env, "ncu_table.py", [os.path.join(d, "header_only.csv")], (1,), "no profiled kernel")
    expect(env, "ncu_table.py", [d], (2,))
    expect(env, "ncu_table.py", [os.path.join(d, "none.csv")], (2,))
    expect(env, "ncu_table.py", [os.path.join(d, "garbage.csv"), "--steps", "0"], (2,))
    expect(env, "torch_baseline.py", ["--steps", "x"], (2,), "--steps")
    expect(env, "torch_baseline.py", ["--config", d, "--trainer", "/nonexistent"], (2,))


def sigint_default():
    """Ctrl-C as in a terminal: ctest or a background job may start this test ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Follower:
    """tools/wandb_log --follow in the background, its stdout read line by line."""

    def __init__(self, env, log_dir, *extra):
        if os.path.exists(env.record):
            os.remove(env.record)
        self.env = env
        self.p = subprocess.Popen(env.cmd("wandb_log", [log_dir, "--project", "p", "--follow",
                                                        *extra]),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env.env, preexec_fn=sigint_default)

    def wait_line(self, needle):
        for line in self.p.stdout:  # blocks until the tool prints it (or exits)
            if needle in line:
                return
        raise Fail(f"wandb_log --follow exited {self.p.wait()} before printing {needle!r}:\n"
                   f"{self.p.stderr.read()}")

    def wait_logged(self, n):
        deadline = time.monotonic() + DEADLINE_S
        while True:
            rec = self.env.recorded()
            if rec and len(rec["logs"]) >= n:
                return rec
            if self.p.poll() is not None:
                raise Fail(f"wandb_log --follow exited {self.p.returncode} before logging {n} "
                           f"lines:\n{self.p.stderr.read()}")
            check(time.monotonic() < deadline, f"wandb_log --follow logged no {n} lines")
            time.sleep(0.05)

    def end(self):
        try:
            out, err = self.p.communicate(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.communicate()
            raise Fail("wandb_log --follow never ended")
        check("Traceback" not in err, f"wandb_log --follow: a traceback:\n{err}")
        return self.p.returncode, out, err


def write(path, data):
    """Appends data at once (the trainer writes a line in one write)."""
    with open(path, "ab") as f:
        f.write(data)


def lock_of(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        start = int(f.read().rsplit(b")", 1)[1].split()[19])
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return {"host": socket.gethostname(), "boot_id": boot, "pid": pid, "pid_start": start,
            "slurm_job": "", "started": "2026-01-01T00:00:00Z", "heartbeat_s": 10}


def test_follow(env, work):
    # Ctrl-C: the W&B run is finished with what was logged; exit 130, one line.
    d = os.path.join(work, "follow_int")
    os.makedirs(d)
    write(os.path.join(d, "metrics.jsonl"), good_lines(steps=2, exit_event=False))
    f = Follower(env, d, "--idle-timeout", "0")
    f.wait_logged(2)
    f.p.send_signal(signal.SIGINT)
    rc, out, err = f.end()
    check(rc == 130 and len(err.strip().splitlines()) == 1 and "interrupted" in err,
          f"Ctrl-C: exit {rc}, expected 130 and one line:\n{err}")
    check(env.recorded()["finished"] is not None, "Ctrl-C: the W&B run was not finished")

    # kill -9: the lock in checkpoint.dir names a process of this host that is then gone.
    d = os.path.join(work, "follow_kill")
    ckpt = os.path.join(work, "follow_kill_ckpt")
    os.makedirs(d)
    os.makedirs(ckpt)
    with open(os.path.join(d, "config.yaml"), "w") as fh:
        fh.write(f"model:\n  hidden_size: 64\ncheckpoint:\n  interval: 0\n  dir: {ckpt}\n"
                 "log:\n  dir: x\n")
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(os.path.join(ckpt, "trainer.lock"), "w") as fh:
        json.dump(lock_of(trainer.pid), fh)
    write(os.path.join(d, "metrics.jsonl"), good_lines(steps=2, exit_event=False))
    f = Follower(env, d, "--idle-timeout", "0")
    f.wait_logged(2)
    last = good_lines(steps=3, exit_event=False)[len(good_lines(steps=2, exit_event=False)):]
    write(os.path.join(d, "metrics.jsonl"), last)  # the killed trainer's last line
    trainer.kill()
    trainer.wait()
    rc, out, err = f.end()
    check(rc == 0 and "the trainer is gone" in out, f"kill -9: exit {rc}:\n{out}{err}")
    rec = env.recorded()
    check(rec["finished"] == 0 and len(rec["logs"]) == 3, f"kill -9: recorded {rec}")

    # --idle-timeout: no lock to read (another host); the file stops growing.
    d = os.path.join(work, "follow_idle")
    os.makedirs(d)
    write(os.path.join(d, "metrics.jsonl"), good_lines(steps=2, exit_event=False))
    rc, out, err = Follower(env, d, "--idle-timeout", "1").end()
    check(rc == 0 and "no line for 1 s" in out, f"--idle-timeout: exit {rc}:\n{out}{err}")
    check(env.recorded()["finished"] == 0, "--idle-timeout: the W&B run was not finished")

    # Started before the trainer: waits for log.dir/metrics.jsonl, then follows to the exit.
    d = os.path.join(work, "follow_first")
    f = Follower(env, d, "--idle-timeout", "0")
    f.wait_line("waiting for")
    os.makedirs(d)
    write(os.path.join(d, "metrics.jsonl"), good_lines(steps=2))
    rc, out, err = f.end()
    check(rc == 0 and "2 lines of" in out, f"started first: exit {rc}:\n{out}{err}")
    # ... and gives up after --idle-timeout when it never appears.
    rc, out, err = Follower(env, os.path.join(work, "never"), "--idle-timeout", "1").end()
    check(rc == 2 and len(err.strip().splitlines()) == 1 and "did not appear" in err,
          f"never created: exit {rc}:\n{err}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tools", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    work = os.path.abspath(os.path.join(a.work, "tool_inputs"))
    subprocess.run(["rm", "-rf", work], check=True)
    os.makedirs(work)
    env = Env(os.path.abspath(a.tools), work)
    failures = []
    for test in (test_damaged, test_outputs, test_sweep_ncu, test_follow):
        try:
            test(env, work)
        except (Fail, subprocess.TimeoutExpired) as e:
            failures.append(f"{test.__name__}: {e}")
    if failures:
        print("FAIL:\n" + "\n".join(failures))
        return 1
    print("test_tool_inputs: passed: one line and exit 2/1/130 from every tool on damaged "
          "files; wandb_log --follow ends after a kill -9, idle, Ctrl-C and waits to start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
