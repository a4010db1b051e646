#!/usr/bin/env bash
# Makes the GPU window's pack (docs/gpu.md): builds here only what tools/gpu_check.sh runs, for
# the GPU machines' architecture (90a: H100 and H200), strips it, and puts it in .gpu/ (ignored by
# git) with the Debian packages that machine lacks; then prints the pack's size beside the 64 MiB
# that the device tool carries together with the working tree.
#
#   tools/gpu_pack.sh [--arch 90a] [--from-build DIR] [--no-debs] [--out .gpu]
#
#   --arch ARCH       CUDA architecture of the kernels (default $GPU_ARCH, else 90a)
#   --from-build DIR  pack the binaries of an existing build instead of building build-pack/
#   --no-debs         leave out the Debian packages and the cuDNN frontend (binaries only)
#   --out DIR         the pack's folder (default .gpu; carry it with the device tool)
#
# What it holds (about 58 MiB with the tree for 90a; the tool carries 64):
#   pack.tar.xz             the programs and test binaries, laid out as in a build; gpu_check.sh
#                           unpacks it into build-packed/ (ignored, not carried) and runs it there
#                           (the tests find the checkout above them at run time)
#   debs/                   runtime packages: every library the binaries load that a Debian
#                           package gives (tools/gpu_setup.sh keeps the machine's own where it has
#                           one), and Open MPI's launcher with what its plug-ins load
#   dev-debs/               the -dev packages of the fallback build on the GPU machine
#   cudnn-frontend.tar.xz   the cuDNN frontend headers, for that fallback build
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
programs=(trainer/trainer tools/prepare_data tools/preflight tools/bench_ops)
# The GPU tests, then the CPU test binaries with cases that run in process (gpu_check.sh cpu).
tests=(test_cuda_ops test_cli_gpu test_kernels test_data test_checkpoint test_config test_trainer
       test_schedule test_tools test_comm test_reliability test_hf test_tokenizer)

build=$from
if [ -z "$build" ]; then
  build=build-pack
  export CCACHE_BASEDIR=$PWD
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINER_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" >/dev/null
  cmake --build "$build" -j"$(nproc)" --target "${programs[@]##*/}" "${tests[@]}"
fi
grep -q '^TRAINER_HAVE_CUDA:INTERNAL=ON$' "$build/CMakeCache.txt" ||
  echo "gpu_pack.sh: note: $build has no CUDA backend; its pack trains on CPUs only" >&2

# The binaries, stripped, in a build's layout: staged in build-packed/ (where gpu_check.sh
# unpacks them on the GPU machine too), then compressed into the pack (xz: a quarter of gzip's size).
staged=build-packed
rm -rf "$staged" "$dest/pack"
mkdir -p "$staged/trainer" "$staged/tools" "$staged/tests" "$dest"
for f in "${programs[@]}" "${tests[@]/#/tests/}"; do
  [ -f "$build/$f" ] || { echo "gpu_pack.sh: $build/$f was not built" >&2; exit 1; }
  strip --strip-unneeded -o "$staged/$f" "$build/$f"
done
XZ_OPT="-T0 ${XZ_LEVEL:--6}" tar -cJf "$dest/pack.tar.xz" -C "$staged" trainer tools tests
if [ -d .git ] && ! git check-ignore -q "$dest"; then echo "/${dest#./}/" >>.git/info/exclude; fi

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
  rm -rf "$dest/debs" "$dest/dev-debs"
  mkdir -p "$dest/debs" "$dest/dev-debs"
  (cd "$dest/debs" && apt-get download "${runtime[@]}" "${mpi_runtime[@]}" >/dev/null 2>../download.log) ||
    { echo "gpu_pack.sh: apt-get download failed: $dest/download.log ('apt-get update' first?)" >&2; exit 1; }
  (cd "$dest/dev-debs" && apt-get download "${dev[@]}" >/dev/null 2>>../download.log) ||
    { echo "gpu_pack.sh: apt-get download failed: $dest/download.log" >&2; exit 1; }
  frontend=.deps/cudnn-frontend/1.32.0/include
  [ -f "$frontend/cudnn_frontend.h" ] || bash tools/install_deps.sh >/dev/null
  rm -f "$dest/download.log"
  rm -rf "$dest/cudnn-frontend"
  XZ_OPT=-T0 tar -cJf "$dest/cudnn-frontend.tar.xz" -C "${frontend%/include}" include
fi

# What the device tool carries: the tracked and untracked-but-not-ignored files, plus the pack.
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$PWD" ]; then
  tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0r stat -c %s 2>/dev/null |
    awk '{ s += $1 } END { print s + 0 }')
else  # a copy of the tree without git: all but the pack and build folders
  tree_bytes=$(find . -path "./${dest#./}" -prune -o -path './build*' -prune -o -type f -printf '%s\n' |
    awk '{ s += $1 } END { print s + 0 }')
fi
pack_bytes=$(du -sb "$dest" | cut -f1)
total=$((tree_bytes + pack_bytes))
for part in pack.tar.xz debs dev-debs cudnn-frontend.tar.xz; do
  [ -e "$dest/$part" ] && echo "gpu_pack.sh: $dest/$part: $(mib "$(du -sb "$dest/$part" | cut -f1)") MiB"
done
echo "gpu_pack.sh: pack $(mib "$pack_bytes") MiB + tree $(mib "$tree_bytes") MiB = $(mib "$total") MiB of the 64 MiB carried"
((total <= 64 * 1048576)) || { echo "gpu_pack.sh: too large to carry: leave out dev-debs, or fewer tests" >&2; exit 1; }
