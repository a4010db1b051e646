#!/usr/bin/env bash
# The GPU window's scripts on a machine without a GPU, so that a scripting error never costs
# GPU time: tools/gpu_check.sh's staging, clock, summary and skips (the dry run of `first`), the
# windows docs/gpu.md names fitting their budgets, a run killed mid-stage returning the stages
# before it, the fallback build's missing packages named, and tools/gpu_pack.sh's pack moved
# into another directory, whose CPU tests pass there reading that directory's files, refused
# once it leaves less than its margin.
#
#   test_gpu_check.sh BUILD_DIR WORK_DIR
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
work=$2
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
fail() {
  echo "FAIL: $*"
  exit 1
}
# expect FILE REGEX: FILE has a line matching REGEX (extended).
expect() { grep -qE "$2" "$1" || { cat "$1"; fail "no line matching '$2' in $1"; }; }

echo "== the dry run of 'first': every stage reports, each GPU stage skipped and why"
bash "$src/tools/gpu_check.sh" --build "$build" --out "$work/first" first >"$work/first.log" 2>&1 ||
  { cat "$work/first.log"; fail "gpu_check.sh first exited $?"; }
s=$work/first/summary.txt
expect "$s" "budget 540 s; stages probe \(>= [0-9]+ s\) ops \(>= [0-9]+ s\) e2e \(>= [0-9]+ s\) bench \(>= [0-9]+ s\) preflight \(>= [0-9]+ s\) memcheck \(>= [0-9]+ s\)"
expect "$s" "^probe: no GPU \(nvidia-smi (not found|sees no device)\)"
expect "$s" "^probe: trainer --version: trainer "
if grep -q '^TRAINER_HAVE_CUDA:INTERNAL=ON$' "$build/CMakeCache.txt"; then
  expect "$s" "^ops: 0 passed, 0 failed, ([1-9][0-9]*) skipped of \1 in [0-9]+ s \(skipped: no CUDA device\)$"
else
  expect "$s" "^ops: skipped, .* has no CUDA op tests"
fi
expect "$s" "^e2e: 0 passed, 0 failed, ([1-9][0-9]*) skipped of \1 in [0-9]+ s \(skipped: "
for stage in bench preflight memcheck; do expect "$s" "^$stage: skipped, no GPU$"; done
expect "$s" "^gpu_check: done in [0-9]+ s$"
cmp -s <(grep -v '^(' "$s") <(grep -vE '^\(' "$work/first.log") || fail "what was printed differs from summary.txt"
# (listed to a file first: grep -q ending early would fail the pipe under pipefail)
tar -tzf "$work/first/logs.tar.gz" >"$work/first/logs.list"
grep -q "ops/cases.txt" "$work/first/logs.list" || fail "logs.tar.gz lacks the op tests' logs"

echo "== the windows docs/gpu.md names: each command's stages fit its budget"
# The documented commands, as "bash tools/gpu_check.sh --budget N STAGE... # the next window"
# and "... # the window after"; their needs summed by gpu_check.sh --needs (probe added).
for window in "the next window" "the window after"; do
  cmd=$(grep -E "^bash tools/gpu_check.sh --budget [0-9]+ [a-z0-9 ]+# $window" "$src/docs/gpu.md") ||
    fail "docs/gpu.md names no command for $window ('bash tools/gpu_check.sh --budget N ... # $window')"
  read -ra args <<<"${cmd%%#*}"
  budget=${args[3]}
  ((budget <= 560)) || fail "$window: --budget $budget leaves a 600 s call no time to return"
  bash "$src/tools/gpu_check.sh" --needs "${args[@]:2}" >"$work/needs.txt" ||
    fail "$window does not fit: $(cat "$work/needs.txt")"
  expect "$work/needs.txt" "^needs: probe [0-9]+ \+ .* = [0-9]+ s of the $budget s budget$"
done
bash "$src/tools/gpu_check.sh" --needs --budget 300 ops e2e compare >"$work/needs.txt" &&
  fail "ops e2e compare fit 300 s: $(cat "$work/needs.txt")"
expect "$work/needs.txt" "^needs: probe [0-9]+ \+ ops [0-9]+ \+ e2e [0-9]+ \+ compare [0-9]+ = [0-9]+ s: more than the 300 s budget$"

echo "== every program a stage runs is one gpu_check.sh --targets names (packed, built in the fallback)"
bash "$src/tools/gpu_check.sh" --targets >"$work/targets.txt"
cat "$src"/tools/{gpu_check,bench,compare_torch}.sh | grep -oE '\$build"?/(trainer|tools|tests)/[a-z_]+\*?' |
  sed 's|^\$build"\{0,1\}/||' | sort -u >"$work/runs.txt"
while read -r f; do
  case $f in *\*) continue ;; esac  # the CPU tests' glob: the cpu stage's own list
  grep -qx "$f" "$work/targets.txt" || fail "a stage runs $f, which gpu_check.sh --targets leaves out"
done <"$work/runs.txt"

echo "== the stages after the first window's, without a GPU: each skipped, saying why"
bash "$src/tools/gpu_check.sh" --build "$build" --out "$work/later" compare opbench profile \
  >"$work/later.log" 2>&1 || { cat "$work/later.log"; fail "gpu_check.sh compare opbench profile"; }
for stage in compare opbench profile; do expect "$work/later/summary.txt" "^$stage: skipped, no GPU$"; done

echo "== the profile stage's plumbing: bench.sh runs the trainer under --wrap, log.profile_steps set"
cat >"$work/fake-ncu" <<'SH'
#!/bin/sh
# Stands in for ncu: notes its own flags, then runs the program.
while [ "${1#-}" != "$1" ]; do echo "flag $1" >>"$(dirname "$0")/fake-ncu.log"; shift; done
exec "$@"
SH
chmod +x "$work/fake-ncu"
bash "$src/tools/bench.sh" --config "$src/configs/tiny.yaml" --backend cpu --seq-len 32 --steps 4 \
  --warmup 1 --global-batch 4 --micro-batch 2 --vocab 257 --build "$build" --out "$work/wrap" \
  --wrap "$work/fake-ncu --profile-from-start=off --csv" -- --set 'log.profile_steps=[4, 4]' \
  >"$work/wrap.md" 2>&1 || { cat "$work/wrap.md"; fail "bench.sh --wrap"; }
expect "$work/fake-ncu.log" "^flag --profile-from-start=off$"
expect "$work/fake-ncu.log" "^flag --csv$"
expect "$work/wrap/trainer.log" "^profiler: capturing steps 4 to 4 \(cudaProfilerStart\)$"
expect "$work/wrap.md" "^\| tiny.yaml \| cpu x1 \| 32 \| 2 \| 4 \| [1-9]"
ls "$work/wrap/ckpt" >"$work/wrap-ckpt.txt" 2>/dev/null || true
grep -qE '^(latest|step_)' "$work/wrap-ckpt.txt" && fail "bench.sh saved a checkpoint: $(cat "$work/wrap-ckpt.txt")"

echo "== the clock: a stage that would not finish in what is left is skipped, saying so"
bash "$src/tools/gpu_check.sh" --build "$build" --out "$work/short" --budget 30 ops cpu >/dev/null 2>&1
expect "$work/short/summary.txt" "^ops: skipped, would not finish: needs [0-9]+ s, (2[0-9]|30) s left$"
expect "$work/short/summary.txt" "^cpu: skipped, would not finish: needs [0-9]+ s, (2[0-9]|30) s left$"

echo "== cut off mid-stage by kill -9: the summary and logs of the stages before it are there"
# A build whose one test hangs once it has started (and says so), so the kill lands mid-stage.
fake=$work/fake-build
mkdir -p "$fake/trainer" "$fake/tests"
printf '#!/bin/sh\necho "trainer fake-build"\n' >"$fake/trainer/trainer"
printf '#!/bin/sh\ncase "$1" in --list*) echo "a case that hangs" ;; *) touch %s; exec sleep 300 ;; esac\n' \
  "$work/started" >"$fake/tests/test_hangs"
chmod +x "$fake/trainer/trainer" "$fake/tests/test_hangs"
# In a process group of its own (its id in $work/pgid), so that one kill takes every process.
setsid sh -c 'echo $$ >"$1"; shift; exec bash "$@"' sh "$work/pgid" "$src/tools/gpu_check.sh" \
  --build "$fake" --out "$work/cut" probe cpu >/dev/null 2>&1 &
for _ in $(seq 300); do [ -e "$work/started" ] && break; sleep 0.1; done
pgid=$(cat "$work/pgid")
[ -e "$work/started" ] || { kill -9 -- -"$pgid"; fail "the hanging test never started"; }
kill -9 -- -"$pgid"
wait 2>/dev/null || true
expect "$work/cut/summary.txt" "^probe: trainer --version: trainer fake-build"
grep -q "^gpu_check: done" "$work/cut/summary.txt" && fail "the killed run claims it finished"
tar -tzf "$work/cut/logs.tar.gz" >/dev/null || fail "no logs.tar.gz from the stages before the kill"

echo "== the pack, moved: its CPU tests pass in another directory, reading that directory's files"
moved=$work/moved
mkdir -p "$moved"
(cd "$src" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - 2>/dev/null) |
  tar -xf - -C "$moved"
XZ_LEVEL=-0 bash "$moved/tools/gpu_pack.sh" --from-build "$build" --no-debs >"$work/pack.log" 2>&1 ||
  { cat "$work/pack.log"; fail "gpu_pack.sh --from-build failed"; }
expect "$work/pack.log" '^gpu_pack.sh: carry \[".gpu"\]: pack [0-9.]+ MiB \+ tree [0-9.]+ MiB = [0-9.]+ MiB of the 64 MiB carried$'
# Past 58 MiB (the 6 MiB margin gone) it refuses, saying so: 56 MiB more, a sparse file.
truncate -s 56M "$moved/.gpu/filler"
XZ_LEVEL=-0 bash "$moved/tools/gpu_pack.sh" --from-build "$build" --no-debs >"$work/pack-full.log" 2>&1 &&
  { cat "$work/pack-full.log"; fail "gpu_pack.sh packed past its margin"; }
expect "$work/pack-full.log" "^gpu_pack.sh: .gpu with the tree is [0-9.]+ MiB, over 58 MiB: the 6 MiB margin is gone"
rm "$moved/.gpu/filler"
rm -rf "$moved/build-packed"  # gpu_check.sh unpacks the pack itself, as on the GPU machine
bash "$moved/tools/gpu_check.sh" --out "$work/moved-out" cpu >/dev/null 2>&1
m=$work/moved-out/summary.txt
expect "$m" "^probe: .*build $moved/build-packed$"
for t in test_config test_trainer test_kernels test_data test_checkpoint; do
  expect "$m" "^cpu $t: [1-9][0-9]* passed, 0 failed, 0 skipped of [1-9][0-9]* in "
done
grep -E "^cpu .* [1-9][0-9]* failed" "$m" && fail "a packed CPU test failed in the moved tree"
# The packed tests read the moved tree's files: spoil its docs/debug.md and the case that reads it
# fails; TR_SOURCE_DIR pointing at the checkout makes it pass again.
case_name="config: docs/debug.md holds the generated switch table"
"$moved/build-packed/tests/test_config" "$case_name" >/dev/null || fail "'$case_name' fails in the moved tree"
echo "spoilt" >"$moved/docs/debug.md"
"$moved/build-packed/tests/test_config" "$case_name" >/dev/null &&
  fail "the packed test did not read the moved tree's docs/debug.md"
TR_SOURCE_DIR=$src "$moved/build-packed/tests/test_config" "$case_name" >/dev/null ||
  fail "TR_SOURCE_DIR=$src did not take the packed test back to the checkout"

echo "== binaries that do not load and no .gpu-dev/: probe says what the next window must carry"
nl=$work/noload
mkdir -p "$nl/trainer"
echo 'int gone(void) { return 0; }' >"$nl/gone.c"
echo 'int gone(void); int main(void) { return gone(); }' >"$nl/main.c"
{ cc -shared -fPIC -o "$nl/libgone.so" "$nl/gone.c" &&
  cc -o "$nl/trainer/trainer" "$nl/main.c" -L"$nl" -lgone && rm "$nl/libgone.so"; } ||
  fail "could not build a program whose library is missing"
bash "$moved/tools/gpu_check.sh" --build "$nl" --out "$work/noload-out" ops >/dev/null 2>&1 &&
  fail "gpu_check.sh went on with binaries that do not load"
n=$work/noload-out/summary.txt
expect "$n" "^probe: the binaries do not load: libgone.so not found; building here$"
expect "$n" '^probe: building here needs the -dev packages, and .gpu-dev/ was not sent: carry \[".gpu-dev"\] instead of \[".gpu"\]'
expect "$n" "^probe: failed; the stages after it need a loadable build, stopping$"
rm -rf "$work"
echo "test_gpu_check: passed"
