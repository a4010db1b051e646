#!/usr/bin/env bash
# The GPU window's one command (docs/gpu.md). Runs stages in order against a prebuilt pack
# (tools/gpu_pack.sh), keeps its own clock, skips a stage that would not finish in what is left,
# and after every stage appends its result to $OUT/summary.txt and prints it, so that a command
# cut off at its limit still returns every stage before.
#
#   bash tools/gpu_check.sh [--budget SECONDS] [--build DIR] [--out DIR] STAGE...
#   bash tools/gpu_check.sh --needs [--budget SECONDS] STAGE...   (the stages' needs; no run)
#   bash tools/gpu_check.sh --targets [STAGE...]    (the programs the stages run; default all)
#
#   --budget  seconds the whole run may take (default 540: a 10-minute call with room to spare)
#   --build   the build to run: default the pack (.gpu/pack.tar.xz, unpacked into build-packed/),
#             else build-gpu/, else build/; with none of them, built here from .gpu-dev/
#   --out     where summary.txt and logs.tar.gz go (default $OUT, else gpu-out/)
#   --needs   prints each stage's need and their sum against the budget; exit 1 if over it
#   --targets prints the build paths (trainer/trainer, tests/test_cuda_ops, ...) of the programs
#             the stages run: what tools/gpu_pack.sh packs and the fallback build makes
#
# STAGE, or a set of them ("first" = probe ops e2e bench preflight memcheck):
#   probe      the GPU, driver and CUDA, the cuDNN/cuBLASLt/NCCL the trainer loads, trainer
#              --version; unpacks .gpu/debs first (tools/gpu_setup.sh). If the binaries do not
#              load, one line why, then builds them here (build-gpu/) and goes on with that build
#   ops        the CUDA op tests against the CPU reference, 4 at a time, a limit per test, with
#              cuDNN's and cuBLASLt's error logging on
#   e2e        a smoke run of the trainer on the GPU (head_dim 64), then the end-to-end GPU tests
#   bench      tools/bench.sh: Qwen2.5-1.5B, then 0.5B, at seq 4096; then 1.5B with FP8
#              projections (train.precision=fp8) beside its bf16 row
#   preflight  the GEMM and memory ceilings of this GPU (tools/preflight)
#   memcheck   compute-sanitizer memcheck over the op tests of our own kernels, small shapes
#   bisect     the GPU training test again under each kernel switch of docs/debug.md
#   cpu        the pack's CPU tests (every in-process case), 8 at a time
#   compare    tools/compare_torch.sh: the trainer against PyTorch, 1.5B; then 0.5B if time is left
#   opbench    tools/bench_ops: each op of a step against the planner's prediction, at the
#              shapes of Qwen2.5-1.5B and 0.5B (one GPU) and of the 72B job's tp 8 stage, and
#              1.5B's block-causal attention over documents of 512 and 64 tokens
#   profile    one step of Qwen2.5-1.5B (2 micro-batches of 4096 tokens) under ncu, captured by
#              log.profile_steps: every kernel's device time by class and by kernel
#              (tools/ncu_table.py); a run cut at its limit says how far it got
# A failing test reports its first error line. Without a GPU the stages that need one say so
# (tests/tools/test_gpu_check.sh runs this script so on every CI run).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
budget=540 build="" out=${OUT:-gpu-out} mode=run
all_stages=(probe ops e2e bench preflight memcheck bisect cpu compare opbench profile)
stages=()
while (($#)); do
  case $1 in
    --budget) budget=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --needs) mode=needs; shift ;;
    --targets) mode=targets; shift ;;
    first) stages+=(probe ops e2e bench preflight memcheck); shift ;;
    probe | ops | e2e | bench | preflight | memcheck | bisect | cpu | compare | opbench | profile) stages+=("$1"); shift ;;
    *) echo "gpu_check.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ $mode = targets ] && ((${#stages[@]} == 0)) && stages=("${all_stages[@]}")
((${#stages[@]})) || { echo "gpu_check.sh: name a stage, or 'first' (see the header of $0)" >&2; exit 2; }
[ "${stages[0]}" = probe ] || stages=(probe "${stages[@]}")

# Seconds each stage needs to finish, from the first window (docs/gpu.md: one H200, `first` in
# 498 s): a stage gets all that is left and each test its own limit within it, but one that
# would not finish in what is left is skipped, and --needs sums them for a documented command.
#   probe      10  the versions and 7 runtime packages unpacked (not timed alone; small)
#   ops       130  as long as its slowest case (4 at a time): the first window's ran to its
#                  120 s limit
#   e2e       210  the 10 s smoke run, then the cases 2 at a time: the first window's hung case
#                  ran to its 200 s limit
#   bench     120  20 steps of 0.638 s (1.5B) and of 0.272 s (0.5B), and two start-ups; the 26 s
#                  and 8 s final saves of the first window are gone (checkpoint.save_at_end);
#                  the FP8 1.5B run (never run: predicted 0.8 of bf16's steps) and its start-up
#   preflight  30  and memcheck 60: with probe and bench (saves included) they took at most the
#                  168 s of the first window's 498 s that ops (>= 120) and e2e (210) left
#   bisect    240  a run of the GPU training test for each kernel switch, 120 s at most each
#   cpu       120  the in-process CPU cases, 8 at a time
#   compare   170  1.5B only: ours is a start-up and 8 steps of 0.638 s (~30 s); PyTorch's
#                  import, model and torch.compile of the first step (~120 s, not measured yet)
#                  and 8 steps; the 0.5B pair only when compare_small s are left after it
#   opbench    90  never run: five bench_ops processes, each a start-up and 11 runs of each op
#   profile   150  never run: the start-up under ncu, 4 steps, then ncu timing each kernel of
#                  step 4 (~2,500 kernels)
declare -A need=([probe]=10 [ops]=130 [e2e]=210 [bench]=120 [preflight]=30 [memcheck]=60
                 [bisect]=240 [cpu]=120 [compare]=170 [opbench]=90 [profile]=150)
compare_small=100  # the 0.5B pair: a shorter start-up and compile of the same

# The programs each stage runs (build paths); tools/gpu_pack.sh packs them all, and the
# fallback build makes those of the stages named.
declare -A runs=([probe]="trainer/trainer" [ops]="tests/test_cuda_ops"
  [e2e]="trainer/trainer tools/prepare_data tools/preflight tests/test_cli_gpu"
  [bench]="trainer/trainer tools/prepare_data" [preflight]="tools/preflight"
  [memcheck]="tests/test_cuda_ops"
  [bisect]="trainer/trainer tools/prepare_data tools/preflight tests/test_cli_gpu"
  [cpu]="trainer/trainer tools/prepare_data tests/test_kernels tests/test_data
         tests/test_checkpoint tests/test_config tests/test_trainer tests/test_schedule
         tests/test_tools tests/test_comm tests/test_reliability tests/test_hf tests/test_tokenizer"
  [compare]="trainer/trainer tools/prepare_data" [opbench]="tools/bench_ops"
  [profile]="trainer/trainer tools/prepare_data")
# The build paths of the named stages' programs, one per line, each once.
# shellcheck disable=SC2086 # each runs[] entry is a word list
targets() { for s in "$@"; do printf '%s\n' ${runs[$s]}; done | awk '!seen[$0]++'; }

# The needs of the stages and their sum against the budget (1 when over it).
needs() {
  local total=0 line="" s
  for s in "$@"; do total=$((total + need[$s])); line+="${line:+ + }$s ${need[$s]}"; done
  if ((total <= budget)); then
    echo "needs: $line = $total s of the $budget s budget"
  else
    echo "needs: $line = $total s: more than the $budget s budget"
    return 1
  fi
}
case $mode in
  needs) needs "${stages[@]}"; exit ;;
  targets) targets "${stages[@]}"; exit 0 ;;
esac
# The pack (tools/gpu_pack.sh) is unpacked into build-packed/ (ignored, so never carried back)
# when that is missing or older than the pack.
unpack() {
  [ -x build-packed/trainer/trainer ] && [ ! .gpu/pack.tar.xz -nt build-packed/trainer/trainer ] && return
  rm -rf build-packed && mkdir -p build-packed || return 1
  if command -v xz >/dev/null; then
    tar -xmJf .gpu/pack.tar.xz -C build-packed
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' .gpu/pack.tar.xz build-packed
  fi
}
if [ -z "$build" ]; then
  if [ -f .gpu/pack.tar.xz ]; then
    unpack || { echo "gpu_check.sh: could not unpack .gpu/pack.tar.xz into build-packed/" >&2; exit 2; }
  fi
  for build in build-packed build-gpu build; do [ -x "$build/trainer/trainer" ] && break; done
  # No pack, no build: the fallback window (.gpu-dev/ sent instead of .gpu/) builds in probe.
  if [ ! -x "$build/trainer/trainer" ] && [ -d .gpu-dev/dev-debs ]; then
    build="build-gpu"
    mkdir -p "$build"
  fi
fi
build=$(cd "$build" 2>/dev/null && pwd) || { echo "gpu_check.sh: no build at '$build'" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/gpu-check.XXXXXX)
summary=$out/summary.txt
: >"$summary"
start=$(date +%s)
deadline=$((start + budget))
gpu=0
any_failed=0

say() { echo "$*" | tee -a "$summary"; }
left() { echo $((deadline - $(date +%s))); }
# Everything so far back to $OUT: the summary is appended as it goes; the logs are re-packed
# after each stage, so a run killed at its limit still returns those of the stages before.
save_logs() {
  tar -czf "$out/logs.tar.gz.part" -C "$work" --exclude='*.bin' --exclude='*.idx' \
    --exclude='*.h5' --exclude='ckpt' --exclude='data' . 2>/dev/null &&
    mv "$out/logs.tar.gz.part" "$out/logs.tar.gz"
}
trap 'save_logs; rm -rf "$work"' EXIT

# first_error LOG: the first line that says what went wrong, as one line (Catch2's "FAILED:"
# with its expression and expansion; else the first error-looking line).
first_error() {
  awk '/: FAILED:$/ { loc = $0; getline e; getline w; getline x; gsub(/^ +/, "", e); gsub(/^ +/, "", x)
                      print loc " " e " (" x ")"; exit }
       /[Ee]rror|ERROR|FATAL|what\(\)|Aborted|terminate/ { if (!first) first = $0 }
       END { if (!loc && first) print first }' "$1" | cut -c1-400
}

# run_cases STAGE BINARY SPEC JOBS LIMIT: each Catch2 case of BINARY that SPEC selects as a
# process group of its own, JOBS at a time, each stopped after LIMIT seconds or what is left of
# the budget (SIGTERM, then SIGKILL to the whole group: a trainer saving on SIGTERM, mpirun's
# ranks); a case that could not start in the budget says so. One line per case that did not
# pass, then the counts.
run_cases() {
  local stage=$1 bin=$2 spec=$3 jobs=$4 limit=$5 dir=$work/$1 i=0 t0
  t0=$(date +%s)
  mkdir -p "$dir"
  "$bin" --list-test-names-only "$spec" 2>/dev/null | sed '/^$/d' >"$dir/cases.txt"
  local -a cases
  mapfile -t cases <"$dir/cases.txt"
  for i in "${!cases[@]}"; do
    while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
    local budget=$(($(left) - 5))
    ((budget < limit)) || budget=$limit
    if ((budget < 5)); then echo "not started: the budget ran out" >"$dir/$i.log"; echo 125 >"$dir/$i.rc"; continue; fi
    # Catch2 test specs: ',' '[' ']' and '\' are special in a name.
    local name=${cases[$i]} escaped
    escaped=$(printf '%s' "$name" | sed 's/[][,\\]/\\&/g')
    (setsid bash -c 'echo $$ >"$1.pgid"; shift; exec "$@"' sh "$dir/$i" timeout -k 10 "$budget" \
      "$bin" --warn NoTests "$escaped" >"$dir/$i.log" 2>&1
     echo $? >"$dir/$i.rc"
     kill -9 -- -"$(cat "$dir/$i.pgid" 2>/dev/null)" 2>/dev/null) &
  done
  wait
  local passed=0 failed=0 skipped=0 rc why
  for i in "${!cases[@]}"; do
    rc=$(cat "$dir/$i.rc" 2>/dev/null || echo lost)
    case $rc in
      0) passed=$((passed + 1)) ;;
      77) skipped=$((skipped + 1)); why=$(grep -m1 '^skipped:' "$dir/$i.log") ;;
      125) failed=$((failed + 1)); say "  NOT STARTED (budget) ${cases[$i]}" ;;
      124 | 137) failed=$((failed + 1)); say "  TIMEOUT ${cases[$i]}" ;;
      *) failed=$((failed + 1)); say "  FAILED (rc $rc) ${cases[$i]}: $(first_error "$dir/$i.log")" ;;
    esac
  done
  [ ${#cases[@]} -gt 0 ] || failed=1
  ((failed == 0)) || any_failed=1
  say "$stage: $passed passed, $failed failed, $skipped skipped of ${#cases[@]} in $(($(date +%s) - t0)) s${why:+ (${why})}"
}

# Libraries the programs link that this machine cannot find, as "libX.so.N ...".
missing_libraries() {
  ldd "$build/trainer/trainer" "$build"/tests/test_cuda_ops 2>/dev/null | awk '/not found/ { print $1 }' |
    sort -u | tr '\n' ' '
}

# The pack's Debian packages (.gpu/, or .gpu-dev/ in a fallback window) and the cuDNN/NCCL of
# PyTorch's wheels, on a machine that lacks them.
setup_env() {
  local debs=.gpu/debs
  [ -d "$debs" ] || debs=.gpu-dev/debs
  if [ -f /tmp/gpu-env.sh ] || { [ -d "$debs" ] && bash tools/gpu_setup.sh "$debs" >"$work/setup.log" 2>&1; }; then
    [ -f "$work/setup.log" ] && say "setup: $(tail -1 "$work/setup.log")"
    # shellcheck disable=SC1091
    source /tmp/gpu-env.sh
  fi
}

# The library file (with its version) the trainer loads for each GPU library.
gpu_libraries() {
  ldd "$build/trainer/trainer" 2>/dev/null | awk '/cudart|cublasLt|cudnn|nccl/ { print $3 }' |
    while read -r so; do [ -e "$so" ] && readlink -f "$so"; done | tr '\n' ' '
}

# Builds the programs of the named stages on this machine, for its GPU, into build-gpu/: the
# fallback when the pack's binaries do not load. Needs the -dev packages and the cuDNN frontend
# of .gpu-dev/, which a window carries instead of .gpu/ (64 MiB do not hold both).
build_here() {
  local t0 dev=.gpu-dev
  t0=$(date +%s)
  if [ ! -d "$dev/dev-debs" ]; then
    say "probe: building here needs the -dev packages, and .gpu-dev/ was not sent: carry" \
      "[\".gpu-dev\"] instead of [\".gpu\"] in the next window (tools/gpu_pack.sh makes both)"
    return 1
  fi
  bash tools/gpu_setup.sh "$dev/dev-debs" >>"$work/setup.log" 2>&1
  if [ -f "$dev/cudnn-frontend.tar.xz" ]; then
    mkdir -p "$work/cudnn-frontend" && tar -xJf "$dev/cudnn-frontend.tar.xz" -C "$work/cudnn-frontend" &&
      export CUDNN_FRONTEND_INCLUDE=$work/cudnn-frontend/include
  fi
  local names
  names=$(targets "${stages[@]}" | sed 's|.*/||' | tr '\n' ' ')
  # shellcheck disable=SC2086 # $names is a word list
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINER_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${GPU_ARCH:-native}" >"$work/configure.log" 2>&1 &&
    timeout -k 10 $(($(left) - 10)) cmake --build build-gpu -j"$(nproc)" --target $names \
      >"$work/build.log" 2>&1
  local rc=$?
  if [ $rc = 0 ]; then
    build=$root/build-gpu
    say "probe: built here in $(($(date +%s) - t0)) s; going on with build-gpu/"
  else
    say "probe: the build here failed (rc $rc): $(cat "$work/configure.log" "$work/build.log" 2>/dev/null |
      grep -m1 -E 'error|Error|FAILED|not found')"
  fi
  return $rc
}

stage_probe() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    gpu=$(nvidia-smi -L | wc -l)
    say "probe: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1) x$gpu"
  else
    say "probe: no GPU (nvidia-smi $(command -v nvidia-smi >/dev/null && echo 'sees no device' || echo 'not found'))"
  fi
  [ -n "$(missing_libraries)" ] && setup_env
  say "probe: nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found'); build $build"
  if [ ! -x "$build/trainer/trainer" ]; then
    say "probe: no prebuilt binaries (.gpu/pack.tar.xz not sent); building here"
    setup_env
    build_here || return 1
  fi
  local missing
  missing=$(missing_libraries)
  if [ -n "$missing" ]; then
    say "probe: the binaries do not load: ${missing}not found; building here"
    build_here || return 1
  fi
  say "probe: loads $(gpu_libraries)"
  say "probe: trainer --version: $("$build/trainer/trainer" --version 2>&1 | head -3 | tr '\n' ' ')"
}

stage_ops() {
  [ -x "$build/tests/test_cuda_ops" ] || { say "ops: skipped, $build has no CUDA op tests (built without CUDA)"; return; }
  # cuDNN and cuBLASLt say why they refuse a graph or a GEMM (on stderr, into the logs).
  CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr CUBLASLT_LOG_LEVEL=2 \
    run_cases ops "$build/tests/test_cuda_ops" "~[.]" 4 $(($(left) < 120 ? $(left) - 5 : 120))
}

# A few steps of a small model (head_dim 64, which every cuDNN accepts) on the GPU: when the
# end-to-end tests (head_dim 16) fail and this passes, the shape is the problem, not the wiring.
smoke() {
  local dir=$work/smoke
  mkdir -p "$dir"
  "$build/tools/prepare_data" --output "$dir/data" --synthetic 200000 --vocab 512 >"$dir/prepare.log" 2>&1
  cat >"$dir/smoke.yaml" <<YAML
model: {hidden_size: 256, intermediate_size: 512, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        head_dim: 64, vocab_size: 512, max_seq_len: 256, tie_embeddings: true}
data: {train: [{path: $dir/data}], valid: [], seq_len: 256}
train: {steps: 10, global_batch: 8, micro_batch: 4, eval_interval: 0, backend: cuda}
checkpoint: {dir: $dir/ckpt, interval: 0}
log: {dir: $dir/log, interval: 1}
YAML
  timeout -k 10 90 "$build/trainer/trainer" --config "$dir/smoke.yaml" --resume none >"$dir/trainer.log" 2>&1
  local rc=$?
  if [ $rc = 0 ]; then
    say "e2e: smoke (head_dim 64, 10 steps on cuda): loss $(grep -o '"loss":[0-9.e+-]*' "$dir/log/metrics.jsonl" |
      sed -n '1p;$p' | cut -d: -f2 | tr '\n' ' ' | sed 's/ $//; s/ / -> /')"
  else
    say "e2e: smoke (head_dim 64) FAILED (rc $rc): $(first_error "$dir/trainer.log")"
  fi
}

stage_e2e() {
  ((gpu > 0)) && smoke
  CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr \
    run_cases e2e "$build/tests/test_cli_gpu" "~[.]" 2 $(($(left) < 200 ? $(left) - 5 : 200))
}

stage_bench() {
  local run preset name
  for run in qwen2.5-1.5b qwen2.5-0.5b qwen2.5-1.5b:fp8; do
    preset=${run%%:*} name=${run/:/-}
    if (($(left) < 60)); then say "bench $name: skipped, $(left) s left"; continue; fi
    local extra=()
    [[ $run == *:fp8 ]] && extra=(-- --set train.precision=fp8)
    timeout -k 10 $(($(left) - 15)) bash tools/bench.sh --preset "$preset" --seq-len 4096 --micro-batch 1 \
      --global-batch 8 --steps 20 --build "$build" --out "$work/bench-$name" "${extra[@]}" >"$work/bench-$name.md" 2>&1
    say "bench $name (rc $?):"
    grep -E '^\||^\(' "$work/bench-$name.md" | tee -a "$summary"
    grep -qE '^\|' "$work/bench-$name.md" || say "  $(first_error "$work/bench-$name/trainer.log" 2>/dev/null || tail -1 "$work/bench-$name.md")"
  done
}

stage_preflight() {
  timeout -k 10 $(($(left) - 15)) "$build/tools/preflight" --backend cuda --max-bytes 256M >"$work/preflight.txt" 2>&1
  say "preflight (rc $?):"
  tee -a "$summary" <"$work/preflight.txt"
}

stage_memcheck() {
  command -v compute-sanitizer >/dev/null || { say "memcheck: skipped, compute-sanitizer not on PATH"; return; }
  # Our own kernels only: the cases that run cuDNN or cuBLASLt are left out.
  TR_TEST_SMALL_SHAPES=1 timeout -k 10 $(($(left) - 15)) compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$build/tests/test_cuda_ops" "~[.]" "~*cuDNN*" "~*cuBLASLt*" "~*attention blocks*" >"$work/memcheck.log" 2>&1
  local rc=$?
  say "memcheck (rc $rc): $(grep -m1 -E 'ERROR SUMMARY|Device not supported|test cases' "$work/memcheck.log")"
  grep -m3 -E '^========= (Invalid|Error|Program hit)' "$work/memcheck.log" | tee -a "$summary"
}

stage_bisect() {
  local switches sw
  switches=$("$build/trainer/trainer" --help-switches | sed -nE 's/^\| `(TR_[A-Z0-9_]+=1)` \| kernel \|.*/\1/p')
  for sw in "" $switches TR_LOSS_CHUNK_TOKENS=110; do
    if (($(left) < 135)); then say "bisect: stopped, $(left) s left"; return; fi
    # shellcheck disable=SC2086 # $sw is empty or one VAR=1 word
    env $sw timeout -k 10 120 "$build/tests/test_cli_gpu" "cli gpu: train.backend=cuda trains on a GPU like the CPU" \
      >"$work/bisect.log" 2>&1
    local rc=$?
    say "bisect ${sw:-(no switch)}: rc $rc $([ $rc != 0 ] && first_error "$work/bisect.log")"
  done
}

stage_cpu() {
  local bin
  for bin in "$build"/tests/test_*; do
    case ${bin##*/} in test_cuda_ops | test_cli_gpu | *.*) continue ;; esac
    [ -x "$bin" ] && [ -n "$("$bin" --list-test-names-only "~[.]~[cli]" 2>/dev/null | sed '/^$/d')" ] || continue
    if (($(left) < 30)); then say "cpu ${bin##*/}: skipped, $(left) s left"; continue; fi
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 run_cases "cpu ${bin##*/}" "$bin" "~[.]~[cli]" 8 \
      $(($(left) < 300 ? $(left) - 5 : 300))
  done
}

# Each op of a step timed beside the planner's prediction (docs/PERFORMANCE.md: the step model):
# the benchmarks' two models on this GPU, and the 72B job's per-GPU shapes (tp 8, its slowest
# stage; 16 nodes x 8 for its micro-batch counts). The op-class totals and the efficiencies the
# ops reached go to the summary, every row to the logs, the 1.5B and 0.5B calibration files
# beside the summary (trainer plan --hardware reads them).
stage_opbench() {
  local name sets
  for name in qwen2.5-1.5b qwen2.5-0.5b qwen2.5-72b; do
    if (($(left) < 30)); then say "opbench $name: skipped, $(left) s left"; continue; fi
    sets=(--set data.seq_len=4096 --set train.micro_batch=1)
    case $name in
      qwen2.5-72b) sets+=(--nodes 16 --gpus-per-node 8) ;;
      # One GPU's models: what their ops reach, as trainer plan --hardware files (head_dim 128
      # and 64: both attention anchors).
      *) sets+=(--set train.global_batch=8 --calibration "$out/calibration-$name.yaml") ;;
    esac
    timeout -k 10 $(($(left) - 10)) "$build/tools/bench_ops" --config "configs/$name.yaml" "${sets[@]}"       --json "$work/opbench-$name.json" >"$work/opbench-$name.md" 2>&1
    say "opbench $name (rc $?): $(head -1 "$work/opbench-$name.md")"
    sed -n '/^| op class/,$p' "$work/opbench-$name.md" | tee -a "$summary"
  done
  # Block-causal attention (cuDNN's ragged batches) at 1.5B's shapes over documents of 512 and
  # 64 tokens, beside the planner's prediction at their span.
  local len
  for len in 512 64; do
    if (($(left) < 20)); then say "opbench documents of $len: skipped, $(left) s left"; continue; fi
    timeout -k 10 $(($(left) - 10)) "$build/tools/bench_ops" --config configs/qwen2.5-1.5b.yaml \
      --set data.seq_len=4096 --set train.micro_batch=1 --set train.global_batch=8 \
      --only "attention: " --doc-len $len >"$work/opbench-docs-$len.md" 2>&1
    say "opbench documents of $len (rc $?):"
    grep -E '^(attention|\| attention)' "$work/opbench-docs-$len.md" | tee -a "$summary"
  done
}

# One step of the 1.5B benchmark (step 4 of 4; 2 micro-batches, so the optimizer's share is 4x
# the 8-micro-batch step's) under ncu, which records only what log.profile_steps brackets with
# cudaProfilerStart/Stop, each kernel's time with warm caches and the clocks left alone. ncu
# runs the kernels one at a time: the table's sum is the step's kernel time, against the bench
# stage's step time for what the device spent idle. ncu writes its CSV only when the run exits,
# so the run must end by itself: 4 short steps and no save (bench.sh), inside a limit 20 s short
# of what is left; a run cut there says how far it got.
stage_profile() {
  local ncu limit t0 rc
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$ncu" ] || { say "profile: skipped, ncu not found"; return; }
  limit=$(($(left) - 20)) t0=$(date +%s)
  timeout -k 10 "$limit" bash tools/bench.sh --preset qwen2.5-1.5b --seq-len 4096 \
    --micro-batch 1 --global-batch 2 --steps 4 --warmup 2 --build "$build" --out "$work/profile" \
    --wrap "$ncu --profile-from-start off --clock-control none --cache-control none --csv --page raw \
--print-units base --print-kernel-base function --metrics gpu__time_duration.sum \
--log-file $work/profile-ncu.csv" -- --set 'log.profile_steps=[4, 4]' >"$work/profile.md" 2>&1
  rc=$?
  if ((rc == 124 || rc == 137)); then
    say "profile: cut at its $limit s limit (ncu writes its CSV only at exit, so there is none):" \
      "$(profile_progress)"
    return
  fi
  say "profile (rc $rc, $(($(date +%s) - t0)) s): qwen2.5-1.5b step 4, 2 micro-batches of 4096 tokens, under ncu:"
  grep -m2 -E '^==(ERROR|WARNING)==' "$work/profile-ncu.csv" 2>/dev/null | tee -a "$summary"
  python3 tools/ncu_table.py "$work/profile-ncu.csv" --top 30 >"$work/profile-table.md" 2>&1
  tee -a "$summary" <"$work/profile-table.md"
}

# How far a cut profile run got: the trainer's steps, whether the capture began, ncu's kernels.
profile_progress() {
  local steps kernels
  steps=$(grep -c '"loss"' "$work/profile/log/metrics.jsonl" 2>/dev/null)
  kernels=$(cat "$work/profile-ncu.csv" "$work/profile/trainer.log" 2>/dev/null | grep -c '^==PROF== Profiling')
  echo "the trainer logged ${steps:-0} of 4 steps;" \
    "$(grep -q '^profiler: capturing' "$work/profile/trainer.log" 2>/dev/null &&
      echo "the capture of step 4 began, ncu had timed $kernels kernels" || echo "the capture never began")"
}

# 1.5B first (the target's shape), then the 0.5B pair only if what is left holds it; 8 steps,
# 2 of them warm-up (tools/compare_torch.sh says why).
stage_compare() {
  local preset rc
  for preset in qwen2.5-1.5b qwen2.5-0.5b; do
    if [ "$preset" = qwen2.5-0.5b ] && (($(left) < compare_small)); then
      say "compare $preset: skipped, would not finish: needs $compare_small s, $(left) s left"
      continue
    fi
    timeout -k 10 $(($(left) - 15)) bash tools/compare_torch.sh --presets "$preset" --seq-len 4096 \
      --micro-batch 1 --global-batch 8 --steps 8 --warmup 2 --build "$build" \
      --out "$work/compare-$preset" >"$work/compare-$preset.log" 2>&1
    rc=$?
    say "compare $preset with PyTorch (rc $rc):"
    tee -a "$summary" <"$work/compare-$preset/compare.md" 2>/dev/null ||
      tail -30 "$work/compare-$preset.log" | tee -a "$summary"
  done
}

say "gpu_check: $(date -u +'%Y-%m-%d %H:%M UTC') $(git rev-parse --short HEAD 2>/dev/null); budget ${budget} s;" \
  "stages $(for s in "${stages[@]}"; do printf '%s (>= %s s) ' "$s" "${need[$s]}"; done)"
needs "${stages[@]}" >/dev/null || say "gpu_check: $(needs "${stages[@]}"); the last will be skipped"
# The stages that run without a GPU: probe, the op and end-to-end tests (each case then says
# "skipped: no CUDA device" itself) and the CPU tests.
runs_without_gpu() { case $1 in probe | ops | e2e | cpu) return 0 ;; *) return 1 ;; esac; }
for stage in "${stages[@]}"; do
  t0=$(date +%s)
  if ((gpu == 0)) && ! runs_without_gpu "$stage"; then
    say "$stage: skipped, no GPU"
  elif (($(left) < need[$stage])); then
    say "$stage: skipped, would not finish: needs ${need[$stage]} s, $(left) s left"
  elif ! "stage_$stage" && [ "$stage" = probe ]; then
    say "probe: failed; the stages after it need a loadable build, stopping"
    any_failed=1
    break
  else
    echo "($stage: $(($(date +%s) - t0)) s, $(left) s left)" >>"$summary"
  fi
  save_logs
done
say "gpu_check: done in $(($(date +%s) - start)) s$( ((any_failed)) && echo ', some tests failed')"
exit $((any_failed))
