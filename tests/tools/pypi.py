"""Set-up shared by the tests whose oracle comes from PyPI (installed into a venv by the test):
whether PyPI answers, and what a failed installation means: skipped (exit 77, never passed)
when PyPI cannot be reached, a failure otherwise."""
import fcntl
import os
import subprocess
import sys
import urllib.request

SKIP = 77


def reachable(package):
    try:
        urllib.request.urlopen(f"https://pypi.org/simple/{package}/", timeout=10)
        return True
    except OSError:
        return False


def setup_failed(test, package, what, error):
    """Exits: 77 with a `skipped:` line when PyPI cannot be reached, else the set-up error."""
    if not reachable(package):
        print("skipped: needs pip: PyPI could not be reached (network, proxy or TLS "
              f"certificates) to install {what}")
        sys.exit(SKIP)
    raise SystemExit(f"{test}: set-up failed: {error}")


def venv_python(venv, probe, pins, test, package, what):
    """The python of a venv at `venv` in which `probe` (Python code) runs, installing `pins`
    when it does not; kept between runs, one installer at a time across test processes. A
    failed installation: skipped when PyPI cannot be reached (setup_failed), else an error."""
    py = os.path.join(venv, "bin", "python")
    os.makedirs(os.path.dirname(venv) or ".", exist_ok=True)
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not os.path.exists(py):
                subprocess.run([sys.executable, "-m", "venv", venv], check=True)
            if subprocess.run([py, "-c", probe], capture_output=True).returncode:
                subprocess.run([py, "-m", "pip", "install", "-q", "--no-cache-dir", *pins],
                               check=True)
        except subprocess.CalledProcessError as e:
            setup_failed(test, package, what, e)
    return py
