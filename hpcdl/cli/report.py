"""`hpcdl report`: a run's or a sweep's story as one self-contained HTML file (written by
hpcdl.report; this module parses the command and prints where it went)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from hpcdl.errors import ValidationError
from hpcdl.report import write_run_report, write_sweep_report
from hpcdl.results.straggler import DEFAULT_THRESHOLD
from hpcdl.sweep.arrays import KIND as ARRAY_KIND
from hpcdl.sweep.grid import read_sweep
from hpcdl.sweep.run import connection_for, load_rows


@click.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path),
                metavar="RUN_DIR|SWEEP_DIR")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              metavar="OUT.html", help="Where to write the report (default: report.html in "
                                       "the run or sweep directory).")
@click.option("--straggler-threshold", type=float, default=DEFAULT_THRESHOLD, show_default=True,
              metavar="X", help="A rank (or node) whose median busy time per step is X "
                                "times the others' is named a straggler.")
@click.option("--no-refresh", is_flag=True,
              help="Sweep: use only what is on disk; do not ask the scheduler about unfinished points.")
@click.option("--json", "as_json", is_flag=True,
              help="Print where the report went and the straggler verdict(s) as JSON.")
def report(path: Path, output: Path | None, straggler_threshold: float, no_refresh: bool,
           as_json: bool) -> None:
    """Write one self-contained HTML report of a run or a sweep (no network needed to
    view it: the charts are inline SVG, there is no script).

    A run: its identity (command, profile, image hash, nodes, Slurm job ids and
    attempts), loss and throughput over steps, busy time per rank and step (a
    straggler rank or node is named), the attempts' timeline, the probe's node-pair
    matrix and the hang diagnosis when the run had them. The per-step figures come
    from the run's metrics/ (the bundled examples write them; your script can with
    hpcdl.jobside.steps.StepWriter); without them the report shows what exists and
    says what is missing.

    A sweep: the speedup, efficiency and sync-share charts, the table, every
    point's straggler verdict, and a report per point in its run directory. A
    sweep from `hpcdl sweep`: the points' loss curves together, the final loss
    (and top-1) against each parameter, the comparison table.

    \b
    Examples:
      hpcdl report runs/hpcdl-20261124-061500-ab12cd
      hpcdl report runs/sweep-20261124-061500-ab12 -o scaling.html
    """
    if straggler_threshold <= 1:
        raise ValidationError(f"straggler-threshold: {straggler_threshold:g} must be above 1 "
                              f"(a ratio to the other ranks' median)")
    if output is not None and not output.parent.is_dir():
        raise ValidationError(f"output {output}: directory {output.parent} does not exist")
    if (read_sweep(path) or {}).get("kind") == ARRAY_KIND:  # `hpcdl sweep`: compare the points
        from hpcdl.report import write_param_sweep_report
        from hpcdl.sweep import arrays

        conn = connection_for(path)
        points, names = arrays.table(path, scheduler=conn.scheduler, query=not no_refresh,
                                     place=conn.place)
        written = write_param_sweep_report(path, points, names,
                                           {"sweep_id": path.name, "sweep_dir": str(path)},
                                           output, threshold=straggler_threshold)
        click.echo(json.dumps({"report": str(written)}) if as_json else f"report: {written}")
        return
    if read_sweep(path) is not None:
        conn = connection_for(path)
        rows, meta = load_rows(path, scheduler=conn.scheduler, place=conn.place,
                               refresh=not no_refresh)
        written, stragglers = write_sweep_report(path, rows, meta, output,
                                                 threshold=straggler_threshold)
        if as_json:
            click.echo(json.dumps({"report": str(written), "stragglers": stragglers}))
            return
        for label, verdict in stragglers.items():
            if verdict and verdict["found"]:
                click.echo(f"{label}: {verdict['message']}")
        click.echo(f"report: {written}")
        return
    if not (path / "plan.json").is_file() and not (path / "metrics").is_dir():
        raise ValidationError(f"{path}: neither a run directory (plan.json or metrics/) nor "
                              f"a sweep directory (sweep.json)")
    written, facts = write_run_report(path, output, threshold=straggler_threshold)
    if as_json:
        click.echo(json.dumps({"report": str(written), "straggler": facts["straggler"],
                               "missing": facts["missing"]}))
        return
    for line in facts["missing"]:
        click.echo(f"missing: {line}", err=True)
    if facts["straggler"] is not None:
        click.echo(facts["straggler"]["message"])
    click.echo(f"report: {written}")
