#!/usr/bin/env bash
# Proves the README's two set-up commands on a fresh Debian 12 machine without the CUDA toolkit:
# debootstraps a minimal bookworm into a folder, copies this working tree there (tracked and
# untracked files that git does not ignore; no build folders), and runs, inside a chroot,
#   bash tools/demo.sh        (1) install packages, build, tokenize, train the tiny model
#   bash tools/run_tests.sh   (2) install packages, build, run the whole test suite
# printing how long each took. Not part of CI (it downloads a Debian base system and builds
# from nothing): run it before changing the build or tools/install_deps.sh lands. Needs root.
#   tools/check_fresh_machine.sh [--root DIR] [--keep]
#     --root DIR  where the chroot goes (default /var/tmp/trainer-fresh-bookworm; emptied first)
#     --keep      leave the chroot in place afterwards (default: removed on success)
set -euo pipefail
cd "$(dirname "$0")/.."
root=/var/tmp/trainer-fresh-bookworm
keep=0
while (($#)); do
  case $1 in
    --root) root=${2:?--root needs a directory}; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "check_fresh_machine.sh: unknown argument '$1'; see the comment at the top" >&2; exit 2 ;;
  esac
done
case $root in /*/*) ;; *) echo "check_fresh_machine.sh: --root $root: give an absolute path two levels deep or more (it is emptied)" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "check_fresh_machine.sh: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
mirror=${mirror:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1
fi

mounts=(proc sys dev dev/pts dev/shm run)
unmount_all() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    mountpoint -q "$root/${mounts[i]}" && umount -l "$root/${mounts[i]}"
  done
  return 0
}
trap unmount_all EXIT
unmount_all
rm -rf "$root"
mkdir -p "$root"

t0=$(date +%s)
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 || {
  echo "check_fresh_machine.sh: debootstrap failed; see $root.debootstrap.log" >&2; exit 1; }
echo "debootstrap (minbase bookworm from $mirror): $(($(date +%s) - t0)) s"

mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --bind /dev "$root/dev"
mount -t devpts devpts "$root/dev/pts"
mount -t tmpfs tmpfs "$root/dev/shm"
mount -t tmpfs tmpfs "$root/run"

# The working tree as a user would have cloned it (plus uncommitted changes), at /root/trainer.
mkdir -p "$root/root/trainer"
git ls-files -z --cached --others --exclude-standard |
  tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$root/root/trainer"
if command -v nvcc >/dev/null; then echo "host has nvcc; the chroot does not (no CUDA toolkit there)"; fi

# A network whose HTTPS goes through an inspecting proxy has its own CA in the host's bundle: a
# machine on that network would trust it too, so pip inside the chroot gets the host's bundle
# (the only thing taken from the host besides the mirror and DNS).
tls_env=()
if [ -s /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$root/etc/ssl"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/host-ca-bundle.crt"
  tls_env=(PIP_CERT=/etc/ssl/host-ca-bundle.crt SSL_CERT_FILE=/etc/ssl/host-ca-bundle.crt)
fi
in_chroot() {
  chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb "${tls_env[@]}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd /root/trainer && $1"
}
status=0
for cmd in "bash tools/demo.sh" "bash tools/run_tests.sh"; do
  t0=$(date +%s)
  log="$root.$(echo "$cmd" | tr -c 'a-z_\n' '_' | tr -s _).log"
  if in_chroot "$cmd" >"$log" 2>&1; then
    echo "ok   '$cmd' in $(($(date +%s) - t0)) s (log: $log)"
  else
    echo "FAIL '$cmd' after $(($(date +%s) - t0)) s (log: $log):"
    tail -20 "$log"
    status=1
  fi
  { grep -E "^done: |^== |tests passed|tests failed" "$log" || true; } | sed 's/^/     /'
done
unmount_all
if ((status == 0 && keep == 0)); then rm -rf "$root"; fi
exit $status
