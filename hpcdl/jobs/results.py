"""What a finished run or sweep holds, read for `hpcdl results` and `hpcdl report`: the
scaling table of a sweep directory, a run directory or a saved table, the straggler
verdicts, and a probe run's report. Points still unfinished are brought up to date from
the scheduler the caller hands in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcdl.jobs.cluster import Cluster, reconnect
from hpcdl.jobs.place import HERE, RunPlace
from hpcdl.jobs.rundir import RunDir
from hpcdl.jobside.errors import ValidationError
from hpcdl.report.gather import straggler_of
from hpcdl.results.table import Row, rows_from_csv, rows_from_json
from hpcdl.schedulers.base import Scheduler
from hpcdl.sweep.grid import read_sweep
from hpcdl.sweep.run import collect


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


def stragglers(path: Path, rows: list[Row], meta: dict[str, Any]) -> dict[str, Any]:
    """The straggler verdict of a run directory ({"straggler": verdict or None}) or of
    every point of a sweep ({"stragglers": {label: verdict or None}}), from their
    per-step metrics; {} for a saved table. It informs: the exit code stays the table's."""
    if not path.is_dir():
        return {}
    if "sweep_id" not in meta:
        return {"straggler": straggler_of(path)}
    return {"stragglers": {r.label: straggler_of(path / r.run_dir) if r.run_dir else None
                           for r in rows}}


def probe_report(path: Path) -> dict[str, Any] | None:
    """The probe report in a run directory's result.json, if it is a probe run (a
    --probe-first job whose training printed a result keeps its scaling row)."""
    if not path.is_dir():
        return None
    try:
        record = RunDir(path).read_result()
    except (OSError, ValueError):
        return None
    if not record or record.get("hpcdl_result"):
        return None
    probe = record.get("probe")
    return probe if isinstance(probe, dict) else None
