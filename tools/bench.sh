#!/usr/bin/env bash
# Training benchmark: runs the trainer for a fixed number of steps on synthetic tokens and
# prints one Markdown table row set: tokens/s, tokens/s per GPU (rank), MFU, step time and its
# breakdown (data wait, gradient reduction + optimizer), host and device memory. Steps after
# the first --warmup are summarised by their median. No checkpoint is written
# (checkpoint.save_at_end=false): a 1.5B save takes longer than the timed steps (docs/gpu.md).
#
#   tools/bench.sh [--config FILE | --preset qwen2.5-1.5b] [--seq-len 4096] [--micro-batch 1]
#                  [--global-batch 8] [--steps 20] [--warmup 3] [--backend cuda]
#                  [--build build] [--out DIR] [--wrap "PROFILER ARGS"] [-- extra trainer arguments]
#
# --wrap runs the trainer under a command (a profiler: tools/gpu_check.sh profile runs it under
# ncu, capturing the steps of log.profile_steps).
#
# MFU = flops_per_token x tokens/s / (ranks x dense bf16 peak of the device); flops_per_token
# counts 6 x matmul parameters (LM head included) + 6 x layers x seq_len x heads x head_dim
# (causal attention), see docs/PERFORMANCE.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
preset=qwen2.5-0.5b config="" seq_len=4096 micro=1 global=8 steps=20 warmup=3 backend=cuda
build=$root/build out="" vocab=151936
extra=() wrap=()
while (($#)); do
  case $1 in
    --config) config=$2; shift 2 ;;
    --preset) preset=$2; shift 2 ;;
    --seq-len) seq_len=$2; shift 2 ;;
    --micro-batch) micro=$2; shift 2 ;;
    --global-batch) global=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --wrap) read -ra wrap <<<"$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "bench.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
((steps > warmup)) || { echo "bench.sh: --steps $steps must exceed --warmup $warmup" >&2; exit 2; }
out=${out:-$(mktemp -d /tmp/trainer-bench.XXXXXX)}
rm -rf "$out/ckpt" "$out/log"  # the benchmark's own scratch: every run starts fresh
mkdir -p "$out/data"
tokens=$(( (steps + 1) * global * (seq_len + 1) * 2 ))
"$build/tools/prepare_data" --output "$out/data/synthetic" --synthetic "$tokens" --vocab "$vocab" >/dev/null
if [ -z "$config" ]; then
  config=$out/bench.yaml
  printf 'model: {preset: %s}\n' "$preset" >"$config"
fi
name=${config##*/}; [ "$config" = "$out/bench.yaml" ] && name=$preset
"${wrap[@]}" "$build/trainer/trainer" --config "$config" --resume none \
  --set "data.train=[{path: $out/data/synthetic, weight: 1.0}]" --set data.valid=[] \
  --set data.seq_len="$seq_len" --set train.steps="$steps" --set train.global_batch="$global" \
  --set train.micro_batch="$micro" --set train.backend="$backend" --set train.eval_interval=0 \
  --set optim.warmup_steps=1 --set checkpoint.interval=0 --set checkpoint.save_at_end=false \
  --set checkpoint.dir="$out/ckpt" --set log.dir="$out/log" --set log.interval=1 "${extra[@]}" \
  >"$out/trainer.log" 2>&1 || { echo "bench.sh: the trainer failed; see $out/trainer.log" >&2; tail -5 "$out/trainer.log" >&2; exit 1; }
python3 - "$out/log/metrics.jsonl" "$name" "$seq_len" "$micro" "$global" "$warmup" "$backend" <<'PY'
import json, statistics, sys
path, name, seq, micro, glob, warmup, backend = sys.argv[1:]
rows = [j for j in map(json.loads, open(path)) if "loss" in j]
timed = [j for j in rows if j["step"] > int(warmup)]
med = lambda k: statistics.median(j.get(k, 0.0) for j in timed)
mfu = f"{100 * med('mfu'):.1f}%" if "mfu" in timed[0] else "n/a"
world = timed[0]["tokens_per_s"] / timed[0]["tokens_per_s_per_rank"]
print("| model | backend | seq | micro | global | tokens/s | tokens/s/rank | MFU | step s | data s | optim s | host MiB | device MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
print(f"| {name} | {backend} x{world:.0f} | {seq} | {micro} | {glob} | {med('tokens_per_s'):.0f} | "
      f"{med('tokens_per_s_per_rank'):.0f} | {mfu} | {med('step_time_s'):.3f} | {med('data_wait_s'):.4f} | "
      f"{med('optimizer_s'):.3f} | {max(j['peak_mem_mib'] for j in rows):.0f} | "
      f"{max(j.get('device_mem_mib', 0) for j in rows):.0f} |")
print(f"({len(timed)} timed steps after {warmup} warm-up; loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f})")
PY
