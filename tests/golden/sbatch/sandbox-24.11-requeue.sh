#!/bin/bash
# Rendered by hpcdl 0.1.0 for profile sandbox: edit the profile or
# the request and render again rather than editing this file.
#SBATCH --job-name=hpcdl-horovod
#SBATCH --partition=debug
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=2
#SBATCH --time=00:10:00
#SBATCH --signal=B:USR1@60
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=/scratch/runs/r1/slurm-%j.out
#SBATCH --error=/scratch/runs/r1/slurm-%j.err

set -euo pipefail

# Slurm 24.11: srun takes the job's CPUs per task again (23.11 on; 22.05's
# SRUN_CPUS_PER_TASK is ignored) and refuses a SLURM_CPUS_PER_TASK that differs from it: Slurm's own value is kept.
export SLURM_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-2}"
export OMP_NUM_THREADS=1
export OMP_PROC_BIND=false
export OMPI_MCA_mpi_yield_when_idle=1
export HPCDL_RUN_DIR=/scratch/runs/r1
export PYTHONPATH=/scratch/runs/r1/job${PYTHONPATH:+:$PYTHONPATH}
export HPCDL_JOB_NAME=hpcdl-horovod
export HPCDL_BACKEND=horovod
# The training script creates this file once it completed its first step (the
# bundled examples do; hpcdl/jobside/requeue.py): no file, no step.
export HPCDL_PROGRESS_FILE=/scratch/runs/r1/progress

# Every rank starts through the run's job/bin/hpcdl-rank-env (--dry-run prints it): it
# sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...), then runs the command.
# - launcher srun: one process per rank; the wrapper derives the variables from its per-rank variables.
# - MASTER_ADDR: the first node of the allocation.
# - MASTER_PORT: 15000 + job id % 15000, so jobs sharing a node do not collide (below the ephemeral port range); the next free one if something on the first node listens on it.
# - GPUs: every rank sees the 1 GPUs of its node and uses GPU LOCAL_RANK (torch.cuda.set_device(LOCAL_RANK), as torchrun and Horovod scripts do).
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
MASTER_PORT=$(/bin/sh /scratch/runs/r1/job/bin/hpcdl-master-port)
export MASTER_PORT

echo "hpcdl: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: 2 ranks (2 nodes x 1)"

# ---- requeue (hpcdl submit --requeue / --chain; hpcdl/jobside/requeue.py has the contract) ----
# Slurm sends SIGUSR1 to this shell 60 s before the time limit, or at
# preemption. The ranks (maybe in a container, maybe using NCCL) are asked through a file
# they poll at step boundaries; they checkpoint and exit 85. This shell, on
# the host where scontrol exists, then requeues the job (at most 2 times).
export HPCDL_CHECKPOINT_DIR=/scratch/runs/r1/checkpoints
export HPCDL_REQUEUE_FLAG=/scratch/runs/r1/requeue.flag
# The job as scontrol, squeue and attempts.tsv name it: an array task (hpcdl sweep) by its
# own id, 123_4, since its SLURM_JOB_ID may be the array's, which names every task.
hpcdl_job=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID:-}}
hpcdl_job=${hpcdl_job:-$SLURM_JOB_ID}
# (from job/bin/hpcdl-nodes, which a job with spares sources instead)
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
# hpcdl_requeue_verdict RC CAUSE LEFT LEAD PROGRESS USED MAX_RESTARTS CHAIN: what the
# attempt ends as and whether it goes back to the queue, as hpcdl/jobs/requeue_policy.py
# specifies it (the arguments are described there; tests/unit/jobs/test_requeue_policy.py
# holds this function to it): prints the cause, 1 to requeue (else 0), and the key of what
# to say. RC empty: the job's signal came and the step still runs. Bash, not Python: the
# batch host may have none. No Slurm and no files here: its callers ask them.
hpcdl_requeue_verdict() {
  local rc=$1 cause=$2 left=$3 lead=$4 progress=$5 used=$6 max=$7 chain=$8
  if [[ -z $rc ]]; then
    # The first word stands. Near the limit, a time limit; a job without a limit ("none")
    # can only be preempted; squeue silent (""): preemption, which spends no restart.
    if [[ -z $cause ]]; then
      if [[ $left =~ ^[0-9]+$ ]] && (( 10#$left <= lead + 60 )); then cause=TIMEOUT; else cause=PREEMPTED; fi
    fi
    echo "$cause 0 signal"
    return 0
  fi
  if [[ $rc == 0 ]]; then cause=COMPLETED
  elif [[ -z $cause ]]; then cause=FAILED
  fi
  if (( chain > 1 )); then  # a chain's next job (--dependency=afterany) resumes
    if [[ $rc != 0 ]]; then echo "$cause 0 chain"; else echo "$cause 0 done"; fi
    return 0
  fi
  # No step and no checkpoint promised (exit 85): the attempt failed before its first
  # step (the container or the start-up failed: STARTUP) or reached its time limit without
  # one (it looks hung: STALLED). Another attempt would do the same, so neither is
  # requeued; a preempted attempt is, whatever it did (not the job's doing).
  if [[ $rc != 0 && $rc != 85 && $progress != 1 ]]; then
    case $cause in FAILED) cause=STARTUP ;; TIMEOUT) cause=STALLED ;; esac
  fi
  case $cause in
    STARTUP) echo "$cause 0 startup"; return 0 ;;
    STALLED) echo "$cause 0 stalled"; return 0 ;;
  esac
  if [[ $rc == 0 ]]; then echo "$cause 0 done"; return 0; fi
  # Preemption is not the job's fault: it is always requeued (a job whose batch shell ends
  # after the signal would otherwise be COMPLETED for Slurm) and uses up no restart; time
  # limits and failures count against --max-restarts (this one included).
  case $cause in PREEMPTED|COMPLETED) ;; *) used=$(( used + 1 )) ;; esac
  if [[ $cause == PREEMPTED ]] || (( used <= max )); then echo "$cause 1 requeue"; else echo "$cause 0 limit"; fi
}
hpcdl_attempt=${SLURM_RESTART_COUNT:-0}
hpcdl_started=$(date +%s)
hpcdl_cause=""
hpcdl_requeued=""
hpcdl_woke=0
hpcdl_step=""
rm -f "$HPCDL_REQUEUE_FLAG" "$HPCDL_PROGRESS_FILE"
hpcdl_on_signal() {
  hpcdl_woke=1
  [[ -n $hpcdl_cause ]] && return 0
  # Time left decides what the signal means (hpcdl_requeue_verdict).
  local left verdict
  left=$(hpcdl_time_left)
  verdict=$(hpcdl_requeue_verdict "" "" "$left" 60 0 0 0 1)
  hpcdl_cause=${verdict%% *}
  echo "hpcdl: SIGUSR1 at $(date +%s) (attempt ${hpcdl_attempt}, ${hpcdl_cause}): asking the ranks to checkpoint and stop" >&2
  date +%s > "$HPCDL_REQUEUE_FLAG"
  # Bounded: if the ranks have not stopped in 45 s, SIGTERM the step (the example
  # takes it as the same request; Slurm's own kill comes later).
  ( sleep 45; kill -TERM "$hpcdl_step" 2>/dev/null ) &
}
trap hpcdl_on_signal USR1
set +e
if (( hpcdl_attempt > 0 )); then
  # The previous attempt's step may still be cleaned up on the nodes; a step launched
  # over it fails to start (and srun may then exit 0). Wait for it, at most 60 s.
  for _ in $(seq 60); do
    [[ -z $(hpcdl_slurm squeue -h -s -j "$hpcdl_job" -o %i | grep -v '\.batch$\|\.extern$') ]] && break
    sleep 1
  done
  sleep 2
fi
srun --label --kill-on-bad-exit=1 --mpi=pmix /bin/sh /scratch/runs/r1/job/bin/hpcdl-rank-env python3 /scratch/runs/r1/job/examples/resnet50_imagenet.py --backend horovod --synthetic --checkpoint-dir /scratch/runs/r1/checkpoints --resume --image-size=32 --batch-size=4 --max-steps=10 --epochs=2 --lr=0.002 --threads=1 --workers=0 --synthetic-size=1280 --synthetic-val-size=64 --num-classes=10 &
hpcdl_step=$!
while :; do
  hpcdl_woke=0
  wait "$hpcdl_step"
  hpcdl_rc=$?
  [[ $hpcdl_woke == 1 ]] || break  # a trapped signal woke wait: the step still runs
done
hpcdl_ended=$(date +%s)
hpcdl_progress=0
[[ -e $HPCDL_PROGRESS_FILE ]] && hpcdl_progress=1
# The restarts the job's earlier attempts spent (hpcdl_requeue_verdict counts this one).
hpcdl_used=0
[[ -e /scratch/runs/r1/attempts.tsv ]] && hpcdl_used=$(awk -F'\t' -v j="$hpcdl_job" '$1 == j && $6 != "PREEMPTED" && $6 != "COMPLETED"' \
  /scratch/runs/r1/attempts.tsv | wc -l)
read -r hpcdl_cause hpcdl_requeue hpcdl_say <<<"$(hpcdl_requeue_verdict "$hpcdl_rc" "$hpcdl_cause" "" \
  60 "$hpcdl_progress" "$hpcdl_used" 2 1)"
# One line per attempt (hpcdl.jobs.rundir.RunDir.attempts reads it).
printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$hpcdl_job" "$hpcdl_attempt" "$hpcdl_started" \
  "$hpcdl_ended" "$hpcdl_rc" "$hpcdl_cause" >> /scratch/runs/r1/attempts.tsv
case $hpcdl_say in
  startup) echo "hpcdl: attempt ${hpcdl_attempt} failed before its first step: exit ${hpcdl_rc} (STARTUP); not requeued (another attempt would fail the same way; the cause is above)" >&2 ;;
  stalled) echo "hpcdl: attempt ${hpcdl_attempt} completed no step before its time limit: exit ${hpcdl_rc} (STALLED); not requeued (it looks hung: --hang-timeout shows where)" >&2 ;;
  limit) echo "hpcdl: attempt ${hpcdl_attempt} ended: exit ${hpcdl_rc} (${hpcdl_cause}); not requeued (--max-restarts 2)" >&2 ;;
esac
if [[ $hpcdl_requeue == 1 ]]; then
  echo "hpcdl: attempt ${hpcdl_attempt} ended: exit ${hpcdl_rc} (${hpcdl_cause}); requeueing at $(date +%s)" >&2
  # Slurm ends this shell in the sleep; should the sleep end first (expedite's TERM
  # does), the shell runs on to its end: requeued, it says nothing more.
  hpcdl_slurm scontrol requeue "$hpcdl_job" && hpcdl_requeued=1 && sleep 300
  [[ -n $hpcdl_requeued ]] || echo "hpcdl: attempt ${hpcdl_attempt}: the requeue failed (its error is above)" >&2
fi
exit "$hpcdl_rc"
