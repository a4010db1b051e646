#!/usr/bin/env bash
# Set up, build and run the whole test suite (what CI runs). GPU tests (label gpu) skip
# themselves cleanly when no device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
cd build && ctest --output-on-failure -j"$(nproc)" "$@"
