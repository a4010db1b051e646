#!/usr/bin/env bash
# Makes the GPU window's pack (docs/gpu.md): builds here only what tools/gpu_check.sh runs, for
# the GPU machines' architecture (90a: H100 and H200), strips it, and puts it in .gpu/ (ignored by
# git) with the Debian packages that machine lacks; the fallback build's packages go to .gpu-dev/.
# Then prints what each carries with the working tree, against the 64 MiB the device tool
# carries, and fails when either leaves less than a 6 MiB margin (58 MiB at most).
#
#   tools/gpu_pack.sh [--arch 90a] [--from-build DIR] [--no-debs] [--out .gpu]
#
#   --arch ARCH       CUDA architecture of the kernels (default $GPU_ARCH, else 90a)
#   --from-build DIR  pack the binaries of an existing build instead of building build-pack/
#   --no-debs         leave out the Debian packages and .gpu-dev/ (binaries only)
#   --out DIR         the pack's folder (default .gpu; carry it with the device tool); the
#                     fallback's is DIR-dev
#
# A window carries one of them with the tree (both would not fit):
#   .gpu/       pack.tar.xz: the programs and tests gpu_check.sh --targets names, laid out as in
#                 a build; gpu_check.sh unpacks it into build-packed/ (ignored, not carried) and
#                 runs it there (the tests find the checkout above them at run time)
#               debs/: runtime packages: every library the binaries load that a Debian package
#                 gives (tools/gpu_setup.sh keeps the machine's own where it has one), and Open
#                 MPI's launcher with what its plug-ins load
#   .gpu-dev/   for a window after one whose binaries did not load: no binaries; debs/ (the
#               same), dev-debs/ (the -dev packages) and cudnn-frontend.tar.xz (the cuDNN
#               frontend headers), from which gpu_check.sh builds the programs on the machine
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${GPU_ARCH:-90a} from="" debs=1 dest=.gpu
while (($#)); do
  case $1 in
    --arch) arch=$2; shift 2 ;;
    --from-build) from=$2; shift 2 ;;
    --no-debs) debs=0; shift ;;
    --out) dest=$2; shift 2 ;;
    *) echo "gpu_pack.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
dev_dest=$dest-dev
# What the window's stages run, as build paths (trainer/trainer, tests/test_cuda_ops, ...).
mapfile -t targets < <(bash tools/gpu_check.sh --targets)

build=$from
if [ -z "$build" ]; then
  build=build-pack
  export CCACHE_BASEDIR=$PWD
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINER_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" >/dev/null
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]##*/}"
fi
grep -q '^TRAINER_HAVE_CUDA:INTERNAL=ON$' "$build/CMakeCache.txt" ||
  echo "gpu_pack.sh: note: $build has no CUDA backend; its pack trains on CPUs only" >&2

# The binaries, stripped, in a build's layout: staged in build-packed/ (where gpu_check.sh
# unpacks them on the GPU machine too), then compressed into the pack (xz -9e: 5.6 MiB, where -6
# made 8.8).
staged=build-packed
rm -rf "$staged" "$dest/pack"
mkdir -p "$staged/trainer" "$staged/tools" "$staged/tests" "$dest"
for f in "${targets[@]}"; do
  [ -f "$build/$f" ] || { echo "gpu_pack.sh: $build/$f was not built" >&2; exit 1; }
  strip --strip-unneeded -o "$staged/$f" "$build/$f"
done
XZ_OPT="-T0 ${XZ_LEVEL:--9e}" tar -cJf "$dest/pack.tar.xz" -C "$staged" trainer tools tests
for d in "$dest" "$dev_dest"; do
  if [ -d .git ] && ! git check-ignore -q "$d"; then echo "/${d#./}/" >>.git/info/exclude; fi
done

# runtime_packages: the Debian packages that own the libraries the packed binaries load, less
# those every Linux has (glibc, the C++ runtime) and those the GPU machine brings (CUDA, cuDNN,
# NCCL: the toolkit's and PyTorch's wheels').
runtime_packages() {
  # A library of a package that ships it under /lib is found by its /lib name.
  ldd "$staged"/*/* 2>/dev/null | awk '/=> \// { print $3 }' | sort -u | xargs -r readlink -f |
    sort -u | while read -r so; do dpkg -S "$so" 2>/dev/null || dpkg -S "${so#/usr}" 2>/dev/null; done |
    cut -d: -f1 | tr ',' '\n' | sed 's/^ *//' | sort -u |
    grep -vE '^(libc6|libstdc\+\+6|libgcc-s1|libcudnn|libnccl|cuda-|libcublas|libcudart|libnvjitlink)'
}
if ((debs)); then
  command -v apt-get >/dev/null || { echo "gpu_pack.sh: apt-get not found; use --no-debs" >&2; exit 1; }
  # Open MPI's launcher, and what its plug-ins load (dlopen: ldd does not see them).
  mpi_runtime=(openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libevent-core-2.1-7
               libevent-pthreads-2.1-7 libfabric1 libucx0 libpsm2-2 libpsm-infinipath1 libibverbs1
               librdmacm1 libnl-3-200 libnl-route-3-200 libmunge2 libnuma1 libltdl7 hdf5-tools)
  # The fallback build's headers and link-time files (tools/install_deps.sh's -dev packages).
  dev=(libyaml-cpp-dev libhdf5-dev hdf5-helpers libaec-dev libabsl-dev catch2 nlohmann-json3-dev
       libopenmpi-dev libopenblas-dev libopenblas-pthread-dev libpcre2-dev libutf8proc-dev
       libprotobuf-dev protobuf-compiler libprotoc32 libboost1.74-dev zlib1g-dev libcurl3-gnutls)
  mapfile -t runtime < <(runtime_packages)
  rm -rf "$dest/debs" "$dest/dev-debs" "$dest/cudnn-frontend.tar.xz" "$dev_dest"
  mkdir -p "$dest/debs" "$dev_dest/dev-debs"
  log=$(cd "$dest" && pwd)/download.log
  (cd "$dest/debs" && apt-get download "${runtime[@]}" "${mpi_runtime[@]}" >/dev/null 2>"$log") ||
    { echo "gpu_pack.sh: apt-get download failed: $log ('apt-get update' first?)" >&2; exit 1; }
  (cd "$dev_dest/dev-debs" && apt-get download "${dev[@]}" >/dev/null 2>>"$log") ||
    { echo "gpu_pack.sh: apt-get download failed: $log" >&2; exit 1; }
  # The same runtime packages, hard-linked where the filesystem allows: a fallback window
  # carries .gpu-dev/ alone.
  cp -rl "$dest/debs" "$dev_dest/debs" 2>/dev/null || cp -r "$dest/debs" "$dev_dest/debs"
  frontend=.deps/cudnn-frontend/1.32.0/include
  [ -f "$frontend/cudnn_frontend.h" ] || bash tools/install_deps.sh >/dev/null
  rm -f "$log"
  XZ_OPT=-T0 tar -cJf "$dev_dest/cudnn-frontend.tar.xz" -C "${frontend%/include}" include
fi

# What the device tool carries: the tracked and untracked-but-not-ignored files, plus the pack.
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$PWD" ]; then
  tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0r stat -c %s 2>/dev/null |
    awk '{ s += $1 } END { print s + 0 }')
else  # a copy of the tree without git: all but the pack and build folders
  tree_bytes=$(find . -path "./${dest#./}" -prune -o -path "./${dev_dest#./}" -prune -o \
    -path './build*' -prune -o -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
fi
# A window carries one folder with the tree; 6 of the 64 MiB stay free for what is added next
# (the FP8 and MoE work), so that a pack that grows is refused here, not on the GPU machine.
margin=6
fits=1
for d in "$dest" "$dev_dest"; do
  [ -d "$d" ] || continue
  for part in "$d"/*; do
    if [ -e "$part" ]; then echo "gpu_pack.sh: $part: $(mib "$(du -sb "$part" | cut -f1)") MiB"; fi
  done
  pack_bytes=$(du -sb "$d" | cut -f1)
  total=$((tree_bytes + pack_bytes))
  echo "gpu_pack.sh: carry [\"${d#./}\"]: pack $(mib "$pack_bytes") MiB + tree $(mib "$tree_bytes") MiB =" \
    "$(mib "$total") MiB of the 64 MiB carried"
  if ((total > (64 - margin) * 1048576)); then
    echo "gpu_pack.sh: ${d#./} with the tree is $(mib "$total") MiB, over $((64 - margin)) MiB: the" \
      "$margin MiB margin is gone; make room (docs/gpu.md: the pack)" >&2
    fits=0
  fi
done
((fits))
