"""A sweep's life: submit one job per point under one sweep directory, follow them
all (one batched scheduler query per poll for every point), and collect each
point's result.json. No terminal output: progress goes to callbacks (the CLI draws
the progress bar), results are returned. Afterwards, for `hpcdl results` and `hpcdl
report`: the table of a sweep directory, a run directory or a saved table
(``load_rows``), and how to reach the cluster its runs ran on (``connection_for``).

By default the points run one at a time (SubmitOptions.one_at_a_time on a job name
the sweep's jobs share; Slurm's singleton dependency): points sharing nodes, or one point's start-up
overlapping another's steps, would measure each other. ``concurrent=True`` drops it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcdl.errors import HpcdlError, ToolError, ValidationError
from hpcdl.jobs.cluster import Cluster, reconnect
from hpcdl.jobs.follow import FollowTimeout, Watcher
from hpcdl.jobs.place import HERE, RunPlace
from hpcdl.jobs.result import ResultRecord, record_result
from hpcdl.jobs.rundir import RunDir
from hpcdl.jobs.submit import Submitted, submit
from hpcdl.plan import JobPlan, JobRequest
from hpcdl.profiles.schema import Profile
from hpcdl.results.table import Row, row_from, rows_from_csv, rows_from_json, with_scaling
from hpcdl.schedulers.base import JobStatus, Scheduler, is_final
from hpcdl.sweep.grid import (
    PointEntry,
    SweepPoint,
    SweepRecord,
    point_entry,
    read_sweep,
    sweep_record,
    write_sweep,
)


def submit_sweep(profile: Profile, base: JobRequest, plans: list[tuple[SweepPoint, JobPlan]],
                 *, sweep_dir: Path, concurrent: bool, scheduler: Scheduler,
                 on_submitted: Callable[[SweepPoint, Submitted], None] | None = None,
                 place: RunPlace = HERE) -> Path:
    """Check every point against the live cluster, then submit them all; returns
    ``sweep_dir`` (created here, with sweep.json). Each plan already names its run
    directory under ``sweep_dir`` (plan_points) and is submitted as it is. The
    points share ``base.files.job_name`` (what singleton orders by). Nothing is submitted
    when a check fails; when the scheduler refuses a point, the points already
    submitted are cancelled and sweep.json says what happened. ``on_submitted``
    runs after each submission. Raises ValidationError, SubmitError, ToolError.
    """
    if scheduler.available():  # one cluster read for all points
        scheduler.check(profile, {f"point {point.label}": plan.demand()
                                  for point, plan in plans})
    sweep_id = sweep_dir.name
    sweep_dir.mkdir(parents=True)
    entries = [point_entry(point) for point, _ in plans]
    # record["points"] is `entries`: filling in an entry and rewriting sweep.json keeps
    # the record true after every submission, so a crash mid-way leaves the job ids known.
    record = sweep_record(sweep_id, profile.name, base, concurrent, entries)
    write_sweep(sweep_dir, record)
    for i, (point, plan) in enumerate(plans):
        try:
            sub = submit(profile, plan, scheduler=scheduler, live_check=False,
                         one_at_a_time=not concurrent, place=place)
        except HpcdlError as err:
            submitted = [e["job_id"] for e in entries if e["job_id"]]
            try:
                scheduler.cancel(submitted)
            except ToolError:
                pass  # the refusal is the error to report; the ids are in sweep.json
            record["aborted"] = f"{point.label}: {err.message}; cancelled {len(submitted)} jobs"
            write_sweep(sweep_dir, record)
            err.message = (f"point {point.label}: {err.message} (cancelled the "
                           f"{len(submitted)} jobs of this sweep already submitted)")
            raise
        entries[i] = point_entry(point, sub.run_dir, sub.job_id)
        write_sweep(sweep_dir, record)
        if on_submitted:
            on_submitted(point, sub)
    return sweep_dir


@dataclasses.dataclass
class PointState:
    """Where one point stands: its result.json record once the job ended."""

    entry: PointEntry
    record: ResultRecord | None = None
    state: str = "UNKNOWN"
    note: str = ""

    @property
    def final(self) -> bool:
        return self.record is not None or self.state in ("NOT_SUBMITTED", "UNKNOWN_JOB")

    @property
    def job_id(self) -> str | None:
        job_id = self.entry.get("job_id")
        return str(job_id) if job_id else None

    def run_dir(self, base: Path) -> RunDir:
        """The point's run directory (sweep.json keeps it relative to ``base``)."""
        return RunDir(base / str(self.entry["run_dir"]))


def _from_disk(base: Path, point: PointState) -> PointState:
    """``point`` with what its run directory already says (result.json), if anything."""
    if point.final:
        return point
    if not point.job_id or not point.entry.get("run_dir"):
        return dataclasses.replace(point, state="NOT_SUBMITTED",
                                   note="the sweep stopped before this point was submitted")
    record = point.run_dir(base).read_result()
    if record is not None:
        return dataclasses.replace(point, record=ResultRecord(**record))  # type: ignore[typeddict-item]
    return point


def _with_status(base: Path, point: PointState, status: JobStatus | None,
                 scheduler: Scheduler | None = None, place: RunPlace = HERE) -> PointState:
    """``point`` brought up to date with the scheduler's ``status``; an ended job's
    result.json is written from its logs (as ``submit --wait`` does), pulled back first
    from a cluster elsewhere (``place``). With a ``scheduler``, an ended job still
    without its exit code is waited for."""
    if status is None or status.source == "missing":
        return dataclasses.replace(point, state="UNKNOWN_JOB",
                                   note=f"job {point.job_id}: unknown to the scheduler")
    if not is_final(status.state):
        reason = f" ({status.reason})" if status.reason else ""
        return dataclasses.replace(point, state=status.state, note=f"job {point.job_id}{reason}")
    if status.exit_code is None and scheduler is not None:  # ended moments ago: settle
        status = scheduler.status(status.job_id, settle_s=15)
    place.fetch(point.run_dir(base))
    record, _ = record_result(point.run_dir(base), status)
    return dataclasses.replace(point, record=record)


def refresh(base: Path, points: list[PointState], *, query: bool = True,
            scheduler: Scheduler, place: RunPlace = HERE) -> list[PointState]:
    """Every point up to date: from result.json where it exists, else (one batched
    query for all) from the scheduler, unless ``query`` is False."""
    points = [_from_disk(base, p) for p in points]
    waiting = [p for p in points if not p.final]
    if not waiting:
        return points
    if not query:
        return [p if p.final else dataclasses.replace(
            p, state="UNKNOWN", note=f"no result.json yet; {scheduler.label} not asked (--no-refresh)")
            for p in points]
    if not scheduler.available():
        return [p if p.final else dataclasses.replace(
            p, state="UNKNOWN", note=f"no result.json yet and {scheduler.label} is not reachable here")
            for p in points]
    known = scheduler.statuses([p.job_id for p in waiting if p.job_id])
    return [p if p.final else _with_status(base, p, known.get(p.job_id or ""), scheduler, place)
            for p in points]


def load_points(sweep_dir: Path) -> tuple[SweepRecord, list[PointState]]:
    record = read_sweep(sweep_dir)
    if record is None:
        raise ValidationError(f"{sweep_dir}: no sweep.json (not a sweep directory)")
    return record, [PointState(entry) for entry in record["points"]]


def rows_of(points: list[PointState]) -> list[Row]:
    return with_scaling([row_from(p.entry, p.record, p.state, p.note) for p in points])


def row_of(point: PointState) -> Row:
    """The table row of one point (without the sweep's speedup columns)."""
    return row_from(point.entry, point.record, point.state, point.note)


def follow_sweep(sweep_dir: Path, *, scheduler: Scheduler, place: RunPlace = HERE,
                 timeout: float | None = None, watcher: Watcher | None = None,
                 on_done: Callable[[PointState, float], None] | None = None,
                 on_progress: Callable[[list[PointState]], None] | None = None) -> list[Row]:
    """Follow every point until all have ended (one batched query per poll for all
    of them, with back-off); returns the table rows. ``on_done(point, elapsed)``
    runs as each point ends (its result.json written), ``on_progress(running)``
    after each poll. Raises ToolError when ``timeout`` seconds pass first.
    """
    _, points = load_points(sweep_dir)
    start = time.monotonic()
    points = [_from_disk(sweep_dir, p) for p in points]
    for point in points:
        if point.final and on_done:
            on_done(point, 0.0)
    index = {p.job_id: i for i, p in enumerate(points) if not p.final and p.job_id}

    def changed(status: JobStatus) -> None:
        i = index[status.job_id]
        if not is_final(status.state):
            points[i] = _with_status(sweep_dir, points[i], status)

    def done(status: JobStatus) -> None:
        # The watcher has the final status (with the exit code, or it waited SETTLE_S).
        i = index[status.job_id]
        points[i] = _with_status(sweep_dir, points[i], status, place=place)
        if on_done:
            on_done(points[i], time.monotonic() - start)

    def polled(pending: dict[str, JobStatus], _elapsed: float) -> None:
        if on_progress:
            on_progress([points[index[job_id]] for job_id in pending])

    watcher = watcher or Watcher(scheduler)
    try:
        watcher.watch(list(index), on_change=changed, on_done=done, on_poll=polled,
                      timeout=timeout)
    except FollowTimeout as err:
        ids = " ".join(err.pending)
        raise ToolError(f"sweep {sweep_dir.name}: {len(err.pending)} points still queued "
                        f"or running after {timeout:g} s",
                        hint=f"hpcdl results {sweep_dir} (later); hpcdl cancel JOB_ID "
                             f"stops one (still going: {ids})") from None
    return rows_of(points)


def run_dir_entry(path: Path) -> PointEntry:
    """A sweep.json-like point for a single run directory (from `hpcdl submit`)."""
    run = RunDir(path)
    try:
        plan = run.read_plan()
    except (OSError, ValueError) as exc:
        raise ValidationError(f"{path}: neither a sweep directory (sweep.json) nor a run "
                              f"directory (plan.json): {exc}") from exc
    job = run.read_job()
    return PointEntry(label=run.name, backend=plan.backend, batch_size=None,
                      nodes=plan.nodes, gpus=plan.gpus_per_node, ranks=plan.ntasks,
                      job_id=job.job_id if job else None, run_dir=run.name)


def collect(path: Path, *, refresh_from_scheduler: bool = True,
            scheduler: Scheduler, place: RunPlace = HERE) -> tuple[list[Row], dict[str, Any]]:
    """The table rows of a sweep directory or a single run directory, bringing
    unfinished points up to date from the scheduler unless told not to."""
    if read_sweep(path) is not None:
        record, points = load_points(path)
        meta = {"sweep_id": record.get("sweep_id"), "sweep_dir": str(path.resolve())}
        base = path
    else:
        points = [PointState(run_dir_entry(path))]
        meta = {"run_dir": str(path.resolve())}
        base = path.parent
    points = refresh(base, points, query=refresh_from_scheduler, scheduler=scheduler,
                     place=place)
    return rows_of(points), meta


def connection_for(path: Path) -> Cluster:
    """How to reach the cluster of a run or sweep directory: through the login node its
    runs' recorded profile names (pulled back from there), else this machine."""
    run = None
    if path.is_dir():
        sweep = read_sweep(path)
        if sweep is None:
            run = RunDir(path)
        else:
            dirs = [p["run_dir"] for p in sweep["points"] if p.get("run_dir")]
            run = RunDir(path / str(dirs[0])) if dirs else None
    return reconnect(run)


def load_rows(path: Path, *, scheduler: Scheduler, refresh: bool,
              place: RunPlace = HERE) -> tuple[list[Row], dict[str, Any]]:
    """Rows and meta from a sweep dir, a run dir, or a saved .json/.csv table; with
    ``refresh``, unfinished points are asked about in ``scheduler`` (and what ended is
    pulled back from ``place``). Raises ValidationError for anything else."""
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".csv":
            return rows_from_csv(text, str(path)), {"source": str(path)}
        if path.suffix == ".json":
            return rows_from_json(text, str(path)), {"source": str(path)}
        raise ValidationError(f"{path}: expected a sweep or run directory, or a .json/.csv table")
    return collect(path, refresh_from_scheduler=refresh, scheduler=scheduler, place=place)
