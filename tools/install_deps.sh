#!/usr/bin/env bash
# Installs the Debian 12 packages the trainer needs to build, test and run the demo.
# Idempotent: packages already present are skipped; safe to run again.
#   tools/install_deps.sh [--build-only]
# --build-only: what building and running trainer and prepare_data needs (the demo), without the
# test suite's tools (Catch2, Slurm and munge, the Python packages, the HDF5 tools, the cuDNN
# frontend).
set -euo pipefail
build_only=0
[ "${1:-}" = "--build-only" ] && build_only=1
pkgs=(
  build-essential cmake ninja-build pkg-config ccache
  libyaml-cpp-dev libhdf5-dev libabsl-dev
  libopenmpi-dev openmpi-bin libopenblas-dev nlohmann-json3-dev zlib1g-dev
  libpcre2-dev libutf8proc-dev
  libprotobuf-dev protobuf-compiler libboost-dev procps
)
((build_only)) || pkgs+=(
  hdf5-tools catch2 slurm-wlm munge
  python3 python3-yaml python3-matplotlib python3-venv
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  echo "installing: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq -o Dpkg::Use-Pty=0 \
    --no-install-recommends "${missing[@]}" >/dev/null
fi

# cuDNN's C++ frontend (header-only; the graph API behind the fused attention), only where
# the CUDA toolkit is: from its PyPI wheel into .deps/ (ignored by git; carry it to the GPU
# machine, which reaches no registry).
frontend_version=1.32.0
frontend_dir="$(cd "$(dirname "$0")/.." && pwd)/.deps/cudnn-frontend"
if ((!build_only)) && command -v nvcc >/dev/null 2>&1 &&
  [ ! -f "$frontend_dir/$frontend_version/include/cudnn_frontend.h" ]; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    sudo_cmd=()
    [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq python3-pip >/dev/null
  fi
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
    "nvidia-cudnn-frontend==$frontend_version"
  mkdir -p "$frontend_dir/$frontend_version"
  python3 -m zipfile -e "$tmp"/nvidia_cudnn_frontend-*.whl "$tmp/wheel"
  cp -r "$tmp/wheel/include" "$frontend_dir/$frontend_version/"
  rm -rf "$tmp"
  echo "cuDNN frontend $frontend_version headers in $frontend_dir/$frontend_version/include"
fi
