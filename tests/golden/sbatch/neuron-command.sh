#!/bin/bash -l
# Rendered by hpcdl 0.1.0 for profile neuron: edit the profile or
# the request and render again rather than editing this file.
#SBATCH --job-name=t1
#SBATCH --partition=cas_v100_2
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=16
#SBATCH --time=01:00:00
#SBATCH --comment=pytorch
#SBATCH --output=/scratch/runs/t1/slurm-%j.out
#SBATCH --error=/scratch/runs/t1/slurm-%j.err

module load gcc/10.2.0 cuda/11.4 cudampi/openmpi-4.1.1

set -euo pipefail

# Slurm >= 22.05: srun no longer inherits --cpus-per-task from the batch job;
# without this the ranks' data loaders starve on one CPU each.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-16}"
export OMP_NUM_THREADS=16
export NCCL_DEBUG=WARN
export HPCDL_RUN_DIR=/scratch/runs/t1
export HPCDL_JOB_NAME=t1
export HPCDL_BACKEND=horovod
export HPCDL_IMAGE=/apps/applications/singularity_images/ngc/pytorch_22.03-hd-py3.sif
# The training script creates this file once it completed its first step (the
# bundled examples do; hpcdl/jobside/requeue.py): no file, no step.
export HPCDL_PROGRESS_FILE=/scratch/runs/t1/progress

# Every rank starts through the run's job/bin/hpcdl-rank-env (--dry-run prints it): it
# sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...), then runs the command.
# - launcher srun: one process per rank; the wrapper derives the variables from its per-rank variables.
# - MASTER_ADDR: the first node of the allocation.
# - MASTER_PORT: 15000 + job id % 15000, so jobs sharing a node do not collide (below the ephemeral port range); the next free one if something on the first node listens on it.
# - GPUs: every rank sees the 1 GPUs of its node and uses GPU LOCAL_RANK (torch.cuda.set_device(LOCAL_RANK), as torchrun and Horovod scripts do).
# - image: /apps/applications/singularity_images/ngc/pytorch_22.03-hd-py3.sif (the profile's container.default_image; --image overrides, --no-image runs natively).
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
MASTER_PORT=$(/bin/sh /scratch/runs/t1/job/bin/hpcdl-master-port)
export MASTER_PORT

echo "hpcdl: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: 1 ranks (1 nodes x 1)"
srun --label --kill-on-bad-exit=1 singularity exec --nv -B /scratch -B /apps -B /scratch/runs/t1 /apps/applications/singularity_images/ngc/pytorch_22.03-hd-py3.sif /bin/sh /scratch/runs/t1/job/bin/hpcdl-rank-env python3 train.py --lr 0.1
