"""The requeue contract between hpcdl's batch script and a training script.

With ``hpcdl submit --requeue`` (or ``--chain N``) Slurm sends a signal to the
batch shell (``#SBATCH --signal=B:SIG@LEAD``: LEAD seconds before the time limit,
or at once when the job is preempted). The batch shell runs on the host, where
``scontrol`` exists; the ranks may run inside Apptainer and may use NCCL, which
takes some signals for itself. So the request travels as a file, not a signal:

* ``$HPCDL_CHECKPOINT_DIR``: where the script keeps its checkpoints (the run
  directory's ``checkpoints/``; every attempt of the job sees the same one);
* ``$HPCDL_REQUEUE_FLAG``: a file the batch shell creates when the job must stop.
  The script checks it at step boundaries (all ranks must agree: reduce the
  answer), finishes the step, writes a checkpoint (rank 0, atomically, never in
  a signal handler), and exits with ``EXIT_REQUEUE`` (85);
* on start it resumes from the newest checkpoint in ``$HPCDL_CHECKPOINT_DIR``
  that loads (a damaged newest file falls back to the one before).

The batch shell then requeues the job itself (``scontrol requeue``) while
``$SLURM_RESTART_COUNT`` is below ``--max-restarts``; a script that ends with
any other non-zero code (a crash, a killed rank) is requeued the same way and
resumes from its last periodic checkpoint. When the shell's wait for the
checkpoint runs out it sends SIGTERM to the step as a fallback, which
``watch_signals`` turns into the same request.

This module is the stdlib-only helper for Python scripts (examples/requeue_contract.py
shows it); the environment variables and the exit code are the contract itself.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from pathlib import Path

FLAG_ENV = "HPCDL_REQUEUE_FLAG"
CHECKPOINT_ENV = "HPCDL_CHECKPOINT_DIR"
# "Stopped on request, checkpoint written: requeue me". Not 0 (the job is not done),
# not 1/2 (errors), not 124 (timeout(1)), not >= 128 (killed by a signal).
EXIT_REQUEUE = 85
# The flag file's name in the run directory (the batch script sets $HPCDL_REQUEUE_FLAG).
FLAG_NAME = "requeue.flag"
# How long the batch shell waits for the ranks to checkpoint and exit after the
# signal, at most, before it sends SIGTERM to the step (the lead time minus this
# margin, so Slurm's own SIGKILL at the limit comes after the fallback).
WAIT_MARGIN_S = 15
MIN_WAIT_S = 10

_signalled = False


def _note(signum: int, frame: object) -> None:
    # Only a flag: the checkpoint is written by the training loop at its next step
    # boundary. Writing it here could interrupt a collective or a half-written file.
    global _signalled
    _signalled = True


def watch_signals(signals: Iterable[int] = (signal.SIGTERM, signal.SIGUSR2)) -> None:
    """Turn these signals into a stop request (the batch shell's fallback, and Slurm's
    SIGTERM at preemption on clusters that send it to the tasks). Main thread only."""
    for signum in signals:
        signal.signal(signum, _note)


def requested(env: dict[str, str] | os._Environ[str] | None = None) -> bool:
    """True once the job was asked to stop: the flag file exists, or a watched signal came."""
    flag = (os.environ if env is None else env).get(FLAG_ENV)
    return _signalled or bool(flag and Path(flag).exists())


def checkpoint_dir(default: str | None = None,
                   env: dict[str, str] | os._Environ[str] | None = None) -> str | None:
    """``$HPCDL_CHECKPOINT_DIR``, else ``default``."""
    return (os.environ if env is None else env).get(CHECKPOINT_ENV) or default


def wait_seconds(lead: int) -> int:
    """How long the batch shell waits for the checkpoint after a signal LEAD s early."""
    return max(MIN_WAIT_S, lead - WAIT_MARGIN_S)
