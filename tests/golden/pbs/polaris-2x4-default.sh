#!/bin/bash -l
# Rendered by hpcdl 0.1.0 for profile polaris (PBS Pro): edit the profile
# or the request and render again rather than editing this file. Submit with `qsub FILE`
# (hpcdl does not submit to PBS; this script is untested against a live PBS server).
#PBS -N hpcdl-horovod
#PBS -l select=2:ncpus=32:ngpus=4
#PBS -l place=scatter
#PBS -l walltime=01:00:00
#PBS -q debug
#PBS -A YOUR_PROJECT
#PBS -l filesystems=home:eagle:grand

module load conda cray-mpich

set -euo pipefail
# PBS starts the script in $HOME: run where qsub was called, as Slurm does.
cd "${PBS_O_WORKDIR:-.}"

export OMP_NUM_THREADS=8
export NCCL_DEBUG=WARN
export NCCL_NET_GDR_LEVEL=PHB
export HPCDL_JOB_NAME=hpcdl-horovod
export HPCDL_BACKEND=horovod

echo "hpcdl: job ${PBS_JOBID:-?} on $(sort -u "${PBS_NODEFILE:-/dev/null}" | paste -sd, -): 8 ranks (2 nodes x 4)"
mpiexec -n 8 --ppn 4 --depth 8 --cpu-bind depth python3 <repo>/examples/resnet50_imagenet.py --backend horovod --synthetic
