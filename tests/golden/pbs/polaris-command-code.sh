#!/bin/bash -l
# Rendered by hpcdl 0.1.0 for profile polaris (PBS Pro): edit the profile
# or the request and render again rather than editing this file. Submit with `qsub FILE`
# (hpcdl does not submit to PBS; this script is untested against a live PBS server).
#PBS -N t2
#PBS -l select=1:ncpus=8:ngpus=1
#PBS -l place=scatter
#PBS -l walltime=01:00:00
#PBS -q debug
#PBS -A YOUR_PROJECT
#PBS -l filesystems=home:eagle:grand
#PBS -o /scratch/runs/t2/
#PBS -e /scratch/runs/t2/

module load conda cray-mpich

set -euo pipefail
# PBS starts the script in $HOME: run where qsub was called, as Slurm does.
cd "${PBS_O_WORKDIR:-.}"

export OMP_NUM_THREADS=8
export NCCL_DEBUG=WARN
export NCCL_NET_GDR_LEVEL=PHB
export HPCDL_RUN_DIR=/scratch/runs/t2
export HPCDL_JOB_NAME=t2
export HPCDL_BACKEND=horovod

# Every rank gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
# NODE_RANK, GROUP_RANK, MASTER_ADDR, MASTER_PORT), so a script written for torchrun
# runs unchanged; Horovod/MPI scripts ignore them. The POSIX sh wrapper below sets
# them in each rank from the launcher's per-rank variables, then execs the command.
# - launcher mpirun: one process per rank; the wrapper derives the variables from its per-rank variables.
# - MASTER_ADDR: the first node of the allocation.
# - MASTER_PORT: 15000 + job id % 15000, so jobs sharing a node do not collide (below the ephemeral port range); the next free one if something on the first node listens on it.
# - GPUs: every rank sees the 1 GPUs of its node and uses GPU LOCAL_RANK (torch.cuda.set_device(LOCAL_RANK), as torchrun and Horovod scripts do).
export MASTER_ADDR="$(head -n 1 "$PBS_NODEFILE")"
# hpcdl picked this port, so a port already taken on this node (the first of the job,
# where rank 0 hosts the rendezvous) must not fail the job: take the next free one.
MASTER_PORT=$((15000 + ${PBS_JOBID%%.*} % 15000)) hpcdl_tries=0
while [ "$hpcdl_tries" -lt 64 ] && hpcdl_hex=$(printf %04X "$MASTER_PORT") && grep -Eqs "^ *[0-9]+: [0-9A-F]+:$hpcdl_hex [0-9A-F]+:[0-9A-F]+ 0A " /proc/net/tcp /proc/net/tcp6; do
  MASTER_PORT=$((15000 + (MASTER_PORT - 15000 + 1) % 15000)) hpcdl_tries=$((hpcdl_tries + 1))
done
export MASTER_PORT
HPCDL_RANK_ENV='# hpcdl-rank-env: the torchrun variables for every rank (POSIX sh; any image)
if [ -n "${OMPI_COMM_WORLD_RANK:-}" ]; then
  # Started by mpirun (Open MPI): its variables describe the processes it started.
  RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE
  LOCAL_RANK=${OMPI_COMM_WORLD_LOCAL_RANK:-0} LOCAL_WORLD_SIZE=${OMPI_COMM_WORLD_LOCAL_SIZE:-1}
  # Open MPI has no node index (OMPI_COMM_WORLD_NODE_RANK counts processes on the
  # node); mpirun fills each node before the next under Slurm.
  NODE_RANK=$((RANK / LOCAL_WORLD_SIZE))
  GROUP_WORLD_SIZE=$(( (WORLD_SIZE + LOCAL_WORLD_SIZE - 1) / LOCAL_WORLD_SIZE ))
  HPCDL_RANK_FROM=openmpi
elif [ -n "${PMI_RANK:-}" ] && [ -n "${PALS_LOCAL_RANKID:-${MPI_LOCALRANKID:-${PMI_LOCAL_RANK:-}}}" ]; then
  # Started by an MPICH-style mpiexec (MPICH, Intel MPI, Cray PALS under PBS). Without a
  # local rank this is srun --mpi=pmi2, whose Slurm variables below say more.
  RANK=$PMI_RANK WORLD_SIZE=${PMI_SIZE:-1}
  LOCAL_RANK=${PALS_LOCAL_RANKID:-${MPI_LOCALRANKID:-${PMI_LOCAL_RANK:-0}}}
  LOCAL_WORLD_SIZE=${MPI_LOCALNRANKS:-${PMI_LOCAL_SIZE:-1}}
  NODE_RANK=${PALS_NODEID:-$((RANK / LOCAL_WORLD_SIZE))}
  GROUP_WORLD_SIZE=$(( (WORLD_SIZE + LOCAL_WORLD_SIZE - 1) / LOCAL_WORLD_SIZE ))
  HPCDL_RANK_FROM=pmi
elif [ -n "${HOROVOD_RANK:-}" ]; then
  # Started by horovodrun (Gloo).
  RANK=$HOROVOD_RANK WORLD_SIZE=$HOROVOD_SIZE
  LOCAL_RANK=${HOROVOD_LOCAL_RANK:-0} LOCAL_WORLD_SIZE=${HOROVOD_LOCAL_SIZE:-1}
  NODE_RANK=${HOROVOD_CROSS_RANK:-0} GROUP_WORLD_SIZE=${HOROVOD_CROSS_SIZE:-1}
  HPCDL_RANK_FROM=horovod
elif [ -n "${SLURM_PROCID:-}" ]; then
  # Started by srun: one task per rank.
  RANK=$SLURM_PROCID WORLD_SIZE=${SLURM_STEP_NUM_TASKS:-${SLURM_NTASKS:-1}}
  LOCAL_RANK=${SLURM_LOCALID:-0} NODE_RANK=${SLURM_NODEID:-0}
  GROUP_WORLD_SIZE=${SLURM_STEP_NUM_NODES:-${SLURM_NNODES:-1}}
  # Tasks on this node: SLURM_STEP_TASKS_PER_NODE reads like 2(x3),1.
  LOCAL_WORLD_SIZE= hpcdl_i=0 hpcdl_ifs=$IFS
  IFS=,
  set -f
  for hpcdl_c in ${SLURM_STEP_TASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-}}; do
    hpcdl_n=${hpcdl_c%%(*} hpcdl_r=1
    case $hpcdl_c in *x*) hpcdl_r=${hpcdl_c#*x}; hpcdl_r=${hpcdl_r%)} ;; esac
    hpcdl_i=$((hpcdl_i + hpcdl_r))
    if [ -z "$LOCAL_WORLD_SIZE" ] && [ "$NODE_RANK" -lt "$hpcdl_i" ]; then
      LOCAL_WORLD_SIZE=$hpcdl_n
    fi
  done
  set +f
  IFS=$hpcdl_ifs
  LOCAL_WORLD_SIZE=${LOCAL_WORLD_SIZE:-$((WORLD_SIZE / GROUP_WORLD_SIZE))}
  HPCDL_RANK_FROM=slurm
else
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 NODE_RANK=0 GROUP_WORLD_SIZE=1
  HPCDL_RANK_FROM=single
fi
GROUP_RANK=$NODE_RANK
export RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE NODE_RANK GROUP_RANK GROUP_WORLD_SIZE
export HPCDL_RANK_FROM
if ! command -v "$1" >/dev/null 2>&1; then
  echo "hpcdl: command not found: $1 (rank ${RANK:-?} on ${SLURMD_NODENAME:-$(uname -n)}${HPCDL_IMAGE:+, in image $HPCDL_IMAGE})" >&2
  exit 127
fi
if [ "${NODE_RANK:-${SLURM_NODEID:-0}}" = 0 ] && [ "${LOCAL_RANK:-${SLURM_LOCALID:-0}}" = 0 ]; then
  case ${MASTER_PORT:-x} in
    *[!0-9]*) ;;
    *)
      # Something listening on MASTER_PORT here (state 0A = LISTEN) means the rendezvous
      # cannot bind: say so now instead of after the retries of torch.distributed.
      hpcdl_hex=$(printf %04X "$MASTER_PORT") hpcdl_busy=
      if command -v grep >/dev/null 2>&1; then
        grep -Eqs "^ *[0-9]+: [0-9A-F]+:$hpcdl_hex [0-9A-F]+:[0-9A-F]+ 0A " /proc/net/tcp /proc/net/tcp6 && hpcdl_busy=1
      else  # no grep in the image: the same in sh (~60 ms for 600 sockets)
        for hpcdl_f in /proc/net/tcp /proc/net/tcp6; do
          [ -r "$hpcdl_f" ] || continue
          while read -r hpcdl_sl hpcdl_local hpcdl_remote hpcdl_state hpcdl_rest; do
            case $hpcdl_local in *:"$hpcdl_hex") [ "$hpcdl_state" = 0A ] && hpcdl_busy=1 ;; esac
          done < "$hpcdl_f"
        done
      fi
      if [ -n "$hpcdl_busy" ]; then
        echo "hpcdl: MASTER_PORT $MASTER_PORT is already in use on ${SLURMD_NODENAME:-$(uname -n)} (another job or process listens on it): choose a free one with --env MASTER_PORT=PORT" >&2
        exit 98
      fi ;;
  esac
fi
exec "$@"
'

echo "hpcdl: job ${PBS_JOBID:-?} on $(sort -u "${PBS_NODEFILE:-/dev/null}" | paste -sd, -): 1 ranks (1 nodes x 1)"
mpiexec -n 1 --ppn 1 --depth 8 --cpu-bind depth /bin/sh -c "${HPCDL_RANK_ENV:?}" hpcdl-rank-env python3 train.py
