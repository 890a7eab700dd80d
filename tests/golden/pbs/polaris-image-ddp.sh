#!/bin/bash -l
# Rendered by hpcdl 0.1.0 for profile polaris (PBS Pro): edit the profile
# or the request and render again rather than editing this file. Submit with `qsub FILE`
# (hpcdl does not submit to PBS; this script is untested against a live PBS server).
#PBS -N resnet50_ddp
#PBS -l select=2:ncpus=16:ngpus=2
#PBS -l place=scatter
#PBS -l walltime=00:20:00
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
export NCCL_SOCKET_IFNAME=ib0
export HPCDL_JOB_NAME='resnet50 ddp'
export HPCDL_BACKEND=ddp
export HPCDL_IMAGE=/images/pytorch-horovod.sif

echo "hpcdl: job ${PBS_JOBID:-?} on $(sort -u "${PBS_NODEFILE:-/dev/null}" | paste -sd, -): 4 ranks (2 nodes x 2)"
mpiexec -n 4 --ppn 2 --depth 8 --cpu-bind depth apptainer exec --nv -B /eagle -B /grand -B /data/imagenet:/imagenet /images/pytorch-horovod.sif python3 /opt/hpcdl/examples/resnet50_imagenet.py --backend ddp --data /imagenet
