#!/usr/bin/env bash
# Our trainer against a PyTorch baseline on the same device and the same shapes: for each preset
# (or --config), tools/bench.sh (ours) and then tools/torch_baseline.py (Hugging Face
# Qwen2ForCausalLM, SDPA, torch.compile, bf16, fused AdamW), one after the other, then ONE
# Markdown table: tokens/s, MFU, peak memory of each and ours ÷ torch. Both count FLOPs our way
# (6·N_matmul + 6·L·s·nh·hd, docs/PERFORMANCE.md) and take the median of the steps after --warmup.
# Neither side saves a checkpoint (bench.sh sets checkpoint.save_at_end=false).
#
#   tools/compare_torch.sh [--presets "qwen2.5-1.5b qwen2.5-0.5b"] [--config FILE]...
#                          [--seq-len 4096] [--micro-batch 1] [--global-batch 8] [--steps 8]
#                          [--warmup 2] [--build build] [--python python3] [--device cuda|cpu]
#                          [--precision autocast|bf16] [--no-compile] [--out DIR]
#                          [--torch-args "extra torch_baseline.py arguments"]
#
# --config (repeatable) replaces --presets: both sides train that file's model (e.g. the CPU
# smoke test: --config configs/tiny.yaml --seq-len 64 --global-batch 2 --steps 4 --warmup 1
# --device cpu --no-compile). Logs, per-run JSON and the table (compare.md) go to --out (default
# a new /tmp/trainer-compare.*). Exits 1 if any run failed (its row says "failed" and the tail of
# its log is printed), 2 on a bad argument.
#
# 8 steps, 2 of them warm-up: the first step builds the graphs (cuDNN's and cuBLASLt's plans here,
# torch.compile's there) and the second may still recompile; the median of the 6 after is
# unmoved by two slow steps, and each step more costs both sides ~0.7 s at 1.5B (docs/gpu.md).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
presets="qwen2.5-1.5b qwen2.5-0.5b" configs=() seq_len=4096 micro=1 global=8 steps=8 warmup=2
build=$root/build python=python3 device=cuda precision=autocast compile_flag="" out=""
torch_args=""
while (($#)); do
  case $1 in
    --presets) presets=$2; shift 2 ;;
    --preset) presets=$2; shift 2 ;;
    --config) configs+=("$2"); shift 2 ;;
    --seq-len) seq_len=$2; shift 2 ;;
    --micro-batch) micro=$2; shift 2 ;;
    --global-batch) global=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --device | --backend) device=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    --no-compile) compile_flag=--no-compile; shift ;;
    --out) out=$2; shift 2 ;;
    --torch-args) torch_args=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare_torch.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
case $device in cuda | cpu) ;; *) echo "compare_torch.sh: --device cuda|cpu, not $device" >&2; exit 2 ;; esac
((steps > warmup)) || { echo "compare_torch.sh: --steps $steps must exceed --warmup $warmup" >&2; exit 2; }
build=$(cd "$build" 2>/dev/null && pwd) || { echo "compare_torch.sh: no build directory $build" >&2; exit 2; }
for f in "$build/trainer/trainer" "$build/tools/prepare_data"; do
  [ -x "$f" ] || { echo "compare_torch.sh: $f is missing: build first (README.md), or --build DIR" >&2; exit 2; }
done
command -v "$python" >/dev/null || { echo "compare_torch.sh: no python '$python' (--python)" >&2; exit 2; }
out=${out:-$(mktemp -d /tmp/trainer-compare.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# The runs: "name|source-argument|value" (a preset or a config file).
runs=()
if ((${#configs[@]})); then
  for c in "${configs[@]}"; do
    [ -f "$c" ] || { echo "compare_torch.sh: no config file $c" >&2; exit 2; }
    c=$(cd "$(dirname "$c")" && pwd)/$(basename "$c")
    n=$(basename "$c"); runs+=("${n%.yaml}|--config|$c")
  done
else
  for p in $presets; do runs+=("$p|--preset|$p"); done
fi

tb=$root/tools/torch_baseline.py
failed=0
echo "compare_torch.sh: $device, seq $seq_len, micro $micro, global $global, $steps steps ($warmup warm-up); logs in $out"
for r in "${runs[@]}"; do
  IFS='|' read -r name kind src <<<"$r"
  # The vocabulary (for the synthetic tokens) and FLOPs per token, from the same resolution of
  # the preset / config that the baseline uses.
  if ! "$python" "$tb" "$kind" "$src" --trainer "$build/trainer/trainer" --seq-len "$seq_len" --describe >"$out/describe-$name.json" 2>"$out/describe-$name.err"; then
    echo "== $name: cannot resolve the model:"; cat "$out/describe-$name.err"
    failed=1; continue
  fi
  vocab=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"]["vocab_size"])' "$out/describe-$name.json")

  echo "== $name: ours (tools/bench.sh)"
  rm -f "$out/ours-$name.json" "$out/torch-$name.json"
  t0=$SECONDS
  if bash "$root/tools/bench.sh" "$kind" "$src" --seq-len "$seq_len" --micro-batch "$micro" \
      --global-batch "$global" --steps "$steps" --warmup "$warmup" --backend "$device" \
      --build "$build" --out "$out/ours-$name" --vocab "$vocab" >"$out/ours-$name.md" 2>&1 &&
    "$python" - "$out/ours-$name/log/metrics.jsonl" "$warmup" "$out/ours-$name.json" <<'PY'
import json, statistics, sys
path, warmup, dest = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = [j for j in map(json.loads, open(path)) if "loss" in j]
timed = [j for j in rows if j["step"] > warmup]
med = lambda k: statistics.median(j[k] for j in timed)
dev = max(j.get("device_mem_mib", 0) for j in rows)
json.dump(dict(tokens_per_s=med("tokens_per_s"), tokens_per_s_per_gpu=med("tokens_per_s_per_rank"),
               mfu=med("mfu") if "mfu" in timed[0] else None, step_time_s=med("step_time_s"),
               device_mem_mib=dev if dev > 0 else max(j["peak_mem_mib"] for j in rows),
               device_mem_is_host=dev <= 0, loss_first=rows[0]["loss"], loss_last=rows[-1]["loss"]),
          open(dest, "w"))
PY
  then
    sed -n '3p;4p' "$out/ours-$name.md"; echo "   ($((SECONDS - t0)) s)"
  else
    log=$out/ours-$name/trainer.log
    [ -s "$log" ] || log=$out/ours-$name.md
    echo "   ours FAILED on $name; tail of $log:"
    tail -n 25 "$log" | sed 's/^/   | /'
    failed=1
  fi

  echo "== $name: PyTorch (tools/torch_baseline.py)"
  t0=$SECONDS
  # shellcheck disable=SC2086  # --torch-args is a word list on purpose
  if PYTHONUNBUFFERED=1 "$python" "$tb" "$kind" "$src" --trainer "$build/trainer/trainer" --seq-len "$seq_len" --micro-batch "$micro" \
      --global-batch "$global" --steps "$steps" --warmup "$warmup" --device "$device" \
      --precision "$precision" $compile_flag $torch_args --json-out "$out/torch-$name.json" \
      >"$out/torch-$name.log" 2>&1; then
    grep -A3 '^| model' "$out/torch-$name.log" | sed -n '3,4p'; echo "   ($((SECONDS - t0)) s)"
  else
    echo "   PyTorch FAILED on $name; tail of $out/torch-$name.log:"
    tail -n 30 "$out/torch-$name.log" | sed 's/^/   | /'
    rm -f "$out/torch-$name.json"
    failed=1
  fi
done

names=()
for r in "${runs[@]}"; do names+=("${r%%|*}"); done
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit+dirty"
gpu=""
[ "$device" = cuda ] && gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
echo
"$python" - "$out" "$seq_len" "$micro" "$global" "$device" "$commit" "$gpu" "${names[@]}" <<'PY' | tee "$out/compare.md"
import datetime, json, os, platform, sys
out, seq, micro, glob, device, commit, gpu, *names = sys.argv[1:]
def load(kind, name):
    p = os.path.join(out, f"{kind}-{name}.json")
    return json.load(open(p)) if os.path.exists(p) else None
def tps(j): return "failed" if j is None else f"{j['tokens_per_s']:.0f}"
def mfu(j): return "failed" if j is None else ("n/a" if j.get("mfu") is None else f"{100 * j['mfu']:.1f}%")
def mib(j, key="device_mem_mib"):
    if j is None: return "failed"
    if j.get(key) is None: return "n/a"
    return f"{j[key]:.0f}" + (" (host)" if key == "device_mem_mib" and j.get("device_mem_is_host") else "")
print("| preset | seq | micro | global | ours tokens/s | ours MFU | ours peak device MiB | "
      "torch tokens/s | torch MFU | torch peak device MiB | torch peak alloc MiB | ours ÷ torch |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
dev_name, torch_desc = None, None
for n in names:
    o, t = load("ours", n), load("torch", n)
    ratio = f"{o['tokens_per_s'] / t['tokens_per_s']:.2f}×" if o and t else "failed"
    print(f"| {n} | {seq} | {micro} | {glob} | {tps(o)} | {mfu(o)} | {mib(o)} | {tps(t)} | {mfu(t)} | "
          f"{mib(t)} | {mib(t, 'peak_alloc_mib')} | {ratio} |")
    if t:
        dev_name = dev_name or t["device"]
        torch_desc = torch_desc or (f"torch {t['torch']}, transformers {t['transformers']}, "
                                    f"{t['backend'].split(' x1 ')[-1]}"
                                    + (f", CUDA {t['cuda']}" if t.get("cuda") else ""))
if device == "cuda":
    dev_name = gpu or dev_name or "unknown GPU"
else:
    dev_name = dev_name or f"cpu ({platform.processor() or platform.machine()})"
print()
print(f"device: {dev_name}; date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
      f"trainer {commit}; PyTorch baseline: {torch_desc or 'failed'}. tokens/s and MFU are medians "
      f"of the steps after warm-up; MFU counts 6·N_matmul + 6·L·s·nh·hd per token against the "
      f"dense bf16 peak; device MiB = GPU memory in use (total − free) at step ends, max; torch "
      f"alloc = torch.cuda.max_memory_allocated.")
PY
exit $((failed ? 1 : 0))
