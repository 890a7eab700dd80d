#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for hpcdl's tests and demo.
#
#   scripts/sandbox.sh up       start what is not running (idempotent; installs packages if missing)
#   scripts/sandbox.sh down     stop the sandbox's own daemons, by PID file
#   scripts/sandbox.sh status   what runs, and the nodes as Slurm sees them (exit 3 if not up)
#   scripts/sandbox.sh config   print the slurm.conf and gres.conf it would write (writes nothing)
#   scripts/sandbox.sh shape NODE [--delay MS] [--rate MBIT] | --clear
#                               slow NODE's link both ways (tc netem / tbf), or undo it
#
# The cluster is data: its nodes, partitions, ports and name are the model in
# hpcdl/sandbox/cluster.py (DEFAULT_SHAPE: two nodes n1, n2 with 4 fake GPUs each, the
# partitions debug, gpu, short, lowprio, urgent), or the shape file HPCDL_SANDBOX_SHAPE
# names (its format is documented there). `hpcdl sandbox render` (run from this
# checkout, or the installed hpcdl) renders slurm.conf, gres.conf, slurmdbd.conf, the
# /etc/hosts block and the variables this script sources (templates/sandbox/); this
# script does what needs root: daemons, namespaces, mounts, veths, tc, munge, MariaDB.
# `config` prints what it would write; the bundled `sandbox` profile is generated from
# the same model.
#
# No systemd: the daemons are started directly, as root. State, config, logs, PID files
# live under $HPCDL_SANDBOX_DIR (default /var/lib/hpcdl-sandbox). /etc/slurm/slurm.conf
# becomes a symlink to the sandbox's config (only when it is absent or already ours), so
# plain `sbatch`/`srun`/`sacct` talk to the sandbox.
#
# How several nodes fit on one host: each slurmd runs in its own network namespace
# (`ip netns`, named hpcdl-TAG-NODE) and its own UTS namespace (hostname n1, n2, ...).
# Each namespace has lo and one eth0, a veth whose host end (hsv-TAG-I) sits on the
# cluster's own bridge (hsb-TAG); the bridge holds the subnet's .1 (slurmctld listens
# there), each node the address its shape gives. TAG is 6 hex digits of the SHA-1 of
# $HPCDL_SANDBOX_DIR, so every cluster directory has its own bridge, veths and
# namespaces, and `down` finds exactly its own again, even after a crash. The node
# names go into a marked block of /etc/hosts ("# >>> hpcdl-sandbox TAG" ... "# <<<
# hpcdl-sandbox TAG"), written by up and removed by down (no other line is touched), so
# the names resolve on the host and in every node (Apptainer binds the host's
# /etc/hosts). Traffic between the nodes crosses a real (virtual) link, which `shape`
# can slow down. A shape whose node addresses are all in 127.0.0.0/8 starts the old
# way instead: no network namespace, each node on its own loopback address in the
# host's network (what bench/bench_sandbox_net.py compares with).
#
# Each slurmd also runs in its own mount namespace (node_mounts); srun --mpi=pmix works
# across the nodes with a per-node TmpFS; accounting (sacct) is slurmdbd + MariaDB in
# the sandbox's own datadir, unless HPCDL_SANDBOX_ACCOUNTING=none.
#
# Environment: HPCDL_SANDBOX_DIR, _SHAPE, _CLUSTER, _CTLD_PORT, _DBD_PORT, _DB_PORT,
# _ACCOUNTING (the cluster: see hpcdl/sandbox/cluster.py), _SHARED, _LOCAL, _HIDE,
# _KEEP (what a node sees, below), _WAIT (seconds), _LINK (0: never link
# /etc/slurm/slurm.conf; only the default directory ever does), _PYTHON (the Python
# with hpcdl's dependencies; default python3).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WAIT_S=${HPCDL_SANDBOX_WAIT:-60}

# What a compute node sees. Each slurmd runs in its own mount namespace, as a node of a
# real cluster: the OS, /home and the "parallel filesystem" SHARED are the host's; /tmp,
# /var/tmp, /dev/shm and LOCAL (node-local scratch) are the node's own (under
# $D/nodes/NODE); the host-only paths in HIDE are empty on the nodes. KEEP lists what
# the nodes still need from inside HIDE: the site's software (root's Python here, like a
# cluster's /sw; the private libc of this machine's Apptainer build). The sandbox's own
# directory is always kept.
SHARED=${HPCDL_SANDBOX_SHARED:-/scratch}
LOCAL=${HPCDL_SANDBOX_LOCAL:-/local}
HIDE=${HPCDL_SANDBOX_HIDE:-/root /opt /var/cache/hpcdl /work /srv /mnt}
KEEP=${HPCDL_SANDBOX_KEEP:-/root/.pyenv /opt/hpcdl/apptainer-libc}

# ---- the cluster, rendered once from its model ------------------------------------
# RENDERED holds slurm.conf, gres.conf, slurmdbd.conf, hosts (the /etc/hosts block) and
# cluster.sh: D, CONF, CLUSTER, the ports, ACCOUNTING, NETNS, SUBNET, CTLD_ADDR, TAG,
# BRIDGE, HOSTS_BEGIN/END, NODES, UP_NODES (a slurmd), READY_NODES (must come up idle),
# NODE_ADDR, NODE_GPUS, NODE_NETNS, NODE_VETH. From a checkout, its own hpcdl is used
# (sandbox.sh may run before hpcdl is installed: only click, jinja2 and pydantic
# are needed); from a wheel (hpcdl/_data/scripts), the installed one.
RENDERED=$(mktemp -d "${TMPDIR:-/tmp}/hpcdl-sandbox-render.XXXXXX")
trap 'rm -rf "$RENDERED"' EXIT
render() {
  local -a pypath=()
  local py=${HPCDL_SANDBOX_PYTHON:-python3} rc=0
  if [[ -f $HERE/../hpcdl/sandbox/cluster.py ]]; then
    pypath=("PYTHONPATH=$(cd "$HERE/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}")
  fi
  env "${pypath[@]}" "$py" -m hpcdl sandbox render --out "$RENDERED" || rc=$?
  # 2: a bad shape or setting, already said in one line. Anything else: this Python.
  if ((rc != 0 && rc != 2)); then
    echo "sandbox: $py could not render the cluster's files (exit $rc); it needs click, jinja2 and pydantic (scripts/install-python-deps.sh), or set HPCDL_SANDBOX_PYTHON" >&2
  fi
  return "$rc"
}
render || exit $?
# shellcheck source=/dev/null
. "$RENDERED/cluster.sh"
export SLURM_CONF=$CONF
DB_SOCKET=$D/run/mysqld.sock
# Another Slurm release (hpcdl sandbox up --slurm 24.11): its daemons and commands are
# the copies in its root filesystem that run on this host's filesystem
# (scripts/slurm-rootfs.sh, ROOT/hpcdl/{sbin,bin}); first on PATH, every plain
# `slurmctld`, `slurmd`, `munged`, `scontrol`, `sinfo` below is that release's. The
# nodes must still see the root (it holds the libraries), and each node's
# /usr/sbin/slurmstepd is the release's: slurmd execs it by that compiled-in path.
STEPD=
if [[ -n $SLURM_ROOT ]]; then
  if [[ ! -x $SLURM_ROOT/hpcdl/sbin/slurmd ]]; then
    echo "sandbox: $SLURM_ROOT has no hpcdl/sbin/slurmd: build it with scripts/slurm-rootfs.sh" >&2
    exit 2
  fi
  PATH=$SLURM_ROOT/hpcdl/sbin:$SLURM_ROOT/hpcdl/bin:$PATH
  KEEP="$KEEP $SLURM_ROOT"
  STEPD=$SLURM_ROOT/hpcdl/sbin/slurmstepd
fi
if ((IS_DEFAULT_DIR)); then LINK=${HPCDL_SANDBOX_LINK:-1}; else LINK=0; fi
HOSTS_FILE=/etc/hosts

log() { printf 'sandbox: %s\n' "$*"; }

# ---- processes -------------------------------------------------------------------

running() {  # running PID: the process exists and is not a zombie waiting to be reaped
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z ]]
}

# pid_alive PIDFILE COMM: the PID in PIDFILE runs and is the program COMM (guards
# against a stale PID file whose number was reused by an unrelated process).
pid_alive() {
  local pidfile=$1 comm=$2 pid
  [[ -s $pidfile ]] || return 1
  pid=$(<"$pidfile")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ -r /proc/$pid/comm && $(<"/proc/$pid/comm") == "$comm" ]] && running "$pid"
}

fail() {  # fail MESSAGE LOGFILE...: print the message and the logs' last lines, exit 1
  local msg=$1; shift
  printf 'sandbox: FAILED: %s\n' "$msg" >&2
  local f
  for f in "$@"; do
    if [[ -s $f ]]; then
      printf -- '--- last lines of %s ---\n' "$f" >&2
      tail -n 25 "$f" >&2
    fi
  done
  exit 1
}

# wait_for DESCRIPTION LOGFILE COMMAND...: retry COMMAND until it succeeds or WAIT_S passes.
# With WATCH="PIDFILE COMM" set, a daemon that wrote its PID file and died fails at once.
# With WATCH_PID set (a child started in the background), its exit fails at once too.
WATCH=
WATCH_PID=
wait_for() {
  local what=$1 logfile=$2; shift 2
  local deadline=$((SECONDS + WAIT_S))
  until "$@" >/dev/null 2>&1; do
    if [[ -n $WATCH_PID ]] && ! running "$WATCH_PID"; then
      WATCH_PID=
      fail "$what exited during start-up" "$logfile"
    fi
    if [[ -n $WATCH ]]; then
      local wpid=${WATCH% *}
      # shellcheck disable=SC2086  # WATCH is "PIDFILE COMM": two arguments
      if [[ -s $wpid ]] && ! pid_alive $WATCH; then
        WATCH=
        fail "$what exited during start-up" "$logfile"
      fi
    fi
    if ((SECONDS >= deadline)); then
      fail "$what not ready after ${WAIT_S} s" "$logfile"
    fi
    sleep 0.2
  done
}

stop_pid() {  # stop_pid NAME PIDFILE COMM: SIGTERM, wait up to 30 s, then SIGKILL
  local name=$1 pidfile=$2 comm=$3 pid i
  if ! pid_alive "$pidfile" "$comm"; then
    rm -f "$pidfile"
    return 0
  fi
  pid=$(<"$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do
    running "$pid" || break
    sleep 0.1
  done
  if running "$pid"; then
    log "$name (pid $pid) ignored SIGTERM for 30 s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
  log "stopped $name (pid $pid)"
}

# ---- configuration ---------------------------------------------------------------

# write_if_changed PATH MODE: stdin becomes PATH (atomically) only when it differs.
write_if_changed() {
  local path=$1 mode=$2 tmp
  tmp=$(mktemp "$path.XXXXXX")
  cat >"$tmp"
  chmod "$mode" "$tmp"
  if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
    rm -f "$tmp"
  else
    mv -f "$tmp" "$path"
  fi
}

write_config() {
  local n
  mkdir -p "$D"/{etc,run/munge,log,state/ctld,tmp,dev,db}
  # Like a site's /etc/slurm: every user's Slurm commands read slurm.conf and gres.conf;
  # the munge key and slurmdbd.conf (the database password) stay root's (0600).
  chmod 755 "$D" "$D/etc" "$D/run" "$D/run/munge" "$D/tmp" "$D/dev"
  mkdir -p "$SHARED" "$LOCAL"
  chmod 1777 "$SHARED"
  for n in "${UP_NODES[@]}"; do  # a node without slurmd needs no spool, TmpFS or devices
    mkdir -p "$D/state/slurmd-$n" "$D/tmp/$n" "$D/dev/$n" \
      "$D/nodes/$n/tmp" "$D/nodes/$n/var-tmp" "$D/nodes/$n/local"
    # Every user's jobs write here: PMIx's per-job directories (TmpFS), /tmp, scratch.
    chmod 1777 "$D/tmp/$n" "$D/nodes/$n/tmp" "$D/nodes/$n/var-tmp" "$D/nodes/$n/local"
    # Fake GPUs: slurmd wants character devices, so clone /dev/null (c 1 3).
    local i
    for ((i = 0; i < NODE_GPUS[$n]; i++)); do
      [[ -c $D/dev/$n/gpu$i ]] || mknod -m 666 "$D/dev/$n/gpu$i" c 1 3
    done
  done

  if [[ ! -s $D/etc/munge.key ]]; then
    (umask 077 && head -c 1024 /dev/urandom >"$D/etc/munge.key")
  fi
  chmod 600 "$D/etc/munge.key"

  # Unprivileged Apptainer mounts a SIF with squashfuse: distributions ship /dev/fuse
  # 0666 for that (this machine's is 0600, which fails every user's container).
  if [[ -c /dev/fuse ]]; then chmod 0666 /dev/fuse; fi

  write_if_changed "$CONF" 644 <"$RENDERED/slurm.conf"
  if [[ -n $SLURM_ROOT ]]; then write_wrappers; fi
  write_if_changed "$D/etc/gres.conf" 644 <"$RENDERED/gres.conf"
  # The database password: root's only.
  if [[ $ACCOUNTING == slurmdbd ]]; then
    write_if_changed "$D/etc/slurmdbd.conf" 600 <"$RENDERED/slurmdbd.conf"
  fi

  # Make plain `sbatch` find the sandbox: only replace what is absent or already ours.
  ((LINK)) || return 0
  mkdir -p /etc/slurm
  local link=/etc/slurm/slurm.conf
  if [[ -L $link && $(readlink "$link") == "$CONF" ]]; then
    :
  elif [[ ! -e $link && ! -L $link ]]; then
    ln -s "$CONF" "$link"
  else
    log "warning: $link exists and is not the sandbox's; export SLURM_CONF=$CONF to use the sandbox"
  fi
}

# write_wrappers: $D/bin/NAME for each of the release's commands: runs it with this
# cluster's SLURM_CONF, and with $D/bin first on PATH, so a job submitted through it
# (sbatch exports the environment) finds the release's srun on the nodes too, as a
# site's `module load slurm/24.11` does. The profile's scheduler.commands names $D/bin.
write_wrappers() {
  local f name
  mkdir -p "$D/bin"
  chmod 755 "$D/bin"
  for f in "$SLURM_ROOT"/hpcdl/bin/*; do
    name=${f##*/}
    printf '#!/bin/sh\n# Written by scripts/sandbox.sh: Slurm %s of this sandbox.\nSLURM_CONF=%s\nPATH=%s:$PATH\nexport SLURM_CONF PATH\nexec %s "$@"\n' \
      "$(<"$SLURM_ROOT/.hpcdl-slurm-version")" "$CONF" "$D/bin" "$f" | write_if_changed "$D/bin/$name" 755
  done
}

# ---- network (netns mode) ------------------------------------------------------------

own_veths() {  # every host-side veth of this cluster's tag, whatever the shape says now
  ip -o link show 2>/dev/null | sed -nE "s/^[0-9]+: (hsv-$TAG-[0-9]+)@.*/\1/p" | sort -V
}

own_netns() {  # every namespace of this cluster's tag
  ip netns list 2>/dev/null | awk -v p="hpcdl-$TAG-" 'index($1, p) == 1 {print $1}' | sort
}

# hosts_edit [BLOCK]: rewrite /etc/hosts without this cluster's marked block, plus BLOCK
# (when given) at the end, under a lock shared by every cluster's up/down; lines outside
# the block are kept byte for byte. Every resolver on the machine reads the file (other
# clusters' jobs: a rank that saw a short one failed with EAI_AGAIN), so a new file is
# renamed over it; where that fails (a bind-mounted /etc/hosts) it is written in place.
hosts_edit() {
  local block=${1:-} rest
  mkdir -p /run/lock
  (
    flock -w 30 8 || { echo "sandbox: cannot lock /run/lock/hpcdl-sandbox-hosts.lock" >&2; exit 1; }
    rest=$(mktemp)
    awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '
      $0 == b || index($0, b " ") == 1 {skip = 1; next}
      skip && $0 == e {skip = 0; next}
      !skip {print}' "$HOSTS_FILE" >"$rest"
    if [[ -n $block ]]; then printf '%s\n' "$block" >>"$rest"; fi
    if ! cmp -s "$rest" "$HOSTS_FILE"; then
      local next="$HOSTS_FILE.hpcdl-$$"
      if ! { cp "$rest" "$next" && chmod 644 "$next" && mv -f "$next" "$HOSTS_FILE"; } 2>/dev/null; then
        rm -f "$next"
        cat "$rest" >"$HOSTS_FILE"
      fi
    fi
    rm -f "$rest"
  ) 8>/run/lock/hpcdl-sandbox-hosts.lock
}

hosts_check() {  # a node name that another line of /etc/hosts already maps fails 'up'
  local n line
  for n in "${NODES[@]}"; do
    line=$(awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" -v n="$n" '
      $0 == b || index($0, b " ") == 1 {skip = 1; next}
      skip && $0 == e {skip = 0; next}
      skip || /^[ \t]*#/ {next}
      {for (i = 2; i <= NF; i++) if ($i == n) {print; exit}}' "$HOSTS_FILE")
    if [[ -n $line ]]; then
      echo "sandbox: node name $n is already in $HOSTS_FILE ('$line'), another cluster's? stop it or give this cluster other node names" >&2
      exit 1
    fi
  done
}

# net_up: the bridge, one namespace + veth per node with a slurmd, the hosts block.
# Idempotent: a node whose slurmd runs keeps its namespace; any other namespace of
# this cluster (left by a crash) is made afresh.
net_up() {
  ((NETNS)) || return 0
  local used n ns veth
  used=$(ip -o -4 addr show 2>/dev/null | awk -v a="$CTLD_ADDR/" -v br="$BRIDGE" 'index($4, a) == 1 && $2 != br {print $2}')
  if [[ -n $used ]]; then
    echo "sandbox: subnet $SUBNET.0/24 is in use here (interface $used holds $CTLD_ADDR): give this cluster's nodes addresses in another /24" >&2
    exit 1
  fi
  hosts_check
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    STARTED+=("bridge $BRIDGE")
  fi
  if ! ip -o -4 addr show dev "$BRIDGE" | grep -q " $CTLD_ADDR/24 "; then
    ip addr add "$CTLD_ADDR/24" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  for n in "${UP_NODES[@]}"; do
    ns=${NODE_NETNS[$n]}
    veth=${NODE_VETH[$n]}
    if [[ -e /run/netns/$ns ]] && pid_alive "$D/run/slurmd-$n.pid" slurmd \
       && ip link show "$veth" >/dev/null 2>&1; then
      continue
    fi
    ip link del "$veth" 2>/dev/null || true
    if [[ -e /run/netns/$ns ]]; then ip netns del "$ns"; fi
    ip netns add "$ns"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$BRIDGE" up
    ip -n "$ns" addr add "${NODE_ADDR[$n]}/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
  done
  hosts_edit "$(<"$RENDERED/hosts")"
}

# net_down: everything of this cluster's tag (not only what the shape names now), so a
# crashed or reshaped cluster is cleaned as well. Idempotent.
net_down() {
  local link ns pids removed=()
  for link in $(own_veths); do ip link del "$link" 2>/dev/null && removed+=("$link"); done
  for ns in $(own_netns); do
    pids=$(ip netns pids "$ns" 2>/dev/null | paste -sd' ' - || true)
    if [[ -n $pids ]]; then log "warning: processes $pids still run in namespace $ns (left alone)"; fi
    ip netns del "$ns" && removed+=("$ns")
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link del "$BRIDGE" && removed+=("$BRIDGE")
  fi
  if grep -qxF "$HOSTS_END" "$HOSTS_FILE" 2>/dev/null; then
    hosts_edit "" && removed+=("hosts block")
  fi
  if ((${#removed[@]})); then log "removed ${removed[*]}"; fi
}

# ---- link shaping -------------------------------------------------------------------

shape_usage() {
  echo "usage: $0 shape NODE [--delay MS] [--rate MBIT] | $0 shape NODE --clear" >&2
  exit 2
}

# cmd_shape NODE ...: a qdisc on both ends of NODE's veth, so traffic to and from the
# node is slowed alike: netem for a delay (with its rate when both are given), tbf
# for a rate alone. --clear removes them.
cmd_shape() {
  local node=${1:-} delay='' rate='' clear=0
  [[ -n $node ]] || shape_usage
  shift
  [[ $node =~ ^[a-z][a-z0-9]*$ ]] || { echo "sandbox: shape: node '$node' is not a node name" >&2; exit 2; }
  while (($#)); do
    case $1 in
      --delay) (($# >= 2)) || { echo "sandbox: shape: --delay needs a value (milliseconds)" >&2; exit 2; }
               delay=$2; shift 2 ;;
      --rate) (($# >= 2)) || { echo "sandbox: shape: --rate needs a value (Mbit/s)" >&2; exit 2; }
              rate=$2; shift 2 ;;
      --clear) clear=1; shift ;;
      *) echo "sandbox: shape: unknown argument '$1' (--delay MS, --rate MBIT or --clear)" >&2; exit 2 ;;
    esac
  done
  if [[ -n $delay ]] && ! { [[ $delay =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v v="$delay" 'BEGIN {exit !(v > 0 && v <= 60000)}'; }; then
    echo "sandbox: shape: --delay '$delay' must be a number of milliseconds above 0 and at most 60000" >&2; exit 2
  fi
  if [[ -n $rate ]] && ! { [[ $rate =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v v="$rate" 'BEGIN {exit !(v >= 0.01 && v <= 100000)}'; }; then
    echo "sandbox: shape: --rate '$rate' must be a number of Mbit/s from 0.01 to 100000" >&2; exit 2
  fi
  if ((clear)) && [[ -n $delay$rate ]]; then
    echo "sandbox: shape: --clear takes no --delay or --rate" >&2; exit 2
  fi
  if ((!clear)) && [[ -z $delay$rate ]]; then
    echo "sandbox: shape: give --delay MS, --rate MBIT (or both), or --clear" >&2; exit 2
  fi
  if [[ ! -v NODE_VETH[$node] ]]; then
    echo "sandbox: shape: node '$node' is not in this cluster's shape (nodes: ${NODES[*]})" >&2; exit 2
  fi
  ((NETNS)) || { echo "sandbox: shape: cluster $D has no network namespaces (its node addresses are loopback addresses)" >&2; exit 2; }
  local ns veth
  ns=${NODE_NETNS[$node]}
  veth=${NODE_VETH[$node]}
  if [[ ! -e /run/netns/$ns ]] || ! ip link show "$veth" >/dev/null 2>&1; then
    echo "sandbox: shape: node $node has no link here (namespace $ns): is cluster $D up?" >&2; exit 1
  fi
  if ((clear)); then
    tc qdisc del dev "$veth" root 2>/dev/null || true
    tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
    log "$node: link $veth unshaped"
    return 0
  fi
  local -a qdisc
  if [[ -n $delay ]]; then
    qdisc=(netem delay "${delay}ms")
    if [[ -n $rate ]]; then qdisc+=(rate "${rate}mbit"); fi
    # A queue for ~1 s of traffic at the rate (netem's default 1000 packets drops more).
    qdisc+=(limit 100000)
  else
    # burst: ~4 ms of traffic at the rate, at least 64 KiB (a GSO segment fits whole).
    local burst
    burst=$(awk -v r="$rate" 'BEGIN {b = int(r * 1e6 / 8 * 0.004); print (b < 65536 ? 65536 : b)}')
    qdisc=(tbf rate "${rate}mbit" burst "$burst" latency 200ms)
  fi
  local err
  if ! err=$(tc qdisc replace dev "$veth" root "${qdisc[@]}" 2>&1); then
    if [[ $err == *"qdisc kind is unknown"* ]]; then
      echo "sandbox: shape: --delay needs tc's netem qdisc, which this kernel lacks (CONFIG_NET_SCH_NETEM); --rate alone works (tbf)" >&2
      exit 1
    fi
    echo "sandbox: shape: tc qdisc replace dev $veth root ${qdisc[*]}: $err" >&2; exit 1
  fi
  if ! err=$(tc -n "$ns" qdisc replace dev eth0 root "${qdisc[@]}" 2>&1); then
    tc qdisc del dev "$veth" root 2>/dev/null || true
    echo "sandbox: shape: tc -n $ns qdisc replace dev eth0 root ${qdisc[*]}: $err" >&2; exit 1
  fi
  log "$node: link $veth shaped both ways: ${qdisc[*]}"
}

# ---- daemons -----------------------------------------------------------------------

STARTED=()

start_munge() {
  local pidfile=$D/run/munged.pid
  if pid_alive "$pidfile" munged; then return 0; fi
  munged --force --socket="$MUNGE_SOCKET" --key-file="$D/etc/munge.key" \
    --log-file="$D/log/munged.log" --pid-file="$pidfile" --seed-file="$D/state/munged.seed" 9>&- \
    || fail "munged did not start" "$D/log/munged.log"
  # shellcheck disable=SC2016  # $1 expands in the inner bash
  wait_for "munged" "$D/log/munged.log" \
    bash -c 'munge -S "$1" -n | unmunge -S "$1"' _ "$MUNGE_SOCKET"
  STARTED+=("munged")
}

db_sql() { mariadb --no-defaults -S "$DB_SOCKET" -u root -e "$1"; }

start_mariadb() {
  local pidfile=$D/run/mysqld.pid
  if pid_alive "$pidfile" mariadbd; then return 0; fi
  local init=0
  # Its own tmpdir (install and server): the shared /tmp is other tests' and clusters'.
  mkdir -p "$D/db-tmp"
  # A database is made once: its system tables, then the accounting database and user,
  # then the marker. One without the marker (an install or a first start that failed
  # half-way: mariadb-install-db can say "failed" and still exit 0) is made again, or
  # every later `up` would start a server slurmdbd cannot log in to. (A database with
  # slurm_acct_db from before the marker existed is whole.)
  if [[ ! -e $D/db/.hpcdl-made && ! -d $D/db/slurm_acct_db ]]; then
    init=1
    rm -rf "$D/db"
    mkdir -p "$D/db"
    mariadb-install-db --no-defaults --datadir="$D/db" --tmpdir="$D/db-tmp" --user=root \
      --auth-root-authentication-method=socket --skip-test-db >"$D/log/mysqld-install.log" 2>&1 \
      && ! grep -q "Installation of system tables failed" "$D/log/mysqld-install.log" \
      || fail "mariadb-install-db failed" "$D/log/mysqld-install.log"
  fi
  # setsid: the server outlives this script and never gets the terminal's signals.
  setsid mariadbd --no-defaults --datadir="$D/db" --tmpdir="$D/db-tmp" --socket="$DB_SOCKET" \
    --port="$DB_PORT" --bind-address=127.0.0.1 --user=root --pid-file="$pidfile" \
    --log-error="$D/log/mysqld.log" --skip-log-bin --innodb-buffer-pool-size=32M --performance-schema=OFF \
    </dev/null >>"$D/log/mysqld.log" 2>&1 9>&- &
  WATCH_PID=$!
  wait_for "mariadbd" "$D/log/mysqld.log" mariadb-admin --no-defaults -S "$DB_SOCKET" -u root ping
  wait_for "mariadbd pid file" "$D/log/mysqld.log" pid_alive "$pidfile" mariadbd
  WATCH_PID=
  if ((init)); then
    db_sql "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
            CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
            CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" \
      || fail "could not create the accounting database" "$D/log/mysqld.log"
    : >"$D/db/.hpcdl-made"
  fi
  STARTED+=("mariadbd")
}

# Another release's cluster: slurmdbd is the release's (first on PATH, its plugins from
# slurmdbd.conf's PluginDir); MariaDB above is always the host's, in the cluster's own
# datadir and ports.
start_slurmdbd() {
  local pidfile=$D/run/slurmdbd.pid
  if pid_alive "$pidfile" slurmdbd; then return 0; fi
  # slurmdbd has no -f: it reads slurmdbd.conf next to $SLURM_CONF.
  SLURM_CONF=$CONF slurmdbd 2>>"$D/log/slurmdbd.log" 9>&- \
    || fail "slurmdbd did not start" "$D/log/slurmdbd.log"
  WATCH="$pidfile slurmdbd"
  wait_for "slurmdbd" "$D/log/slurmdbd.log" bash -c "exec 3<>/dev/tcp/127.0.0.1/$DBD_PORT"
  WATCH=
  STARTED+=("slurmdbd")
}

start_slurmctld() {
  local pidfile=$D/run/slurmctld.pid
  if pid_alive "$pidfile" slurmctld; then return 0; fi
  slurmctld -f "$CONF" 2>>"$D/log/slurmctld.log" 9>&- \
    || fail "slurmctld did not start" "$D/log/slurmctld.log"
  WATCH="$pidfile slurmctld"
  wait_for "slurmctld" "$D/log/slurmctld.log" scontrol ping
  WATCH=
  STARTED+=("slurmctld")
}

start_slurmd() {
  local n=$1 pidfile=$D/run/slurmd-$1.pid
  if pid_alive "$pidfile" slurmd; then return 0; fi
  # Own UTS namespace: the node (and every job step it starts) sees its own hostname (n1, n2);
  # in netns mode also its own network namespace (job steps and Apptainer inherit both).
  local -a netns=()
  if ((NETNS)); then netns=(nsenter "--net=/run/netns/${NODE_NETNS[$n]}"); fi
  # Own mount namespace too: the node sees only what a cluster shares (node_mounts).
  # shellcheck disable=SC2016  # $1, $2 expand in the inner bash
  "${netns[@]}" unshare --uts --mount --propagation private bash -c \
    "$(declare -f node_mounts)"$'\n''node_mounts "$1" "$3" "$4" "$5" "$6" "$7" "$8" >>"$3/log/mounts-$1.log" 2>&1 && hostname "$1" && exec slurmd -N "$1" -f "$2"' \
    _ "$n" "$CONF" "$D" "$SHARED" "$LOCAL" "$HIDE" "$KEEP" "$STEPD" \
    2>>"$D/log/slurmd-$n.log" 9>&- || fail "slurmd $n did not start" "$D/log/slurmd-$n.log" "$D/log/mounts-$n.log"
  wait_for "slurmd $n" "$D/log/slurmd-$n.log" pid_alive "$pidfile" slurmd
  STARTED+=("slurmd $n")
}

# node_mounts NODE DIR SHARED LOCAL HIDE KEEP [STEPD]: run inside the node's new mount namespace
# (private propagation), before slurmd. Paths to keep are moved aside first (a bind
# under /run, which nothing hides), the private and hidden mounts made, then the kept
# paths moved back to where they were; the hiding tmpfs ends read-only.
node_mounts() {
  local node=$1 dir=$2 shared=$3 local_dir=$4 path i=0 stash
  local -a hide keep moved=()
  m() { mount "$@" || { echo "node $node: mount $* failed" >&2; exit 1; }; }
  read -r -a hide <<<"$5"
  read -r -a keep <<<"$6"
  keep+=("$dir")
  stash=/run/hpcdl-sandbox-stash/$node-$$
  mkdir -p "$stash"
  for path in "${keep[@]}"; do
    [[ -e $path ]] || continue
    mkdir -p "$stash/$i"
    m --bind "$path" "$stash/$i"
    moved+=("$i:$path")
    i=$((i + 1))
  done
  # /tmp last: the node's own directories may be under it (a test cluster in /tmp).
  m --bind "$dir/nodes/$node/var-tmp" /var/tmp
  m --bind "$dir/nodes/$node/local" "$local_dir"
  m -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
  m --bind "$dir/nodes/$node/tmp" /tmp
  local -a hidden=()
  for path in "${hide[@]}"; do
    [[ -d $path && $path != "$shared" ]] || continue
    m -t tmpfs -o "mode=$(stat -c %a "$path"),nosuid,nodev" tmpfs "$path"
    hidden+=("$path")
  done
  local entry
  for entry in "${moved[@]}"; do
    path=${entry#*:}
    mkdir -p "$path"
    m --move "$stash/${entry%%:*}" "$path"
  done
  for path in "${hidden[@]}"; do m -o remount,ro "$path"; done
  # Another release's slurmstepd where slurmd execs it (its compiled-in path).
  if [[ -n ${7:-} ]]; then m --bind "$7" /usr/sbin/slurmstepd; fi
  rm -rf "$stash"
  echo "node $node: private /tmp /var/tmp /dev/shm $local_dir; hidden ${hidden[*]}; kept ${moved[*]}"
}

nodes_ready() {  # every node with a slurmd in a usable state (idle, mixed or allocated)
  local states
  states=$(sinfo -h -N -o '%N %t' | sort -u)
  for n in "${READY_NODES[@]}"; do
    grep -qE "^$n (idle|mix|alloc|comp)\$" <<<"$states" || return 1
  done
}

resume_down_nodes() {
  # A node left down/drained by an earlier unclean stop would otherwise never take jobs.
  local bad
  # Only nodes that run a slurmd: a node the shape says is down stays down.
  bad=$(sinfo -h -N -o '%N %t' | awk '$2 ~ /down|drain|fail/ {print $1}' | sort -u \
        | grep -Fxf <(printf '%s\n' "${READY_NODES[@]}") | paste -sd, - || true)
  if [[ -n $bad ]]; then
    scontrol update NodeName="$bad" State=RESUME >/dev/null 2>&1 || true
  fi
}

# stale_reasons: why daemons that run now do not match what this 'up' would set up (a
# slurm.conf that differs from the running one; a slurmd outside its node's namespace,
# left by a sandbox.sh of before the namespaces), one line each. Checked before anything
# is written: the Slurm clients must still reach the running daemons to stop them.
stale_reasons() {
  local n pid ns
  if pid_alive "$D/run/slurmctld.pid" slurmctld && [[ -f $CONF ]] \
     && ! cmp -s "$RENDERED/slurm.conf" "$CONF"; then
    echo "slurm.conf differs from the one slurmctld runs with"
  fi
  for n in "${UP_NODES[@]}"; do
    pid_alive "$D/run/slurmd-$n.pid" slurmd || continue
    pid=$(<"$D/run/slurmd-$n.pid")
    if [[ $(stat -L -c %i "/proc/$pid/ns/mnt" 2>/dev/null) == "$(stat -L -c %i /proc/self/ns/mnt)" ]]; then
      echo "slurmd $n (pid $pid) runs in the host's mount namespace (it sees every host path)"
    fi
    # A KEEP path made after the node started (Apptainer's private libc, installed after
    # `up`) is hidden from it: the node's containers would not start.
    for k in $KEEP; do
      if [[ -e $k && ! -e /proc/$pid/root$k ]]; then
        echo "slurmd $n (pid $pid) does not see $k, which exists now"
      fi
    done
  done
  ((NETNS)) || return 0
  for n in "${UP_NODES[@]}"; do
    pid_alive "$D/run/slurmd-$n.pid" slurmd || continue
    pid=$(<"$D/run/slurmd-$n.pid")
    ns=/run/netns/${NODE_NETNS[$n]}
    if [[ ! -e $ns || $(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null) != "$(stat -L -c %i "$ns")" ]]; then
      echo "slurmd $n (pid $pid) runs outside its network namespace"
    fi
  done
}

# pmix_link: the release's mpi/pmix plugin reads the root's libpmix through
# /run/hpcdl-pmix-RELEASE (scripts/slurm-rootfs.sh, pmix_path); /run is emptied at
# boot, so each up makes the link. Two sandboxes of one release share it (one root).
pmix_link() {
  local link target
  [[ -n $SLURM_ROOT && -s $SLURM_ROOT/hpcdl/pmix-link ]] || return 0
  read -r link target <"$SLURM_ROOT/hpcdl/pmix-link"
  ln -sfn "$target" "$link"
}

cmd_up() {
  local t0=$SECONDS
  "$HERE/install-slurm.sh" | grep -v 'all packages present' || true
  # A sandbox is rebuilt, not patched: daemons left from another shape or script version
  # would run half the old cluster (CI reuses a machine's running sandbox).
  local reasons w
  reasons=$(stale_reasons)
  if [[ -n $reasons ]]; then
    while IFS= read -r w; do log "restarting: $w (running jobs are cancelled)"; done <<<"$reasons"
    cmd_down
  fi
  write_config
  net_up
  pmix_link
  start_munge
  if [[ $ACCOUNTING == slurmdbd ]]; then
    start_mariadb
    start_slurmdbd
  fi
  start_slurmctld
  local n
  for n in "${UP_NODES[@]}"; do start_slurmd "$n"; done
  local deadline=$((SECONDS + WAIT_S))
  until nodes_ready; do
    resume_down_nodes
    if ((SECONDS >= deadline)); then
      sinfo -N >&2 || true
      local logs=("$D/log/slurmctld.log")
      for n in "${UP_NODES[@]}"; do logs+=("$D/log/slurmd-$n.log"); done
      fail "nodes ${READY_NODES[*]} not idle after ${WAIT_S} s" "${logs[@]}"
    fi
    sleep 0.2
  done
  if ((${#STARTED[@]} == 0)); then
    log "already up (nothing started) in $((SECONDS - t0)) s"
  else
    log "started ${STARTED[*]} in $((SECONDS - t0)) s"
  fi
  log "config $CONF; nodes: $(sinfo -h -N -o '%N:%t' | sort -u | paste -sd' ' -)"
}

cmd_down() {
  local t0=$SECONDS n
  if pid_alive "$D/run/slurmctld.pid" slurmctld; then
    # Jobs first, so no job step outlives its slurmd.
    local ids
    ids=$(timeout 10 squeue -h -o %i 2>/dev/null | paste -sd' ' - || true)
    if [[ -n $ids ]]; then
      # shellcheck disable=SC2086
      timeout 10 scancel $ids 2>/dev/null || true
      log "cancelled jobs $ids"
    fi
  fi
  for n in "${NODES[@]}"; do stop_pid "slurmd $n" "$D/run/slurmd-$n.pid" slurmd; done
  stop_pid slurmctld "$D/run/slurmctld.pid" slurmctld
  stop_pid slurmdbd "$D/run/slurmdbd.pid" slurmdbd
  stop_pid mariadbd "$D/run/mysqld.pid" mariadbd
  stop_pid munged "$D/run/munged.pid" munged
  # A login node (scripts/sandbox-login.sh) sits on this cluster's bridge: it goes too.
  if [[ -e /run/netns/hpcdl-$TAG-login ]]; then
    HPCDL_SANDBOX_DIR=$D "$HERE/sandbox-login.sh" down
  fi
  net_down
  log "down in $((SECONDS - t0)) s"
}

cmd_status() {
  local all=0 name pidfile comm
  local -a rows=("munged:munged.pid:munged")
  if [[ $ACCOUNTING == slurmdbd ]]; then
    rows+=("mariadbd:mysqld.pid:mariadbd" "slurmdbd:slurmdbd.pid:slurmdbd")
  fi
  rows+=("slurmctld:slurmctld.pid:slurmctld")
  local row n
  for n in "${UP_NODES[@]}"; do rows+=("slurmd-$n:slurmd-$n.pid:slurmd"); done
  for row in "${rows[@]}"; do
    IFS=: read -r name pidfile comm <<<"$row"
    if pid_alive "$D/run/$pidfile" "$comm"; then
      printf '%-10s running (pid %s)\n' "$name" "$(<"$D/run/$pidfile")"
    else
      printf '%-10s stopped\n' "$name"
      all=1
    fi
  done
  for n in "${NODES[@]}"; do
    if ((NETNS)); then
      local ns veth link qd
      ns=${NODE_NETNS[$n]}; veth=${NODE_VETH[$n]}
      if [[ -e /run/netns/$ns ]] && ip link show "$veth" >/dev/null 2>&1; then
        qd=$(tc qdisc show dev "$veth" root 2>/dev/null | sed -nE '1{/noqueue/d; s/^qdisc ([a-z]+) [0-9a-f]+: root (refcnt [0-9]+ )?/\1 /p}')
        link="link $veth${qd:+ shaped: $qd}"
      else
        link="no link"
      fi
      printf '%-10s %s netns %s, %s\n' "node-$n" "${NODE_ADDR[$n]}" "$ns" "$link"
    else
      printf '%-10s %s (loopback, no netns)\n' "node-$n" "${NODE_ADDR[$n]}"
    fi
  done
  if ((all == 0)); then
    sinfo -o '%P %a %l %D %N %G' 2>/dev/null || true
    sinfo -h -N -o '%N %t' | sort -u
    nodes_ready || all=1
  fi
  printf 'sandbox: %s (%s)\n' "$([[ $all == 0 ]] && echo up || echo 'not up')" "$D"
  return $((all == 0 ? 0 : 3))
}

main() {
  local cmd=${1:-}
  case $cmd in
    up|down)
      [[ $(id -u) == 0 ]] || { echo "sandbox: must run as root (starts Slurm daemons)" >&2; exit 1; }
      # One 'up'/'down' at a time (parallel test sessions): serialize on a lock file.
      mkdir -p "$D"
      # Daemons are started with 9>&- so they never inherit (and hold) this lock.
      exec 9>"$D/.lock"
      flock -w 300 9 || { echo "sandbox: another up/down holds $D/.lock" >&2; exit 1; }
      "cmd_$cmd" ;;
    status) cmd_status ;;
    shape)
      [[ $(id -u) == 0 ]] || { echo "sandbox: must run as root (tc on the node's link)" >&2; exit 1; }
      shift; cmd_shape "$@" ;;
    config) cat "$RENDERED/slurm.conf" "$RENDERED/gres.conf" ;;
    *) echo "usage: $0 up|down|status|config|shape NODE [--delay MS] [--rate MBIT] [--clear]" >&2; exit 2 ;;
  esac
}

main "$@"
