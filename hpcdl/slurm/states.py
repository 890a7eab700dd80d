"""The one table that maps Slurm job states to hpcdl's, with an UNKNOWN fallback.

Slurm has some two dozen job states (``squeue -t`` long names, ``sacct`` State,
``scontrol`` JobState); users need six. A state Slurm adds later maps to
UNKNOWN rather than to a guess.
"""

from __future__ import annotations

# hpcdl's own states are scheduler-neutral (hpcdl.scheduler); this table maps Slurm's.
from hpcdl.scheduler import (  # re-exported: the table's targets
    CANCELLED,
    COMPLETED,
    FAILED,
    FINAL_STATES,
    HPCDL_STATES,
    PENDING,
    RUNNING,
    SUSPENDED,
    TIMEOUT,
    UNKNOWN,
    is_final,
)

__all__ = ["CANCELLED", "COMPLETED", "FAILED", "FINAL_STATES", "HPCDL_STATES", "PENDING",
           "RUNNING", "SLURM_TO_HPCDL", "SUSPENDED", "TIMEOUT", "UNKNOWN", "is_final",
           "normalize_slurm_state", "to_hpcdl"]

# Slurm state (long name, as squeue %T / sacct State / scontrol JobState print it) -> hpcdl.
SLURM_TO_HPCDL: dict[str, str] = {
    "PENDING": PENDING,
    "CONFIGURING": PENDING,
    "REQUEUED": PENDING,
    "REQUEUE_FED": PENDING,
    "REQUEUE_HOLD": PENDING,
    "RESV_DEL_HOLD": PENDING,
    "RUNNING": RUNNING,
    "COMPLETING": RUNNING,   # the job's processes are being cleaned up
    "SIGNALING": RUNNING,
    "STAGE_OUT": RUNNING,
    "RESIZING": RUNNING,
    "SUSPENDED": SUSPENDED,
    "STOPPED": SUSPENDED,
    "COMPLETED": COMPLETED,
    "FAILED": FAILED,
    "BOOT_FAIL": FAILED,
    "NODE_FAIL": FAILED,
    "OUT_OF_MEMORY": FAILED,
    "SPECIAL_EXIT": FAILED,
    "CANCELLED": CANCELLED,
    "PREEMPTED": CANCELLED,
    "REVOKED": CANCELLED,
    "TIMEOUT": TIMEOUT,
    "DEADLINE": TIMEOUT,
}


def normalize_slurm_state(raw: str) -> str:
    """Slurm's state word without decorations.

    sacct prints "CANCELLED by 0" and, when a column is too narrow, a trailing
    "+"; squeue may print short codes' long forms in any case.
    """
    word = raw.strip().split(" ", 1)[0] if raw.strip() else ""
    return word.rstrip("+").upper()


def to_hpcdl(raw: str) -> str:
    """hpcdl's state for a Slurm state string; UNKNOWN for anything not in the table."""
    return SLURM_TO_HPCDL.get(normalize_slurm_state(raw), UNKNOWN)
