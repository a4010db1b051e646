#!/usr/bin/env bash
# Pipeline schedules on CPU ranks: the same small model trained under 1f1b, interleaved (v 2) and
# zero_bubble on --pp MPI ranks (one thread each), and a Markdown table per schedule of its
# closed-form bubble (parallel/schedule.h) against what the ranks measured: the share of the
# step the first stage waited on the pipeline's messages (time_pipeline_wait_s / step time) and the
# step time, medians of the steps after --warmup. A benchmark, not a test: run it on a machine
# with a core per rank.
#
#   tools/bench_pipeline.sh [--pp 2] [--micro-batches 4] [--steps 12] [--warmup 2]
#                           [--build build] [--out DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pp=2 micro_batches=4 steps=12 warmup=2 build=$root/build out=""
while (($#)); do
  case $1 in
    --pp) pp=$2; shift 2 ;;
    --micro-batches) micro_batches=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "bench_pipeline.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
((steps > warmup)) || { echo "bench_pipeline.sh: --steps $steps must exceed --warmup $warmup" >&2; exit 2; }
out=${out:-$(mktemp -d /tmp/trainer-bench-pipeline.XXXXXX)}
mkdir -p "$out/data"
seq_len=256 layers=$((4 * pp))
"$build/tools/prepare_data" --output "$out/data/synthetic" \
  --synthetic $(((steps + 1) * micro_batches * (seq_len + 1) * 2)) --vocab 512 >/dev/null
cat >"$out/model.yaml" <<YAML
model: {hidden_size: 256, intermediate_size: 768, num_layers: $layers, num_heads: 4,
        num_kv_heads: 2, head_dim: 64, vocab_size: 512, max_seq_len: $seq_len}
data: {train: [{path: $out/data/synthetic}], seq_len: $seq_len}
train: {steps: $steps, global_batch: $micro_batches, micro_batch: 1, backend: cpu,
        eval_interval: 0}
optim: {warmup_steps: 1}
checkpoint: {interval: 0, dir: $out/ckpt}
YAML
echo "pp $pp, $micro_batches micro-batches per step, $layers layers of H 256 at seq $seq_len," \
  "one CPU thread per rank ($(nproc) cores)"
echo
echo "| schedule | bubble (closed form) | stage 0 waits on the pipeline | step (s) |"
echo "|---|---|---|---|"
for schedule in "1f1b" "interleaved --set parallel.virtual_stages=2" "zero_bubble"; do
  name=${schedule%% *}
  rm -rf "$out/ckpt" "$out/log"
  # shellcheck disable=SC2086 # the schedule's words are --set flags
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root -n "$pp" \
    -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$build/trainer/trainer" --config "$out/model.yaml" \
    --resume none --set parallel.pp="$pp" --set parallel.pipeline_schedule=$schedule \
    --set log.dir="$out/log" --set log.interval=1 >"$out/$name.log" 2>&1 ||
    { echo "bench_pipeline.sh: the $name run failed; see $out/$name.log" >&2; exit 1; }
  # The trainer's start-up line names the schedule and its closed-form bubble.
  python3 - "$out/log/metrics.jsonl" "$out/$name.log" "$warmup" <<'PY'
import json, re, statistics, sys
path, log, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
line = re.search(r"pipeline: (.*?), \d+ micro-batches per step: bubble ([0-9.]+%)", open(log).read())
rows = [j for j in map(json.loads, open(path)) if "loss" in j and j["step"] > warmup]
step = statistics.median(j["step_time_s"] for j in rows)
wait = statistics.median(j["time_pipeline_wait_s"] / j["step_time_s"] for j in rows)
print(f"| {line.group(1)} | {line.group(2)} | {100 * wait:.1f}% | {step:.3f} |")
PY
done
