"""`hpcdl report`: one self-contained HTML file per run or sweep.

``gather`` reads a run directory (identity, attempts, probe, hang, per-step
metrics, the straggler verdict, what is missing); ``charts`` draws static SVG with
matplotlib; ``html`` puts them on one page. This module ties them together and
writes the file (atomically). matplotlib is imported only from here down, when a
report is made: never on the CLI's import path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcdl.core.atomic import write_atomic
from hpcdl.jobs.rundir import REPORT_NAME, RunDir
from hpcdl.results.straggler import DEFAULT_THRESHOLD


def write_run_report(path: Path, out: Path | None = None, *,
                     threshold: float = DEFAULT_THRESHOLD) -> tuple[Path, dict[str, Any]]:
    """Write run directory ``path``'s report to ``out`` (default: path/report.html);
    returns the file and the gathered facts."""
    from hpcdl.report.gather import gather_run
    from hpcdl.report.html import render_run

    facts = gather_run(path, threshold=threshold)
    target = out or RunDir(path).report
    write_atomic(target, render_run(facts))
    return target, facts


def write_sweep_report(path: Path, rows: list[Any], meta: dict[str, Any],
                       out: Path | None = None, *, threshold: float = DEFAULT_THRESHOLD,
                       point_reports: bool = True) -> tuple[Path, dict[str, Any]]:
    """Write sweep directory ``path``'s report (the table ``rows`` and ``meta`` from
    hpcdl.sweep.run.collect) to ``out`` (default: path/report.html), and with
    ``point_reports`` each point's own report into its run directory (the table links
    to them). Returns the file and {label: straggler verdict or None}."""
    from hpcdl.report.html import render_sweep
    from hpcdl.results.read import straggler_of

    target = out or path / REPORT_NAME
    stragglers: dict[str, Any] = {}
    links: dict[str, str] = {}
    for row in rows:
        run_dir = path / row.run_dir if row.run_dir else None
        if run_dir is None or not run_dir.is_dir():
            stragglers[row.label] = None
            continue
        if point_reports:
            written, facts = write_run_report(run_dir, threshold=threshold)
            stragglers[row.label] = facts["straggler"]
            links[row.label] = _relative(written, target.parent)
        else:
            stragglers[row.label] = straggler_of(run_dir, threshold=threshold)
    write_atomic(target, render_sweep(rows, meta, stragglers, link=lambda r: links.get(r.label)))
    return target, stragglers


def write_param_sweep_report(path: Path, rows: list[dict[str, Any]], params: list[str],
                             meta: dict[str, Any], out: Path | None = None, *,
                             threshold: float = DEFAULT_THRESHOLD) -> Path:
    """Write an `hpcdl sweep` directory's report (``rows``: hpcdl.sweep.compare's) to
    ``out`` (default: path/report.html), each point's own report into its run
    directory (the table links to them); returns the file."""
    from hpcdl.jobside.steps import read_metrics
    from hpcdl.report.charts import rank0_steps
    from hpcdl.report.html import render_param_sweep

    target = out or path / REPORT_NAME
    series: dict[str, list[tuple[int, float]]] = {}
    links: dict[Any, str] = {}
    for row in rows:
        run_dir = path / str(row.get("run_dir") or "")
        if not row.get("run_dir") or not run_dir.is_dir():
            continue
        label = " ".join(f"{k}={row.get(k)}" for k in params)
        steps = rank0_steps(read_metrics(RunDir(run_dir).metrics))
        series[label] = [(int(r["step"]), float(r["loss"])) for r in steps
                         if isinstance(r.get("loss"), (int, float))]
        if (run_dir / "plan.json").is_file():
            written, _ = write_run_report(run_dir, threshold=threshold)
            links[row.get("point")] = _relative(written, target.parent)
    write_atomic(target, render_param_sweep(rows, params, meta, series,
                                            link=lambda r: links.get(r.get("point"))))
    return target


def _relative(path: Path, base: Path) -> str:
    import os

    return os.path.relpath(path.resolve(), base.resolve())
