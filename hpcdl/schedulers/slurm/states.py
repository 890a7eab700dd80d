"""The one table that maps Slurm job states to hpcdl's, with an UNKNOWN fallback.

Slurm has some two dozen job states (``squeue -t`` long names, ``sacct`` State,
``scontrol`` JobState); users need six. A state Slurm adds later maps to
UNKNOWN rather than to a guess.
"""

from __future__ import annotations

from hpcdl.jobside import requeue
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


# Slurm's accounting state of an ended attempt of a requeued job (sacct -D, one row per
# attempt) -> hpcdl's reason, where Slurm's word is enough: where the batch script has
# a word for it too, the script's (hpcdl.jobside.requeue), so that both read the same.
ATTEMPT_REASONS = {"PREEMPTED": requeue.PREEMPTED, "NODE_FAIL": "NODE_FAIL",
                   "TIMEOUT": requeue.TIMEOUT, "COMPLETED": requeue.COMPLETED,
                   "FAILED": requeue.FAILED, "CANCELLED": "CANCELLED",
                   "OUT_OF_MEMORY": requeue.FAILED, "BOOT_FAIL": "NODE_FAIL"}
# An attempt in one of these states has not ended (the newest) or was requeued (any other).
_ATTEMPT_GOING = ("RUNNING", "PENDING", "REQUEUED")


def attempt_reason(raw: str, *, last: bool, script_cause: str | None) -> str:
    """Why an attempt ended (hpcdl.schedulers.base.Scheduler.attempt_reason): the batch
    script's cause when it recorded one, else Slurm's word (ATTEMPT_REASONS); a
    NODE_FAIL, which the script cannot see, wins over the script's cause."""
    state = raw.split(" ", 1)[0]
    if state == "NODE_FAIL":
        return "NODE_FAIL"
    if script_cause is not None:
        return script_cause
    if state in ATTEMPT_REASONS:
        return ATTEMPT_REASONS[state]
    if state in _ATTEMPT_GOING:
        return state if last else "REQUEUED"
    return state
