#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, for hpcdl's tests and demo.
#
#   scripts/sandbox.sh up       start what is not running (idempotent; installs packages if missing)
#   scripts/sandbox.sh down     stop the sandbox's own daemons, by PID file
#   scripts/sandbox.sh status   what runs, and the nodes as Slurm sees them (exit 3 if not up)
#
# No systemd: the daemons are started directly, as root. State, config, logs, PID files
# live under $HPCDL_SANDBOX_DIR (default /var/lib/hpcdl-sandbox). /etc/slurm/slurm.conf
# becomes a symlink to the sandbox's config (only when it is absent or already ours), so
# plain `sbatch`/`srun`/`sacct` talk to the sandbox.
#
# How two nodes fit on one host: each slurmd runs in its own UTS namespace
# (`unshare --uts`, hostname n1 / n2) on its own port and its own loopback address
# (all of 127.0.0.0/8 is local), so `srun hostname` prints n1 and n2.
#
# ---------------------------------------------------------------------------------
# The cluster (keep hpcdl/profiles/bundled/sandbox.yaml in step with this block):
#   ClusterName  hpcdl-sandbox
#   nodes        n1 (127.0.1.1, port 16821), n2 (127.0.1.2, port 16822)
#                each CPUs=8 (advertised: SlurmdParameters=config_overrides), RealMemory=4096 MB
#                (memory is not a consumable resource: CR_Core), Gres=gpu:fake:4
#   partitions   debug  Default=YES  MaxNodes=2  MaxTime=00:30:00  DefaultTime=00:10:00
#                gpu                 MaxNodes=2  MaxTime=02:00:00  DefaultTime=00:10:00
#                short               MaxNodes=1  MaxTime=00:05:00  DefaultTime=00:05:00
#   limits       EnforcePartLimits=ALL: impossible requests are refused by sbatch at once
#   MPI          srun --mpi=pmix (PMIx v4) across both nodes; per-node TmpFS (shared /tmp
#                breaks pmix: "pmixp_mkdir: ... File exists")
#   accounting   slurmdbd + MariaDB (own datadir, port 16306) so sacct works
#   ports        slurmctld 16817, slurmdbd 16819, slurmd 16821/16822 (clear of the defaults)
# ---------------------------------------------------------------------------------
set -euo pipefail

D=${HPCDL_SANDBOX_DIR:-/var/lib/hpcdl-sandbox}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONF=$D/etc/slurm.conf
export SLURM_CONF=$CONF
MUNGE_SOCKET=$D/run/munge/munge.socket.2
DB_SOCKET=$D/run/mysqld.sock
DB_PORT=16306
DB_PASS=hpcdl-sandbox   # local-only database bound to 127.0.0.1; not a secret
CTLD_PORT=16817
DBD_PORT=16819
NODES=(n1 n2)
declare -A NODE_ADDR=([n1]=127.0.1.1 [n2]=127.0.1.2)
declare -A NODE_PORT=([n1]=16821 [n2]=16822)
GPUS_PER_NODE=4
WAIT_S=${HPCDL_SANDBOX_WAIT:-60}

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
  [[ -r /proc/$pid/comm && $(</proc/$pid/comm) == "$comm" ]] && running "$pid"
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
  local host n
  host=$(hostname -s)
  mkdir -p "$D"/{etc,run/munge,log,state/ctld,tmp,dev,db}
  chmod 700 "$D/etc"
  chmod 755 "$D/run" "$D/run/munge"
  for n in "${NODES[@]}"; do
    mkdir -p "$D/state/slurmd-$n" "$D/tmp/$n" "$D/dev/$n"
    # Fake GPUs: slurmd wants character devices, so clone /dev/null (c 1 3).
    local i
    for ((i = 0; i < GPUS_PER_NODE; i++)); do
      [[ -c $D/dev/$n/gpu$i ]] || mknod -m 666 "$D/dev/$n/gpu$i" c 1 3
    done
  done

  if [[ ! -s $D/etc/munge.key ]]; then
    (umask 077 && head -c 1024 /dev/urandom >"$D/etc/munge.key")
  fi
  chmod 600 "$D/etc/munge.key"

  write_if_changed "$CONF" 644 <<EOF
# Written by scripts/sandbox.sh (hpcdl): regenerated on every 'up'; edit the script.
ClusterName=hpcdl-sandbox
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$D/state/ctld
SlurmdSpoolDir=$D/state/slurmd-%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
# No cgroups on these machines.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
# Advertise 8 CPUs per node whatever the host has.
SlurmdParameters=config_overrides
# Refuse impossible requests at submit time instead of pending forever.
EnforcePartLimits=ALL
# Without these each job waits ~3 s more before it is scheduled.
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,bf_interval=1
MinJobAge=300
KillWait=5
InactiveLimit=0
ReturnToService=2
MpiDefault=none
# Each node its own TmpFS: pmix creates per-job directories there.
TmpFS=$D/tmp/%n
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageTRES=gres/gpu
# The slurmdbd connection ignores AuthInfo: its munge socket goes here.
AccountingStoragePass=$MUNGE_SOCKET
MailProg=/bin/true
NodeName=n1 NodeHostname=n1 NodeAddr=${NODE_ADDR[n1]} Port=${NODE_PORT[n1]} CPUs=8 Sockets=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=4096 Gres=gpu:fake:$GPUS_PER_NODE State=UNKNOWN
NodeName=n2 NodeHostname=n2 NodeAddr=${NODE_ADDR[n2]} Port=${NODE_PORT[n2]} CPUs=8 Sockets=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=4096 Gres=gpu:fake:$GPUS_PER_NODE State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxNodes=2 MaxTime=00:30:00 DefaultTime=00:10:00 State=UP
PartitionName=gpu Nodes=n1,n2 MaxNodes=2 MaxTime=02:00:00 DefaultTime=00:10:00 State=UP
PartitionName=short Nodes=n1,n2 MaxNodes=1 MaxTime=00:05:00 DefaultTime=00:05:00 State=UP
EOF

  write_if_changed "$D/etc/gres.conf" 644 <<EOF
# Written by scripts/sandbox.sh: 4 fake GPUs per node (character devices, see write_config).
AutoDetect=off
NodeName=n1 Name=gpu Type=fake File=$D/dev/n1/gpu[0-$((GPUS_PER_NODE - 1))]
NodeName=n2 Name=gpu Type=fake File=$D/dev/n2/gpu[0-$((GPUS_PER_NODE - 1))]
EOF

  write_if_changed "$D/etc/slurmdbd.conf" 600 <<EOF
# Written by scripts/sandbox.sh.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=$host
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$D/run/slurmdbd.pid
LogFile=$D/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF

  # Make plain `sbatch` find the sandbox: only replace what is absent or already ours.
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

# ---- daemons -----------------------------------------------------------------------

STARTED=()

start_munge() {
  local pidfile=$D/run/munged.pid
  if pid_alive "$pidfile" munged; then return 0; fi
  munged --force --socket="$MUNGE_SOCKET" --key-file="$D/etc/munge.key" \
    --log-file="$D/log/munged.log" --pid-file="$pidfile" --seed-file="$D/state/munged.seed" 9>&- \
    || fail "munged did not start" "$D/log/munged.log"
  wait_for "munged" "$D/log/munged.log" \
    bash -c 'munge -S "$1" -n | unmunge -S "$1"' _ "$MUNGE_SOCKET"
  STARTED+=("munged")
}

db_sql() { mariadb --no-defaults -S "$DB_SOCKET" -u root -e "$1"; }

start_mariadb() {
  local pidfile=$D/run/mysqld.pid
  if pid_alive "$pidfile" mariadbd; then return 0; fi
  local init=0
  if [[ ! -d $D/db/mysql ]]; then
    init=1
    mariadb-install-db --no-defaults --datadir="$D/db" --user=root \
      --auth-root-authentication-method=socket --skip-test-db >"$D/log/mysqld-install.log" 2>&1 \
      || fail "mariadb-install-db failed" "$D/log/mysqld-install.log"
  fi
  # setsid: the server outlives this script and never gets the terminal's signals.
  setsid mariadbd --no-defaults --datadir="$D/db" --socket="$DB_SOCKET" --port="$DB_PORT" \
    --bind-address=127.0.0.1 --user=root --pid-file="$pidfile" --log-error="$D/log/mysqld.log" \
    --skip-log-bin --innodb-buffer-pool-size=32M --performance-schema=OFF \
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
  fi
  STARTED+=("mariadbd")
}

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
  # Own UTS namespace: the node (and every job step it starts) sees hostname n1 / n2.
  unshare --uts bash -c 'hostname "$1" && exec slurmd -N "$1" -f "$2"' _ "$n" "$CONF" \
    2>>"$D/log/slurmd-$n.log" 9>&- || fail "slurmd $n did not start" "$D/log/slurmd-$n.log"
  wait_for "slurmd $n" "$D/log/slurmd-$n.log" pid_alive "$pidfile" slurmd
  STARTED+=("slurmd $n")
}

nodes_ready() {  # both nodes in a usable state (idle, mixed or allocated)
  local states
  states=$(sinfo -h -N -o '%N %t' | sort -u)
  for n in "${NODES[@]}"; do
    grep -qE "^$n (idle|mix|alloc|comp)\$" <<<"$states" || return 1
  done
}

resume_down_nodes() {
  # A node left down/drained by an earlier unclean stop would otherwise never take jobs.
  local bad
  bad=$(sinfo -h -N -o '%N %t' | awk '$2 ~ /down|drain|fail/ {print $1}' | sort -u | paste -sd, -)
  if [[ -n $bad ]]; then
    scontrol update NodeName="$bad" State=RESUME >/dev/null 2>&1 || true
  fi
}

cmd_up() {
  local t0=$SECONDS
  "$HERE/install-slurm.sh" | grep -v 'all packages present' || true
  write_config
  start_munge
  start_mariadb
  start_slurmdbd
  start_slurmctld
  local n
  for n in "${NODES[@]}"; do start_slurmd "$n"; done
  local deadline=$((SECONDS + WAIT_S))
  until nodes_ready; do
    resume_down_nodes
    if ((SECONDS >= deadline)); then
      sinfo -N >&2 || true
      fail "nodes n1, n2 not idle after ${WAIT_S} s" \
        "$D/log/slurmctld.log" "$D/log/slurmd-n1.log" "$D/log/slurmd-n2.log"
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
  log "down in $((SECONDS - t0)) s"
}

cmd_status() {
  local all=0 name pidfile comm
  local -a rows=("munged:munged.pid:munged" "mariadbd:mysqld.pid:mariadbd"
                 "slurmdbd:slurmdbd.pid:slurmdbd" "slurmctld:slurmctld.pid:slurmctld"
                 "slurmd-n1:slurmd-n1.pid:slurmd" "slurmd-n2:slurmd-n2.pid:slurmd")
  local row
  for row in "${rows[@]}"; do
    IFS=: read -r name pidfile comm <<<"$row"
    if pid_alive "$D/run/$pidfile" "$comm"; then
      printf '%-10s running (pid %s)\n' "$name" "$(<"$D/run/$pidfile")"
    else
      printf '%-10s stopped\n' "$name"
      all=1
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
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
  esac
}

main "$@"
