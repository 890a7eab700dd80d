#!/bin/bash
# Rendered by hpcdl 0.1.0 for profile sandbox: edit the profile or
# the request and render again rather than editing this file.
#SBATCH --job-name=hpcdl-horovod
#SBATCH --partition=debug
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=2
#SBATCH --time=00:10:00
#SBATCH --output=./slurm-%j.out
#SBATCH --error=./slurm-%j.err

set -euo pipefail

# Slurm 24.11: srun takes the job's CPUs per task again (23.11 on; 22.05's
# SRUN_CPUS_PER_TASK is ignored) and refuses a SLURM_CPUS_PER_TASK that differs from it: Slurm's own value is kept.
export SLURM_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-2}"
export OMP_NUM_THREADS=1
export OMP_PROC_BIND=false
export OMPI_MCA_mpi_yield_when_idle=1
export HPCDL_JOB_NAME=hpcdl-horovod
export HPCDL_BACKEND=horovod

# Every rank starts through the run's job/bin/hpcdl-rank-env (--dry-run prints it): it
# sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...), then runs the command.
# - launcher srun: one process per rank; the wrapper derives the variables from its per-rank variables.
# - MASTER_ADDR: the first node of the allocation.
# - MASTER_PORT: 15000 + job id % 15000, so jobs sharing a node do not collide (below the ephemeral port range); the next free one if something on the first node listens on it.
# - GPUs: every rank sees the 4 GPUs of its node and uses GPU LOCAL_RANK (torch.cuda.set_device(LOCAL_RANK), as torchrun and Horovod scripts do).
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
MASTER_PORT=$(/bin/sh ./job/bin/hpcdl-master-port)
export MASTER_PORT

echo "hpcdl: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: 8 ranks (2 nodes x 4)"
srun --label --kill-on-bad-exit=1 --mpi=pmix /bin/sh ./job/bin/hpcdl-rank-env python3 <repo>/examples/resnet50_imagenet.py --backend horovod --synthetic --image-size=32 --batch-size=4 --max-steps=10 --epochs=2 --lr=0.002 --threads=1 --workers=0 --synthetic-size=1280 --synthetic-val-size=64 --num-classes=10
