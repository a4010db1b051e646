#!/usr/bin/env bash
# On the GPU machine (see ../shared/gpu/README.md; carry .gpu and .deps/cudnn-frontend, which
# ../shared/gpu/prepare.sh and tools/install_deps.sh fill; not the rest of .deps, whose test
# venvs are gigabytes). prepare.sh's list lacks some of our packages; name them:
#   ../shared/gpu/prepare.sh .gpu libpcre2-dev libutf8proc-dev libutf8proc2 libprotobuf-dev \
#     libprotobuf32 protobuf-compiler libprotoc32 libboost1.74-dev       # about 13 MB more
# It builds for the GPU present
# (CMAKE_CUDA_ARCHITECTURES=native, or $GPU_ARCH; if build-gpu is not there yet), then runs the
# chosen stages and writes $OUT/summary.txt (the results) and $OUT/logs.tar.gz (every log): two
# files, within what the device tool brings back.
#
#   bash .gpu/setup.sh && source /tmp/gpu-env.sh && bash tools/gpu_check.sh [STAGE ...]
#
# Stages (default: tests bench preflight; each fits one 10-minute call after the build):
#   tests      the gpu-labelled op tests (every CUDA op against the CPU reference), once more
#              under compute-sanitizer memcheck and racecheck (small shapes) with cuDNN's and
#              cuBLASLt's own logging on, so a refused graph or GEMM says why; the end-to-end GPU
#              training tests (one GPU; 8 ranks sharing it through parallel.comm=mpi, against one
#              rank; with 2+ GPUs also NCCL between them, else those report skipped; when they
#              fail, again under each kernel switch of docs/debug.md, to name the culprit); then
#              the CPU suite
#   bench      tools/bench.sh for 0.5B and 1.5B at seq 4096 (docs/PERFORMANCE.md)
#   preflight  tools/preflight on this GPU: NCCL collectives of one rank, GEMM, HBM copy
#   compare    tools/compare_torch.sh: our trainer against the PyTorch baseline (0.5B, 1.5B)
set -uo pipefail
out=${OUT:-gpu-out}
work=/tmp/gpu-check
mkdir -p "$out" "$work"
stages=("$@")
((${#stages[@]})) || stages=(tests bench preflight)
summary=$work/summary.txt
{
  date -u +"%Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nvcc --version | tail -1
  git rev-parse --short HEAD 2>/dev/null
} >>"$summary" 2>&1
finish() {
  tar -czf "$out/logs.tar.gz" -C "$work" --exclude='*.bin' --exclude='*.idx' --exclude='*.h5' . 2>/dev/null
  cp "$summary" "$out/summary.txt"
  cat "$summary"
}
trap finish EXIT

if [ ! -f build-gpu/build.ninja ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="${GPU_ARCH:-native}" \
    >"$work/configure.log" 2>&1 || { echo "configure failed" >>"$summary"; tail -30 "$work/configure.log" >>"$summary"; exit 1; }
fi
start=$(date +%s)
cmake --build build-gpu -j"$(nproc)" >"$work/build.log" 2>&1 || {
  echo "build failed" >>"$summary"; grep -E "error|FAILED" -A3 "$work/build.log" | head -60 >>"$summary"; exit 1; }
echo "build: $(( $(date +%s) - start )) s" >>"$summary"

for stage in "${stages[@]}"; do
  case $stage in
    tests)
      # cuDNN and cuBLASLt say why they refuse a graph or a GEMM (on stderr, into the logs).
      export CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr CUBLASLT_LOG_LEVEL=2
      ( cd build-gpu && ctest -L gpu -E "^cli gpu:" --output-on-failure ) >"$work/ctest-gpu.log" 2>&1
      echo "gpu op tests (rc $?):" >>"$summary"
      grep -E "tests passed|Failed|Skipped|relative error" "$work/ctest-gpu.log" | head -40 >>"$summary"
      # For each failing test, its first error line (ctest prints a failed test's output right
      # after its status line).
      awk '/Test +#[0-9]+: .*\*\*\*(Failed|Exception)/ { name = $0; sub(/.*Test +#[0-9]+: /, "", name);
             sub(/ +\.+.*/, "", name); want = 1; next }
           /Test +#[0-9]+: / { want = 0 }
           want && /FAILED|[Ee]rror|ERROR/ { print "  FAILED " name ": " $0; want = 0 }' \
        "$work/ctest-gpu.log" | head -20 >>"$summary"
      # The op tests under compute-sanitizer, small shapes only: out-of-bounds and misaligned
      # accesses, then shared-memory races (each tool bounded in time).
      if command -v compute-sanitizer >/dev/null 2>&1; then
        for tool in memcheck racecheck; do
          TR_TEST_SMALL_SHAPES=1 timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 \
            build-gpu/tests/test_cuda_ops >"$work/sanitizer-$tool.log" 2>&1
          echo "compute-sanitizer $tool (rc $?): $(grep -m1 -E "ERROR SUMMARY|test cases" "$work/sanitizer-$tool.log")" >>"$summary"
          grep -m3 -E "^========= (Invalid|Race|Error)" "$work/sanitizer-$tool.log" >>"$summary"
        done
      else
        echo "compute-sanitizer: not found on PATH" >>"$summary"
      fi
      ( cd build-gpu && ctest -R "^cli gpu:" --output-on-failure ) >"$work/ctest-e2e.log" 2>&1
      e2e=$?
      echo "end-to-end GPU training on $(nvidia-smi -L | wc -l) GPU(s) (rc $e2e):" >>"$summary"
      grep -E "tests passed|Failed|Skipped|skipped:|loss" "$work/ctest-e2e.log" | head -40 >>"$summary"
      if [ "$e2e" != 0 ]; then  # bisect: each kernel switch (docs/debug.md), then all at once
        all="TR_LOSS_CHUNK_TOKENS=110 $(build-gpu/trainer/trainer --help-switches |
          sed -nE 's/^\| `(TR_[A-Z0-9_]+=1)` \| kernel \|.*/\1/p' | tr '\n' ' ')"
        for sw in $all "$all"; do
          ( cd build-gpu && env $sw ctest -R "^cli gpu:" ) >"$work/bisect.log" 2>&1
          echo "  with $sw: rc $? $(grep -E "tests passed" "$work/bisect.log")" >>"$summary"
        done
      fi
      ( cd build-gpu && OMP_NUM_THREADS=1 ctest -j8 -LE "gpu|slurm|python" ) >"$work/ctest-cpu.log" 2>&1
      echo "cpu suite (rc $?): $(grep -E "tests passed" "$work/ctest-cpu.log")" >>"$summary"
      ;;
    bench)
      for preset in qwen2.5-0.5b qwen2.5-1.5b; do
        bash tools/bench.sh --preset "$preset" --seq-len 4096 --micro-batch 1 --global-batch 8 \
          --steps 20 --build build-gpu --out "$work/bench-$preset" >"$work/bench-$preset.md" 2>&1
        echo "bench $preset (rc $?):" >>"$summary"
        cat "$work/bench-$preset.md" >>"$summary"
      done
      ;;
    preflight)
      build-gpu/tools/preflight --backend cuda --max-bytes 256M >"$work/preflight.txt" 2>&1
      echo "preflight (rc $?):" >>"$summary"
      cat "$work/preflight.txt" >>"$summary"
      ;;
    compare)
      bash tools/compare_torch.sh --presets "qwen2.5-0.5b qwen2.5-1.5b" --seq-len 4096 \
        --micro-batch 1 --global-batch 8 --steps 20 --warmup 3 --build build-gpu \
        --out "$work/compare" >"$work/compare.log" 2>&1
      echo "compare with PyTorch (rc $?):" >>"$summary"
      cat "$work/compare/compare.md" >>"$summary" 2>/dev/null || tail -30 "$work/compare.log" >>"$summary"
      ;;
    *) echo "gpu_check.sh: unknown stage '$stage' (tests, bench, preflight, compare)" >>"$summary"; exit 2 ;;
  esac
done
