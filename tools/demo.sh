#!/usr/bin/env bash
# Demo: set up, build, tokenize the licence texts every Debian machine has, train the tiny
# model (configs/tiny.yaml) on the CPU. Extra arguments go to the trainer (e.g. --set ...).
# It installs and builds only what that needs: the configuration without CUDA, in build-cpu/
# (tools/run_tests.sh builds and tests that one too), the trainer and prepare_data.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh --build-only
export CCACHE_BASEDIR="$PWD"
cmake -S . -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINER_CUDA=OFF \
  -DBUILD_TESTING=OFF >/dev/null
cmake --build build-cpu --target trainer prepare_data -j"$(nproc)"

mkdir -p runs/data
texts=/usr/share/common-licenses
valid=("$texts/Apache-2.0" "$texts/MPL-2.0")
train=()
for f in "$texts"/*; do
  [ -f "$f" ] || continue
  case "$f" in "${valid[0]}" | "${valid[1]}") ;; *) train+=("$f") ;; esac
done
build-cpu/tools/prepare_data --format text --output runs/data/licenses_train "${train[@]}"
build-cpu/tools/prepare_data --format text --output runs/data/licenses_valid "${valid[@]}"
build-cpu/trainer/trainer --config configs/tiny.yaml "$@"
