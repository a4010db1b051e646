#!/usr/bin/env bash
# prepare_data, preflight, bench_ops and bench_data read their flags through one parser
# (tools/flags.h), as processes: an unknown flag and a bad value are one line on stderr naming the
# flag, and exit 2; --help lists every flag the tool's file defines (ABSL_FLAG), and no other, and
# exits 0 (bench_data's with its defaults);
# prepare_data's positional INPUTs still work, with flags before, between and after them.
#   test_tool_flags.sh BUILD_DIR WORK_DIR
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

# `expect_bad TOOL WANT ARGS...`: exit 2, nothing on stdout, one line on stderr containing WANT.
expect_bad() {
  local tool=$1 want=$2 rc=0
  shift 2
  "$build/tools/$tool" "$@" >"$work/out" 2>"$work/err" || rc=$?
  [ $rc = 2 ] || fail "$tool $*: exit $rc, not 2: $(cat "$work/err")"
  [ ! -s "$work/out" ] || fail "$tool $*: wrote to stdout: $(cat "$work/out")"
  [ "$(wc -l <"$work/err")" = 1 ] || fail "$tool $*: not one line: $(cat "$work/err")"
  grep -qF -- "$want" "$work/err" || fail "$tool $*: '$want' not in: $(cat "$work/err")"
}

expect_bad prepare_data "unknown flag --outptu; did you mean --output? (--help lists them)" \
  --outptu "$work/x" in.txt
expect_bad preflight "unknown flag --bogus (--help lists them)" --bogus 1
expect_bad bench_ops "unknown flag --confg; did you mean --config?" --confg x.yaml
expect_bad bench_data "unknown flag --seq-lne; did you mean --seq-len? (--help lists them)" \
  --seq-lne 512
expect_bad prepare_data "--threads 'abc' is not an integer" --output "$work/x" --threads=abc in.txt
expect_bad preflight "--iters 'abc' is not a positive integer" --iters=abc
expect_bad bench_ops "--nodes 'abc' is not a positive integer" --config x.yaml --nodes abc
expect_bad bench_data "--steps '0' is not a positive integer" --seq-len 512 --steps 0
expect_bad bench_data "--samples '8x' is not a positive integer" --samples=8x
expect_bad bench_data "unexpected argument '512'" --doc-len 100 512
# A --dir already holding a dataset of bench_data's names is refused, and left as it was.
mkdir -p "$work/held" && printf 'mine' >"$work/held/docs.idx"
expect_bad bench_data "--dir $work/held already holds docs.idx; name a directory without it" \
  --dir "$work/held"
[ "$(cat "$work/held/docs.idx")" = mine ] || fail "bench_data changed an existing docs.idx"
expect_bad prepare_data "--output needs a value" in.txt --output
expect_bad preflight "unexpected argument 'stray'" --iters 2 stray

# --help: stdout, exit 0, and a "  --name (type...)" line for each ABSL_FLAG of the tool's file.
for tool in prepare_data preflight bench_ops bench_data; do
  "$build/tools/$tool" --help >"$work/help" 2>"$work/err" || fail "$tool --help: exit $?"
  [ ! -s "$work/err" ] || fail "$tool --help wrote to stderr: $(cat "$work/err")"
  head -1 "$work/help" | grep -q "^usage: $tool " || fail "$tool --help: no usage line"
  python3 - "$src/tools/$tool.cpp" "$work/help" "$tool" <<'PY' || exit 1
import re, sys
source, help_text, tool = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
defined = sorted(n.replace("_", "-") for n in re.findall(r"ABSL_FLAG\(\s*[^,]+,\s*(\w+),", source))
listed = sorted(re.findall(r"^  --([\w-]+) \(", help_text, re.M))
assert len(defined) >= {"bench_data": 5}.get(tool, 8), (tool, defined)
assert listed == defined, (tool, "listed", listed, "defined", defined)
PY
done
cmp <("$build/tools/preflight" -h) <("$build/tools/preflight" --help) || fail "-h is not --help"
# bench_data's defaults, as its help shows them.
"$build/tools/bench_data" --help >"$work/help"
for want in "seq-len (positive integer; default 4096)" "samples (positive integer; default 64)" \
  "doc-len (positive integer; default 1000)" "steps (positive integer; default 20)"; do
  grep -qF -- "  --$want" "$work/help" || fail "bench_data --help: no '--$want'"
done

# Positional INPUTs among flags, "--" before one that looks like a flag, and --name=VALUE.
printf 'one' >"$work/a.txt"
printf 'two' >"$work/b.txt"
printf 'three' >"$work/--c.txt"
(cd "$work" && "$build/tools/prepare_data" a.txt --format text b.txt --output=out -- --c.txt) \
  >"$work/wrote" || fail "prepare_data with positionals: exit $?"
grep -q "^prepare_data: wrote 3 documents (0 empty skipped), 14 tokens" "$work/wrote" ||
  fail "prepare_data: $(cat "$work/wrote")"
[ -s "$work/out.bin" ] && [ -s "$work/out.idx" ] || fail "no out.bin / out.idx"
echo "test_tool_flags: passed"
