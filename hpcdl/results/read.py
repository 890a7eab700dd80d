"""What a finished run or sweep holds beside its table, read for `hpcdl results` and
`hpcdl report`: the straggler verdicts from the per-step metrics, and a probe run's
report. (The table itself, of a sweep or run directory or a saved one, is
hpcdl.sweep.run.load_rows.) Reads only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcdl.jobs.rundir import RunDir
from hpcdl.jobside import steps as step_metrics
from hpcdl.results.straggler import DEFAULT_THRESHOLD, verdict
from hpcdl.results.table import Row


def straggler_of(path: Path, *, threshold: float = DEFAULT_THRESHOLD) -> dict[str, Any] | None:
    """The straggler verdict of run directory ``path``; None when it has no metrics."""
    metrics = step_metrics.read_metrics(RunDir(path).metrics)
    return verdict(metrics, threshold=threshold) if metrics else None


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
