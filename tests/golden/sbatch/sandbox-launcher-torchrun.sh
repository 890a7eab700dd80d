#!/bin/bash
# Rendered by hpcdl 0.1.0 for profile sandbox: edit the profile or
# the request and render again rather than editing this file.
#SBATCH --job-name=hpcdl-ddp
#SBATCH --partition=debug
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:2
#SBATCH --cpus-per-task=2
#SBATCH --time=00:10:00
#SBATCH --output=/scratch/runs/t1/slurm-%j.out
#SBATCH --error=/scratch/runs/t1/slurm-%j.err

set -euo pipefail

# Slurm >= 22.05: srun no longer inherits --cpus-per-task from the batch job;
# without this the ranks' data loaders starve on one CPU each.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-2}"
export OMP_NUM_THREADS=1
export OMP_PROC_BIND=false
export OMPI_MCA_mpi_yield_when_idle=1
export HPCDL_RUN_DIR=/scratch/runs/t1
export HPCDL_JOB_NAME=hpcdl-ddp
export HPCDL_BACKEND=ddp
export HPCDL_IMAGE=/scratch/images/x.sif
# The training script creates this file once it completed its first step (the
# bundled examples do; hpcdl/jobside/requeue.py): no file, no step.
export HPCDL_PROGRESS_FILE=/scratch/runs/t1/progress

# Every rank starts through the run's job/bin/hpcdl-rank-env (--dry-run prints it): it
# sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...), then runs the command.
# - launcher torchrun: one torchrun per node (srun --ntasks-per-node=1), each starting 2 ranks; c10d rendezvous at $MASTER_ADDR:$MASTER_PORT.
# - MASTER_ADDR: the first node of the allocation.
# - MASTER_PORT: 15000 + job id % 15000, so jobs sharing a node do not collide (below the ephemeral port range); the next free one if something on the first node listens on it.
# - GPUs: every rank sees the 2 GPUs of its node and uses GPU LOCAL_RANK (torch.cuda.set_device(LOCAL_RANK), as torchrun and Horovod scripts do).
# - image: /scratch/images/x.sif (--image).
# - the bundled example comes from the run directory's copy (job/), bound read-only at /hpcdl (the image needs no copy of hpcdl).
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
MASTER_PORT=$(/bin/sh /scratch/runs/t1/job/bin/hpcdl-master-port)
export MASTER_PORT

echo "hpcdl: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: 4 ranks (2 nodes x 2)"
srun --label --kill-on-bad-exit=1 --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=4 apptainer exec --nv -B /var/lib/hpcdl-sandbox/tmp -B /scratch -B /local -B /scratch/runs/t1 -B /scratch/runs/t1/job:/hpcdl:ro --env PYTHONPATH=/hpcdl /scratch/images/x.sif /bin/sh /scratch/runs/t1/job/bin/hpcdl-rank-env python3 -m torch.distributed.run --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" --no-python python3 /hpcdl/examples/resnet50_imagenet.py --backend ddp --synthetic --checkpoint-dir /scratch/runs/t1/checkpoints --image-size=32 --batch-size=4 --max-steps=10 --epochs=2 --lr=0.002 --threads=1 --workers=0 --synthetic-size=1280 --synthetic-val-size=64 --num-classes=10
