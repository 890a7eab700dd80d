"""The one table that maps Slurm job states to hpcdl's, with an UNKNOWN fallback.

Slurm has some two dozen job states (``squeue -t`` long names, ``sacct`` State,
``scontrol`` JobState); users need six. A state Slurm adds later maps to
UNKNOWN rather than to a guess.
"""

from __future__ import annotations

from hpcdl.schedulers.base import JobState

# Slurm state (long name, as squeue %T / sacct State / scontrol JobState print it) -> hpcdl.
SLURM_TO_HPCDL: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,   # the job's processes are being cleaned up
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SUSPENDED": JobState.SUSPENDED,
    "STOPPED": JobState.SUSPENDED,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    "PREEMPTED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
    "DEADLINE": JobState.TIMEOUT,
}


def normalize_slurm_state(raw: str) -> str:
    """Slurm's state word without decorations.

    sacct prints "CANCELLED by 0" and, when a column is too narrow, a trailing
    "+"; squeue may print short codes' long forms in any case.
    """
    word = raw.strip().split(" ", 1)[0] if raw.strip() else ""
    return word.rstrip("+").upper()


def to_hpcdl(raw: str) -> JobState:
    """hpcdl's state for a Slurm state string; UNKNOWN for anything not in the table."""
    return SLURM_TO_HPCDL.get(normalize_slurm_state(raw), JobState.UNKNOWN)


# Slurm states after which a requeueable job may come back (PENDING again, same id).
MAY_COME_BACK = frozenset({"PREEMPTED", "NODE_FAIL", "REQUEUED", "REQUEUE_HOLD"})


def may_come_back(raw: str) -> bool:
    """True for a Slurm state a requeue may follow (see MAY_COME_BACK)."""
    return normalize_slurm_state(raw) in MAY_COME_BACK
