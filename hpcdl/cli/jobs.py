"""`hpcdl status`, `hpcdl logs`, `hpcdl cancel`: a submitted job's life."""

from __future__ import annotations

import json

import click

from hpcdl.cli.display import attempt_lines, lost_line
from hpcdl.errors import ValidationError
from hpcdl.jobs.attempts import no_step_message
from hpcdl.jobs.cluster import connect, reconnect
from hpcdl.jobs.follow import log_chunks
from hpcdl.jobs.recoveries import excluded_line
from hpcdl.jobs.recoveries import lines as recovery_lines
from hpcdl.jobs.rundir import RunDir, find_array_runs, find_run
from hpcdl.jobs.status import JobSnapshot, job_snapshot
from hpcdl.jobs.timelimit import clock_text, timeout_message
from hpcdl.schedulers.base import JobStatus, Scheduler
from hpcdl.schedulers.registry import scheduler_for


def _row(s: JobStatus) -> str:
    code = "" if s.exit_code is None else f"{s.exit_code}" + (f"/sig{s.signal}" if s.signal else "")
    return (f"{s.job_id:<10} {s.state:<10} {s.native_state:<12} {code:<8} {s.partition:<10} "
            f"{s.nodes:<12} {s.elapsed:<10} {clock_text(s.time_limit):<10} {s.name}")


_HEADER = (f"{'JOBID':<10} {'STATE':<10} {'SLURM':<12} {'EXIT':<8} {'PARTITION':<10} "
           f"{'NODES':<12} {'ELAPSED':<10} {'TIMELIMIT':<10} NAME")


@click.command()
@click.argument("job_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--since", default="now-1days", show_default=True,
              help="Without JOBID: list finished jobs since this time (sacct -S syntax).")
@click.option("--all-users", is_flag=True, help="Without JOBID: every user's jobs.")
@click.option("--profile", "-p", "profile", metavar="NAME|PATH",
              help="Without JOBID: the cluster of this profile (through its login node when "
                   "it names one); default: this machine's scheduler.")
def status(job_id: str | None, as_json: bool, since: str, all_users: bool,
           profile: str | None) -> None:
    """Show a job's state (or your recent jobs): squeue while it runs, sacct after.

    STATE is hpcdl's (PENDING, RUNNING, SUSPENDED, COMPLETED, FAILED, CANCELLED,
    TIMEOUT, UNKNOWN); SLURM is Slurm's own word; EXIT is the job's exit code;
    TIMELIMIT the job's time limit (for a TIMEOUT job, the one it hit: a line
    below the table says so and what to do; when its run directory shows it
    completed no training step, that it looks hung). A requeued job whose last
    attempt failed before its first step (not requeued) gets a line saying why.

    A job submitted from this machine to a cluster reached over SSH is found
    again through its run directory (a laptop closed mid-run included).

    \b
    Examples:
      hpcdl status 1234
      hpcdl status --json
      hpcdl status -p sandbox-remote
    """
    if job_id:
        run = find_run(job_id)
        # Through the login node the run's profile names, if any (an array: its tasks').
        conn = reconnect(run or _array_task(job_id))
        if run is not None:
            conn.place.fetch(run)
        snap = job_snapshot(job_id, conn.scheduler)
        row, tried = snap.status, snap.attempts
        if as_json:
            data = row.to_dict()
            if len(tried) > 1:
                data["attempts"] = [a.to_dict() for a in tried]
            if snap.run is not None:  # False: no training step completed (null: cannot tell)
                data["steps_completed"] = snap.steps
            if snap.recoveries:
                data["recoveries"] = [r.to_dict() for r in snap.recoveries]
            if snap.excluded:
                data["excluded_nodes"] = snap.excluded
            click.echo(json.dumps(data))
        else:
            click.echo(_HEADER)
            click.echo(_row(row))
            for line in _verdicts(snap, conn.scheduler):
                click.echo(line)
            if len(tried) > 1:
                click.echo(f"{len(tried)} attempts (requeued):")
                for line in attempt_lines(tried):
                    click.echo(line)
            if snap.recoveries:
                click.echo(f"{len(snap.recoveries)} node failure"
                           f"{'s' if len(snap.recoveries) != 1 else ''} inside the job:")
                for line in recovery_lines(snap.recoveries):
                    click.echo(line)
            if snap.excluded:
                click.echo(excluded_line(snap.excluded))
        return
    from hpcdl.profiles import load_profile  # pydantic: only for a profile named

    scheduler = connect(load_profile(profile)).scheduler if profile else scheduler_for()
    rows = scheduler.list_jobs(since=since, all_users=all_users)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows]))
        return
    click.echo(_HEADER)
    for r in rows:
        click.echo(_row(r))


def _array_task(job_id: str) -> RunDir | None:
    """A run directory of array ``job_id``'s tasks (an `hpcdl sweep` point), whose
    records say how to reach its cluster; None when no task of it is here."""
    tasks = find_array_runs(job_id)
    return tasks[0] if tasks else None


def _verdicts(snap: JobSnapshot, scheduler: Scheduler) -> list[str]:
    """The lines below the table: the time-limit line (that the job looks hung when its
    run directory shows no step), and the one for a last attempt that failed before its
    first step."""
    lines = [timeout_message(snap.status, scheduler=scheduler, steps=snap.steps,
                             nodes=snap.nodes),
             no_step_message(snap.attempts, snap.stderr, scheduler=scheduler, nodes=snap.nodes)]
    return [line for line in lines if line]


@click.command()
@click.argument("job_id")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the job ends.")
def logs(job_id: str, follow: bool) -> None:
    """Print a job's stdout (stderr goes to stderr), from its run directory.

    An array task is JOBID_TASK (e.g. 123_4: `hpcdl sweep`'s point 4).

    With -f, follows the files while the job runs and stops when it has ended.
    """
    # Lazy: hpcdl.jobs.submit brings the planner (pydantic, jinja2: some 150 ms here) with it,
    # which `hpcdl status`, in this module too, does not need.
    from hpcdl.jobs.submit import log_files

    run = find_run(job_id)
    if run is None:
        tasks = find_array_runs(job_id)
        if tasks:  # one log per task: the array as a whole has none
            ids = sorted(t.read_job().job_id for t in tasks if t.read_job())  # type: ignore[union-attr]
            raise ValidationError(f"job {job_id}: an array of {len(tasks)} tasks, one log "
                                  f"each; name one: hpcdl logs {ids[0]} (tasks "
                                  f"{', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''})")
    conn = reconnect(run)
    out, err = log_files(job_id, conn.scheduler)
    sync = (lambda: conn.place.fetch(run)) if run is not None and conn.place.remote else None
    for chunk in log_chunks(job_id, out, err, scheduler=conn.scheduler, follow_job=follow,
                            sync=sync, on_lost=lost_line()):
        click.echo(chunk.text, err=chunk.stderr, nl=False)
    if not follow and not out.exists() and not err.exists():
        click.echo(f"(job {job_id} has written no output yet: {out})", err=True)


@click.command()
@click.argument("job_id")
def cancel(job_id: str) -> None:
    """Cancel a pending or running job (scancel) and report its final state.

    JOBID may be a job array (every task) or one task of it (JOBID_TASK, e.g. 123_4).
    """
    # Lazy, as in logs: the planner is not the status command's.
    from hpcdl.jobs.submit import cancel as cancel_job

    scheduler = reconnect(find_run(job_id) or _array_task(job_id)).scheduler
    final = cancel_job(job_id, scheduler)
    click.echo(f"job {job_id}: {final.state} ({scheduler.label} {final.native_state})")
