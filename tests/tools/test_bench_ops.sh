#!/usr/bin/env bash
# tools/bench_ops on the CPU: every op of the planner's step model for the tiny model runs at its
# shape and is reported beside its prediction, the op-class totals add up, and bad arguments get
# one line and exit 2.
#   test_bench_ops.sh BUILD_DIR WORK_DIR
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
bin=$1/tools/bench_ops
work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

"$bin" --config "$src/configs/tiny.yaml" --backend cpu --json "$work/ops.json" >"$work/out.md" ||
  { cat "$work/out.md"; fail "bench_ops exited $?"; }
python3 - "$work/ops.json" "$work/out.md" <<'PY' || exit 1
import json, re, sys
ops = json.load(open(sys.argv[1]))["ops"]
out = open(sys.argv[2]).read()
names = [o["op"] for o in ops]
# The model's op list for one stage of the tiny model (pp 1: one chunk with the head): the four
# projections' three GEMMs, attention both ways, the passes (each residual add fused with the
# norm after it), the LM head, the loss and the optimizer, each once.
want = [f"{p}: {w}" for p in ("qkv projection", "attention output projection",
                              "gate and up projection", "down projection", "LM head")
        for w in ("forward", "input gradient", "weight gradient")]
want += ["attention: forward", "attention: backward", "rmsnorm: forward", "rmsnorm: backward",
         "add + rmsnorm: forward", "rope: forward", "rope: backward",
         "swiglu: forward", "swiglu: backward", "embedding: forward", "embedding: backward",
         "final rmsnorm: forward", "final rmsnorm: backward", "cross-entropy", "loss sum", "adamw",
         "gradient norm"]
missing = sorted(set(want) - set(names))
assert not missing, f"ops not run: {missing}"
assert len(names) == len(set(names)), "an op twice"
for o in ops:
    assert o["measured_s"] > 0 and o["predicted_s"] > 0 and o["count"] > 0, o
    assert (o["flop"] > 0) == (o["class"] in ("GEMM", "attention")), o
    # Each op's row in the table, with its measured/predicted ratio.
    row = re.search(r"^\| " + re.escape(o["op"]) + r" \|.*\| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|",
                    out, re.M)
    assert row, o["op"]
    assert abs(float(row.group(3)) - o["measured_s"] / o["predicted_s"]) <= 0.01 * float(row.group(3)) + 0.01, o
# The totals: each class's measured seconds per step is the sum of its ops' count x median.
for cls in ("GEMM", "attention", "memory", "loss", "optimizer"):
    total = sum(o["count"] * o["measured_s"] for o in ops if o["class"] == cls)
    row = re.search(r"^\| " + cls + r" \| ([0-9.e+-]+) \| ([0-9.e+-]+) \|", out, re.M)
    assert row, cls
    assert abs(float(row.group(2)) - total) <= 1e-3 * total + 1e-6, (cls, row.group(2), total)
print("bench_ops: ops and totals ok")
PY
# --calibration: what the ops reached, as trainer plan --hardware keys. Planned with that file,
# attention's ops (forward, backward) and the streaming ops (passes, loss, optimizer) are
# predicted at exactly the time they took, and the fitted GEMM fill predicts the GEMMs no worse
# than the table's; trainer plan reads the file, a second --hardware over it.
"$bin" --config "$src/configs/tiny.yaml" --backend cpu --json "$work/cal1.json" \
  --calibration "$work/cal.yaml" >"$work/cal1.md" || { cat "$work/cal1.md"; fail "--calibration"; }
grep -q "^measured_by: bench_ops$" "$work/cal.yaml" || { cat "$work/cal.yaml"; fail "cal.yaml"; }
"$bin" --config "$src/configs/tiny.yaml" --backend cpu --json "$work/cal2.json" \
  --hardware "$work/cal.yaml" >"$work/cal2.md" || { cat "$work/cal2.md"; fail "--hardware"; }
python3 - "$work/cal1.json" "$work/cal2.json" "$work/cal.yaml" <<'PY' || exit 1
import json, math, sys
one, two = (json.load(open(f)) for f in sys.argv[1:3])
written = {}
for line in open(sys.argv[3]):
    if line.startswith("#"):
        continue
    key, value = line.split(":", 1)
    written[key] = value.strip()
assert written["name"] == "h100", written
cal = one["calibration"]
assert set(cal) == {"gemm_fill", "attention_fwd_hd64", "attention_bwd_hd64", "stream_fraction"}, cal
for key, value in cal.items():
    assert abs(float(written[key]) - value) <= 1e-5 * value, (key, written[key], value)
groups = {
    "attention forward": lambda o: o["class"] == "attention" and o["op"] != "attention: backward",
    "attention backward": lambda o: o["op"] == "attention: backward",
    "streaming": lambda o: o["class"] in ("memory", "loss", "optimizer"),
}
for name, pick in groups.items():
    took = sum(o["count"] * o["measured_s"] for o in one["ops"] if pick(o))
    now = sum(o["count"] * o["predicted_s"] for o in two["ops"] if pick(o))
    assert took > 0 and abs(now - took) <= 1e-4 * took, (name, now, took)
def error(run):
    e = 0
    for a, b in zip(one["ops"], run["ops"]):
        assert a["op"] == b["op"]
        if a["class"] == "GEMM":
            e += a["count"] * a["measured_s"] * math.log(a["measured_s"] / b["predicted_s"]) ** 2
    return e
assert error(two) <= error(one), (error(two), error(one))
print("bench_ops: --calibration ok")
PY
echo "stream_fraction: 0.5" >"$work/half.yaml"
trainer=$1/trainer/trainer
"$trainer" plan --config "$src/configs/tiny.yaml" --gpus-per-node 1 --hardware "$work/cal.yaml" \
  --json >"$work/plan1.json" || fail "trainer plan --hardware cal.yaml"
"$trainer" plan --config "$src/configs/tiny.yaml" --gpus-per-node 1 --hardware "$work/cal.yaml" \
  --hardware "$work/half.yaml" --json >"$work/plan2.json" || fail "trainer plan, two --hardware"
python3 - "$work/plan1.json" "$work/plan2.json" "$work/cal.yaml" <<'PY' || exit 1
import json, sys
a, b = (json.load(open(f))["compute"][0] for f in sys.argv[1:3])
stream = next(float(l.split(":")[1]) for l in open(sys.argv[3]) if l.startswith("stream_fraction"))
for part in ("memory_s", "loss_s", "optimizer_s"):
    assert abs(b[part] / a[part] - stream / 0.5) <= 1e-4 * stream / 0.5, (part, a[part], b[part])
assert b["attention_s"] == a["attention_s"]  # the GEMMs' fp32 accumulation streams too
print("trainer plan: --hardware twice ok")
PY
# A fraction above 1 (here: a copy ceiling set far below what the CPU's passes reach) is written
# as 1, saying so.
echo "memory_gbps: 0.0001" >"$work/slow.yaml"
"$bin" --config "$src/configs/tiny.yaml" --backend cpu --only swiglu --hardware "$work/slow.yaml" \
  --calibration "$work/capped.yaml" >"$work/capped.md" || { cat "$work/capped.md"; fail "capped"; }
grep -q "^stream_fraction: the ops reached [0-9.e+]* of the ceiling (their data in L2?); written as 1$" \
  "$work/capped.md" || { cat "$work/capped.md"; fail "no capped line"; }
grep -qx "stream_fraction: 1" "$work/capped.yaml" || { cat "$work/capped.yaml"; fail "capped.yaml"; }
# --only narrows the ops; bad arguments: one line, exit 2.
"$bin" --config "$src/configs/tiny.yaml" --backend cpu --only swiglu >"$work/only.md"
[ "$(grep -c '^| swiglu' "$work/only.md")" = 2 ] || { cat "$work/only.md"; fail "--only swiglu"; }
[ "$(grep -c '^| qkv' "$work/only.md")" = 0 ] || fail "--only swiglu ran other ops"
! grep -q "not timed" "$work/out.md" || fail "an op of the qwen2 family was not timed"
# --doc-len: attention runs block-causal over documents of 40 tokens of the tiny model's 128
# (40, 40, 40, 8: 38 keys per query), predicted at that span.
"$bin" --config "$src/configs/tiny.yaml" --backend cpu --only "attention: " --doc-len 40 \
  --json "$work/docs.json" >"$work/docs.md" || { cat "$work/docs.md"; fail "--doc-len 40"; }
grep -q "^attention: block-causal over documents of 40 tokens (.* per micro-batch): 38.0 keys per query$" \
  "$work/docs.md" || { cat "$work/docs.md"; fail "--doc-len line"; }
python3 - "$work/ops.json" "$work/docs.json" <<'PY' || exit 1
import json, sys
whole = {o["op"]: o for o in json.load(open(sys.argv[1]))["ops"]}
docs = json.load(open(sys.argv[2]))["ops"]
# Ragged attention does not calibrate the whole sequences' fractions.
assert json.load(open(sys.argv[2]))["calibration"] == {}
assert [o["op"] for o in docs] == ["attention: forward", "attention: backward"], docs
for o in docs:
    # The span's FLOPs at the span's rate: s / (s + 128) against 4096's (step_model.h).
    rate = lambda s: s / (s + 128)
    ratio = o["predicted_s"] / whole[o["op"]]["predicted_s"]
    assert abs(ratio - 38 / 128 * rate(128) / rate(38)) < 1e-9, (o["op"], ratio)
    assert o["measured_s"] > 0
print("bench_ops: --doc-len ok")
PY
# qwen3's QK-norm: each of its kernels (split, the q and k heads' norms, join; forward and
# backward) is an op of the list, timed on its own; none is left untimed.
"$bin" --config "$src/configs/tiny.yaml" --set model.family=qwen3 --backend cpu --only qk-norm \
  >"$work/qk.md"
[[ $(grep -c "^| qk-norm: " "$work/qk.md") == 8 ]] || { cat "$work/qk.md"; fail "qk-norm rows"; }
! grep -q "^not timed" "$work/qk.md" || { cat "$work/qk.md"; fail "qk-norm not timed"; }
# --fp8: each GEMM also as the FP8 path (linear_fp8 on codes, its operand's fp8_cast), in a
# table of its own: the qkv projection's three GEMMs in each table.
"$bin" --config "$src/configs/tiny.yaml" --backend cpu --only "qkv projection" --fp8 \
  >"$work/fp8.md" || { cat "$work/fp8.md"; fail "--fp8"; }
grep -q "^| FP8 GEMM | shape | bf16 us | fp8 us |" "$work/fp8.md" &&
  [[ $(grep -c "^| qkv projection: " "$work/fp8.md") == 6 ]] || { cat "$work/fp8.md"; fail "--fp8 rows"; }
set +e
"$bin" --config "$src/configs/tiny.yaml" --set parallel.cp=2 --backend cpu >/dev/null 2>"$work/err"
rc=$?
set -e
[ $rc = 2 ] && grep -q "set parallel.cp=1" "$work/err" || { cat "$work/err"; fail "cp 2: rc $rc"; }
set +e
"$bin" --backend cpu >/dev/null 2>"$work/err"
rc=$?
set -e
[ $rc = 2 ] && grep -q "^bench_ops: --config is required" "$work/err" || { cat "$work/err"; fail "no --config: rc $rc"; }
echo "test_bench_ops: passed"
