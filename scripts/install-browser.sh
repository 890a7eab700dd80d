#!/usr/bin/env bash
# Install (when missing) Debian's Chromium for the report tests: `hpcdl report`'s HTML
# is opened in a real headless browser (tests/integration/test_report_browser.py, through
# Playwright's Python client with executable_path=/usr/bin/chromium). No browser is
# downloaded by Playwright itself (`playwright install` is never run): the Debian
# package is the browser.
#
# Idempotent: exits at once when the package is installed. Downloaded .debs are kept
# under ${HPCDL_CACHE:-/var/cache/hpcdl}/debs/browser, as install-slurm.sh does.
set -euo pipefail

PACKAGES=(chromium fonts-dejavu-core)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
  [[ $status == ii* ]] || missing+=("$pkg")
done
if ((${#missing[@]} == 0)); then
  echo "install-browser: all packages present (${PACKAGES[*]})"
  exit 0
fi

if [[ $(id -u) != 0 ]]; then
  echo "install-browser: missing ${missing[*]} and not root: install them as root" >&2
  exit 1
fi

cache=${HPCDL_CACHE:-/var/cache/hpcdl}/debs/browser
mkdir -p "$cache/partial"
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=900 -o "Dir::Cache::archives=$cache"
          -o APT::Keep-Downloaded-Packages=true -y --no-install-recommends)

echo "install-browser: installing ${missing[*]}"
t0=$SECONDS
if ! apt-get "${apt_opts[@]}" install "${missing[@]}"; then
  apt-get -o DPkg::Lock::Timeout=900 update
  apt-get "${apt_opts[@]}" install "${missing[@]}"
fi
echo "install-browser: done in $((SECONDS - t0)) s"
