#!/bin/bash
# Rendered by hpcdl 0.1.0 for profile generic: edit the profile or
# the request and render again rather than editing this file.
#SBATCH --job-name="resnet50 ddp"
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:2
#SBATCH --cpus-per-task=8
#SBATCH --time=00:20:00
#SBATCH --output=./slurm-%j.out
#SBATCH --error=./slurm-%j.err

set -euo pipefail

# Slurm >= 22.05: srun no longer inherits --cpus-per-task from the batch job;
# without this the ranks' data loaders starve on one CPU each.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-8}"
export OMP_NUM_THREADS=8
export NCCL_DEBUG=WARN
export NCCL_SOCKET_IFNAME=ib0
export HPCDL_JOB_NAME='resnet50 ddp'
export HPCDL_BACKEND=ddp
export HPCDL_IMAGE=/scratch/images/pytorch-horovod.sif

# Every rank starts through the run's job/bin/hpcdl-rank-env (--dry-run prints it): it
# sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...), then runs the command.
# - launcher srun: one process per rank; the wrapper derives the variables from its per-rank variables.
# - MASTER_ADDR: the first node of the allocation.
# - MASTER_PORT: 15000 + job id % 15000, so jobs sharing a node do not collide (below the ephemeral port range); the next free one if something on the first node listens on it.
# - GPUs: every rank sees the 2 GPUs of its node and uses GPU LOCAL_RANK (torch.cuda.set_device(LOCAL_RANK), as torchrun and Horovod scripts do).
# - image: /scratch/images/pytorch-horovod.sif (--image).
# - the bundled example comes from the host, bound read-only at /hpcdl (the image needs no copy of hpcdl).
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
MASTER_PORT=$(/bin/sh ./job/bin/hpcdl-master-port)
export MASTER_PORT

echo "hpcdl: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: 4 ranks (2 nodes x 2)"
srun --label --kill-on-bad-exit=1 --mpi=pmix apptainer exec --nv -B /scratch/data/imagenet:/imagenet -B <repo>/examples:/hpcdl/examples:ro -B <repo>/hpcdl:/hpcdl/hpcdl:ro --env PYTHONPATH=/hpcdl /scratch/images/pytorch-horovod.sif /bin/sh ./job/bin/hpcdl-rank-env python3 /hpcdl/examples/resnet50_imagenet.py --backend ddp --data /imagenet
