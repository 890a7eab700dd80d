"""A sweep's life through Slurm: submit one job per point under one sweep directory,
follow them all with a progress bar, and collect each point's result.json.

By default the points run one at a time (``sbatch --dependency=singleton`` on a job
name the sweep's jobs share): points sharing nodes, or one point's start-up
overlapping another's steps, would measure each other. ``concurrent=True`` drops it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcdl import proc
from hpcdl.errors import HpcdlError, ToolError, ValidationError
from hpcdl.plan import JobPlan, JobRequest
from hpcdl.profiles.schema import Profile
from hpcdl.scaling import Row, count, row_from, with_scaling
from hpcdl.slurm import livecheck
from hpcdl.slurm.jobs import record_result, submit_plan, unreachable
from hpcdl.slurm.query import job_status, settled, slurm_available
from hpcdl.slurm.states import is_final
from hpcdl.sweep import (
    SweepPoint,
    point_entry,
    read_sweep,
    sweep_record,
    write_sweep,
)

Echo = Callable[..., None]
POLL_S = 1.0


def submit_sweep(profile: Profile, base: JobRequest, plans: list[tuple[SweepPoint, JobPlan]],
                 *, sweep_dir: Path, concurrent: bool, echo: Echo) -> Path:
    """Check every point against the live cluster, then submit them all; returns
    ``sweep_dir`` (created here, with sweep.json). Each plan already names its run
    directory under ``sweep_dir`` (plan_points) and is submitted as it is. The
    points share ``base.job_name`` (what singleton orders by). Nothing is submitted when a check fails; when
    sbatch refuses a point, the points already submitted are cancelled and sweep.json
    says what happened. Raises ValidationError, SubmitError, ToolError.
    """
    if slurm_available():
        try:
            cluster = livecheck.read_cluster()  # once for all points
        except ToolError as err:
            raise unreachable(err, profile) from err
        for point, plan in plans:
            try:
                livecheck.check_plan(profile, plan, cluster)
            except ValidationError as err:
                raise ValidationError(f"point {point.label}: {err.message}", hint=err.hint) from err
    sweep_id = sweep_dir.name
    sweep_dir.mkdir(parents=True)
    options = () if concurrent else ("--dependency=singleton",)
    entries = [point_entry(point) for point, _ in plans]
    # record["points"] is `entries`: filling in an entry and rewriting sweep.json keeps
    # the record true after every sbatch, so a crash mid-way leaves the job ids known.
    record = sweep_record(sweep_id, profile.name, base, concurrent, entries)
    write_sweep(sweep_dir, record)
    for i, (point, plan) in enumerate(plans):
        try:
            sub = submit_plan(profile, plan, live_check=False, sbatch_options=options)
        except HpcdlError as err:
            cancelled = _cancel([e["job_id"] for e in entries if e["job_id"]])
            record["aborted"] = f"{point.label}: {err.message}; cancelled {len(cancelled)} jobs"
            write_sweep(sweep_dir, record)
            err.message = (f"point {point.label}: {err.message} (cancelled the "
                           f"{len(cancelled)} jobs of this sweep already submitted)")
            raise
        entries[i] = point_entry(point, sub.run_dir, sub.job_id)
        write_sweep(sweep_dir, record)
        echo(f"submitted {point.label}: job {sub.job_id} ({count(point.ranks, 'rank')} on "
             f"{count(point.nodes, 'node')})", err=True)
    return sweep_dir


def _cancel(job_ids: list[str]) -> list[str]:
    if job_ids:
        proc.run(["scancel", *job_ids], timeout=30, check=False)
    return job_ids


@dataclasses.dataclass
class PointState:
    """Where one point stands: its result.json record once the job ended."""

    entry: dict[str, Any]
    record: dict[str, Any] | None = None
    state: str = "UNKNOWN"
    note: str = ""

    @property
    def final(self) -> bool:
        return self.record is not None or self.state in ("NOT_SUBMITTED", "UNKNOWN_JOB")


def refresh_point(sweep_dir: Path, point: PointState, *, query: bool = True) -> PointState:
    """Bring ``point`` up to date: read its result.json, or ask Slurm and, when the
    job has ended, write result.json from its logs (as ``submit --wait`` does)."""
    if point.final:
        return point
    job_id, name = point.entry.get("job_id"), point.entry.get("run_dir")
    if not job_id or not name:
        return dataclasses.replace(point, state="NOT_SUBMITTED",
                                   note="the sweep stopped before this point was submitted")
    run_dir = sweep_dir / name
    result_path = run_dir / "result.json"
    if result_path.is_file():
        return dataclasses.replace(point, record=json.loads(result_path.read_text("utf-8")))
    if not query:
        return dataclasses.replace(point, state="UNKNOWN",
                                   note="no result.json yet; Slurm not asked (--no-refresh)")
    if not slurm_available():
        return dataclasses.replace(point, state="UNKNOWN",
                                   note="no result.json yet and Slurm is not reachable here")
    try:
        status = job_status(job_id)
    except ToolError as err:
        return dataclasses.replace(point, state="UNKNOWN_JOB", note=err.message)
    if not is_final(status.state):
        reason = f" ({status.reason})" if status.reason else ""
        return dataclasses.replace(point, state=status.state, note=f"job {job_id}{reason}")
    record, _ = record_result(run_dir, settled(status))
    return dataclasses.replace(point, record=record)


def load_points(sweep_dir: Path) -> tuple[dict[str, Any], list[PointState]]:
    record = read_sweep(sweep_dir)
    if record is None:
        raise ValidationError(f"{sweep_dir}: no sweep.json (not a sweep directory)")
    return record, [PointState(entry) for entry in record["points"]]


def rows_of(points: list[PointState]) -> list[Row]:
    return with_scaling([row_from(p.entry, p.record, p.state, p.note) for p in points])


def follow_sweep(sweep_dir: Path, *, echo: Echo, timeout: float | None = None,
                 live: bool | None = None) -> list[Row]:
    """Poll every point until all have ended, with a progress bar on a terminal (one
    line per finished point otherwise); returns the table rows. Raises ToolError when
    ``timeout`` seconds pass first."""
    _, points = load_points(sweep_dir)
    live = sys.stderr.isatty() if live is None else live
    deadline = None if timeout is None else time.monotonic() + timeout
    start = time.monotonic()
    bar = _Bar(len(points), live, echo)
    try:
        while True:
            for i, point in enumerate(points):
                if not point.final:
                    points[i] = refresh_point(sweep_dir, point)
                    if points[i].final:
                        bar.finished(_done_line(points[i], time.monotonic() - start))
            running = [p for p in points if not p.final]
            if not running:
                break
            bar.status(running)
            if deadline is not None and time.monotonic() > deadline:
                ids = " ".join(str(p.entry.get("job_id")) for p in running)
                raise ToolError(f"sweep {sweep_dir.name}: {len(running)} points still queued "
                                f"or running after {timeout:g} s",
                                hint=f"hpcdl results {sweep_dir} (later); scancel {ids}")
            time.sleep(POLL_S)
    finally:
        bar.close()
    return rows_of(points)


def _done_line(point: PointState, elapsed: float) -> str:
    row = row_from(point.entry, point.record, point.state, point.note)
    what = (f"{row.images_per_sec:.1f} img/s" if row.ok and row.images_per_sec is not None
            else f"{row.state}{' (' + row.note + ')' if row.note else ''}")
    return f"{row.label}: {what} [{elapsed:.0f} s]"


class _Bar:
    """A rich progress bar on a terminal; plain lines in logs and pipes."""

    def __init__(self, total: int, live: bool, echo: Echo) -> None:
        self.echo, self.done, self.total = echo, 0, total
        self.progress: Any = None
        if live:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TimeElapsedColumn(),
                                     console=_stderr_console())
            self.task = self.progress.add_task("sweep", total=total)
            self.progress.start()

    def finished(self, line: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress.console.print(line, markup=False, highlight=False)
            self.progress.update(self.task, completed=self.done)
        else:
            self.echo(f"[{self.done}/{self.total}] {line}", err=True)

    def status(self, running: list[PointState]) -> None:
        if self.progress is None:
            return
        now = next((p for p in running if p.state == "RUNNING"), running[0])
        self.progress.update(self.task, description=f"{now.entry['label']}: {now.state}")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def run_dir_entry(run_dir: Path) -> dict[str, Any]:
    """A sweep.json-like point for a single run directory (from `hpcdl submit`)."""
    try:
        plan = json.loads((run_dir / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValidationError(f"{run_dir}: neither a sweep directory (sweep.json) nor a run "
                              f"directory (plan.json): {exc}") from exc
    job_id = None
    if (run_dir / "job.json").is_file():
        job_id = json.loads((run_dir / "job.json").read_text(encoding="utf-8")).get("job_id")
    return {"label": run_dir.name, "backend": plan.get("backend"), "batch_size": None,
            "nodes": plan["nodes"], "gpus": plan["gpus_per_node"], "ranks": plan["ntasks"],
            "job_id": job_id, "run_dir": run_dir.name}


def collect(path: Path, *, refresh: bool = True) -> tuple[list[Row], dict[str, Any]]:
    """The table rows of a sweep directory or a single run directory, bringing
    unfinished points up to date from Slurm unless ``refresh`` is False."""
    if read_sweep(path) is not None:
        record, points = load_points(path)
        meta = {"sweep_id": record.get("sweep_id"), "sweep_dir": str(path.resolve())}
        base = path
    else:
        points = [PointState(run_dir_entry(path))]
        meta = {"run_dir": str(path.resolve())}
        base = path.parent
    points = [refresh_point(base, p, query=refresh) for p in points]
    return rows_of(points), meta
