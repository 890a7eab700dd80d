"""Asking Slurm about jobs: squeue for live jobs, sacct for finished ones,
``scontrol show job`` to bridge the seconds in which sacct lags behind.
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Sequence
from dataclasses import replace

from hpcdl.errors import ToolError
from hpcdl.schedulers.base import is_final
from hpcdl.schedulers.executor import LOCAL, Executor
from hpcdl.schedulers.slurm.array import split_task_id
from hpcdl.schedulers.slurm.parse import (
    HISTORY_FIELDS,
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SQUEUE_STATUS_FIELDS,
    JobStatus,
    array_of,
    is_sacct_placeholder,
    parse_sacct,
    parse_sacct_history,
    parse_scontrol_exit,
    parse_squeue,
    parse_squeue_status,
)

QUERY_TIMEOUT = 30


def slurm_available(ex: Executor = LOCAL) -> bool:
    """True when Slurm's client tools are on PATH."""
    return all(ex.which_all(("sbatch", "squeue", "sacct", "scontrol")).values())


def squeue_job(job_id: str, ex: Executor = LOCAL) -> JobStatus | None:
    """The job as squeue sees it (live, or ended less than MinJobAge ago), or None. An
    array's id gives the array as a whole (array_of its tasks); ``123_4`` one task."""
    # -r: one line per array task, pending ones too (without it squeue folds them
    # into one "123_[2-5%2]" line).
    res = ex.run(["squeue", "-h", "-t", "all", "-r", "-j", job_id, "-o", SQUEUE_FORMAT],
                   timeout=QUERY_TIMEOUT, check=False)
    # squeue exits 1 with "Invalid job id specified" once the job left its memory.
    found = parse_squeue(res.stdout) if res.ok else []
    rows = [r for r in found if r.job_id == job_id]
    return rows[0] if rows else array_of(job_id, found, "squeue -r")


def sacct_job(job_id: str, ex: Executor = LOCAL) -> JobStatus | None:
    """The job's accounting row (an array's: array_of its tasks' rows), or None when
    the database has none (yet)."""
    res = ex.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", SACCT_FIELDS],
                   timeout=QUERY_TIMEOUT, check=False)
    if not res.ok:
        return None
    found = parse_sacct(res.stdout)
    rows = [r for r in found if r.job_id == job_id]
    return rows[-1] if rows else array_of(job_id, found, "sacct")


def scontrol_exit(job_id: str, slurm_state: str,
                  ex: Executor = LOCAL) -> tuple[int | None, int | None]:
    """(exit, signal) from ``scontrol show job`` while slurmctld still holds the job."""
    res = ex.run(["scontrol", "-o", "show", "job", job_id], timeout=QUERY_TIMEOUT, check=False)
    if not res.ok:
        return None, None
    return parse_scontrol_exit(res.stdout, slurm_state)


def job_status(job_id: str, *, settle_s: float = 0.0, ex: Executor = LOCAL) -> JobStatus:
    """The job's status: squeue while slurmctld holds the job, sacct after.

    For a job that just ended, slurmctld (squeue + ``scontrol show job``) already
    has the final state and exit code while sacct may still show its placeholder
    row, so that answer is used first. For older jobs ``settle_s`` is how long to
    keep polling sacct while its row is a placeholder. Raises ToolError when Slurm
    knows nothing about ``job_id``.
    """
    live = squeue_job(job_id, ex)
    if live is not None:
        if not is_final(live.state):
            return live
        # An array that ended: its tasks' exit codes are in sacct, not in one
        # `scontrol show job` record.
        code, sig = (scontrol_exit(job_id, live.native_state, ex)
                     if live.source != "squeue -r" else (None, None))
        if code is not None:
            return _with_exit(live, code, sig, source="squeue+scontrol")
    deadline = time.monotonic() + settle_s
    while True:
        row = sacct_job(job_id, ex)
        if row is not None and not is_sacct_placeholder(row, live):
            return row
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if live is not None:
        return live
    if row is not None:
        return row
    raise ToolError(
        f"job {job_id}: unknown to squeue and sacct",
        hint="check the id (hpcdl status lists your jobs)",
    )


def statuses(job_ids: Sequence[str], ex: Executor = LOCAL) -> dict[str, JobStatus]:
    """The status of many jobs from at most two commands: one squeue for all of them
    (for a job that ended less than MinJobAge ago it has the exit code too), and one
    sacct for those squeue no longer lists or lists without an exit code.

    A job that ended and that neither has a final answer for (sacct still shows its
    placeholder) comes back with squeue's final state and no exit code: ask again,
    or use job_status with ``settle_s``. Jobs neither command knows are left out.
    """
    wanted = list(dict.fromkeys(job_ids))
    if not wanted:
        return {}
    # Array tasks (123_4) are asked for by their array (123): one squeue -r lists every
    # task of it, so following a 1,000-point sweep stays one command per poll.
    asked = ",".join(dict.fromkeys(_array_or_self(j) for j in wanted))
    res = ex.run(["squeue", "-h", "-t", "all", "-r", "-j", asked,
                    "-O", SQUEUE_STATUS_FIELDS], timeout=QUERY_TIMEOUT, check=False)
    # squeue exits 1 ("Invalid job id specified") when it has forgotten a lone job id.
    live = ({r.job_id: r for r in parse_squeue_status(res.stdout) if r.job_id in wanted}
            if res.ok else {})
    out = {job_id: row for job_id, row in live.items()
           if not is_final(row.state) or row.exit_code is not None}
    ended = [job_id for job_id in wanted if job_id not in out]
    if not ended:
        return out
    sa = ex.run(["sacct", "-n", "-P", "-X", "-j",
                 ",".join(dict.fromkeys(_array_or_self(j) for j in ended)), "-o", SACCT_FIELDS],
                  timeout=QUERY_TIMEOUT, check=False)
    rows = {r.job_id: r for r in parse_sacct(sa.stdout)} if sa.ok else {}
    for job_id in ended:
        row, seen = rows.get(job_id), live.get(job_id)
        if row is not None and not is_sacct_placeholder(row, seen):
            out[job_id] = row
        elif seen is not None:
            out[job_id] = seen
        elif row is not None:
            out[job_id] = row
    return out


def _array_or_self(job_id: str) -> str:
    """The array's id of task ``123_4``; any other id as it is."""
    task = split_task_id(job_id)
    return task[0] if task else job_id


def history(job_id: str, ex: Executor = LOCAL) -> list[JobStatus]:
    """Every attempt of ``job_id`` (sacct -D: a requeued job's earlier runs too), oldest
    first; empty when the accounting database has none."""
    res = ex.run(["sacct", "-n", "-P", "-X", "-D", "-j", job_id, "-o", HISTORY_FIELDS],
                   timeout=QUERY_TIMEOUT, check=False)
    if not res.ok:
        return []
    return [r for r in parse_sacct_history(res.stdout) if r.job_id == job_id]


def settled(status: JobStatus, ex: Executor = LOCAL) -> JobStatus:
    """A finished job's status with its exit code: when neither slurmctld nor (yet)
    the accounting database had it, keep asking sacct for a few seconds."""
    if status.exit_code is not None:
        return status
    return job_status(status.job_id, settle_s=15, ex=ex)


def _with_exit(row: JobStatus, code: int | None, sig: int | None,
               source: str | None = None) -> JobStatus:
    return replace(row, exit_code=code, signal=sig, source=source or row.source)


def list_jobs(*, since: str = "now-1days", all_users: bool = False,
              ex: Executor = LOCAL) -> list[JobStatus]:
    """The user's jobs: live ones from squeue, finished ones (since ``since``) from sacct."""
    user = [] if all_users else ["-u", getpass.getuser()]
    sq = ex.run(["squeue", "-h", "-t", "all", *user, "-o", SQUEUE_FORMAT],
                  timeout=QUERY_TIMEOUT, check=False)
    live = {r.job_id: r for r in parse_squeue(sq.stdout)} if sq.ok else {}
    sa = ex.run(["sacct", "-n", "-P", "-X", "-S", since, *(["-a"] if all_users else user),
                   "-o", SACCT_FIELDS], timeout=QUERY_TIMEOUT, check=False)
    merged = {r.job_id: r for r in parse_sacct(sa.stdout)} if sa.ok else {}
    for job_id, row in live.items():
        # A live job's squeue state is current; a finished one's sacct row has the exit code.
        if (not is_final(row.state) or job_id not in merged
                or is_sacct_placeholder(merged[job_id], row)):
            merged[job_id] = row
    return sorted(merged.values(), key=lambda r: _id_key(r.job_id))


def _id_key(job_id: str) -> tuple[int, str]:
    head = job_id.split("_", 1)[0]
    return (int(head) if head.isdigit() else 0, job_id)
