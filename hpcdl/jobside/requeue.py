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
  that loads (a damaged newest file falls back to the one before);
* ``$HPCDL_PROGRESS_FILE``: once an attempt has completed its first training step,
  the script creates this file (``mark_step`` writes the attempt, the step and the
  time; any content will do, ``touch`` is enough). The batch shell removes it before
  each attempt starts and looks for it when the attempt ends: an attempt that failed
  without it (and did not exit ``EXIT_REQUEUE``) failed before its first step (a
  container that did not start, an import error, a rendezvous that never formed)
  and is not requeued, since it would fail the same way again; one that reached its
  time limit without it looks hung and is not requeued either. A preempted attempt
  is requeued whatever it did. hpcdl reads the same file after the job: a job that
  ran out of time without it is reported as looking hung, not short of time.

The batch shell then requeues the job itself (``scontrol requeue``) while
``$SLURM_RESTART_COUNT`` is below ``--max-restarts``; a script that ends with
any other non-zero code (a crash, a killed rank) after its first step is requeued
the same way and resumes from its last periodic checkpoint. When the shell's wait for the
checkpoint runs out it sends SIGTERM to the step as a fallback, which
``watch_signals`` turns into the same request.

This module is the stdlib-only helper for Python scripts (examples/requeue_contract.py
shows it); the environment variables and the exit code are the contract itself.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

FLAG_ENV = "HPCDL_REQUEUE_FLAG"
CHECKPOINT_ENV = "HPCDL_CHECKPOINT_DIR"
# "Stopped on request, checkpoint written: requeue me". Not 0 (the job is not done),
# not 1/2 (errors), not 124 (timeout(1)), not >= 128 (killed by a signal).
EXIT_REQUEUE = 85
# The flag file's name in the run directory (the batch script sets $HPCDL_REQUEUE_FLAG).
FLAG_NAME = "requeue.flag"
# "This attempt completed a training step": the file's name in the run directory (the
# batch script sets $HPCDL_PROGRESS_FILE to it, with or without --requeue).
PROGRESS_ENV = "HPCDL_PROGRESS_FILE"
PROGRESS_NAME = "progress"
# How long the batch shell waits for the ranks to checkpoint and exit after the
# signal, at most, before it sends SIGTERM to the step (the lead time minus this
# margin, so Slurm's own SIGKILL at the limit comes after the fallback).
WAIT_MARGIN_S = 15
MIN_WAIT_S = 10

# Why an attempt ended, in the words the batch script records ($hpcdl_cause in the job
# script, the sixth column of the run's attempts.tsv), spelt here once: the job script's
# requeue and node guard blocks are rendered from these (templates/sbatch.sh.j2's
# ``cause``, which hpcdl.plan.build fills from cause_words()), hpcdl.jobs.attempts reads
# attempts.tsv with them. templates/hpcdl-nodes.sh is staged unrendered:
# tests/unit/jobside/test_causes.py checks that every word it (and every rendered script)
# assigns or compares is one of CAUSES, and that each of CAUSES is spelt in the bash.
# Which word an attempt ends with, and whether it is requeued: hpcdl.jobs.requeue_policy.
COMPLETED = "COMPLETED"  # the step exited 0
FAILED = "FAILED"  # it exited non-zero and no signal came
TIMEOUT = "TIMEOUT"  # the job's signal came near its time limit
PREEMPTED = "PREEMPTED"  # the signal came earlier, or the job has no limit: preemption
STARTUP = "STARTUP"  # FAILED before the attempt's first training step
STALLED = "STALLED"  # TIMEOUT before the attempt's first training step: it looks hung
NODES = "NODES"  # the node guard: fewer healthy nodes left than the training needs
CAUSES = (COMPLETED, FAILED, TIMEOUT, PREEMPTED, STARTUP, STALLED, NODES)
# An attempt that completed no training step: not requeued (another would do the same).
NO_STEP = (STARTUP, STALLED)
# Attempts that spend no restart of --max-restarts: preemption is not the job's doing,
# and a completed attempt is not a restart.
SPEND_NO_RESTART = (PREEMPTED, COMPLETED)
# A signal this close to the time limit (the lead, plus this much for squeue's answer
# and the clocks) is the time limit's (TIMEOUT); an earlier one is a preemption.
LEAD_SLACK_S = 60

_signalled = False
_marked = False


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


def mark_step(step: int, env: Mapping[str, str] | None = None) -> bool:
    """Record that this attempt completed a training step: ``$HPCDL_PROGRESS_FILE``
    gets one JSON line (attempt, step, time). Only the first call of a process writes
    (later ones return at once, so it can be called after every step); nothing without
    the variable. True when it wrote. One rank is enough (rank 0: the others have
    done the same step once a step's collectives returned)."""
    global _marked
    if _marked:  # the cheap path: every step after the first
        return False
    environ = os.environ if env is None else env
    path = environ.get(PROGRESS_ENV)
    if not path:
        return False
    attempt = environ.get("SLURM_RESTART_COUNT", "0")
    line = json.dumps({"attempt": int(attempt) if attempt.isdigit() else 0, "step": step,
                       "time": round(time.time(), 3)})
    target = Path(path)
    # Atomic (temp file + rename): the batch shell and hpcdl only test that it exists,
    # but a person reading it should never see half a line. Stdlib only (ranks import
    # this inside any image).
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(line + "\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _marked = True
    return True



def cause_words() -> dict[str, object]:
    """The job script template's ``cause`` variable: each of CAUSES by its own name
    (``{{ cause.TIMEOUT }}``), and ``spend_no_restart`` (SPEND_NO_RESTART)."""
    return {**{word: word for word in CAUSES}, "spend_no_restart": list(SPEND_NO_RESTART)}
