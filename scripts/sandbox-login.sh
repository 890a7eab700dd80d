#!/usr/bin/env bash
# A login node for the sandbox cluster, reached over SSH the way a laptop reaches a
# real cluster.
#
#   scripts/sandbox-login.sh up       start it (idempotent; the sandbox must be up)
#   scripts/sandbox-login.sh down     stop it and remove its namespace
#   scripts/sandbox-login.sh status   its address and whether sshd runs (exit 3 if not)
#
# OpenSSH's sshd (Debian's openssh-server, scripts/install-ssh.sh) runs in its own
# network namespace, hpcdl-TAG-login, on the sandbox's bridge at the subnet's .250
# (10.77.0.250 for the default cluster), port 22. Key-only: no passwords, no keyboard-
# interactive, no root; each user's own ~/.ssh/authorized_keys (homes are shared, as on
# a cluster). It shares the host's filesystem, so its sessions have Slurm's client
# commands and reach slurmctld over the bridge; SLURM_CONF is set for them
# (sshd SetEnv), so a cluster in another directory works too. UsePAM is off: an account
# needs a password entry that is not locked ('*' is fine; useradd's '!' is refused).
# State, config, host key, log and PID file live under $HPCDL_SANDBOX_DIR/login.
set -euo pipefail

D=${HPCDL_SANDBOX_DIR:-/var/lib/hpcdl-sandbox}
TAG=$(printf '%s' "$D" | sha1sum | cut -c1-6)
BRIDGE=hsb-$TAG
NS=hpcdl-$TAG-login
VETH=hsl-$TAG
L=$D/login
PIDFILE=$L/sshd.pid
OCTET=250
SSHD=/usr/sbin/sshd

log() { printf 'sandbox-login: %s\n' "$*"; }
die() { printf 'sandbox-login: %s\n' "$1" >&2; exit "${2:-1}"; }

# D goes into sshd_config unquoted: the sandbox model's directory rule
# (hpcdl.sandbox.cluster.DIRECTORY), so it can never start another line or word.
[[ $D =~ ^/[A-Za-z0-9._+/-]*$ ]] \
  || die "HPCDL_SANDBOX_DIR: '$D' is not an absolute directory (letters, digits, . _ - + /)" 2

address() {  # the login node's address: the bridge's /24, host part .250
  local cidr
  cidr=$(ip -o -4 addr show dev "$BRIDGE" 2>/dev/null | awk '{print $4; exit}')
  [[ $cidr =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.1/24$ ]] \
    || die "the sandbox in $D is not up with its own network (no bridge $BRIDGE): run scripts/sandbox.sh up first"
  printf '%s.%s' "${BASH_REMATCH[1]}" "$OCTET"
}

running() {
  local pid
  [[ -s $PIDFILE ]] || return 1
  pid=$(<"$PIDFILE")
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
    && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == sshd ]]
}

cmd_up() {
  [[ $(id -u) == 0 ]] || die "up needs root (network namespace, sshd)" 2
  [[ -x $SSHD ]] || die "$SSHD is missing: run scripts/install-ssh.sh"
  local addr
  addr=$(address)
  if running && [[ -e /run/netns/$NS ]]; then
    log "login node up at $addr port 22 (sshd pid $(<"$PIDFILE"))"
    return 0
  fi
  mkdir -p "$L" /run/sshd
  chmod 755 "$L"
  if [[ ! -s $L/host_ed25519 ]]; then
    ssh-keygen -q -t ed25519 -N '' -C "hpcdl sandbox login node" -f "$L/host_ed25519"
  fi
  ip link del "$VETH" 2>/dev/null || true
  if [[ -e /run/netns/$NS ]]; then ip netns del "$NS"; fi
  ip netns add "$NS"
  ip link add "$VETH" type veth peer name eth0 netns "$NS"
  ip link set "$VETH" master "$BRIDGE" up
  ip -n "$NS" addr add "$addr/24" dev eth0
  ip -n "$NS" link set lo up
  ip -n "$NS" link set eth0 up
  # The host may still map the address to the MAC of a namespace made by an earlier up:
  # forget it, or connections wait on ARP's stale-entry timers (tens of seconds).
  ip neigh flush to "$addr" 2>/dev/null || true
  cat >"$L/sshd_config.tmp" <<EOF
# Written by scripts/sandbox-login.sh up: the sandbox's login node.
ListenAddress $addr
Port 22
HostKey $L/host_ed25519
PidFile $PIDFILE
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UsePAM no
X11Forwarding no
SetEnv SLURM_CONF=$D/etc/slurm.conf
LogLevel VERBOSE
EOF
  mv "$L/sshd_config.tmp" "$L/sshd_config"
  "$SSHD" -t -f "$L/sshd_config" || die "sshd refused its config $L/sshd_config"
  : >"$L/sshd.log"
  # Its own UTS namespace too: a session on it says it is on "login", not on the host.
  ip netns exec "$NS" unshare --uts sh -c 'hostname login && exec "$0" "$@"' \
    "$SSHD" -f "$L/sshd_config" -E "$L/sshd.log"
  local i
  for ((i = 0; i < 100; i++)); do
    # Up means reachable from the host over the bridge, not only listening.
    if running && grep -q "Server listening" "$L/sshd.log" \
       && timeout 1 bash -c ': </dev/tcp/$0/22' "$addr" 2>/dev/null; then
      log "login node up at $addr port 22 (sshd pid $(<"$PIDFILE")); host key $L/host_ed25519.pub"
      return 0
    fi
    sleep 0.1
  done
  tail -n 5 "$L/sshd.log" >&2 || true
  die "sshd did not start in namespace $NS (log: $L/sshd.log)"
}

cmd_down() {
  [[ $(id -u) == 0 ]] || die "down needs root" 2
  local removed=()
  if running; then
    kill "$(<"$PIDFILE")" && removed+=("sshd")
  fi
  rm -f "$PIDFILE"
  ip link del "$VETH" 2>/dev/null && removed+=("$VETH")
  if [[ -e /run/netns/$NS ]]; then ip netns del "$NS" && removed+=("$NS"); fi
  if ((${#removed[@]})); then log "removed ${removed[*]}"; else log "nothing to stop"; fi
}

cmd_status() {
  local addr
  addr=$(address 2>/dev/null) || { echo "sandbox-login: the sandbox is not up"; exit 3; }
  if running; then
    echo "login node: $addr port 22, sshd pid $(<"$PIDFILE"), host key $L/host_ed25519.pub"
  else
    echo "login node: not running (would be $addr port 22)"
    exit 3
  fi
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
