"""Set-up shared by the tests whose oracle comes from PyPI (installed into a venv by the test):
whether PyPI answers, and what a failed installation means: skipped (exit 77, never passed)
when PyPI cannot be reached, a failure otherwise."""
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
