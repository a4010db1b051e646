#!/usr/bin/env bash
# On the GPU machine (see ../shared/gpu/README.md; carry .gpu and .deps, which
# ../shared/gpu/prepare.sh and tools/install_deps.sh fill): builds for sm_90a, runs the
# gpu-labelled tests (every CUDA op against the CPU reference), the end-to-end GPU training
# test, the benchmarks of docs/PERFORMANCE.md, then the CPU suite; logs and a summary go to
# $OUT (default ./gpu-out).
#   bash .gpu/setup.sh && source /tmp/gpu-env.sh && bash tools/gpu_check.sh
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nvcc --version | tail -1
} >"$out/device.txt" 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  >"$out/configure.log" 2>&1 || { echo "configure failed"; tail -30 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" >"$out/build.log" 2>&1 || {
  echo "build failed"; grep -E "error|FAILED" -A3 "$out/build.log" | head -60; exit 1; }
( cd build-gpu && ctest -L gpu --output-on-failure ) >"$out/ctest-gpu.log" 2>&1
gpu_rc=$?
( cd build-gpu && ctest -R "backend=cuda" --output-on-failure ) >"$out/ctest-e2e.log" 2>&1
e2e_rc=$?
for preset in qwen2.5-0.5b qwen2.5-1.5b; do
  bash tools/bench.sh --preset "$preset" --seq-len 4096 --micro-batch 1 --global-batch 8 \
    --steps 20 --build build-gpu --out "$out/bench-$preset" >"$out/bench-$preset.md" 2>&1
done
( cd build-gpu && OMP_NUM_THREADS=1 ctest -j8 -LE "gpu|slurm" ) >"$out/ctest-cpu.log" 2>&1
cpu_rc=$?
{
  echo "device: $(cat "$out/device.txt" | head -1)"
  echo "gpu tests (rc $gpu_rc):"; grep -E "tests passed|Passed|Failed|Skipped|relative error" "$out/ctest-gpu.log" | head -40
  echo "end-to-end GPU training (rc $e2e_rc):"; grep -E "tests passed|Failed" "$out/ctest-e2e.log"
  cat "$out"/bench-*.md
  echo "cpu suite (rc $cpu_rc):"; grep -E "tests passed" "$out/ctest-cpu.log"
} | tee "$out/summary.txt"
