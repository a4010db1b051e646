#!/usr/bin/env bash
# Checkpoint stall benchmark: trains a wide tiny-shaped model on the CPU three times, saving every
# --interval steps: with synchronous saves, with checkpoint.async, and with node-local saves
# (checkpoint.local_interval, to --local-dir, default /dev/shm) and persistent ones only at the
# end. It prints a Markdown table: checkpoint size, save time (first step to commit) and how long
# the training loop stalled for it: the median over the saves followed by a full interval of
# training (the final save, and the one just before it, are waited for by the end of the run). Training uses
# OMP_NUM_THREADS threads (default 1), leaving the other cores to the background writer, as a
# GPU job leaves the host's cores. Then the disk's own write (fsync) and read bandwidth for a file
# of the checkpoint's size, beside the sync save's rate, and the load of the sync run's last
# checkpoint (a resume's verification and read) beside the disk's read. Numbers go to
# docs/checkpoints.md.
#
#   tools/bench_checkpoint.sh [--hidden 1024] [--layers 8] [--steps 37] [--interval 12]
#                             [--build build] [--out DIR] [--local-dir DIR]
#                             [--modes "sync async local"]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
hidden=1024 layers=8 steps=37 interval=12 build=$root/build out="" local_dir=/dev/shm
modes="sync async local"
while (($#)); do
  case $1 in
    --hidden) hidden=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --local-dir) local_dir=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    *) echo "bench_checkpoint.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
# Without --out the run's files (checkpoints of several GiB) go to a directory removed when the
# benchmark succeeds (a failure keeps it for its logs).
keep_out=$out
out=${out:-$(mktemp -d /tmp/trainer-ckpt-bench.XXXXXX)}
mkdir -p "$out/data"
"$build/tools/prepare_data" --synthetic 200000 --vocab 257 --output "$out/data/synth" >/dev/null
heads=$((hidden / 128))
echo "| mode | parameters | checkpoint GiB | save s (median) | loop stall s (median) | stall / save |"
echo "|---|---|---|---|---|---|"
# The benchmark's model and data; the caller adds the checkpoint and log keys.
trainer() {
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$build/trainer/trainer" --config "$root/configs/tiny.yaml" \
    --set model.hidden_size="$hidden" --set model.intermediate_size=$((4 * hidden)) \
    --set model.num_layers="$layers" --set model.num_heads="$heads" \
    --set model.num_kv_heads="$heads" --set model.head_dim=128 \
    --set "data.train=[{path: $out/data/synth}]" --set "data.valid=[{path: $out/data/synth}]" \
    --set data.seq_len=32 --set train.global_batch=2 --set train.micro_batch=1 \
    --set train.steps="$steps" --set train.eval_interval=0 --set optim.warmup_steps=1 "$@"
}
local_root=$(mktemp -d "$local_dir/trainer-ckpt-bench.XXXXXX")
trap 'rc=$?; rm -rf "$local_root"; if [ $rc -eq 0 ] && [ -z "$keep_out" ]; then rm -rf "$out"; fi' EXIT
for mode in $modes; do
  case $mode in sync | async | local) ;; *) echo "bench_checkpoint.sh: unknown mode $mode" >&2; exit 2 ;; esac
  rm -rf "$out/ckpt-$mode" "$out/log-$mode"
  async=false every=$interval local_every=0
  [ "$mode" = async ] && async=true
  [ "$mode" = local ] && every=0 local_every=$interval
  trainer --set checkpoint.dir="$out/ckpt-$mode" --set checkpoint.interval="$every" \
    --set checkpoint.keep_last=2 --set checkpoint.async=$async \
    --set checkpoint.local_interval="$local_every" --set checkpoint.local_dir="$local_root" \
    --set log.dir="$out/log-$mode" >"$out/$mode.log" 2>&1 ||
    { echo "bench_checkpoint.sh: the $mode run failed; see $out/$mode.log" >&2; exit 1; }
  python3 - "$out/log-$mode/metrics.jsonl" "$out/ckpt-$mode" "$mode" "$steps" "$interval" <<'PY'
import json, os, statistics, sys
path, ckpt, mode = sys.argv[1:4]
steps, interval = int(sys.argv[4]), int(sys.argv[5])
event = "local_checkpoint" if mode == "local" else "checkpoint"
saves = [j for j in map(json.loads, open(path))
         if j.get("event") == event and j["step"] + interval <= steps]
if not saves:
    sys.exit("bench_checkpoint.sh: no save followed by a full interval; raise --steps")
latest = open(os.path.join(ckpt, "latest")).read().strip()
d = os.path.join(ckpt, latest)
size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
params = size / 12
if mode == "local":  # one part holds the whole state here (one rank), and its header and state
    size = statistics.median(j["bytes"] for j in saves)
save = statistics.median(j["seconds"] for j in saves)
stall = statistics.median(j["stall_s"] for j in saves)
ratio = stall / save if save > 0 else 1.0
print(f"| {mode} | {params / 1e6:.0f}M | {size / 2**30:.2f} | {save:.2f} | {stall:.3f} | {ratio:.2f} |")
if mode == "sync":  # for the disk's line below
    open(os.path.join(os.path.dirname(path), "save.txt"), "w").write(f"{size} {save}\n")
PY
done

# The disk's own bandwidth for a file of the checkpoint's size, where the checkpoints went:
# written and read bypassing the page cache where the file system allows (O_DIRECT, as a save
# writes; the write with fsync, as a save commits), each the median of 3; and the sync save's
# rate beside it. A buffered write into fresh page-cache pages can be several times slower
# than the disk (0.35 GB/s against 2.3-3.2 GB/s direct on the development VM), and a buffered
# write that reuses the pages of a file just deleted several times faster than a save sees.
if [ -f "$out/log-sync/save.txt" ]; then
  read -r bytes save_s <"$out/log-sync/save.txt"
  blocks=$(((bytes + (1 << 20) - 1) >> 20))
  rate() {  # dd's own GB/s figure from its last line, as a number of bytes/s
    awk '{ for (i = 1; i <= NF; ++i) if ($i ~ /^[kMGT]?B\/s$/) { v = $(i - 1);
           m = $i ~ /^k/ ? 1e3 : $i ~ /^M/ ? 1e6 : $i ~ /^G/ ? 1e9 : $i ~ /^T/ ? 1e12 : 1; print v * m } }'
  }
  writes=() reads=()
  for _ in 1 2 3; do
    writes+=("$({ dd if=/dev/zero of="$out/disk.bin" bs=16M count="$(((blocks + 15) / 16))" \
                    oflag=direct conv=fsync 2>&1 ||
                 dd if=/dev/zero of="$out/disk.bin" bs=1M count="$blocks" conv=fsync 2>&1; } |
               tail -1 | rate)")
    reads+=("$({ dd if="$out/disk.bin" of=/dev/null bs=16M iflag=direct 2>&1 ||
               dd if="$out/disk.bin" of=/dev/null bs=1M 2>&1; } | tail -1 | rate)")
    rm -f "$out/disk.bin"
  done
  python3 - "$bytes" "$save_s" "${writes[*]}" "${reads[*]}" "$out/disk-read.txt" <<'PY'
import statistics, sys
size, save = int(sys.argv[1]), float(sys.argv[2])
write = statistics.median(float(x) for x in sys.argv[3].split())
read = statistics.median(float(x) for x in sys.argv[4].split())
rate = size / save if save > 0 else 0.0
print(f"disk: {size / 2**30:.2f} GiB written with fsync at {write / 1e9:.2f} GB/s, read at "
      f"{read / 1e9:.2f} GB/s (median of 3); the sync save wrote {rate / 1e9:.2f} GB/s, "
      f"{100 * rate / write:.0f}% of the disk's")
open(sys.argv[5], "w").write(f"{read}\n")
PY
  # The load: a resume's start-up (every file's checksum, then this rank's blocks) from a cold
  # page cache, timed as the difference between `--dry-run` resuming the sync run's last
  # checkpoint and `--dry-run` over an empty checkpoint.dir (the same start-up without it),
  # each the median of 3.
  mkdir -p "$out/empty-ckpt"
  evict() {  # drops the checkpoint's files from the page cache, as after a restart
    python3 -c 'import os, sys
for d, _, fs in os.walk(sys.argv[1]):
    for f in fs:
        fd = os.open(os.path.join(d, f), os.O_RDONLY)
        os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$1"
  }
  timed() {  # seconds the benchmark's trainer takes with these arguments
    local t0 t1
    t0=$(date +%s.%N)
    trainer "$@" >"$out/load.log" 2>&1 ||
      { echo "bench_checkpoint.sh: a --dry-run for the load failed; see $out/load.log" >&2; exit 1; }
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'
  }
  with=() without=()
  for _ in 1 2 3; do
    evict "$out/ckpt-sync"
    with+=("$(timed --set checkpoint.dir="$out/ckpt-sync" --set log.dir="$out/log-load" --dry-run)")
    without+=("$(timed --set checkpoint.dir="$out/empty-ckpt" --set log.dir="$out/log-load" \
                 --dry-run)")
  done
  python3 - "$bytes" "$(cat "$out/disk-read.txt")" "${with[*]}" "${without[*]}" <<'PY'
import statistics, sys
size, read = int(sys.argv[1]), float(sys.argv[2])
load = statistics.median(map(float, sys.argv[3].split())) - statistics.median(
    map(float, sys.argv[4].split()))
rate = size / load if load > 0 else 0.0
print(f"load: {size / 2**30:.2f} GiB verified and read in {load:.2f} s from a cold page cache "
      f"(median of 3), {rate / 1e9:.2f} GB/s, {100 * rate / read:.0f}% of the disk's read")
PY
fi
