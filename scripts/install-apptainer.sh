#!/usr/bin/env bash
# Install a real Apptainer (with the `singularity` alias) on Debian 12 bookworm.
#
# Apptainer is not packaged for bookworm. Debian sid's apptainer needs glibc >= 2.38
# (bookworm has 2.36), so this script:
#   1. installs the bookworm packages Apptainer needs at run time;
#   2. fetches sid's apptainer + libc6 .debs with a PRIVATE apt state that points at sid
#      (the system's apt sources are never touched);
#   3. unpacks sid's libc into a private prefix and patchelf's every dynamically linked
#      executable of the package to that prefix's loader + rpath (host libc untouched);
#   4. repacks the .deb without the libc6 dependency and installs it with apt, so Debian's
#      maintainer scripts run and /usr/bin/singularity exists;
#   5. in the repacked package, /usr/bin/apptainer is a small wrapper that sets
#      APPTAINER_DROP_CAPS to the capabilities root lacks on this VM (CAP_SYS_RESOURCE
#      here) and execs the real binary, moved to /usr/libexec/apptainer. Without it every
#      exec/build fails with "Requesting capability set ... while permitted capability set
#      is ...". It must be /usr/bin/apptainer itself, not a wrapper earlier on PATH:
#      Apptainer re-runs BINDIR/apptainer with a cleared environment (the sandboxed
#      unsquashfs of `Bootstrap: localimage` builds). Apptainer derives its prefix from
#      its own path, two levels up, so the real binary sits directly in /usr/libexec.
#
# Idempotent: a second run with everything in place returns in well under a second.
# Cache: ${HPCDL_CACHE:-/var/cache/hpcdl}/debs (the downloaded and the repacked .debs).
# Env: HPCDL_DEBIAN_MIRROR (default http://deb.debian.org/debian), HPCDL_FORCE_REINSTALL=1.
set -euo pipefail

CACHE=${HPCDL_CACHE:-/var/cache/hpcdl}
DEBS=$CACHE/debs
MIRROR=${HPCDL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
LIBC_PREFIX=/opt/hpcdl/apptainer-libc
SUFFIX=+hpcdl2
# --force-confold: a reinstall keeps the apptainer.conf that configure() edited.
APT_INSTALL=(apt-get -o DPkg::Lock::Timeout=900 -o Dpkg::Options::=--force-confold
             install -y --no-install-recommends)
# fuse3: its setuid fusermount3 lets an ordinary user's job mount a packed dataset with
# squashfuse (submit --data X.sqfs --no-image), as cluster nodes allow.
BOOKWORM_DEPS=(squashfs-tools uidmap libseccomp2 libsqlite3-0 containernetworking-plugins
               e2fsprogs fuse2fs squashfuse fuse3 debootstrap patchelf)

log() { printf '[install-apptainer] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (installs packages)"
[ "$(dpkg --print-architecture)" = amd64 ] || die "only amd64 is supported"

# The wrapper that becomes /usr/bin/apptainer (bash: `exec -a` keeps argv[0], so the
# `singularity` alias, a symlink to it, still behaves as singularity).
write_wrapper() {
    cat >"$1" <<'WRAPPER'
#!/bin/bash
# Installed by hpcdl scripts/install-apptainer.sh. Root on these VMs lacks capabilities
# that Apptainer requests by default (CAP_SYS_RESOURCE); drop the missing ones, computed
# from this process's permitted set, unless the caller chose APPTAINER_DROP_CAPS.
# The real binary is /usr/libexec/apptainer (its prefix is still /usr).
if [ "$EUID" = 0 ] && [ -z "${APPTAINER_DROP_CAPS:-}" ]; then
    names=(CAP_CHOWN CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_FSETID CAP_KILL
      CAP_SETGID CAP_SETUID CAP_SETPCAP CAP_LINUX_IMMUTABLE CAP_NET_BIND_SERVICE
      CAP_NET_BROADCAST CAP_NET_ADMIN CAP_NET_RAW CAP_IPC_LOCK CAP_IPC_OWNER CAP_SYS_MODULE
      CAP_SYS_RAWIO CAP_SYS_CHROOT CAP_SYS_PTRACE CAP_SYS_PACCT CAP_SYS_ADMIN CAP_SYS_BOOT
      CAP_SYS_NICE CAP_SYS_RESOURCE CAP_SYS_TIME CAP_SYS_TTY_CONFIG CAP_MKNOD CAP_LEASE
      CAP_AUDIT_WRITE CAP_AUDIT_CONTROL CAP_SETFCAP CAP_MAC_OVERRIDE CAP_MAC_ADMIN CAP_SYSLOG
      CAP_WAKE_ALARM CAP_BLOCK_SUSPEND CAP_AUDIT_READ CAP_PERFMON CAP_BPF
      CAP_CHECKPOINT_RESTORE)
    prm=0
    while read -r key value _; do
        if [ "$key" = "CapPrm:" ]; then prm=$value; fi
    done </proc/self/status
    last=40
    read -r last </proc/sys/kernel/cap_last_cap || true
    missing=
    for ((i = 0; i <= last && i < ${#names[@]}; i++)); do
        if (( ((16#$prm >> i) & 1) == 0 )); then missing=${missing:+$missing,}${names[i]}; fi
    done
    if [ -n "$missing" ]; then export APPTAINER_DROP_CAPS=$missing; fi
fi
exec -a "$0" /usr/libexec/apptainer "$@"
WRAPPER
    chmod 0755 "$1"
}

# An earlier version of this script put wrappers in /usr/local/bin; no longer needed.
remove_old_wrappers() {
    local f
    for f in /usr/local/bin/apptainer /usr/local/bin/singularity; do
        if [ -f "$f" ] && grep -q 'install-apptainer.sh' "$f"; then rm -f "$f"; fi
    done
    rm -rf /usr/local/lib/hpcdl
    hash -r
}

# Ranks on one node should share one mount of the image. With a loop device each, every
# rank decompresses and caches its own copy of torch's libraries: CPU time at start-up,
# and N copies of the same code in memory. Measured with bench/bench_e2e.py (Horovod,
# 4 ranks on the sandbox): first training step 1.7-2.2 s after native without it,
# 0.0-1.4 s with it; throughput 0.83-0.92x native without, 0.89-1.04x with (noisy).
configure() {
    local conf=/etc/apptainer/apptainer.conf
    [ -f "$conf" ] || die "no $conf after install"
    grep -q '^shared loop devices = yes$' "$conf" && return 0
    sed -i 's/^shared loop devices = .*/shared loop devices = yes/' "$conf"
    grep -q '^shared loop devices = yes$' "$conf" || echo 'shared loop devices = yes' >>"$conf"
    log "set 'shared loop devices = yes' in $conf"
}

installed_version() { dpkg-query -W -f='${Status} ${Version}\n' apptainer 2>/dev/null |
                      awk '$3 == "installed" {print $4}'; }

# The bookworm packages Apptainer and hpcdl's jobs use; also on the fast path below, so a
# machine that has Apptainer gets a package added to the list later (fuse3).
install_deps() {
    local missing=() p
    for p in "${BOOKWORM_DEPS[@]}"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' ||
            missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    log "installing bookworm packages: ${missing[*]}"
    if ! apt-cache show "${missing[0]}" >/dev/null 2>&1; then
        apt-get -o DPkg::Lock::Timeout=900 update -qq
    fi
    DEBIAN_FRONTEND=noninteractive "${APT_INSTALL[@]}" "${missing[@]}" >&2
}

# --- fast path: already installed -----------------------------------------------------------
if [ "${HPCDL_FORCE_REINSTALL:-0}" != 1 ] && [[ "$(installed_version)" == *"$SUFFIX" ]] &&
   [ -x /usr/libexec/apptainer ]; then
    remove_old_wrappers
    if /usr/bin/apptainer --version >/dev/null 2>&1; then
        configure
        install_deps
        log "already installed: $(/usr/bin/apptainer --version)"
        exit 0
    fi
    log "installed package does not run; reinstalling"
fi

start=$(date +%s)
mkdir -p "$DEBS"

# --- 1. bookworm dependencies ---------------------------------------------------------------
install_deps

# --- 2. sid .debs through a private apt state ----------------------------------------------
find_deb() { ls -1 "$DEBS"/"$1"_*_"$2".deb 2>/dev/null | grep -v '+hpcdl' | sort -V | tail -n1; }
APPTAINER_DEB=$(find_deb apptainer amd64 || true)
LIBC_DEB=$(find_deb libc6 amd64 || true)
if [ -z "$APPTAINER_DEB" ] || [ -z "$LIBC_DEB" ]; then
    SID=$CACHE/sid-apt
    mkdir -p "$SID/lists/partial" "$SID/archives/partial" "$SID/cache" "$SID/etc/preferences.d"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR sid main" \
        >"$SID/etc/sources.list"
    : >"$SID/status"
    SID_OPTS=(-o Dir::State::Lists="$SID/lists" -o Dir::State::status="$SID/status"
              -o Dir::Cache="$SID/cache" -o Dir::Cache::archives="$SID/archives"
              -o Dir::Etc::SourceList="$SID/etc/sources.list"
              -o Dir::Etc::SourceParts=/nonexistent
              -o Dir::Etc::PreferencesParts="$SID/etc/preferences.d"
              -o Acquire::Check-Valid-Until=false -o APT::Get::List-Cleanup=false
              -o Acquire::Languages=none -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
    log "fetching the sid package index (private apt state in $SID)"
    apt-get "${SID_OPTS[@]}" update -qq >&2
    log "downloading sid apptainer + libc6"
    (cd "$DEBS" && apt-get "${SID_OPTS[@]}" download apptainer libc6 >&2)
    APPTAINER_DEB=$(find_deb apptainer amd64)
    LIBC_DEB=$(find_deb libc6 amd64)
fi
[ -n "$APPTAINER_DEB" ] && [ -n "$LIBC_DEB" ] || die "could not download apptainer/libc6 from sid"
log "using $(basename "$APPTAINER_DEB") and $(basename "$LIBC_DEB")"

# --- 3. private libc prefix -----------------------------------------------------------------
LIBC_VERSION=$(dpkg-deb -f "$LIBC_DEB" Version)
if [ "$(cat "$LIBC_PREFIX/.version" 2>/dev/null)" != "$LIBC_VERSION" ]; then
    mkdir -p "$(dirname "$LIBC_PREFIX")"
    tmp=$(mktemp -d "$(dirname "$LIBC_PREFIX")/.libc.XXXXXX")
    dpkg-deb -x "$LIBC_DEB" "$tmp"
    echo "$LIBC_VERSION" >"$tmp/.version"
    rm -rf "$LIBC_PREFIX"
    mv "$tmp" "$LIBC_PREFIX"
fi
LIBDIR=$LIBC_PREFIX/usr/lib/x86_64-linux-gnu
LOADER=$LIBDIR/ld-linux-x86-64.so.2
[ -e "$LOADER" ] || die "no loader in the unpacked libc ($LOADER)"

# --- 4. patch + repack ------------------------------------------------------------------------
AVERSION=$(dpkg-deb -f "$APPTAINER_DEB" Version)
REPACKED=$DEBS/apptainer_${AVERSION}${SUFFIX}_amd64.deb
if [ ! -s "$REPACKED" ] || [ "${HPCDL_FORCE_REINSTALL:-0}" = 1 ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    dpkg-deb -R "$APPTAINER_DEB" "$work/pkg"
    patched=0
    while IFS= read -r -d '' f; do
        # Only dynamically linked ELF executables carry an interpreter to replace.
        # DT_RPATH (--force-rpath), unlike RUNPATH, wins over an LD_LIBRARY_PATH that
        # Apptainer sets for its helpers.
        if patchelf --print-interpreter "$f" >/dev/null 2>&1; then
            patchelf --set-interpreter "$LOADER" --force-rpath \
                     --set-rpath "$LIBDIR:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu" "$f"
            patched=$((patched + 1))
            log "patched ${f#"$work/pkg"}"
        fi
    done < <(find "$work/pkg/usr" -type f -perm -u+x -print0)
    [ "$patched" -gt 0 ] || die "no executable to patch in $APPTAINER_DEB"
    mkdir -p "$work/pkg/usr/libexec"
    mv "$work/pkg/usr/bin/apptainer" "$work/pkg/usr/libexec/apptainer"
    write_wrapper "$work/pkg/usr/bin/apptainer"
    # Drop the libc6 dependency (satisfied privately) and mark the version as ours.
    python3 - "$work/pkg/DEBIAN/control" "$SUFFIX" <<'PY'
import re, sys
path, suffix = sys.argv[1], sys.argv[2]
text = open(path).read()
def fix_depends(m):
    deps = [d.strip() for d in m.group(2).split(",")]
    deps = [d for d in deps if not re.match(r"libc6(\s|$|:)", d)]
    return m.group(1) + ", ".join(deps) + "\n"
text = re.sub(r"^(Depends: )(.*)\n", fix_depends, text, flags=re.M)
text = re.sub(r"^(Version: .*)$", lambda m: m.group(1) + suffix, text, count=1, flags=re.M)
open(path, "w").write(text)
PY
    (cd "$work/pkg" && find usr -type f -exec md5sum {} + >DEBIAN/md5sums)
    dpkg-deb --root-owner-group -Zxz -b "$work/pkg" "$REPACKED.tmp" >/dev/null
    mv -f "$REPACKED.tmp" "$REPACKED"
fi

log "installing $(basename "$REPACKED")"
DEBIAN_FRONTEND=noninteractive "${APT_INSTALL[@]}" "$REPACKED" >&2
remove_old_wrappers

/usr/bin/apptainer --version >/dev/null || die "apptainer --version fails after install"
/usr/bin/singularity --version >/dev/null || die "singularity --version fails after install"
configure
log "installed $(/usr/bin/apptainer --version) in $(( $(date +%s) - start )) s"
