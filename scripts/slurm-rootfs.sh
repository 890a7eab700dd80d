#!/usr/bin/env bash
# A Debian root filesystem holding one Slurm release's daemons and commands, for the
# sandboxes of releases newer than the host's (bookworm ships 22.05 only; trixie's 24.11
# and forky's 26.05 need a newer glibc than the host has, so they live in a root of
# their own Debian release and run from there; see docs/guide/sandbox.md).
#
#   scripts/slurm-rootfs.sh RELEASE      build (or find) the root, print its path
#   scripts/slurm-rootfs.sh --path RELEASE   print the path it would have (builds nothing)
#
# RELEASE: 24.11 (Debian trixie) or 26.05 (Debian forky). The root holds slurmctld,
# slurmd, slurmdbd, slurm-client and munge: the release's own slurmdbd keeps the
# sandbox's accounting (sacct), as the host's 22.05 sandbox has. The database server is
# not the release's: sandbox.sh starts the host's MariaDB (bookworm's) in each
# sandbox's own datadir; the release's slurmdbd speaks to it through the root's
# libmariadb (the client protocol has not changed between them).
#
# Cached by content: the root is $HPCDL_SLURM_ROOTFS_CACHE (default
# /var/cache/hpcdl/slurm-rootfs)/RELEASE-KEY, KEY = 12 hex digits of the SHA-256 of this
# script and the release, so a change to this script builds a new root and an unchanged
# one finds the old at once. It is built in a temporary directory beside it and renamed
# into place only when complete: a root at the final path is always whole.
set -euo pipefail

CACHE=${HPCDL_SLURM_ROOTFS_CACHE:-/var/cache/hpcdl/slurm-rootfs}
MIRROR=${HPCDL_DEBIAN_MIRROR:-http://deb.debian.org/debian}

only_path=0
if [[ ${1:-} == --path ]]; then only_path=1; shift; fi
if (($# != 1)); then
  echo "usage: slurm-rootfs.sh [--path] RELEASE (24.11 or 26.05)" >&2
  exit 2
fi
release=$1
# The Debian release holding each Slurm release, and the debootstrap script for it:
# bookworm's debootstrap has no forky script; sid's serves any testing release.
case $release in
  24.11) suite=trixie; script=/usr/share/debootstrap/scripts/trixie ;;
  26.05) suite=forky; script=/usr/share/debootstrap/scripts/sid ;;
  *)
    echo "slurm-rootfs: release '$release' is not one this script builds (known: 24.11 from trixie, 26.05 from forky; 22.05 is the host's own packages)" >&2
    exit 2 ;;
esac

key=$( { cat "${BASH_SOURCE[0]}"; printf '%s\n' "$release"; } | sha256sum | cut -c1-12)
root=$CACHE/$release-$key
if ((only_path)) || [[ -x $root/usr/sbin/slurmd ]]; then
  echo "$root"
  exit 0
fi

if ((EUID != 0)); then
  echo "slurm-rootfs: building a root filesystem needs root (debootstrap, chroot)" >&2
  exit 2
fi
mkdir -p "$CACHE"
tmp=$(mktemp -d "$CACHE/.build-$release-XXXXXX")
# mktemp makes it 0700: the packages' scripts (su munge) and every user's Slurm
# commands must traverse it.
chmod 755 "$CACHE" "$tmp"
# The chroot's /proc is mounted for the package scripts; it must be gone before rm -rf
# could reach the host's /proc through it.
cleanup() {
  local m
  # debootstrap's own mounts (proc, sys, dev/pts) too, deepest first.
  for m in $(findmnt -rn -o TARGET | grep -F "$tmp/" | sort -r); do umount -l "$m" || true; done
  rm -rf --one-file-system "$tmp" "$tmp.log"
}
trap cleanup EXIT
# host_run TMP ROOT: copies of the release's executables that run on the HOST's
# filesystem (not chrooted), in ROOT/hpcdl/{bin,sbin}: their ELF interpreter and rpath
# point at ROOT's own loader and libraries (bookworm's glibc is too old for them). The
# job steps that slurmd starts then see the host's files (its python, Apptainer, /home),
# as on a real node. The plugins' own RUNPATH is pointed at ROOT as well, so a plugin's
# libraries also come from ROOT. The originals stay as they are (chroot still works).
host_run() {
  local tmp=$1 root=$2 f dir lib
  lib="$root/usr/lib/x86_64-linux-gnu/slurm-wlm:$root/usr/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/slurm"
  mkdir -p "$tmp/hpcdl/bin" "$tmp/hpcdl/sbin"
  # Resolved inside the root: /usr/sbin/slurmd is an absolute symlink through
  # /etc/alternatives, which outside the root names the HOST's 22.05 binary.
  for f in slurmctld slurmd slurmstepd slurmdbd munged; do
    cp "$tmp$(chroot "$tmp" readlink -f "/usr/sbin/$f")" "$tmp/hpcdl/sbin/$f"
  done
  for f in sbatch srun squeue scontrol sinfo scancel sacct sacctmgr salloc sprio sshare sstat scrontrol munge unmunge; do
    if chroot "$tmp" test -e "/usr/bin/$f"; then
      cp "$tmp$(chroot "$tmp" readlink -f "/usr/bin/$f")" "$tmp/hpcdl/bin/$f"
    fi
  done
  for f in "$tmp"/hpcdl/bin/* "$tmp"/hpcdl/sbin/*; do
    [[ -L $f ]] && continue
    patchelf --set-interpreter "$root/usr/lib64/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$lib" "$f"
  done
  pmix_path "$tmp" "$root"
  for dir in "$tmp/usr/lib/x86_64-linux-gnu/slurm-wlm" "$tmp/usr/lib/x86_64-linux-gnu/slurm"; do
    [[ -d $dir ]] || continue
    for f in "$dir"/*.so*; do
      [[ -f $f && ! -L $f ]] || continue
      patchelf --set-rpath "$lib" "$f"
    done
  done
}

# pmix_path TMP ROOT: the release's mpi/pmix plugin dlopens PMIXP_LIBPATH/libpmix.so.2,
# PMIXP_LIBPATH compiled in as /usr/lib/x86_64-linux-gnu/pmix2/lib: on the host that is
# bookworm's PMIx 4, whose libpmix inside the release's slurmstepd hangs every
# `srun --mpi=pmix` step. The path is rewritten in the plugin to /run/hpcdl-pmix-RELEASE
# padded with slashes to the same length (a path may hold any number of them; the bytes
# around it stay where they are), and the root's libpmix gets the root's libraries'
# rpath. `sandbox.sh up` makes that link (the name is in ROOT/hpcdl/pmix-link) to
# ROOT's PMIx directory; /run is emptied at boot, so every up makes it again. A release
# whose Debian build has no mpi/pmix plugin (forky's 26.05) gets no link file.
pmix_path() {
  local tmp=$1 root=$2 f lib link old=/usr/lib/x86_64-linux-gnu/pmix2/lib
  lib="$root/usr/lib/x86_64-linux-gnu/slurm-wlm:$root/usr/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/slurm"
  link=/run/hpcdl-pmix-$release
  for f in "$tmp"/usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix_v*.so; do
    [[ -f $f ]] || return 0
    OLD=$old NEW=$link perl -0777 -pi -e '
      my ($o, $n) = ($ENV{OLD}, $ENV{NEW});
      die "new path longer than old\n" if length($n) > length($o);
      $n .= "/" x (length($o) - length($n));
      s/\Q$o\E/$n/g or die "no $o in plugin\n";' "$f"
  done
  for f in "$tmp$old"/libpmix.so.*; do
    if [[ -f $f && ! -L $f ]]; then patchelf --set-rpath "$lib" "$f"; fi
  done
  printf '%s %s\n' "$link" "$root$old" >"$tmp/hpcdl/pmix-link"
}

start=$SECONDS
echo "slurm-rootfs: building Slurm $release (Debian $suite) in $tmp" >&2
debootstrap --variant=minbase "$suite" "$tmp" "$MIRROR" "$script" >"$tmp.log" 2>&1 || {
  echo "slurm-rootfs: debootstrap $suite failed; last lines of its log:" >&2
  tail -n 20 "$tmp.log" >&2
  rm -f "$tmp.log"
  exit 1
}
rm -f "$tmp.log"
# No service may start inside the root during the installs (there is no init there,
# and a started munged would hold the root busy).
printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
chmod 755 "$tmp/usr/sbin/policy-rc.d"
# forky's Release file on the mirror is past its Valid-Until; trixie's is not, and the
# option is harmless there.
printf 'Acquire::Check-Valid-Until "false";\n' >"$tmp/etc/apt/apt.conf.d/99hpcdl-no-valid-until"
mount -t proc proc "$tmp/proc"
chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get -q update >/dev/null
chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get -q -y install --no-install-recommends \
  slurmctld slurmd slurmdbd slurm-client munge >/dev/null
chroot "$tmp" apt-get clean
umount "$tmp/proc"
rm -rf "$tmp/var/lib/apt/lists/"*
version=$(chroot "$tmp" /usr/sbin/slurmd -V)
host_run "$tmp" "$root"
printf '%s\n' "$version" >"$tmp/.hpcdl-slurm-version"
mv -T "$tmp" "$root"
trap - EXIT
echo "slurm-rootfs: $version in $((SECONDS - start)) s" >&2
echo "$root"
