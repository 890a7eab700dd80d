#!/bin/bash -l
# Rendered by hpcdl 0.1.0 for profile polaris (PBS Pro): edit the profile
# or the request and render again rather than editing this file. Submit with `qsub FILE`
# (hpcdl does not submit to PBS; this script is untested against a live PBS server).
#PBS -N t1
#PBS -l select=1:ncpus=8:ngpus=1
#PBS -l place=scatter
#PBS -l walltime=01:00:00
#PBS -q debug
#PBS -A YOUR_PROJECT
#PBS -l filesystems=home:eagle:grand
#PBS -o /runs/t1/
#PBS -e /runs/t1/

module load conda cray-mpich

set -euo pipefail
# PBS starts the script in $HOME: run where qsub was called, as Slurm does.
cd "${PBS_O_WORKDIR:-.}"

export OMP_NUM_THREADS=8
export NCCL_DEBUG=WARN
export NCCL_NET_GDR_LEVEL=PHB
export HPCDL_JOB_NAME=t1
export HPCDL_BACKEND=horovod

echo "hpcdl: job ${PBS_JOBID:-?} on $(sort -u "${PBS_NODEFILE:-/dev/null}" | paste -sd, -): 1 ranks (1 nodes x 1)"
mpiexec -n 1 --ppn 1 --depth 8 --cpu-bind depth python3 train.py --lr 0.1
