#!/usr/bin/env bash
# Installs the Debian 12 packages the trainer needs to build, test and run the demo.
# Idempotent: packages already present are skipped; safe to run again.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config ccache
  libyaml-cpp-dev libhdf5-dev hdf5-tools libabsl-dev catch2
  libopenmpi-dev openmpi-bin libopenblas-dev nlohmann-json3-dev zlib1g-dev
  slurm-wlm munge
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
