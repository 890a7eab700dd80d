"""A job that ran out of time: the one line that says so, with the limit it hit and
what to do about it, and the exit code ``hpcdl submit --wait`` gives it. Pure
functions over a job's status (and its stderr), shared by ``submit --wait`` and
``hpcdl status``.

A job that hit its limit without completing a single training step did not need
more time: it looks hung (a rendezvous or a first collective that never returned),
and the line says so. Whether it completed one is read from the run directory's
progress file (hpcdl/jobside/requeue.py) by the caller: ``steps`` is True (it did), False
(it did not, and the command is one that records its first step) or None (cannot
tell: no run directory, or a custom command that may never write the file).
"""

from __future__ import annotations

from hpcdl.core.duration import format_time, parse_time
from hpcdl.jobs.rundir import RunDir
from hpcdl.schedulers.base import JobState, JobStatus, Scheduler

# `hpcdl submit --wait` exits with this when the job hit its time limit, as timeout(1)
# does: a script can tell "give it more time" from a crash (the job's own exit code
# would be 143 = 128 + SIGTERM, the same as a cancelled job's).
EXIT_TIMEOUT = 124

def clock_text(duration: str) -> str:
    """A Slurm time limit or elapsed time as HH:MM:SS (D-HH:MM:SS), whichever form Slurm
    printed it in (squeue "1:25" is 85 s, sacct "00:01:25"); other words
    ("Partition_Limit", "0:00", "") unchanged."""
    try:
        return format_time(parse_time(duration))
    except ValueError:
        return duration.strip()


def ran_out_of_time(status: JobStatus, stderr: str = "", *, scheduler: Scheduler) -> bool:
    """True when the scheduler ended the job at its time limit or deadline (state
    TIMEOUT), or its state was read while it ended and its stderr carries the
    scheduler's note that the time limit ended it (Scheduler.time_ran_out)."""
    return scheduler.time_ran_out(status, stderr) is not None


def _headroom(limit: str, max_time: str | None, partition: str) -> str:
    """How much more --time the partition allows, when it is known."""
    if not max_time:
        return ""
    try:
        hit, most = parse_time(limit), parse_time(max_time)
    except ValueError:
        return ""
    where = f"partition {partition}" if partition else "the partition"
    if hit is not None and (most is None or most > hit):
        return f" ({where} allows up to {max_time})"
    return f" (already {where}'s maximum: choose a partition with a longer one)"


def hang_advice(nodes: int = 1) -> str:
    """What to run next for a job that looks hung (the time-limit line and a requeued
    attempt that stalled both end with it)."""
    probe = f" and `hpcdl probe -N {nodes}` to test the nodes' links" if nodes > 1 else ""
    return ("rerun with --hang-timeout SECONDS to get every rank's stack when it "
            f"stops making progress{probe}")


def steps_seen(records_steps: bool, progress_exists: bool) -> bool | None:
    """Whether the job completed a training step, from its run directory: the progress
    file says yes; its absence says no only for a command that records its first step
    (``records_steps``, the plan's); otherwise None (cannot tell)."""
    if progress_exists:
        return True
    return False if records_steps else None


def run_steps_seen(run: RunDir) -> bool | None:
    """Whether the job of ``run`` (its last attempt) completed a training step: True,
    False, or None when it cannot be told (the command may never write the progress
    file, or plan.json is unreadable). See steps_seen."""
    try:
        records = run.read_plan().data.get("records_steps") is True
    except (OSError, ValueError):
        records = False
    return steps_seen(records, run.progress.exists())


def timeout_message(status: JobStatus, stderr: str = "", *, scheduler: Scheduler,
                    max_time: str | None = None, steps: bool | None = None,
                    nodes: int = 1) -> str | None:
    """One line for a job that ran out of time: the limit it hit and the fixes;
    None for any other job. ``max_time`` is the partition's limit, when known, so
    the line can say how much more --time is possible. ``steps`` False (no training
    step completed, known from the run directory): it looks hung instead, and the
    fix is the hang watchdog (``nodes`` > 1: and the probe), not more time.
    """
    ran_out = scheduler.time_ran_out(status, stderr)
    if ran_out is None:
        return None
    after = f" after {clock_text(status.elapsed)}" if status.elapsed else ""
    said = f"{scheduler.label} {status.native_state or JobState.TIMEOUT}"
    if steps is False:
        limit = clock_text(status.time_limit)
        what = ("its deadline" if ran_out == "deadline"
                else f"its time limit of {limit}" if limit else "its time limit")
        return (f"job {status.job_id} hit {what}{after} ({said}) "
                f"without completing a single training step: it looks hung, not short of "
                f"time; {hang_advice(nodes)}")
    shorter = "make it shorter (fewer steps: -X --max-steps=N, -X --epochs=N)"
    if ran_out == "deadline":
        return (f"job {status.job_id} reached its deadline{after} ({said}): "
                f"set a later one, or {shorter}")
    limit = clock_text(status.time_limit)
    what = f"its time limit of {limit}" if limit else "its time limit"
    room = _headroom(limit, max_time, status.partition) if limit else ""
    return (f"job {status.job_id} hit {what}{after} ({said}): "
            f"give it more with --time{room}, or {shorter}, or let it continue: "
            f"--requeue (checkpoint, requeue, resume) or --chain N where requeue is off")
