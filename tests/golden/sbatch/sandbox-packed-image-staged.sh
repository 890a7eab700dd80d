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
#SBATCH --output=/scratch/runs/p4/slurm-%j.out
#SBATCH --error=/scratch/runs/p4/slurm-%j.err

set -euo pipefail

# Slurm >= 22.05: srun no longer inherits --cpus-per-task from the batch job;
# without this the ranks' data loaders starve on one CPU each.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-2}"
export OMP_NUM_THREADS=1
export OMP_PROC_BIND=false
export OMPI_MCA_mpi_yield_when_idle=1
export HPCDL_RUN_DIR=/scratch/runs/p4
export HPCDL_DATA=/data
export HPCDL_JOB_NAME=hpcdl-horovod
export HPCDL_BACKEND=horovod
export HPCDL_IMAGE=/scratch/images/pytorch-horovod.sif
# The training script creates this file once it completed its first step (the
# bundled examples do; hpcdl/jobside/requeue.py): no file, no step.
export HPCDL_PROGRESS_FILE=/scratch/runs/p4/progress

# Every rank starts through the run's job/bin/hpcdl-rank-env (--dry-run prints it): it
# sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...), then runs the command.
# - launcher srun: one process per rank; the wrapper derives the variables from its per-rank variables.
# - MASTER_ADDR: the first node of the allocation.
# - MASTER_PORT: 15000 + job id % 15000, so jobs sharing a node do not collide (below the ephemeral port range); the next free one if something on the first node listens on it.
# - GPUs: every rank sees the 2 GPUs of its node and uses GPU LOCAL_RANK (torch.cuda.set_device(LOCAL_RANK), as torchrun and Horovod scripts do).
# - image: /scratch/images/pytorch-horovod.sif (--image).
# - the bundled example comes from the run directory's copy (job/), bound read-only at /hpcdl (the image needs no copy of hpcdl).
# - image staged: each node's copy /local/hpcdl-$SLURM_JOB_ID-pytorch-horovod.sif (sbcast, below), removed at the end.
# - dataset staged: each node's copy /local/hpcdl-$SLURM_JOB_ID-data-imagenet.sqfs (sbcast, below), removed at the end.
# - dataset: each node's copy of /scratch/data/imagenet.sqfs, mounted by the container runtime read-only at /data ($HPCDL_DATA).
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
MASTER_PORT=$(/bin/sh /scratch/runs/p4/job/bin/hpcdl-master-port)
export MASTER_PORT

echo "hpcdl: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: 4 ranks (2 nodes x 2)"

# ---- staging (hpcdl submit --stage-image / --stage-data; profile container.stage: sbcast) ----
# Every node gets its own copy of the image and the packed dataset in its local scratch, sent once by
# Slurm's sbcast (compressed, down Slurm's own tree) before the first rank starts: the
# ranks then read it from their node, not all at once from the shared filesystem. A
# copy's name holds the job id; the copies are removed when this script ends.
hpcdl_nodes=$SLURM_JOB_NUM_NODES
hpcdl_each_node() {  # one task on every node of the job
  srun --nodes="$hpcdl_nodes" --ntasks="$hpcdl_nodes" --ntasks-per-node=1 --mpi=none "$@"
}
hpcdl_staged=()
hpcdl_unstage() {
  if [[ -n ${hpcdl_staged[*]-} ]]; then hpcdl_each_node rm -f ${hpcdl_staged[@]+"${hpcdl_staged[@]}"} 2>/dev/null || true; fi
}
trap hpcdl_unstage EXIT
# hpcdl_stage WHAT SRC DEST DIR: room first, on every node (one line each: node, then
# df's line for DIR): a node without it stops the job in one line that names it, before
# sbcast fills it. DEST is recorded before the copy: a partial one is removed too.
hpcdl_stage() {
  local what=$1 src=$2 dest=$3 dir=$4 need free short rc=0
  need=$(stat -L -c %s "$src")
  free=$(hpcdl_each_node sh -c 'echo "$SLURMD_NODENAME $(df -Pk "$1" | tail -n 1)"' sh "$dir") || true
  short=$(printf '%s\n' "$free" | awk -v need="$need" -v nodes="$hpcdl_nodes" '
    NF >= 5 { seen++; if ($(NF - 2) * 1024 < need) { printf "%s%s (%.0f MiB free)", sep, $1, $(NF - 2) / 1024; sep = ", " } }
    END { if (seen < nodes) printf "%s%d of %d nodes (free space unreadable)", sep, nodes - seen, nodes }')
  if [[ -n $short ]]; then
    echo "hpcdl: ${what} staging: no room for ${src} ($((need / 1048576)) MiB) in ${dir} on ${short}; no rank was started" >&2
    exit 1
  fi
  echo "hpcdl: staging ${src} ($((need / 1048576)) MiB) to ${dest} on ${hpcdl_nodes} nodes with sbcast"
  hpcdl_staged+=("$dest")
  sbcast --compress --force "$src" "$dest" || rc=$?
  if [[ $rc != 0 ]]; then
    echo "hpcdl: ${what} staging: sbcast ${src} to ${dest} failed (exit ${rc}; its error is above); no rank was started" >&2
    exit 1
  fi
}
hpcdl_stage image "$HPCDL_IMAGE" /local/hpcdl-"$SLURM_JOB_ID"-pytorch-horovod.sif /local
export HPCDL_IMAGE=/local/hpcdl-"$SLURM_JOB_ID"-pytorch-horovod.sif
hpcdl_stage dataset /scratch/data/imagenet.sqfs /local/hpcdl-"$SLURM_JOB_ID"-data-imagenet.sqfs /local
export HPCDL_DATA_FILE=/local/hpcdl-"$SLURM_JOB_ID"-data-imagenet.sqfs
srun --label --kill-on-bad-exit=1 --mpi=pmix apptainer exec --nv -B /var/lib/hpcdl-sandbox/tmp -B /scratch -B /local -B /scratch/runs/p4 -B /scratch/runs/p4/job:/hpcdl:ro -B "$HPCDL_DATA_FILE":/data:image-src=/,ro --env PYTHONPATH=/hpcdl "$HPCDL_IMAGE" /bin/sh /scratch/runs/p4/job/bin/hpcdl-rank-env python3 /hpcdl/examples/resnet50_imagenet.py --backend horovod --data /data --checkpoint-dir /scratch/runs/p4/checkpoints --image-size=32 --batch-size=4 --max-steps=10 --epochs=2 --lr=0.002 --threads=1 --workers=0 --synthetic-size=1280 --synthetic-val-size=64 --num-classes=10
