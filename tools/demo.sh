#!/usr/bin/env bash
# Demo: set up, build, tokenize the licence texts every Debian machine has, train the tiny
# model (configs/tiny.yaml) on the CPU. Extra arguments go to the trainer (e.g. --set ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target trainer prepare_data -j"$(nproc)"

mkdir -p runs/data
texts=/usr/share/common-licenses
valid=("$texts/Apache-2.0" "$texts/MPL-2.0")
train=()
for f in "$texts"/*; do
  [ -f "$f" ] || continue
  case "$f" in "${valid[0]}" | "${valid[1]}") ;; *) train+=("$f") ;; esac
done
build/tools/prepare_data --format text --output runs/data/licenses_train "${train[@]}"
build/tools/prepare_data --format text --output runs/data/licenses_valid "${valid[@]}"
build/trainer/trainer --config configs/tiny.yaml "$@"
