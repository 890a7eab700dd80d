#!/bin/bash
# Rendered by hpcdl 0.1.0 for profile polaris: an interactive allocation.
# Inside it, start ranks with srun (e.g. `srun python3 train.py`).
module load conda cray-mpich
# Slurm >= 22.05: srun inside the allocation does not inherit --cpus-per-task.
export SRUN_CPUS_PER_TASK=8
salloc --job-name=interactive --partition=prod --nodes=2 --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=8 --time=02:00:00 --account=YOUR_PROJECT
