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
#SBATCH --output=/scratch/runs/m1/slurm-%j.out
#SBATCH --error=/scratch/runs/m1/slurm-%j.err

set -euo pipefail

# Slurm >= 22.05: srun no longer inherits --cpus-per-task from the batch job;
# without this the ranks' data loaders starve on one CPU each.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-2}"
export OMP_NUM_THREADS=1
export OMP_PROC_BIND=false
export OMPI_MCA_mpi_yield_when_idle=1
export HPCDL_RUN_DIR=/scratch/runs/m1
export HPCDL_JOB_NAME=hpcdl-horovod
export HPCDL_BACKEND=horovod
# The training script creates this file once it completed its first step (the
# bundled examples do; hpcdl/jobside/requeue.py): no file, no step.
export HPCDL_PROGRESS_FILE=/scratch/runs/m1/progress

# Every rank starts through the run's job/bin/hpcdl-rank-env (--dry-run prints it): it
# sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...), then runs the command.
# - launcher mpirun: one process per rank; the wrapper derives the variables from its per-rank variables.
# - MASTER_ADDR: the first node of the allocation.
# - MASTER_PORT: 15000 + job id % 15000, so jobs sharing a node do not collide (below the ephemeral port range); the next free one if something on the first node listens on it.
# - GPUs: each rank sees one GPU, number LOCAL_RANK of its node's 2 (CUDA_VISIBLE_DEVICES narrowed by the wrapper; --gpu-bind none keeps all).
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
MASTER_PORT=$(/bin/sh /scratch/runs/m1/job/bin/hpcdl-master-port)
export MASTER_PORT

echo "hpcdl: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: 4 ranks (2 nodes x 2)"
mpirun -np "$SLURM_NTASKS" /bin/sh /scratch/runs/m1/job/bin/hpcdl-rank-env python3 x.py
