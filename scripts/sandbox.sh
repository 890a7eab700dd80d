#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, for hpcdl's tests and demo.
#
#   scripts/sandbox.sh up       start what is not running (idempotent; installs packages if missing)
#   scripts/sandbox.sh down     stop the sandbox's own daemons, by PID file
#   scripts/sandbox.sh status   what runs, and the nodes as Slurm sees them (exit 3 if not up)
#   scripts/sandbox.sh config   print the slurm.conf and gres.conf it would write (writes nothing)
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
# Another cluster beside it (tests of `hpcdl profiles detect` start one): give it its own
# directory, ports and shape, e.g.
#   HPCDL_SANDBOX_DIR=/tmp/c2 HPCDL_SANDBOX_SHAPE=shape.txt HPCDL_SANDBOX_CTLD_PORT=17817 \
#   HPCDL_SANDBOX_ACCOUNTING=none HPCDL_SANDBOX_CLUSTER=c2 scripts/sandbox.sh up
# A shape file has one line per node and per partition (what DEFAULT_SHAPE below holds):
#   node NAME ADDR PORT CPUS MEM_MB GRES|- up|down|nogres
#        (down: configured DOWN, no slurmd; nogres: a slurmd, but no gres.conf line for its
#        GPUs, so Slurm drains it: the "node without GRES files" case)
#   partition NAME NODES|- [Key=Value ...]            (slurm.conf PartitionName options)
# Only the default directory links /etc/slurm/slurm.conf (HPCDL_SANDBOX_LINK=0 never does).
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
#                lowprio             MaxNodes=2  MaxTime=00:10:00  PriorityTier=1, PreemptMode=REQUEUE,
#                                    GraceTime=60: what urgent preempts (issue 15's requeue tests)
#                urgent              MaxNodes=2  MaxTime=00:05:00  PriorityTier=10
#                (debug, gpu, short: PreemptMode=OFF, so urgent never preempts their jobs)
#   preemption   PreemptType=preempt/partition_prio, PreemptMode=REQUEUE, JobRequeue=1,
#                SlurmctldParameters=preempt_send_user_signal: a preempted job's batch shell
#                gets its --signal (hpcdl: B:USR2) at once, with GraceTime to checkpoint
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
DB_PORT=${HPCDL_SANDBOX_DB_PORT:-16306}
DB_PASS=hpcdl-sandbox   # local-only database bound to 127.0.0.1; not a secret
CTLD_PORT=${HPCDL_SANDBOX_CTLD_PORT:-16817}
DBD_PORT=${HPCDL_SANDBOX_DBD_PORT:-16819}
CLUSTER=${HPCDL_SANDBOX_CLUSTER:-hpcdl-sandbox}
ACCOUNTING=${HPCDL_SANDBOX_ACCOUNTING:-slurmdbd}   # slurmdbd | none
if [[ $D == /var/lib/hpcdl-sandbox ]]; then LINK=${HPCDL_SANDBOX_LINK:-1}; else LINK=0; fi
WAIT_S=${HPCDL_SANDBOX_WAIT:-60}

# The default cluster: the one sandbox.yaml describes.
DEFAULT_SHAPE='node n1 127.0.1.1 16821 8 4096 gpu:fake:4 up
node n2 127.0.1.2 16822 8 4096 gpu:fake:4 up
partition debug n1,n2 Default=YES MaxNodes=2 MaxTime=00:30:00 DefaultTime=00:10:00 PreemptMode=OFF
partition gpu n1,n2 MaxNodes=2 MaxTime=02:00:00 DefaultTime=00:10:00 PreemptMode=OFF
partition short n1,n2 MaxNodes=1 MaxTime=00:05:00 DefaultTime=00:05:00 PreemptMode=OFF
partition lowprio n1,n2 MaxNodes=2 MaxTime=00:10:00 DefaultTime=00:05:00 PriorityTier=1 PreemptMode=REQUEUE GraceTime=60
partition urgent n1,n2 MaxNodes=2 MaxTime=00:05:00 DefaultTime=00:02:00 PriorityTier=10 PreemptMode=OFF'

# ---- the shape, read once ----------------------------------------------------------
NODES=()        # every configured node
UP_NODES=()     # the nodes that get a slurmd
READY_NODES=()  # the nodes that must come up idle (not 'nogres')
PARTITION_LINES=()
declare -A NODE_ADDR NODE_PORT NODE_CPUS NODE_MEM NODE_GRES NODE_STATE
read_shape() {
  local text kind name addr port cpus mem gres state rest
  if [[ -n ${HPCDL_SANDBOX_SHAPE:-} ]]; then
    text=$(<"$HPCDL_SANDBOX_SHAPE") || { echo "sandbox: cannot read $HPCDL_SANDBOX_SHAPE" >&2; exit 2; }
  else
    text=$DEFAULT_SHAPE
  fi
  while read -r kind name rest; do
    case $kind in
      ''|'#'*) ;;
      node)
        read -r addr port cpus mem gres state <<<"$rest"
        [[ $name =~ ^[a-z][a-z0-9]*$ && $addr =~ ^127(\.[0-9]+){3}$ && $port =~ ^[0-9]+$
           && $cpus =~ ^[0-9]+$ && $mem =~ ^[0-9]+$ && $gres =~ ^(-|gpu:[a-z0-9]+:[0-9]+)$
           && $state =~ ^(up|down|nogres)$ ]] || { echo "sandbox: bad shape line: node $name $rest" >&2; exit 2; }
        NODES+=("$name"); NODE_ADDR[$name]=$addr; NODE_PORT[$name]=$port
        NODE_CPUS[$name]=$cpus; NODE_MEM[$name]=$mem; NODE_GRES[$name]=$gres
        NODE_STATE[$name]=$state
        if [[ $state != down ]]; then UP_NODES+=("$name"); fi
        if [[ $state == up ]]; then READY_NODES+=("$name"); fi ;;
      partition)
        [[ $name =~ ^[a-z][a-z0-9_]*$ && $rest =~ ^[][A-Za-z0-9,:=\ -]+$ ]] \
          || { echo "sandbox: bad shape line: partition $name $rest" >&2; exit 2; }
        if [[ $rest == -* ]]; then  # no nodes at all
          rest=${rest#-}; rest=${rest# }
          PARTITION_LINES+=("PartitionName=$name${rest:+ $rest} State=UP")
        elif [[ $rest == *State=* ]]; then  # a partition that is DOWN, DRAIN, INACTIVE
          PARTITION_LINES+=("PartitionName=$name Nodes=$rest")
        else
          PARTITION_LINES+=("PartitionName=$name Nodes=$rest State=UP")
        fi ;;
      *) echo "sandbox: bad shape line: $kind $name $rest" >&2; exit 2 ;;
    esac
  done <<<"$text"
}
read_shape

gpus_of() {  # gpus_of NODE: the node's GPU count (0 without GRES)
  local g=${NODE_GRES[$1]}
  if [[ $g == - ]]; then echo 0; else echo "${g##*:}"; fi
}

is_up() { local u; for u in "${UP_NODES[@]}"; do [[ $u == "$1" ]] && return 0; done; return 1; }

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

render_slurm_conf() {
  local host n g
  host=$(hostname -s)
  cat <<EOF
# Written by scripts/sandbox.sh (hpcdl): regenerated on every 'up'; edit the script.
ClusterName=$CLUSTER
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
# Preemption and requeue (issue 15): urgent's jobs requeue lowprio's; the preempted
# job's batch shell gets its --signal at once (not SIGTERM to the ranks) and the
# partition's GraceTime to write a checkpoint.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
JobRequeue=1
InactiveLimit=0
ReturnToService=2
MpiDefault=none
# Each node its own TmpFS: pmix creates per-job directories there.
TmpFS=$D/tmp/%n
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
JobAcctGatherType=jobacct_gather/none
EOF
  if [[ $ACCOUNTING == slurmdbd ]]; then
    cat <<EOF
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageTRES=gres/gpu
# The slurmdbd connection ignores AuthInfo: its munge socket goes here.
AccountingStoragePass=$MUNGE_SOCKET
EOF
  else
    echo "AccountingStorageType=accounting_storage/none"
  fi
  echo "MailProg=/bin/true"
  for n in "${NODES[@]}"; do
    g=${NODE_GRES[$n]}
    printf 'NodeName=%s NodeHostname=%s NodeAddr=%s Port=%s CPUs=%s Sockets=1 CoresPerSocket=%s ThreadsPerCore=1 RealMemory=%s%s State=%s\n' \
      "$n" "$n" "${NODE_ADDR[$n]}" "${NODE_PORT[$n]}" "${NODE_CPUS[$n]}" "${NODE_CPUS[$n]}" \
      "${NODE_MEM[$n]}" "$([[ $g == - ]] || echo " Gres=$g")" \
      "$(is_up "$n" && echo UNKNOWN || echo DOWN)"
  done
  printf '%s\n' "${PARTITION_LINES[@]}"
}

render_gres_conf() {
  local n g count first=1 counts
  counts=$(for n in "${NODES[@]}"; do gpus_of "$n"; done | grep -v '^0$' | sort -u)
  for n in "${NODES[@]}"; do
    g=${NODE_GRES[$n]}
    [[ $g == - || ${NODE_STATE[$n]} == nogres ]] && continue
    if ((first)); then
      if [[ $counts == *$'\n'* ]]; then counts="fake GPUs"; else counts="$counts fake GPUs per node"; fi
      echo "# Written by scripts/sandbox.sh: $counts (character devices, see write_config)."
      echo "AutoDetect=off"
      first=0
    fi
    count=${g##*:}
    g=${g#gpu:}
    echo "NodeName=$n Name=gpu Type=${g%%:*} File=$D/dev/$n/gpu[0-$((count - 1))]"
  done
  if ((first)); then echo "AutoDetect=off"; fi
}

write_config() {
  local n
  mkdir -p "$D"/{etc,run/munge,log,state/ctld,tmp,dev,db}
  chmod 700 "$D/etc"
  chmod 755 "$D/run" "$D/run/munge"
  for n in "${UP_NODES[@]}"; do  # a node without slurmd needs no spool, TmpFS or devices
    mkdir -p "$D/state/slurmd-$n" "$D/tmp/$n" "$D/dev/$n"
    # Fake GPUs: slurmd wants character devices, so clone /dev/null (c 1 3).
    local i gpus
    gpus=$(gpus_of "$n")
    for ((i = 0; i < gpus; i++)); do
      [[ -c $D/dev/$n/gpu$i ]] || mknod -m 666 "$D/dev/$n/gpu$i" c 1 3
    done
  done

  if [[ ! -s $D/etc/munge.key ]]; then
    (umask 077 && head -c 1024 /dev/urandom >"$D/etc/munge.key")
  fi
  chmod 600 "$D/etc/munge.key"

  render_slurm_conf | write_if_changed "$CONF" 644
  render_gres_conf | write_if_changed "$D/etc/gres.conf" 644

  if [[ $ACCOUNTING == slurmdbd ]]; then
    local host
    host=$(hostname -s)
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
  # Own UTS namespace: the node (and every job step it starts) sees its own hostname (n1, n2).
  unshare --uts bash -c 'hostname "$1" && exec slurmd -N "$1" -f "$2"' _ "$n" "$CONF" \
    2>>"$D/log/slurmd-$n.log" 9>&- || fail "slurmd $n did not start" "$D/log/slurmd-$n.log"
  wait_for "slurmd $n" "$D/log/slurmd-$n.log" pid_alive "$pidfile" slurmd
  STARTED+=("slurmd $n")
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

cmd_up() {
  local t0=$SECONDS
  "$HERE/install-slurm.sh" | grep -v 'all packages present' || true
  write_config
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
    config) render_slurm_conf; render_gres_conf ;;
    *) echo "usage: $0 up|down|status|config" >&2; exit 2 ;;
  esac
}

main "$@"
