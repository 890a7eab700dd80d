"""The rank environment every rank of a job gets: a small POSIX sh wrapper.

Scripts written for ``torchrun`` read RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
NODE_RANK/GROUP_RANK, MASTER_ADDR and MASTER_PORT. Under ``srun`` (or ``mpirun``)
nothing sets them. The job script therefore starts every rank through
``/bin/sh RUN_DIR/job/bin/hpcdl-rank-env COMMAND...`` (a PBS script: ``/bin/sh -c
"$HPCDL_RANK_ENV" hpcdl-rank-env COMMAND...``): the wrapper derives the variables from
Slurm's (or Open MPI's, an MPICH-style mpiexec's, Horovod's) per-rank variables and then
``exec``s COMMAND. It is sh, not Python, so it works in any image (``apptainer exec``
of a site's image that has no hpcdl, or a native run) and costs one fork.

MASTER_ADDR and MASTER_PORT are decided once in the batch shell on the host (the
first node of the allocation; a port derived from the job id) and reach the ranks
through the environment; see ``hpcdl.plan``.

Before ``exec`` the wrapper checks, each in one line on stderr:
- that COMMAND exists (in the image: ``command -v``), exit 127;
- on the rank that hosts the rendezvous (node 0, local rank 0), that nothing already
  listens on MASTER_PORT (read from /proc/net/tcp{,6}: no tools needed), exit 98.
  Another job on the same node holding the port would otherwise surface as a
  torch.distributed traceback (EADDRINUSE) after a minute of retries.

A Slurm job runs it as a file of its run, ``RUN_DIR/job/bin/hpcdl-rank-env``
(``rank_env_file``), beside the batch shell's MASTER_PORT pick
(``RUN_DIR/job/bin/hpcdl-master-port``, ``port_pick_file``): both are staged with the
run (hpcdl.launch.staging), so job.sbatch stays short and ``--dry-run`` prints them after it.
A PBS script, which hpcdl renders but does not submit, carries both inline.

This module is pure (text in, text out); the text must not contain a single quote,
so a job script can carry it in one single-quoted variable readably.
"""

from __future__ import annotations

from typing import Literal

# The variables torchrun sets for its workers that scripts read (plus hpcdl's marker).
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                 "GROUP_RANK", "GROUP_WORLD_SIZE")
# $0 of the wrapper: what `ps` shows and what sh names in its own messages.
WRAPPER_NAME = "hpcdl-rank-env"
SCRIPT_VARIABLE = "HPCDL_RANK_ENV"
# The two job-side sh files of a Slurm job, relative to its job directory.
RANK_ENV_FILE = f"bin/{WRAPPER_NAME}"
PORT_PICK_FILE = "bin/hpcdl-master-port"

Mode = Literal["ranks", "torchrun"]

_DERIVE = """\
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
"""

# Slurm gives every task of a node all GPUs of the node (--gres=gpu:N): keep the
# one of the local rank, so local rank k drives GPU k.
_GPU_BIND = """\
case ${CUDA_VISIBLE_DEVICES:-} in
  *,*)
    hpcdl_i=0 hpcdl_pick= hpcdl_ifs=$IFS
    IFS=,
    set -f
    for hpcdl_g in $CUDA_VISIBLE_DEVICES; do
      [ "$hpcdl_i" = "$LOCAL_RANK" ] && hpcdl_pick=$hpcdl_g
      hpcdl_i=$((hpcdl_i + 1))
    done
    set +f
    IFS=$hpcdl_ifs
    if [ -n "$hpcdl_pick" ]; then
      HPCDL_NODE_GPUS=$CUDA_VISIBLE_DEVICES CUDA_VISIBLE_DEVICES=$hpcdl_pick
      export HPCDL_NODE_GPUS CUDA_VISIBLE_DEVICES
    fi ;;
esac
"""

# torchrun mode: node 0 hosts the c10d store on MASTER_ADDR:MASTER_PORT, the others
# connect. Said explicitly (torchrun reads --rdzv-conf from PET_RDZV_CONF): left to its
# guess, every node whose address matches MASTER_ADDR tries to host (all of them when
# nodes share a network namespace and MASTER_ADDR is loopback, as in a sandbox on
# loopback addresses).
# Node 0 also tells the workers where it is (--local-addr, from PET_LOCAL_ADDR): by
# definition MASTER_ADDR, while its own guess (its FQDN) may not resolve elsewhere.
_TORCHRUN = """\
if [ "${SLURM_NODEID:-0}" = 0 ]; then
  PET_RDZV_CONF=is_host=1
  if [ -n "${MASTER_ADDR:-}" ]; then PET_LOCAL_ADDR=$MASTER_ADDR; export PET_LOCAL_ADDR; fi
else
  PET_RDZV_CONF=is_host=0
fi
NODE_RANK=${SLURM_NODEID:-0} LOCAL_RANK=0
export PET_RDZV_CONF
"""

_HOST = "${SLURMD_NODENAME:-$(uname -n)}"

# The hang watchdog (hpcdl submit --hang-timeout) finds each rank by the file written
# here: exec keeps the pid, so it is the command's. Under torchrun the file names the
# node's agent, whose workers are its children. Only in jobs with the watchdog.
_RECORD_PID = """\
if [ -n "${HPCDL_PID_DIR:-}" ]; then
  echo "HOST $$" > "$HPCDL_PID_DIR/KIND" || echo "hpcdl: cannot record the pid of rank ${RANK:-?} in $HPCDL_PID_DIR (the hang watchdog will not see it)" >&2
fi
"""

# Exit 0 when something on this node listens on the port $hpcdl_hex (4 hex digits):
# /proc/net/tcp{,6} state 0A = LISTEN. Shared by the rank check below and the batch
# shell's MASTER_PORT pick (templates/rank-env.sh.j2), which both read it on node 0.
PORT_LISTENED = ('grep -Eqs "^ *[0-9]+: [0-9A-F]+:$hpcdl_hex [0-9A-F]+:[0-9A-F]+ 0A " '
                 "/proc/net/tcp /proc/net/tcp6")

_CHECKS = """\
if ! command -v "$1" >/dev/null 2>&1; then
  echo "hpcdl: command not found: $1 (rank ${RANK:-?} on HOST${HPCDL_IMAGE:+, in image $HPCDL_IMAGE})" >&2
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
        PORT_LISTENED && hpcdl_busy=1
      else  # no grep in the image: the same in sh (~60 ms for 600 sockets)
        for hpcdl_f in /proc/net/tcp /proc/net/tcp6; do
          [ -r "$hpcdl_f" ] || continue
          while read -r hpcdl_sl hpcdl_local hpcdl_remote hpcdl_state hpcdl_rest; do
            case $hpcdl_local in *:"$hpcdl_hex") [ "$hpcdl_state" = 0A ] && hpcdl_busy=1 ;; esac
          done < "$hpcdl_f"
        done
      fi
      if [ -n "$hpcdl_busy" ]; then
        echo "hpcdl: MASTER_PORT $MASTER_PORT is already in use on HOST (another job or process listens on it): choose a free one with --env MASTER_PORT=PORT" >&2
        exit 98
      fi ;;
  esac
fi
exec "$@"
"""


def rank_env_script(mode: Mode = "ranks", *, gpu_bind: bool = False,
                    record_pid: bool = False) -> str:
    """The wrapper's sh text.

    ``ranks``: every task is one rank (srun, mpirun, horovodrun): derive the torchrun
    variables, optionally narrow CUDA_VISIBLE_DEVICES to the local rank's GPU.
    ``torchrun``: one task per node runs torchrun, which sets its workers' variables
    itself; only the checks run (node 0 hosts the c10d rendezvous on MASTER_PORT).
    ``record_pid``: write "NODE PID" to $HPCDL_PID_DIR/rank-RANK (torchrun: node-N)
    before exec, for the hang watchdog (hpcdl.jobs.watchdog).
    """
    parts = [f"# {WRAPPER_NAME}: the torchrun variables for every rank (POSIX sh; any image)\n"]
    if mode == "ranks":
        parts.append(_DERIVE)
        if gpu_bind:
            parts.append(_GPU_BIND)
    else:
        parts.append(_TORCHRUN)
    if record_pid:
        kind = "node-$NODE_RANK" if mode == "torchrun" else "rank-$RANK"
        parts.append(_RECORD_PID.replace("HOST", _HOST).replace("KIND", kind))
    parts.append(_CHECKS.replace("HOST", _HOST).replace("PORT_LISTENED", PORT_LISTENED))
    text = "".join(parts)
    if "'" in text:  # pragma: no cover - guarded by a unit test
        raise AssertionError("the rank-env script must not contain a single quote")
    return text


def rank_env_file(mode: Mode = "ranks", *, gpu_bind: bool = False,
                  record_pid: bool = False) -> str:
    """The wrapper as the file ``RANK_ENV_FILE`` a job runs with ``/bin/sh FILE COMMAND...``
    (sh, not exec: a run directory on a noexec mount still works)."""
    return "#!/bin/sh\n" + rank_env_script(mode, gpu_bind=gpu_bind, record_pid=record_pid)


def port_pick_lines(start: str, *, base: int, span: int, tries: int) -> str:
    """sh lines that set MASTER_PORT (not exported) to ``start``, a shell arithmetic
    expression in [base, base + span), or when something on this node listens on that
    port, to the next free one in the range (wrapping; at most ``tries`` moves)."""
    return (f"MASTER_PORT={start} hpcdl_tries=0\n"
            f'while [ "$hpcdl_tries" -lt {tries} ] && hpcdl_hex=$(printf %04X "$MASTER_PORT") '
            f"&& {PORT_LISTENED}; do\n"
            f"  MASTER_PORT=$(({base} + (MASTER_PORT - {base} + 1) % {span})) "
            "hpcdl_tries=$((hpcdl_tries + 1))\n"
            "done\n")


def port_pick_file(start: str, *, base: int, span: int, tries: int) -> str:
    """The file ``PORT_PICK_FILE``: the batch shell runs it on the job's first node and
    exports what it prints as MASTER_PORT (see port_pick_lines)."""
    return ("#!/bin/sh\n"
            "# hpcdl-master-port: prints the job's MASTER_PORT (POSIX sh). hpcdl picked the port,\n"
            "# so one already taken on this node (the job's first, where rank 0 hosts the\n"
            "# rendezvous) must not fail the job: the next free one is taken instead.\n"
            + port_pick_lines(start, base=base, span=span, tries=tries)
            + 'echo "$MASTER_PORT"\n')
