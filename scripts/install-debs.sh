#!/usr/bin/env bash
# install-debs.sh NAME PACKAGE...: install (when missing) Debian packages for one part
# of hpcdl's set-up (NAME names it in messages and in the .deb cache).
#
# Idempotent: exits at once when every package is already installed. Downloaded .debs
# are kept under ${HPCDL_CACHE:-/var/cache/hpcdl}/debs/NAME so a fresh clone on the same
# machine (CI) reinstalls without the network. The machine's policy-rc.d stays in
# place: package installs must not start services.
set -euo pipefail

name=$1
shift
PACKAGES=("$@")

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
  [[ $status == ii* ]] || missing+=("$pkg")
done
if ((${#missing[@]} == 0)); then
  echo "install-$name: all packages present (${PACKAGES[*]})"
  exit 0
fi

if [[ $(id -u) != 0 ]]; then
  echo "install-$name: missing ${missing[*]} and not root: install them as root" >&2
  exit 1
fi

cache=${HPCDL_CACHE:-/var/cache/hpcdl}/debs/$name
mkdir -p "$cache/partial"
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=900 -o "Dir::Cache::archives=$cache"
          -o APT::Keep-Downloaded-Packages=true -y --no-install-recommends)

echo "install-$name: installing ${missing[*]}"
t0=$SECONDS
# Try with the package lists we have (and the cached .debs); refresh them once if that fails.
if ! apt-get "${apt_opts[@]}" install "${missing[@]}"; then
  apt-get -o DPkg::Lock::Timeout=900 update
  apt-get "${apt_opts[@]}" install "${missing[@]}"
fi
echo "install-$name: done in $((SECONDS - t0)) s"
