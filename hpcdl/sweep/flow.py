"""A scaling sweep from its planned points to its table: submit every point into one
sweep directory, follow them all to their end, then write the table (results.json,
results.csv) and its plot (scaling.png) beside sweep.json. No terminal output: the
caller's callbacks see each submission, each poll and each point's end; the rows and
the files written come back as a SweepOutcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdl.core.atomic import write_atomic
from hpcdl.jobs.place import HERE, RunPlace
from hpcdl.jobs.submit import Submitted
from hpcdl.plan import JobPlan, JobRequest
from hpcdl.profiles.schema import Profile
from hpcdl.results.plot import build_figure, write_png
from hpcdl.results.table import Row, to_csv, to_json
from hpcdl.schedulers.base import Scheduler
from hpcdl.sweep.grid import SweepPoint, SweepRecord, read_sweep
from hpcdl.sweep.run import PointState, follow_sweep, row_of, submit_sweep

# Files a followed sweep leaves in its sweep directory beside sweep.json.
RESULT_FILES = ("results.json", "results.csv", "scaling.png")

OnSubmitted = Callable[[SweepPoint, Submitted], None]
# A point ended: its table row (without the sweep's speedup columns) and the seconds
# since following began.
OnPointDone = Callable[[Row, float], None]
# After each poll: the label and state of the point to show (the one running, else the
# first still queued).
OnSweepProgress = Callable[[str, str], None]


@dataclass(frozen=True)
class SweepOutcome:
    """A followed sweep: its table rows and the files written from them."""

    rows: list[Row]
    written: list[Path]

    @property
    def ok(self) -> bool:
        """Every point ended with a result."""
        return all(r.ok for r in self.rows)


def start_sweep(profile: Profile, base: JobRequest, plans: list[tuple[SweepPoint, JobPlan]],
                *, sweep_dir: Path, concurrent: bool, scheduler: Scheduler,
                on_submitted: OnSubmitted | None = None,
                place: RunPlace = HERE) -> SweepRecord:
    """Submit every point (see hpcdl.sweep.run.submit_sweep); returns sweep.json as it
    stands once all are queued. Raises ValidationError, SubmitError, ToolError."""
    submit_sweep(profile, base, plans, sweep_dir=sweep_dir, concurrent=concurrent,
                 scheduler=scheduler, on_submitted=on_submitted, place=place)
    return read_sweep(sweep_dir) or SweepRecord()


def finish_sweep(sweep_dir: Path, sweep_id: str, *, scheduler: Scheduler,
                 place: RunPlace = HERE,
                 on_done: OnPointDone | None = None,
                 on_progress: OnSweepProgress | None = None) -> SweepOutcome:
    """Follow every point of ``sweep_dir`` to its end, then write the table and its plot
    (RESULT_FILES). Raises ToolError (see hpcdl.sweep.run.follow_sweep)."""

    def done(point: PointState, elapsed: float) -> None:
        if on_done is not None:
            on_done(row_of(point), elapsed)

    def progress(running: list[PointState]) -> None:
        if on_progress is not None:
            now = next((p for p in running if p.state == "RUNNING"), running[0])
            on_progress(str(now.entry["label"]), now.state)

    rows = follow_sweep(sweep_dir, scheduler=scheduler, place=place, on_done=done,
                        on_progress=progress)
    return SweepOutcome(rows, write_sweep_results(sweep_dir, rows, {"sweep_id": sweep_id}))


def write_sweep_results(sweep_dir: Path, rows: list[Row], meta: dict[str, Any]) -> list[Path]:
    """results.json, results.csv and scaling.png in the sweep directory (atomically)."""
    json_path, csv_path, png_path = (sweep_dir / name for name in RESULT_FILES)
    write_atomic(json_path, to_json(rows, meta) + "\n")
    write_atomic(csv_path, to_csv(rows))
    write_png(build_figure(rows, title=str(meta.get("sweep_id", ""))), png_path)
    return [json_path, csv_path, png_path]
