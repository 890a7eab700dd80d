"""What `hpcdl status JOBID` shows beside the scheduler's row, read from the job's run
directory: a requeued job's attempts, whether it completed a training step, its node
count and, for a last attempt that failed before its first step, its stderr (whose
last words are the cause). No terminal output: a JobSnapshot comes back.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcdl.jobs import recoveries, rundir
from hpcdl.jobs.attempts import NO_STEP, Attempt, from_script, join, read_script_attempts
from hpcdl.jobs.rundir import RunDir
from hpcdl.jobs.timelimit import run_steps_seen
from hpcdl.schedulers.base import JobStatus, Scheduler


@dataclass(frozen=True)
class JobSnapshot:
    """A job as the scheduler and its run directory (None: not found) see it.
    ``steps``: a training step completed (None: cannot tell, or no run directory);
    ``stderr``: the last attempt's stderr when it failed before its first step, else
    empty."""

    status: JobStatus
    run: RunDir | None
    attempts: list[Attempt]
    steps: bool | None
    nodes: int
    stderr: str
    recoveries: list[recoveries.Recovery]
    excluded: list[dict[str, str]]  # nodes the guard left out, and why (bad-nodes.tsv)


def job_snapshot(job_id: str, scheduler: Scheduler) -> JobSnapshot:
    """The scheduler's status of ``job_id`` (settled for a job that just ended) and what
    its run directory adds. Raises ToolError when the scheduler cannot be asked."""
    status = scheduler.status(job_id, settle_s=3)
    run = rundir.find_run(job_id)  # on the module, so a test can stand in for it
    tried = attempts(job_id, run, scheduler)
    steps, nodes, stderr = None, 1, ""
    found = recoveries.read(run.path, job_id) if run is not None else []
    if run is not None:
        steps = run_steps_seen(run)
        try:
            nodes = run.read_plan().nodes
        except (OSError, ValueError):
            pass
        if tried and tried[-1].reason in NO_STEP:  # its cause is the stderr's last word
            try:
                stderr = run.logs(job_id)[1].read_text(encoding="utf-8", errors="replace")
            except OSError:
                pass
    return JobSnapshot(status, run, tried, steps, nodes, stderr, found,
                       recoveries.excluded(run.path) if run is not None else [])


def attempts(job_id: str, run: RunDir | None, scheduler: Scheduler) -> list[Attempt]:
    """A requeued job's attempts (the scheduler's history joined with its run
    directory's attempts.tsv; that record alone when the scheduler has no history)."""
    script = [s for s in read_script_attempts(run) if s.job_id == job_id] if run else []
    history = scheduler.history(job_id)
    return join(history, script, scheduler=scheduler) if history else from_script(script)
