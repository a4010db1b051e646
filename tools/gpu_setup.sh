#!/usr/bin/env bash
# On the GPU machine (tools/gpu_check.sh's probe runs it): adds the Debian packages of the pack
# (tools/gpu_pack.sh) without overwriting any file the machine already has, finds cuDNN and NCCL
# (the system's, else PyTorch's wheels), and writes /tmp/gpu-env.sh for later commands to source.
#
#   bash tools/gpu_setup.sh DEBS_DIR        (GPU_SETUP_ROOT=DIR unpacks under DIR instead of /)
set -uo pipefail
debs=${1:?"usage: gpu_setup.sh DEBS_DIR"}
root=${GPU_SETUP_ROOT:-/}
added=0 kept=0
for deb in "$debs"/*.deb; do
  [ -e "$deb" ] || continue
  clash=
  while read -r path; do
    case "$path" in usr/share/doc/* | usr/share/man/* | usr/share/lintian/* | "") continue ;; esac
    if [ -e "$root/$path" ] && [ ! -d "$root/$path" ]; then clash=$path; break; fi
  done < <(dpkg-deb -c "$deb" | awk '{ print $6 }' | sed 's|^\./||')
  if [ -z "$clash" ]; then
    # As dpkg -x, but a directory symlink of the machine's (/lib -> usr/lib on a merged-/usr
    # system) stays a symlink instead of becoming a directory.
    dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C "$root" && added=$((added + 1))
  else
    kept=$((kept + 1))
    echo "setup: kept the machine's own ${clash##*/} (skipped $(basename "$deb"))"
  fi
done
[ "$root" = / ] && ldconfig

# cuDNN and NCCL: system headers first, else the Python wheels that PyTorch brought. Open MPI's
# launcher by its usual names (dpkg -x does not run the alternatives that make them).
prefix=/tmp/nvdeps
mkdir -p "$prefix/include" "$prefix/lib" "$prefix/bin"
py=$(command -v python3 || true)
found=()
for lib in cudnn nccl; do
  if [ -e "/usr/include/$lib.h" ] || [ -e "/usr/local/cuda/include/$lib.h" ]; then
    found+=("$lib: system"); continue
  fi
  dir=$([ -n "$py" ] && "$py" -c "import nvidia.$lib as m; print(list(m.__path__)[0])" 2>/dev/null)
  if [ -z "$dir" ] || [ ! -d "$dir/include" ]; then found+=("$lib: NOT FOUND"); continue; fi
  ln -sf "$dir"/include/* "$prefix/include/"
  for so in "$dir"/lib/lib*.so*; do
    ln -sf "$so" "$prefix/lib/"
    base=$(basename "$so")
    ln -sf "$so" "$prefix/lib/${base%%.so*}.so"
  done
  found+=("$lib: $dir")
done
# What Debian's alternatives would have made (dpkg-deb runs no maintainer scripts): Open MPI's
# launcher and compiler wrappers by their usual names, and OpenBLAS as libopenblas.so.0 (and
# libblas.so.3, and the link-time names the fallback build looks for) on the library path.
for name in mpirun mpiexec mpicc mpicxx; do
  command -v "$name" >/dev/null || { [ -x "$root/usr/bin/$name.openmpi" ] && ln -sf "$root/usr/bin/$name.openmpi" "$prefix/bin/$name"; }
done
openblas=$root/usr/lib/x86_64-linux-gnu/openblas-pthread
if [ -d "$openblas" ]; then
  for so in "$openblas"/lib*.so*; do [ -e "$prefix/lib/$(basename "$so")" ] || ln -sf "$so" "$prefix/lib/"; done
fi
cuda=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
cat >/tmp/gpu-env.sh <<ENV
export PATH=$prefix/bin:$cuda/bin:\$PATH
export CUDA_HOME=$cuda
export CMAKE_PREFIX_PATH=$prefix:$cuda\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}
export CPATH=$prefix/include\${CPATH:+:\$CPATH}
export LIBRARY_PATH=$prefix/lib\${LIBRARY_PATH:+:\$LIBRARY_PATH}
export LD_LIBRARY_PATH=$prefix/lib:$cuda/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ENV
echo "setup: added $added packages, kept the machine's own for $kept; ${found[*]}; wrote /tmp/gpu-env.sh"
