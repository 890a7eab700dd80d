#!/bin/bash
# Rendered by hpcdl 0.1.0 for profile karolina: an interactive allocation.
# Inside it, start ranks with srun (e.g. `srun python3 train.py`).
# hpcdl alloc loads no modules: the profile's modules: are for its job scripts; load them in the allocation.
# Slurm >= 22.05: srun inside the allocation does not inherit --cpus-per-task.
export SRUN_CPUS_PER_TASK=16
salloc --job-name=interactive --partition=qgpu --nodes=2 --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=16 --time=02:00:00 --account=OPEN-00-00
