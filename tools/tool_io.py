"""The Python tools' promise (docs/operations.md): one line on stderr, never a traceback, and
exit 2 for bad input, 1 for a failure of the machine (an output that cannot be written, a full
disk), 130 when interrupted. Also the one reader of a metrics.jsonl line they share."""
import argparse
import json
import sys

BAD_INPUT, MACHINE, INTERRUPTED = 2, 1, 130


class InputError(Exception):
    """Bad input, one line for the user: '<file>: <problem>; <fix>'."""


class MachineError(Exception):
    """A failure of the machine, one line: '<file>: <what failed> (<reason>)'."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (argparse prints the usage too), exit 2."""

    def error(self, message):
        self.exit(BAD_INPUT, f"{self.prog}: {message}; see --help\n")


def parse_line(path, n, raw):
    """A metrics.jsonl line (bytes) → its JSON value, or None when it is not JSON (a line a crash
    cut short, which the caller may skip). Not UTF-8 or nested too deeply: InputError."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}:{n}: is not UTF-8 text (byte {e.start + 1}); is it the "
                         "trainer's metrics.jsonl? fix or delete that line")
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(f"{path}:{n}: is nested too deeply to be a metrics line; "
                         "fix or delete that line")
    except json.JSONDecodeError:
        return None


def read_text(path, what="file"):
    """A whole UTF-8 text file; a missing, unreadable or non-UTF-8 one is InputError."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror}); pass a readable {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: is not UTF-8 text (byte {e.start + 1}); pass the {what}")


def run(prog, main):
    """sys.exit(main()) with the promise: InputError → 2, MachineError and OSError → 1,
    Ctrl-C → 130, each as one line on stderr."""
    try:
        code = main()
    except InputError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        code = BAD_INPUT
    except MachineError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        code = MACHINE
    except OSError as e:  # writing an output: read-only file system, full disk, permissions
        where = f"{e.filename}: " if e.filename else ""
        print(f"{prog}: {where}{e.strerror or e}; check the disk and the output path",
              file=sys.stderr)
        code = MACHINE
    except MemoryError:
        print(f"{prog}: out of memory", file=sys.stderr)
        code = MACHINE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        code = INTERRUPTED
    sys.exit(code)
