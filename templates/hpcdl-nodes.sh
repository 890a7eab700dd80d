#!/bin/bash
# hpcdl-nodes: the node guard of a job with spare nodes (hpcdl submit --spares S;
# hpcdl/launch/nodes.py says what the job script exports for it). Staged into the run's
# job/bin and used two ways:
#   . job/bin/hpcdl-nodes          job.sbatch sources it: hpcdl_supervise keeps the
#                                  training on N healthy nodes of the N+S allocated
#   bash job/bin/hpcdl-nodes check the health gate's check on this node: one line,
#                                  "hpcdl-gate NODE ok" or "hpcdl-gate NODE bad: WHY" (the
#                                  gate's step carries the function itself, so a node
#                                  that lost the shared filesystem still says why)
# A node that fails the gate, does not answer it, is down for Slurm, or whose rank printed
# a hardware error is excluded for the rest of the run (RUN_DIR/bad-nodes.tsv, carried
# across requeues) and given back to Slurm; the training restarts from its newest
# checkpoint on healthy nodes, without going back to the queue. No file here is written
# but the run directory's records; every message is one line on stderr starting "hpcdl:".
# Bash 4.2 or later (RHEL/Rocky 7 and 8 have 4.2 and 4.4), under job.sbatch's
# `set -euo pipefail`: no EPOCHREALTIME (bash 5), and an array that may be empty is expanded
# as ${a[@]+"${a[@]}"} (before bash 4.4, "${a[@]}" of an empty one is an unbound variable
# under set -u). tests/unit/launch/test_job_bash.py lists what newer bash would be needed for.

# ---- on each node: the gate's checks ---------------------------------------------------
hpcdl_node_check() {
  local node=${SLURMD_NODENAME:-$(hostname -s)} why="" seen smi path free out
  if (( ${HPCDL_GATE_GPUS:-0} > 0 )); then
    # The GPUs Slurm gave the job on this node, and those the driver lists, if it is here.
    seen=0
    [[ -n ${CUDA_VISIBLE_DEVICES:-} ]] && seen=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
    if command -v nvidia-smi >/dev/null 2>&1; then
      smi=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
      (( smi < seen )) && seen=$smi
    fi
    (( seen >= HPCDL_GATE_GPUS )) || why+="; ${seen} of ${HPCDL_GATE_GPUS} GPUs visible"
  fi
  while IFS= read -r path; do
    [[ -z $path || -d $path ]] || why+="; ${path} is not mounted"
  done <<<"${HPCDL_GATE_PATHS:-}"
  [[ -z ${HPCDL_RUN_DIR:-} || -w $HPCDL_RUN_DIR ]] || why+="; the run directory ${HPCDL_RUN_DIR} is not writable"
  if [[ -n ${HPCDL_GATE_LOCAL:-} ]]; then
    free=$(df -Pk "$HPCDL_GATE_LOCAL" 2>/dev/null | awk 'NR == 2 {print $4}')
    if [[ -z $free ]]; then
      why+="; ${HPCDL_GATE_LOCAL} cannot be read"
    elif (( free < ${HPCDL_GATE_MIN_MB:-0} * 1024 )); then
      why+="; ${HPCDL_GATE_LOCAL} has $((free / 1024)) MiB free (needs ${HPCDL_GATE_MIN_MB})"
    fi
  fi
  if [[ -n ${HPCDL_GATE_RUNTIME:-} && -n ${HPCDL_IMAGE:-} ]]; then
    # The container starts (the ranks' image, the node's staged copy when there is one).
    if ! out=$("$HPCDL_GATE_RUNTIME" exec ${HPCDL_GATE_NV:+--nv} "$HPCDL_IMAGE" /bin/true 2>&1); then
      why+="; the container does not start: $(tail -n 1 <<<"$out" | tr -d '\t')"
    fi
  fi
  if [[ -z $why ]]; then echo "hpcdl-gate $node ok"; else echo "hpcdl-gate $node bad: ${why#; }"; fi
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  [[ ${1:-} == check ]] || { echo "usage: $0 check (job.sbatch sources this file)" >&2; exit 2; }
  hpcdl_node_check
  exit 0
fi

# ---- in the batch shell: the supervisor ------------------------------------------------
# The job as scontrol, squeue and the run's records name it: an array task (hpcdl sweep) by
# its own id, 123_4, since its SLURM_JOB_ID may be the array's, which names every task.
hpcdl_job=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID:-}}
hpcdl_job=${hpcdl_job:-${SLURM_JOB_ID:-}}
# Seconds since the epoch (bash 4.2's printf, no process); milliseconds: bash 5's
# EPOCHREALTIME where the shell has it (its decimal point is the locale's), else date's %N.
hpcdl_now() { printf '%(%s)T\n' -1; }
hpcdl_ms() {
  local t=${EPOCHREALTIME:-}
  if [[ -n $t ]]; then
    t=${t//[.,]/}
  else
    t=$(date +%s%6N)  # microseconds, as EPOCHREALTIME's digits are
    [[ $t =~ ^[0-9]+$ ]] || t=$(( $(hpcdl_now) * 1000000 ))  # a date without %N
  fi
  echo $(( 10#$t / 1000 ))
}
hpcdl_join() { local IFS=,; echo "$*"; }

# ---- Slurm's commands, bounded (job.sbatch's requeue block carries this part too) ----
# A Slurm command that does not answer (slurmctld busy or restarting, a node's slurmd
# stuck) must not hold the job script: each runs under timeout, and is KILLed
# HPCDL_KILL_S s after its TERM. A failure is named on stderr in one line ("hpcdl:
# squeue -h -j 7 -o %L failed (no answer in 30 s)"); the caller says what it means.
# With HPCDL_SLURM_NOTERM set (hpcdl_exclude_and_requeue, after its requeuehold) this shell
# ignores the TERM that Slurm sends every process of the batch step as it requeues the job,
# and the command must too, from its first instant: timeout catches a TERM (its child
# exits 143 on one before its exec), and Slurm's TERM comes as the next call starts (seen
# on 22.05: the update of ExcNodeList ended with exit 143, the job requeued without its
# exclusions). There the command is this shell's own child, which keeps the ignored TERM
# across its exec, and a KILL HPCDL_SLURM_TIMEOUT s later bounds it.
hpcdl_slurm() {
  local err rc=0 why
  if [[ -n ${HPCDL_SLURM_NOTERM:-} ]]; then
    local errf pid killer
    errf=$(mktemp)
    "$@" 2>"$errf" &
    pid=$!
    { sleep "${HPCDL_SLURM_TIMEOUT:-30}"; kill -KILL "$pid"; } >/dev/null 2>&1 &
    killer=$!
    wait "$pid" || rc=$?
    kill -KILL "$killer" 2>/dev/null || true
    err=$(cat "$errf"); rm -f "$errf"
  else
    { err=$(timeout -k "${HPCDL_KILL_S:-10}" "${HPCDL_SLURM_TIMEOUT:-30}" "$@" 2>&1 >&3 3>&-) || rc=$?; } 3>&1
  fi
  (( rc == 0 )) && return 0
  case $rc in
    124|137) why="no answer in ${HPCDL_SLURM_TIMEOUT:-30} s" ;;
    *) why="exit ${rc}${err:+: $(tail -n 1 <<<"$err" | tr -d '\t' | cut -c 1-200)}" ;;
  esac
  echo "hpcdl: $* failed (${why})" >&2
  return "$rc"
}

# hpcdl_left_seconds TEXT: a Slurm time (squeue %L prints D-HH:MM:SS, HH:MM:SS or MM:SS;
# --time also takes D-HH, D-HH:MM and minutes) in seconds; "none" for a job without a
# limit (UNLIMITED; NOT_SET before Slurm set one); nothing for what is not a time
# (INVALID, an error). Fields may have leading zeros: read as decimal (10#).
hpcdl_left_seconds() {
  local t=${1//[[:space:]]/} d=0 h=0 m=0 s=0
  case $t in
    UNLIMITED|NOT_SET|INFINITE|Unlimited|infinite) echo none; return 0 ;;
  esac
  if [[ $t =~ ^([0-9]+)-([0-9]+)(:([0-9]+)(:([0-9]+))?)?$ ]]; then
    d=${BASH_REMATCH[1]} h=${BASH_REMATCH[2]} m=${BASH_REMATCH[4]:-0} s=${BASH_REMATCH[6]:-0}
  elif [[ $t =~ ^([0-9]+):([0-9]+):([0-9]+)$ ]]; then
    h=${BASH_REMATCH[1]} m=${BASH_REMATCH[2]} s=${BASH_REMATCH[3]}
  elif [[ $t =~ ^([0-9]+):([0-9]+)$ ]]; then
    m=${BASH_REMATCH[1]} s=${BASH_REMATCH[2]}
  elif [[ $t =~ ^([0-9]+)$ ]]; then
    m=${BASH_REMATCH[1]}
  else
    return 0
  fi
  echo $(( 10#$d * 86400 + 10#$h * 3600 + 10#$m * 60 + 10#$s ))
}

# The job's time left as hpcdl_left_seconds says it ("none": no limit); nothing when
# squeue did not answer (hpcdl_slurm named why).
hpcdl_time_left() {
  local out
  out=$(hpcdl_slurm squeue -h -j "$hpcdl_job" -o %L) || return 0
  hpcdl_left_seconds "$(head -n 1 <<<"$out")"
}
# ---- end of the part the requeue block carries ----

# hpcdl_nodes_init N: the allocation's nodes, the bad ones known from earlier attempts.
hpcdl_nodes_init() {
  hpcdl_want=$1
  hpcdl_cycle=0
  hpcdl_host=${SLURMD_NODENAME:-$(hostname -s)}
  hpcdl_dir=${HPCDL_RUN_DIR:-${SLURM_SUBMIT_DIR:-.}}
  hpcdl_bad_file=$hpcdl_dir/bad-nodes.tsv
  hpcdl_recoveries=$hpcdl_dir/recoveries.tsv
  hpcdl_hb_pid="" hpcdl_hb_dir="" hpcdl_hb_t0=0 hpcdl_hb_nodes=() hpcdl_dead=()
  mapfile -t hpcdl_all < <(hpcdl_slurm scontrol show hostnames "$SLURM_JOB_NODELIST" || true)
  # The job's steps now (the batch shell's, a dataset's mount step): the guard never
  # cancels these, only steps it started (hpcdl_cancel_steps).
  hpcdl_keep_steps=" $(hpcdl_slurm squeue -h -s -j "$hpcdl_job" -o %i | tr '\n' ' ' || true) "
  declare -gA hpcdl_bad=()
  local node why
  if [[ -f $hpcdl_bad_file ]]; then
    while IFS=$'\t' read -r node why; do [[ -n $node ]] && hpcdl_bad[$node]=$why; done <"$hpcdl_bad_file"
  fi
  echo "hpcdl: node guard: the training runs on ${hpcdl_want} of ${#hpcdl_all[@]} nodes ($(hpcdl_join ${hpcdl_all[@]+"${hpcdl_all[@]}"})); the others are spares" >&2
}

# hpcdl_mark_bad NODE WHY: excluded from now on (and in the run's record).
hpcdl_mark_bad() {
  [[ -n ${hpcdl_bad[$1]+x} ]] && return 0
  hpcdl_bad[$1]=$2
  printf '%s\t%s\n' "$1" "$2" >>"$hpcdl_bad_file"
  echo "hpcdl: node $1 excluded: $2" >&2
}

hpcdl_bad_list() {
  local node out=()
  for node in ${hpcdl_bad[@]+"${!hpcdl_bad[@]}"}; do out+=("$node (${hpcdl_bad[$node]})"); done
  local IFS=';'; echo ${out[*]+"${out[*]}"}
}

# hpcdl_state_bad STATE: whether a node in sinfo's STATE (%t: "drng", "down*", "mix-";
# or a long form: "draining", "mixed+drain") must leave the training: down, draining or
# drained (an admin's or a health check's doing), failing, rebooting, or flagged not
# responding (*), powered off (~), powering down (%) or to be (!), reboot issued (^).
# Not bad: a maintenance reservation ($, maint, resv), a reboot asked for when the node is
# next idle (@), planned by the backfill (-), powering up (#).
hpcdl_state_bad() {
  local s part
  s=$(tr '[:upper:]' '[:lower:]' <<<"$1")
  [[ $s == *[*~%!^]* ]] && return 0
  s=${s//[^a-z_+]/}
  local IFS=+
  for part in $s; do
    case $part in
      down|drain|drng|drained|draining|fail|failg|failing|boot|booting|reboot|reboot_issued|\
      pow_dn|power_down|powered_down|powering_down|inval|invalid|invalid_reg) return 0 ;;
    esac
  done
  return 1
}

# hpcdl_cancel_steps: every step of the job but those it had when the guard started (the
# training's, a gate's left behind). srun's SIGKILL ends srun here, not the ranks on the
# other nodes, which slurmd then ends only when it notices (a node that does not answer,
# a rank stuck in the kernel); the next step would run beside them and their GPU memory.
hpcdl_cancel_steps() {
  local step steps name
  steps=$(hpcdl_slurm squeue -h -s -j "$hpcdl_job" -o '%i %j') || {
    echo "hpcdl: the old step's ranks may still run on the surviving nodes: squeue did not list the job's steps (above)" >&2
    return 0
  }
  while read -r step name; do
    [[ -z $step || $name == hpcdl-heartbeat ]] && continue  # (hpcdl_hb_stop's)
    case $step in *.batch|*.extern|*.interactive) continue ;; esac
    [[ $hpcdl_keep_steps == *" ${step} "* ]] && continue
    if hpcdl_slurm scancel "$step"; then
      echo "hpcdl: cancelled step ${step} on every node it ran on" >&2
    fi
  done <<<"$steps"
}

# hpcdl_drop_gone NODE...: sets hpcdl_in_job to the NODEs the job still holds; one Slurm
# took out of it (a --no-kill job goes on without a node Slurm declared down) is excluded.
# Asked along with the others, it would fail the gate's whole srun ("Requested node
# configuration is not available") and every node with it: seen on 26.05, where the step
# the node took down ended before sinfo said "down". When squeue does not say, all stay.
hpcdl_drop_gone() {
  local held node
  hpcdl_in_job=("$@")
  (( $# )) || return 0
  held=$(hpcdl_slurm squeue -h -j "$hpcdl_job" -o %N) || return 0
  [[ -n $held ]] || return 0
  held=$(hpcdl_slurm scontrol show hostnames "$held") || return 0
  hpcdl_in_job=()
  for node in "$@"; do
    if grep -qxF "$node" <<<"$held"; then
      hpcdl_in_job+=("$node")
    else
      hpcdl_mark_bad "$node" "Slurm: no longer in the job (declared down)"
    fi
  done
}

# hpcdl_gate NODE...: the gate's step on every NODE at once (beside any step left by a
# dead node: --overlap); sets hpcdl_healthy to those that answered ok, in order.
hpcdl_gate() {
  local t0 ms0 out node line rc=0 ms
  t0=$(hpcdl_now) ms0=$(hpcdl_ms)
  hpcdl_healthy=()
  hpcdl_drop_gone "$@"
  set -- ${hpcdl_in_job[@]+"${hpcdl_in_job[@]}"}
  (( $# )) || return 0
  # Bounded with -k: a node whose check hangs in the kernel (a dead NFS or FUSE mount) can
  # keep srun from ending on TERM; KILL ends it HPCDL_KILL_S s later, and the node that did
  # not answer is excluded.
  out=$(timeout -k "${HPCDL_KILL_S:-10}" "$HPCDL_GATE_TIMEOUT" srun --overlap --nodes="$#" \
    --ntasks="$#" --ntasks-per-node=1 --nodelist="$(hpcdl_join "$@")" --kill-on-bad-exit=0 \
    --mpi=none bash -c "$(declare -f hpcdl_node_check); hpcdl_node_check") || rc=$?
  if (( rc == 124 || rc == 137 )); then
    echo "hpcdl: gate: the step ran past its ${HPCDL_GATE_TIMEOUT} s and was ended" >&2
  fi
  for node in "$@"; do
    line=$(grep -m 1 -F "hpcdl-gate ${node} " <<<"$out" || true)
    case $line in
      "hpcdl-gate ${node} ok") hpcdl_healthy+=("$node") ;;
      "hpcdl-gate ${node} bad: "*) hpcdl_mark_bad "$node" "gate: ${line#*bad: }" ;;
      *) hpcdl_mark_bad "$node" "gate: no answer in $(( $(hpcdl_now) - t0 )) s" ;;
    esac
  done
  ms=$(( $(hpcdl_ms) - ms0 ))
  echo "hpcdl: gate: ${#hpcdl_healthy[@]} of $# nodes healthy in $((ms / 1000)).$(printf %03d $((ms % 1000))) s" >&2
  # A gate's step that did not end may hold its nodes' slots (and a CPU each).
  (( rc == 124 || rc == 137 )) && hpcdl_cancel_steps
  return 0
}

# --probe-first (job.sbatch then defines hpcdl_probe): the allreduce probe over the nodes
# the gate passed, before the first rank; the nodes it names slow (a link the gate does
# not measure) are excluded like the gate's. Any other failure of the probe ends the job
# as it does without spares: the training command is not started.
hpcdl_probe_nodes() {
  declare -F hpcdl_probe >/dev/null || return 0
  local rc=0 node why keep=()
  if (( ${#hpcdl_healthy[@]} < 2 )); then
    echo "hpcdl: probe skipped: ${#hpcdl_healthy[@]} healthy node (an allreduce needs 2)" >&2
    return 0
  fi
  HPCDL_NODELIST=$(hpcdl_join ${hpcdl_healthy[@]+"${hpcdl_healthy[@]}"})
  HPCDL_STEP_NODES=${#hpcdl_healthy[@]}
  HPCDL_STEP_TASKS=$(( HPCDL_STEP_NODES * HPCDL_TASKS_PER_NODE ))
  export HPCDL_NODELIST HPCDL_STEP_NODES HPCDL_STEP_TASKS
  [[ -n ${HPCDL_SET_MASTER_ADDR:-} ]] && export MASTER_ADDR=${hpcdl_healthy[0]}
  # A port no training cycle uses (they count up from the first).
  [[ -n ${HPCDL_MASTER_PORT0:-} ]] && export MASTER_PORT=$(( HPCDL_MASTER_PORT0 + HPCDL_MAX_RELAUNCHES + 1 ))
  rm -f "$HPCDL_PROBE_SLOW"
  echo "hpcdl: probe on ${HPCDL_NODELIST} before the first rank" >&2
  hpcdl_probe || rc=$?
  if (( rc == 1 )) && [[ -s $HPCDL_PROBE_SLOW ]]; then
    while IFS=$'\t' read -r node why; do
      [[ -n $node ]] && hpcdl_mark_bad "$node" "$why"
    done <"$HPCDL_PROBE_SLOW"
    for node in ${hpcdl_healthy[@]+"${hpcdl_healthy[@]}"}; do [[ -z ${hpcdl_bad[$node]+x} ]] && keep+=("$node"); done
    hpcdl_healthy=(${keep[@]+"${keep[@]}"})
  elif (( rc != 0 )); then
    echo "hpcdl: the probe failed (exit ${rc}; its verdict is above in the job's output): the training command was not started" >&2
    exit "$rc"
  else
    echo "hpcdl: the probe found no slow node" >&2
  fi
}

# Give the bad nodes back: the allocation shrinks to the others (the batch host stays: this
# shell runs there). Slurm writes slurm_job_ID_resize.sh, which brings the SLURM_*
# variables in line with the smaller allocation; it is written and read in a scratch dir.
hpcdl_release() {
  local keep=() gone=() node dir f held
  for node in ${hpcdl_all[@]+"${hpcdl_all[@]}"}; do
    if [[ -n ${hpcdl_bad[$node]+x} && $node != "$hpcdl_host" ]]; then gone+=("$node"); else keep+=("$node"); fi
  done
  (( ${#gone[@]} )) || return 0
  hpcdl_all=(${keep[@]+"${keep[@]}"})
  dir=$(mktemp -d)
  if (cd "$dir" && hpcdl_slurm scontrol update JobId="$hpcdl_job" NodeList="$(hpcdl_join ${keep[@]+"${keep[@]}"})" >/dev/null); then
    # The file's name holds a job number scontrol picks (an array task's may be the
    # array's): any in this private directory is this job's.
    # shellcheck disable=SC1090
    for f in "$dir"/slurm_job_*_resize.sh; do [[ -f $f ]] && . "$f"; done
    echo "hpcdl: released $(hpcdl_join ${gone[@]+"${gone[@]}"}) (the job keeps $(hpcdl_join ${keep[@]+"${keep[@]}"}))" >&2
  elif ! held=$(hpcdl_slurm squeue -h -j "$hpcdl_job" -o %N) \
      || ! held=$(hpcdl_slurm scontrol show hostnames "$held"); then
    # Both failed: whether the job still holds the nodes is not known.
    echo "hpcdl: could not release $(hpcdl_join ${gone[@]+"${gone[@]}"}), and Slurm did not say which nodes the job holds (both failures above); the job may keep them, unused" >&2
  elif [[ ,$(paste -sd, - <<<"$held"), != *,"${gone[0]}",* ]]; then
    echo "hpcdl: $(hpcdl_join ${gone[@]+"${gone[@]}"}) left the job (Slurm took the node back when it declared it down)" >&2
  else
    echo "hpcdl: could not release $(hpcdl_join ${gone[@]+"${gone[@]}"}) (scontrol update NodeList refused, above); the job keeps them, unused" >&2
  fi
  rm -rf "$dir"
}

# After a failed step: what Slurm and the ranks say about the nodes it ran on. Slurm's
# word is asked for the spares too: one it already knows down is then left out of the
# next gate, which would otherwise wait MessageTimeout (10 s) for it.
hpcdl_judge_step() {
  local node state line task states ask=()
  for node in ${hpcdl_all[@]+"${hpcdl_all[@]}"}; do [[ -z ${hpcdl_bad[$node]+x} ]] && ask+=("$node"); done
  (( ${#ask[@]} )) || ask=(${hpcdl_active[@]+"${hpcdl_active[@]}"})
  # (a failure is named; the ranks' own words below still count)
  states=$(hpcdl_slurm sinfo -h -N -n "$(hpcdl_join ${ask[@]+"${ask[@]}"})" -o '%N %t') || states=""
  while read -r node state; do
    [[ -n $node ]] && hpcdl_state_bad "$state" && hpcdl_mark_bad "$node" "Slurm: node state ${state}"
  done <<<"$states"
  while IFS= read -r line; do
    task=${line%%:*}
    [[ $task =~ ^[0-9]+$ ]] || continue
    node=${hpcdl_active[task / HPCDL_TASKS_PER_NODE]:-}
    [[ -n $node ]] && hpcdl_mark_bad "$node" "rank ${task}: $(tr -d '\t' <<<"${line#*: }" | cut -c 1-200)"
  done < <(grep -E "^[0-9]+: .*(${HPCDL_HW_PATTERN})" "$hpcdl_err" 2>/dev/null || true)
}

# ---- the heartbeat: which node died, without waiting for Slurm to say -----------------
# Beside each training step, a step of its own (--overlap, one task per node, no CPU to
# speak of) on every node the job may use, spares included: each task prints
# "hpcdl-beat NODE" every second, and srun brings the lines here over Slurm's own I/O
# (no shared filesystem, no clock but this host's). A node whose beats stop for
# HPCDL_HB_DEAD_S s while another node's still come in died (power, kernel, network:
# slurmd and everything of the job on it went together); it is excluded at once, and no
# step is sent to it to find out, which waits Slurm's MessageTimeout (10 s by default).
# All beats stopping together is this host's or srun's trouble, not the nodes': no
# verdict then, and the gate decides as before. HPCDL_HB_DEAD_S unset or 0: no heartbeat.

# hpcdl_hb_read DIR: srun's lines in, DIR/NODE out holding the second of its last beat
# (bash's builtins only: no process per beat).
hpcdl_hb_read() {
  local line node
  while IFS= read -r line; do
    node=${line#hpcdl-beat }
    [[ $line == "hpcdl-beat "* && $node =~ ^[A-Za-z0-9._-]+$ ]] || continue
    printf '%(%s)T\n' -1 >"$1/$node" 2>/dev/null || true
  done
}

# hpcdl_hb_start NODE...: the heartbeat step on NODEs. Not under timeout: it lasts as
# long as the training step, and hpcdl_hb_stop ends it (KILL here, scancel there). srun's
# "task N: Killed" lines are kept (DIR/ended): a node whose heartbeat task ended (the
# OOM killer, a stray kill) is alive, its slurmstepd said so, and is not judged.
hpcdl_hb_start() {
  hpcdl_hb_pid="" hpcdl_hb_nodes=("$@")
  (( ${HPCDL_HB_DEAD_S:-0} > 0 && $# > 0 )) || return 0
  hpcdl_hb_dir=$(mktemp -d) hpcdl_hb_t0=$(hpcdl_now)
  srun --overlap --job-name=hpcdl-heartbeat --nodes="$#" --ntasks="$#" --ntasks-per-node=1 \
    --nodelist="$(hpcdl_join "$@")" --kill-on-bad-exit=0 --mpi=none \
    bash -c 'while :; do echo "hpcdl-beat ${SLURMD_NODENAME:-$(hostname -s)}"; sleep 1; done' \
    </dev/null > >(hpcdl_hb_read "$hpcdl_hb_dir") 2> >(hpcdl_err_filter "$hpcdl_hb_dir/ended") &
  hpcdl_hb_pid=$!
}

# hpcdl_hb_look [T]: hpcdl_dead: the heartbeat's nodes with no beat for HPCDL_HB_DEAD_S s
# while another node beat in the last 2 s; hpcdl_hb_newest: the last beat of any (0:
# none yet); hpcdl_hb_after: how many nodes beat at second T or later.
hpcdl_hb_look() {
  local now node t stale=()
  hpcdl_dead=() hpcdl_hb_newest=0 hpcdl_hb_after=0
  [[ -n $hpcdl_hb_pid ]] || return 0
  now=$(hpcdl_now)
  for node in ${hpcdl_hb_nodes[@]+"${hpcdl_hb_nodes[@]}"}; do
    [[ -s $hpcdl_hb_dir/ended ]] && grep -qF "srun: error: ${node}: task" "$hpcdl_hb_dir/ended" && continue
    if [[ -f $hpcdl_hb_dir/$node ]]; then
      t=""
      read -r t <"$hpcdl_hb_dir/$node" 2>/dev/null || true
      [[ $t =~ ^[0-9]+$ ]] || t=$now  # (being written this instant)
      (( t > hpcdl_hb_newest )) && hpcdl_hb_newest=$t
      (( t >= ${1:-$now} )) && hpcdl_hb_after=$(( hpcdl_hb_after + 1 ))
    else
      # No beat yet: judged as if one came HPCDL_HB_DEAD_S s after the start (srun's
      # launch), and no sign of life.
      t=$(( hpcdl_hb_t0 + HPCDL_HB_DEAD_S ))
    fi
    (( now - t >= HPCDL_HB_DEAD_S )) && stale+=("$node")
  done
  (( now - hpcdl_hb_newest <= 2 )) && hpcdl_dead=(${stale[@]+"${stale[@]}"})
  return 0
}

# hpcdl_hb_verdict: every node hpcdl_hb_look found dead excluded; returns 0 when one of
# them ran the training step.
hpcdl_hb_verdict() {
  local node hit=1
  for node in ${hpcdl_dead[@]+"${hpcdl_dead[@]}"}; do
    [[ -n ${hpcdl_bad[$node]+x} ]] && continue
    hpcdl_mark_bad "$node" "heartbeat: none for ${HPCDL_HB_DEAD_S} s or more while the other nodes' came"
    [[ " ${hpcdl_active[*]-} " == *" ${node} "* ]] && hit=0
  done
  return "$hit"
}

# hpcdl_hb_settle: after the step failed, at most HPCDL_HB_DEAD_S + 1 s for the heartbeat
# to say whether one of its nodes died (its beats stay away) or none did (every node beat
# after the failure: the gate then judges the rest as before).
hpcdl_hb_settle() {
  local t0
  [[ -n $hpcdl_hb_pid ]] || return 0
  t0=$(( $(hpcdl_now) + 1 ))
  while :; do
    hpcdl_hb_look "$t0"
    hpcdl_hb_verdict && return 0
    (( hpcdl_hb_after + ${#hpcdl_dead[@]} >= ${#hpcdl_hb_nodes[@]} )) && return 0
    (( $(hpcdl_now) >= t0 + HPCDL_HB_DEAD_S )) && return 0
    kill -0 "$hpcdl_hb_pid" 2>/dev/null || return 0
    sleep 0.5
  done
}

# hpcdl_hb_stop: the heartbeat step ended: srun KILLed here, the step cancelled on its
# nodes (its name finds it), its records removed.
hpcdl_hb_stop() {
  local steps step name
  [[ -n $hpcdl_hb_pid ]] || return 0
  kill -KILL "$hpcdl_hb_pid" 2>/dev/null || true
  { wait "$hpcdl_hb_pid"; } 2>/dev/null || true
  hpcdl_hb_pid=""
  rm -rf "$hpcdl_hb_dir"
  if steps=$(hpcdl_slurm squeue -h -s -j "$hpcdl_job" -o '%i %j'); then
    while read -r step name; do
      [[ $name == hpcdl-heartbeat ]] && { hpcdl_slurm scancel "$step" || true; }
    done <<<"$steps"
  else
    echo "hpcdl: the heartbeat step may still run on the nodes (a task printing a line a second): squeue did not list the job's steps (above)" >&2
  fi
  return 0
}

# Wait for the training step, and watch for a node that died under it. First sign: its
# heartbeat stopped (above): the node is excluded and the step ended at once. Without a
# heartbeat's word, two more: a rank ended while srun goes on (srun waits for a dead
# node's tasks until Slurm declares the node down, minutes later), or nothing in the run
# directory changed for HPCDL_STALL_S (MPI ranks wait for a dead peer without end; not
# looked at while every node beats: a live node's quiet run is the hang watchdog's).
# Either way the gate then asks the step's nodes; one that does not answer is excluded
# and the step is ended here.
hpcdl_wait_step() {
  local since="" now mark tick=0 killed=0 rc=0 beating=0
  mark=$(mktemp)
  hpcdl_quiet_since=$(hpcdl_now)
  while kill -0 "$hpcdl_step" 2>/dev/null; do
    sleep 1
    now=$(hpcdl_now)
    [[ -n $hpcdl_cause ]] && continue  # time limit or preemption: the job script's turn
    if [[ -f $hpcdl_dir/relaunch.request ]]; then
      # The hang watchdog dumped the stacks: end the step and relaunch, without the
      # node it names ("-": none).
      local node why
      IFS=$'\t' read -r node why <"$hpcdl_dir/relaunch.request" || true
      rm -f "$hpcdl_dir/relaunch.request"
      echo "hpcdl: the hang watchdog asks for a relaunch: ${why}" >&2
      [[ -n $node && $node != - ]] && hpcdl_mark_bad "$node" "hang watchdog: ${why}"
      hpcdl_hung=1 killed=1
      kill -KILL "$hpcdl_step" 2>/dev/null || true
      break
    fi
    hpcdl_hb_look
    if hpcdl_hb_verdict; then
      echo "hpcdl: a node of the step stopped beating: ending the step" >&2
      killed=1
      kill -KILL "$hpcdl_step" 2>/dev/null || true
      break
    fi
    # (every node beating: the run directory is not looked at, nor walked by find)
    beating=0
    (( hpcdl_hb_newest > 0 && now - hpcdl_hb_newest <= 2 )) && beating=1 hpcdl_quiet_since=$now
    [[ -z $since ]] && grep -qE "$HPCDL_TASK_ENDED" "$hpcdl_err" 2>/dev/null && since=$now
    # (not into job/, the job's own scripts, nor code/, the --code copy: neither is the
    # training's progress, and a big code tree would be walked every 5 s)
    if (( ++tick % 5 == 0 && ! beating )) && [[ -n $(find "$hpcdl_dir" \( -path "$hpcdl_dir/job" -o -path "$hpcdl_dir/code" \) -prune \
        -o -newer "$mark" -print -quit 2>/dev/null) ]]; then
      touch "$mark"
      hpcdl_quiet_since=$now
    fi
    if [[ -n $since ]] && (( now - since >= HPCDL_STUCK_S )); then
      echo "hpcdl: a rank ended ${HPCDL_STUCK_S} s ago and the step goes on: asking its nodes" >&2
    elif (( now - hpcdl_quiet_since >= HPCDL_STALL_S )); then
      echo "hpcdl: nothing in the run directory changed for ${HPCDL_STALL_S} s: asking the step's nodes" >&2
    else
      continue
    fi
    hpcdl_gate ${hpcdl_active[@]+"${hpcdl_active[@]}"}
    if (( ${#hpcdl_healthy[@]} < ${#hpcdl_active[@]} )); then
      killed=1
      kill -KILL "$hpcdl_step" 2>/dev/null || true
      break
    fi
    [[ -n $since ]] && since=$now
    hpcdl_quiet_since=$now
  done
  rm -f "$mark"
  # (bash's own "Killed" line for a step ended here is not the job's news)
  { wait "$hpcdl_step"; } 2>/dev/null || rc=$?
  (( killed )) && hpcdl_cancel_steps
  return "$rc"
}

# hpcdl_err_filter FILE: stdin to stderr, line by line; into FILE only the lines the guard
# looks for (at most 200), so the batch host's /tmp does not fill with a chatty step's
# stderr and the watch loop's grep each second reads a few lines, not all of it.
# (The words reach awk through its environment: -v would read backslashes as escapes.)
hpcdl_err_filter() {
  HPCDL_ERR_KEEP=$1 HPCDL_ERR_HW="^[0-9]+: .*(${HPCDL_HW_PATTERN})" HPCDL_TASK_ENDED=$HPCDL_TASK_ENDED awk '
    BEGIN { keep = ENVIRON["HPCDL_ERR_KEEP"]; ended = ENVIRON["HPCDL_TASK_ENDED"]; hw = ENVIRON["HPCDL_ERR_HW"] }
    { print > "/dev/stderr"; fflush("/dev/stderr") }
    n < 200 && ($0 ~ ended || $0 ~ hw) { print >> keep; fflush(keep); n++ }'
}

hpcdl_newest_checkpoint() {
  local newest
  newest=$(ls -1 "$hpcdl_dir/checkpoints" 2>/dev/null | grep -E '^checkpoint-[0-9]+\.pt$' | sort -t- -k2 -n | tail -n 1)
  echo "${newest:--}"
}

# hpcdl_supervise: the training (hpcdl_launch, defined by job.sbatch) on N healthy nodes;
# after a node failure, again on healthy ones from the newest checkpoint, at most
# HPCDL_MAX_RELAUNCHES times. Returns the last step's exit code; hpcdl_cause is NODES when
# too few healthy nodes are left (the job script then requeues or ends, naming them).
hpcdl_supervise() {
  local rc=0 node failed_at="" left
  hpcdl_hung=0
  local -a candidates how
  hpcdl_err=$(mktemp)
  while :; do
    candidates=()
    for node in ${hpcdl_all[@]+"${hpcdl_all[@]}"}; do [[ -z ${hpcdl_bad[$node]+x} ]] && candidates+=("$node"); done
    hpcdl_gate ${candidates[@]+"${candidates[@]}"}
    [[ -z $failed_at ]] && hpcdl_probe_nodes
    hpcdl_release
    if [[ -n $failed_at ]]; then
      # The failed step's nodes that are bad now: a node failure (anything else is the
      # training's own failure, which the job script handles as before).
      how=()
      for node in ${hpcdl_active[@]+"${hpcdl_active[@]}"}; do [[ -n ${hpcdl_bad[$node]+x} ]] && how+=("$node"); done
      if (( ${#how[@]} == 0 && ! hpcdl_hung )); then
        echo "hpcdl: the training step failed (exit ${rc}) and every node is healthy: not a node failure, no relaunch" >&2
        rm -f "$hpcdl_err"
        return "$rc"
      fi
    fi
    if (( ${#hpcdl_healthy[@]} < hpcdl_want )); then
      echo "hpcdl: ${#hpcdl_healthy[@]} healthy nodes left, the training needs ${hpcdl_want}; bad nodes: $(hpcdl_bad_list)" >&2
      [[ -n $failed_at ]] && hpcdl_record "$failed_at" "-"
      hpcdl_cause=NODES
      rm -f "$hpcdl_err"
      return $(( rc ? rc : 1 ))
    fi
    if [[ -n $failed_at ]]; then
      if (( hpcdl_cycle > HPCDL_MAX_RELAUNCHES )); then
        echo "hpcdl: node failure after $(( hpcdl_cycle - 1 )) relaunches (--max-restarts ${HPCDL_MAX_RELAUNCHES}): no relaunch" >&2
        hpcdl_record "$failed_at" "-"
        rm -f "$hpcdl_err"
        return "$rc"
      fi
      # ("none": no time limit; nothing: squeue did not say, named above)
      left=$(hpcdl_time_left)
      if [[ -n $left && $left != none ]] && (( left < HPCDL_MIN_LEFT_S )); then
        echo "hpcdl: node failure with ${left} s left (under ${HPCDL_MIN_LEFT_S}): no relaunch" >&2
        hpcdl_record "$failed_at" "-"
        rm -f "$hpcdl_err"
        return "$rc"
      fi
    fi
    # (recorded while hpcdl_active still names the failed step's nodes)
    [[ -n $failed_at ]] && hpcdl_record "$failed_at" "$(hpcdl_now)"
    hpcdl_hung=0
    hpcdl_active=(${hpcdl_healthy[@]+"${hpcdl_healthy[@]:0:hpcdl_want}"})
    HPCDL_NODELIST=$(hpcdl_join ${hpcdl_active[@]+"${hpcdl_active[@]}"})
    export HPCDL_NODELIST HPCDL_CYCLE=$hpcdl_cycle
    # Rank 0 runs on the first node of the list: the rendezvous is there, on a port of
    # this cycle's own (the last one's may still be held by a dying rank).
    [[ -n ${HPCDL_SET_MASTER_ADDR:-} ]] && export MASTER_ADDR=${hpcdl_active[0]}
    [[ -n ${HPCDL_MASTER_PORT0:-} ]] && export MASTER_PORT=$(( HPCDL_MASTER_PORT0 + hpcdl_cycle ))
    [[ -n $failed_at ]] && echo "hpcdl: relaunch ${hpcdl_cycle} on ${HPCDL_NODELIST} from $(hpcdl_newest_checkpoint)" >&2
    echo "hpcdl: training on ${HPCDL_NODELIST}${MASTER_ADDR:+ (rendezvous ${MASTER_ADDR}:${MASTER_PORT:-})}" >&2
    rm -f "${HPCDL_PROGRESS_FILE:-/nonexistent}"
    : >"$hpcdl_err"
    # The step's stderr goes on to the job's; what the guard reads of it (srun's "task
    # ended" lines, the ranks' hardware errors) is kept, at most 200 lines, not the rest.
    hpcdl_hb_start ${hpcdl_healthy[@]+"${hpcdl_healthy[@]}"}
    hpcdl_launch 2> >(hpcdl_err_filter "$hpcdl_err") &
    hpcdl_step=$!
    hpcdl_wait_step
    rc=$?
    # The step's exit: the heartbeat says in seconds whether a node died under it.
    (( rc != 0 && ! hpcdl_hung )) && [[ -z $hpcdl_cause ]] && hpcdl_hb_settle
    hpcdl_hb_stop
    if [[ $rc == 0 || -n $hpcdl_cause ]]; then
      rm -f "$hpcdl_err"
      return "$rc"
    fi
    failed_at=$(hpcdl_now)
    hpcdl_judge_step
    hpcdl_cycle=$(( hpcdl_cycle + 1 ))
  done
}

# One line per node failure or hang (hpcdl.jobs.recoveries reads it): job, attempt, relaunch,
# when it was detected, the bad nodes among the step's, how each was found, when the
# training was started again ("-": it was not), on which nodes, from which checkpoint.
hpcdl_record() {
  local node nodes=() why=()
  for node in ${hpcdl_active[@]+"${hpcdl_active[@]}"}; do
    [[ -n ${hpcdl_bad[$node]+x} ]] && { nodes+=("$node"); why+=("$node: ${hpcdl_bad[$node]}"); }
  done
  (( ${#why[@]} )) || why=("hang watchdog: a hang on healthy nodes")
  local IFS=';'
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$hpcdl_job" "${SLURM_RESTART_COUNT:-0}" \
    "$hpcdl_cycle" "$1" "$(hpcdl_join ${nodes[@]+"${nodes[@]}"})" ${why[*]+"${why[*]}"} "$2" \
    "$([[ $2 == - ]] && echo - || hpcdl_join ${hpcdl_healthy[@]+"${hpcdl_healthy[@]:0:hpcdl_want}"})" \
    "$(hpcdl_newest_checkpoint)" >>"$hpcdl_recoveries"
}

# hpcdl_exclude_and_requeue: back to the queue with every bad node excluded
# (scontrol cannot change ExcNodeList of a running job: hold it as it requeues, set it,
# release; SIGTERM, which the requeue sends this shell, is ignored meanwhile, and the
# three must be done before Slurm's KILL, KillWait (30 s by default) after it: each is
# bounded to 5 s, release tried twice). A job whose allocation was shrunk may refuse
# every update for a while (Slurm without accounting never lets it again: "the DB index
# is being set"): a harmless update first tells (the job's own comment, read and written
# back as it is), and then the job is requeued plainly rather than left held; the dead
# nodes are down for Slurm anyway, and the next attempt excludes the others itself
# (bad-nodes.tsv). Returns non-zero when the job was not requeued, or is left held.
hpcdl_exclude_and_requeue() {
  local bad comment HPCDL_SLURM_TIMEOUT=5 HPCDL_KILL_S=2 HPCDL_SLURM_NOTERM=""
  bad=$(hpcdl_join ${hpcdl_bad[@]+"${!hpcdl_bad[@]}"})
  [[ -z $bad ]] && { hpcdl_slurm scontrol requeue "$hpcdl_job"; return; }
  if ! comment=$(hpcdl_slurm squeue -h -j "$hpcdl_job" -o %k); then
    echo "hpcdl: the job's comment could not be read (above): requeued without ExcNodeList; the next attempt leaves ${bad} out itself" >&2
    hpcdl_slurm scontrol requeue "$hpcdl_job"
    return
  fi
  [[ $comment == "(null)" ]] && comment=""
  if ! hpcdl_slurm scontrol update JobId="$hpcdl_job" Comment="$comment" >/dev/null; then
    echo "hpcdl: the job cannot be updated now (Slurm refused to write back its comment): requeued without ExcNodeList; the next attempt leaves ${bad} out itself" >&2
    hpcdl_slurm scontrol requeue "$hpcdl_job"
    return
  fi
  trap '' TERM
  HPCDL_SLURM_NOTERM=1  # (local: hpcdl_slurm's commands ignore the requeue's TERM too)
  hpcdl_slurm scontrol requeuehold "$hpcdl_job" || return 1
  if hpcdl_slurm scontrol update JobId="$hpcdl_job" ExcNodeList="$bad" >/dev/null; then
    echo "hpcdl: requeued with ExcNodeList=${bad}" >&2
  else
    echo "hpcdl: requeued without ExcNodeList (Slurm refused it, above); the next attempt leaves ${bad} out itself" >&2
  fi
  hpcdl_slurm scontrol release "$hpcdl_job" && return 0
  sleep 1
  hpcdl_slurm scontrol release "$hpcdl_job" && return 0
  echo "hpcdl: the job is requeued but held: scontrol release ${hpcdl_job} failed twice (above); release it by hand (scontrol release ${hpcdl_job}) or cancel it" >&2
  return 1
}
