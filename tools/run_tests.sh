#!/usr/bin/env bash
# Set up, build and run the whole test suite (what CI runs), in every configuration this machine
# can build:
#   build/      the default configuration (-DTRAINER_CUDA=AUTO: the CUDA backend where nvcc is);
#   build-cpu/  -DTRAINER_CUDA=OFF, built and tested too when build/ has CUDA, so that the
#               configuration without CUDA (laptops, login nodes, CPU boxes) never rots. Both
#               run the same CPU code, so there it runs the tests labelled cpu-build (every
#               case in process, and the launches whose behaviour differs without CUDA); the
#               whole suite runs in build/, or in build-cpu/ alone with --only cpu.
# GPU tests (label gpu) report "skipped" without a device. Arguments go to both ctest runs.
#   tools/run_tests.sh [--only default|cpu] [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
only=""
if [ "${1:-}" = "--only" ]; then
  only=${2:?"--only needs 'default' or 'cpu'"}
  shift 2
  case $only in default | cpu) ;; *) echo "run_tests.sh: --only $only: use 'default' or 'cpu'" >&2; exit 2 ;; esac
fi
bash tools/install_deps.sh
# ccache keys on paths relative to the checkout, so a fresh clone elsewhere (CI) hits the cache.
export CCACHE_BASEDIR="$PWD"
# The tests' MPI launches run on one machine: Open MPI's ob1 (shared memory) without first
# starting UCX saves about 0.2 s of each 8-rank launch, and the suite makes hundreds.
export OMPI_MCA_pml=ob1

# has_cuda DIR: whether the build in DIR has the CUDA backend (CMake records it in the cache).
has_cuda() { grep -q '^TRAINER_HAVE_CUDA:INTERNAL=ON$' "$1/CMakeCache.txt"; }

# build_and_test DIR CTEST_FILTER CMAKE_ARGS...: configure, build and run ctest in DIR, the
# tests CTEST_FILTER picks (e.g. "-L cpu-build"; empty: all).
build_and_test() {
  local dir=$1 filter=$2 start
  shift 2
  start=$(date +%s)
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON "$@" >/dev/null
  cmake --build "$dir" -j"$(nproc)"
  local backend=cpu
  has_cuda "$dir" && backend=cuda
  echo "== $dir (backend: $backend) built in $(($(date +%s) - start)) s; its tests: =="
  # shellcheck disable=SC2086 # the filter is words
  (cd "$dir" && ctest --output-on-failure -j"$(nproc)" $filter "${ctest_args[@]}")
}
ctest_args=("$@")

if [ "$only" != cpu ]; then
  build_and_test build ""
fi
if [ "$only" = cpu ]; then
  build_and_test build-cpu "" -DTRAINER_CUDA=OFF
elif [ -z "$only" ] && has_cuda build; then
  build_and_test build-cpu "-L cpu-build" -DTRAINER_CUDA=OFF
fi
