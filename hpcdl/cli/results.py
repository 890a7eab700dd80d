"""`hpcdl results`: the table of a sweep or run directory (scaling or, for `hpcdl sweep`,
the comparison of its points), as text, JSON or CSV, and a scaling plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from hpcdl.cli.display import probe_view
from hpcdl.errors import ValidationError
from hpcdl.results.plot import build_figure, write_png
from hpcdl.results.read import probe_report, stragglers
from hpcdl.results.table import FIELDS, Row, format_table, to_csv, to_json
from hpcdl.sweep.arrays import KIND as ARRAY_KIND
from hpcdl.sweep.grid import read_sweep
from hpcdl.sweep.run import connection_for, load_rows


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print the table as CSV.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              metavar="OUT.png", help="Also draw speedup, efficiency and sync share vs ranks.")
@click.option("--no-refresh", is_flag=True,
              help="Use only what is on disk; do not ask the scheduler about unfinished points.")
@click.option("--sort", "sort_by", metavar="COLUMN",
              help="Order the rows by COLUMN (a table column or, for `hpcdl sweep`, a "
                   "parameter); -COLUMN for descending. Empty cells go last.")
def results(path: Path, as_json: bool, as_csv: bool, plot_path: Path | None,
            no_refresh: bool, sort_by: str | None) -> None:
    """The scaling table of a sweep (or one run): img/s, speedup and efficiency
    against the 1-rank baseline per backend, per-rank img/s, gradient-sync share.

    PATH is a sweep directory (from `hpcdl scale`), a run directory (from `hpcdl
    submit`), or a results .json/.csv written earlier. For a sweep from `hpcdl
    sweep` the table compares the points instead: their parameters, state, final
    loss, top-1, img/s and run time. Points still queued or
    running are asked about in Slurm (their result.json is written once they ended);
    failed and missing points are listed with their state, never dropped.

    \b
    Examples:
      hpcdl results runs/sweep-20261123-101500-ab12 --plot scaling.png
      hpcdl results runs/sweep-20261123-101500-ab12 --csv > scaling.csv
    """
    if as_json and as_csv:
        raise ValidationError("--json and --csv: choose one output form")
    conn = connection_for(path)
    if path.is_dir() and (read_sweep(path) or {}).get("kind") == ARRAY_KIND:
        _param_results(path, conn, as_json=as_json, as_csv=as_csv, plot=plot_path is not None,
                       refresh=not no_refresh, sort_by=sort_by)
        return
    rows, meta = load_rows(path, scheduler=conn.scheduler, place=conn.place,
                           refresh=not no_refresh)
    if sort_by is not None:
        rows = _sorted_rows(rows, sort_by)
    probe = probe_report(path)
    if probe is not None:  # an `hpcdl probe` run: its tables instead of a scaling row
        if as_csv or plot_path is not None:
            raise ValidationError(f"{path}: a probe run has no scaling table (--csv, --plot); "
                                  f"use --json or the default tables")
        click.echo(json.dumps({**meta, "probe": probe}) if as_json else probe_view(probe))
        return
    verdicts = stragglers(path, rows, meta)
    if as_json:
        click.echo(to_json(rows, {**meta, **verdicts}))
    elif as_csv:
        click.echo(to_csv(rows), nl=False)
    else:
        click.echo(format_table(rows))
        found = ([("", verdicts["straggler"])] if "straggler" in verdicts
                 else list(verdicts.get("stragglers", {}).items()))
        for label, verdict in found:
            if verdict and verdict["found"]:
                click.echo(f"{label + ': ' if label else ''}{verdict['message']}")
    if plot_path is not None:
        if not plot_path.parent.is_dir():
            raise ValidationError(f"--plot {plot_path}: directory {plot_path.parent} does not exist")
        write_png(build_figure(rows, title=str(meta.get("sweep_id", path.name))), plot_path)
        click.echo(f"wrote {plot_path}", err=True)


def _sorted_rows(rows: list[Row], column: str) -> list[Row]:
    """The scaling table ordered by ``column`` (-COLUMN: descending), empty cells last.
    Raises ValidationError naming the columns."""
    from hpcdl.sweep.compare import sort_key

    name = column.removeprefix("-")
    if name not in FIELDS:
        raise ValidationError(f"sort: no column {name!r}; columns: {', '.join(FIELDS)}")
    present = [r for r in rows if getattr(r, name) not in (None, "")]
    absent = [r for r in rows if getattr(r, name) in (None, "")]
    return sorted(present, key=lambda r: sort_key(getattr(r, name)),
                  reverse=column.startswith("-")) + absent


def _param_results(path: Path, conn: Any, *, as_json: bool, as_csv: bool, plot: bool,
                   refresh: bool, sort_by: str | None) -> None:
    """`hpcdl results` of an `hpcdl sweep` directory: the comparison table."""
    from hpcdl.sweep import arrays, compare

    if plot:
        raise ValidationError(f"{path}: --plot draws a scaling sweep; for a parameter sweep "
                              f"use `hpcdl report {path}`")
    rows, names = arrays.table(path, scheduler=conn.scheduler, query=refresh, place=conn.place)
    if sort_by is not None:
        rows = compare.sort_rows(rows, sort_by, names)
    if as_json:
        click.echo(compare.to_json(rows, {"sweep_dir": str(path.resolve()), "params": names}))
    elif as_csv:
        click.echo(compare.to_csv(rows, names), nl=False)
    else:
        click.echo(compare.format_table(rows, names))
