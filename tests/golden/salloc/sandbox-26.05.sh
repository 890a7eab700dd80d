#!/bin/bash
# Rendered by hpcdl 0.1.0 for profile sandbox: an interactive allocation.
# Inside it, start ranks with srun (e.g. `srun python3 train.py`).
# srun inside the allocation takes its --cpus-per-task (23.11 on); the same value here.
export SLURM_CPUS_PER_TASK=2
salloc --job-name=interactive --partition=gpu --nodes=2 --ntasks-per-node=2 --gres=gpu:2 --cpus-per-task=2 --time=02:00:00
