#!/usr/bin/env bash
# Install (when missing) the Debian packages the sandbox Slurm cluster needs:
# munge, Slurm 22.05 (controller, node daemon, client, accounting daemon),
# MariaDB for accounting, Open MPI + PMIx for `srun --mpi=pmix`.
#
# Idempotent: exits at once when every package is already installed.
# Downloaded .debs are kept under ${HPCDL_CACHE:-/var/cache/hpcdl}/debs/slurm so a
# fresh clone on the same machine (CI) reinstalls without the network.
# The machine's policy-rc.d stays in place: package installs must not start
# services; scripts/sandbox.sh starts the daemons itself.
set -euo pipefail

PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server
          openmpi-bin libopenmpi-dev libpmix2 libpmix-dev)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
  [[ $status == ii* ]] || missing+=("$pkg")
done
if ((${#missing[@]} == 0)); then
  echo "install-slurm: all packages present (${PACKAGES[*]})"
  exit 0
fi

if [[ $(id -u) != 0 ]]; then
  echo "install-slurm: missing ${missing[*]} and not root: install them as root" >&2
  exit 1
fi

cache=${HPCDL_CACHE:-/var/cache/hpcdl}/debs/slurm
mkdir -p "$cache/partial"
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=900 -o "Dir::Cache::archives=$cache"
          -o APT::Keep-Downloaded-Packages=true -y --no-install-recommends)

echo "install-slurm: installing ${missing[*]}"
t0=$SECONDS
# Try with the package lists we have (and the cached .debs); refresh them once if that fails.
if ! apt-get "${apt_opts[@]}" install "${missing[@]}"; then
  apt-get -o DPkg::Lock::Timeout=900 update
  apt-get "${apt_opts[@]}" install "${missing[@]}"
fi
echo "install-slurm: done in $((SECONDS - t0)) s"
