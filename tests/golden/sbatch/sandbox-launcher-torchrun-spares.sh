#!/bin/bash
# Rendered by hpcdl 0.1.0 for profile sandbox: edit the profile or
# the request and render again rather than editing this file.
#SBATCH --job-name=hpcdl-horovod
#SBATCH --partition=debug
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:2
#SBATCH --cpus-per-task=2
#SBATCH --time=00:10:00
#SBATCH --no-kill
#SBATCH --output=/scratch/runs/t2/slurm-%j.out
#SBATCH --error=/scratch/runs/t2/slurm-%j.err

set -euo pipefail

# Slurm >= 22.05: srun no longer inherits --cpus-per-task from the batch job;
# without this the ranks' data loaders starve on one CPU each.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-2}"
export OMP_NUM_THREADS=1
export OMP_PROC_BIND=false
export OMPI_MCA_mpi_yield_when_idle=1
export HPCDL_PID_DIR=/scratch/runs/t2/pids
export HPCDL_HEARTBEAT_DIR=/scratch/runs/t2/heartbeat
export PYTHONUNBUFFERED=1
export HPCDL_RUN_DIR=/scratch/runs/t2
export HPCDL_JOB_NAME=hpcdl-horovod
export HPCDL_BACKEND=horovod
# The training script creates this file once it completed its first step (the
# bundled examples do; hpcdl/jobside/requeue.py): no file, no step.
export HPCDL_PROGRESS_FILE=/scratch/runs/t2/progress

# Every rank starts through the run's job/bin/hpcdl-rank-env (--dry-run prints it): it
# sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...), then runs the command.
# - launcher torchrun: one torchrun per node (srun --ntasks-per-node=1), each starting 2 ranks; c10d rendezvous at $MASTER_ADDR:$MASTER_PORT.
# - MASTER_ADDR: the first node of the allocation.
# - MASTER_PORT: 15000 + job id % 15000, so jobs sharing a node do not collide (below the ephemeral port range); the next free one if something on the first node listens on it.
# - GPUs: every rank sees the 2 GPUs of its node and uses GPU LOCAL_RANK (torch.cuda.set_device(LOCAL_RANK), as torchrun and Horovod scripts do).
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
MASTER_PORT=$(/bin/sh /scratch/runs/t2/job/bin/hpcdl-master-port)
export MASTER_PORT

echo "hpcdl: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: 2 ranks (1 nodes x 2)"

# ---- hang watchdog (hpcdl submit --hang-timeout 30; hpcdl/jobside/hangwatch.py) ----
# The job watches itself, with or without `submit --wait`: no progress for 30 s (the
# ranks' heartbeats in RUN_DIR/heartbeat, else any file of the run directory) -> a py-spy
# stack of every rank (srun --overlap) and a diagnosis in RUN_DIR/hang/, then relaunch.
# It runs here, on the batch host, under this host's python3 (srun and scancel are here,
# not in the image) and ends with this script. Without a python3 >= 3.9 here the job
# runs unwatched, says so, and `submit --wait` on the login node watches instead.
hpcdl_watch_py=$(command -v python3 || true)
if [[ -n $hpcdl_watch_py ]] && "$hpcdl_watch_py" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
  PYTHONPATH=/scratch/runs/t2/job "$hpcdl_watch_py" -m hpcdl.jobside.hangwatch --job-id "$SLURM_JOB_ID" --run-dir /scratch/runs/t2 --timeout 30 --action relaunch &
else
  echo "hpcdl: hang watchdog: no python3 >= 3.9 on the batch host ${SLURMD_NODENAME:-$(hostname)} (${hpcdl_watch_py:-none on PATH}): the job does not watch itself" >&2
  echo "no python3 >= 3.9 on the batch host ${SLURMD_NODENAME:-$(hostname)} (${hpcdl_watch_py:-none on PATH})" > /scratch/runs/t2/hang-unwatched || true
fi

# ---- node guard (hpcdl submit --spares 1; job/bin/hpcdl-nodes, hpcdl/launch/nodes.py) ----
# The training runs on 1 of the allocation's 2 nodes. Before it, and before every
# relaunch, a health gate runs on every node (the container starts, the GPUs are visible,
# the shared paths are mounted, local scratch has room). When the training step fails
# because a node died, no longer answers, or a rank printed a hardware error, that node is
# excluded and given back, and the training starts again on healthy nodes from its newest
# checkpoint, at most 3 times: no trip back to the queue.
export HPCDL_CHECKPOINT_DIR=/scratch/runs/t2/checkpoints
export HPCDL_NODES_FILE=/scratch/runs/t2/job/bin/hpcdl-nodes
export HPCDL_TASKS_PER_NODE=2
export HPCDL_MAX_RELAUNCHES=3
export HPCDL_GATE_TIMEOUT=90
export HPCDL_GATE_GPUS=2
export HPCDL_GATE_PATHS='/home
/scratch'
export HPCDL_STUCK_S=10
export HPCDL_STALL_S=30
export HPCDL_MIN_LEFT_S=60
export HPCDL_HB_DEAD_S=5
export HPCDL_TASK_ENDED='^srun: error: [^:]+: tasks? [0-9,-]+: (Exited|Killed|Terminated)'
export HPCDL_HW_PATTERN='fallen off the bus|uncorrectable ECC|ECC error|Xid [0-9]+|CUDA error: unspecified launch failure|hpcdl: this node is bad'
export HPCDL_GATE_LOCAL=/local
export HPCDL_GATE_MIN_MB=256
export HPCDL_SET_MASTER_ADDR=1
export HPCDL_MASTER_PORT0=$MASTER_PORT
# shellcheck disable=SC1090
source /scratch/runs/t2/job/bin/hpcdl-nodes
hpcdl_nodes_init 1
hpcdl_launch() { exec srun --label --kill-on-bad-exit=1 --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=4 --nodelist="$HPCDL_NODELIST" --overlap /bin/sh /scratch/runs/t2/job/bin/hpcdl-rank-env python3 -m torch.distributed.run --nnodes=1 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" --no-python python3 ddp.py; }
set +e
hpcdl_cause=""
hpcdl_supervise
hpcdl_rc=$?
if [[ $hpcdl_rc != 0 && $hpcdl_cause == NODES ]]; then
  echo "hpcdl: job ${SLURM_JOB_ID} ended: fewer than 1 healthy nodes; bad: $(hpcdl_bad_list); newest checkpoint: $(hpcdl_newest_checkpoint) (submit again with --requeue to go back to the queue without them)" >&2
fi
exit "$hpcdl_rc"
