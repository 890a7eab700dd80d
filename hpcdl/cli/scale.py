"""`hpcdl scale` (submit a scaling sweep, optionally follow it) and `hpcdl results`
(the scaling table of a sweep or run directory, as text, JSON or CSV, and a plot)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from hpcdl.cli.display import SweepBar, done_line, probe_view, sweep_dir_line
from hpcdl.cli.options import (
    SWEEP,
    SectionedCommand,
    container,
    data,
    launch,
    opt,
    output,
    parse_env,
    placement,
    section,
)
from hpcdl.cli.submit import defaults_line, echo_warning
from hpcdl.jobs.prepare import open_cluster
from hpcdl.jobs.submit import Submitted
from hpcdl.jobside.errors import ValidationError
from hpcdl.plan import JobRequest
from hpcdl.profiles import load_profile
from hpcdl.results.plot import build_figure, write_png
from hpcdl.results.read import probe_report, stragglers
from hpcdl.results.table import FIELDS, Row, count, format_table, to_csv, to_json
from hpcdl.sweep.arrays import KIND as ARRAY_KIND
from hpcdl.sweep.flow import finish_sweep, start_sweep
from hpcdl.sweep.grid import (
    SweepPoint,
    check_base,
    default_job_name,
    expand,
    new_sweep_id,
    parse_backends,
    parse_int_list,
    pin_partition,
    point_entry,
    read_sweep,
    sweep_path,
)
from hpcdl.sweep.prepare import PreparedPoints, prepare_points
from hpcdl.sweep.run import connection_for, load_rows


@click.command(cls=SectionedCommand)
@placement(
    partition="Partition of every point (default: the smallest that fits the "
              "largest point).",
    nodes=opt("--nodes", "-N", "nodes_text", default="1", show_default=True, metavar="LIST",
              help="Node counts to sweep, e.g. 1,2,4."),
    gpus=opt("--gpus", "-G", "gpus_text", required=True, metavar="LIST",
             help="GPUs per node to sweep (one rank per GPU), e.g. 1,2,4."),
    time="Wall time limit of each point's job.",
    job_name="Job name the points share (default: hpcdl-scale-<id>).")
@container("image", "no_image", "binds")
@data("data", "synthetic")
@launch("example_args", "env", "launcher", "gpu_bind", "template")
@section(
    SWEEP,
    opt("--backend", "backends_text", default="horovod", show_default=True,
        metavar="LIST", help="Backends to sweep: horovod, ddp or horovod,ddp."),
    opt("--batch-size", "batch_text", metavar="LIST",
        help="Per-rank batch sizes to sweep (default: the example's 32)."),
    opt("--concurrent", is_flag=True,
        help="Let the points run at the same time (default: one after another)."))
@output("dry_run", "as_json", "wait",
        dry_run="Show the points and their run directories (--json: each plan and "
                "script); submit nothing.",
        wait="Follow every point, then print the table and write the results and "
             "plot.")
def scale(profile: str | None, partition: str | None, nodes_text: str, gpus_text: str,
          backends_text: str, batch_text: str | None, time: str | None,
          cpus_per_task: int | None, job_name: str | None, template: str | None,
          image: str | None, env: tuple[str, ...], binds: tuple[str, ...], data: str | None,
          synthetic: bool, example_args: tuple[str, ...], no_image: bool, launcher: str | None,
          gpu_bind: str | None, concurrent: bool, dry_run: bool, as_json: bool,
          wait: bool) -> None:
    """Run the bundled example at every point of a scaling sweep.

    One job per combination of --backend, --batch-size, --nodes and --gpus, all with
    the same settings. Every point is checked against the profile before anything
    is submitted (exit 2 naming the point, the field and the limit). The jobs go
    into one sweep directory under $HPCDL_RUNS (default ./runs); `hpcdl results`
    turns it into a speedup/efficiency table and plot at any time.

    \b
    Examples:
      hpcdl scale -p sandbox -N 1,2 -G 1,2 --backend horovod,ddp --synthetic \\
          --image img.sif -c 1 -X --arch=resnet18 -X --max-steps=20 --wait
      hpcdl scale -p taurus -N 1,2,4 -G 1,2,4 --batch-size 32,64 --dry-run
    """
    nodes = parse_int_list("nodes", nodes_text)
    gpus = parse_int_list("gpus", gpus_text, minimum=0)
    backends = parse_backends(backends_text)
    batches = parse_int_list("batch-size", batch_text) if batch_text else None
    prof = load_profile(profile)
    cluster = open_cluster(prof, "scale", dry_run=dry_run)  # a PBS profile's: --dry-run only
    sweep_id = new_sweep_id()
    base = JobRequest(partition=partition, time=time, cpus_per_task=cpus_per_task,
                      job_name=job_name or default_job_name(sweep_id), image=image,
                      env=parse_env(env), binds=binds, data=data, synthetic=synthetic,
                      example_args=example_args, template=template, no_image=no_image,
                      launcher=launcher, gpu_bind=gpu_bind)
    check_base(base, sweeping_batch=batches is not None)
    points = expand(backends, nodes, gpus, batches)
    base, why = pin_partition(prof, base, points)  # one partition: comparable speedups
    # Each point planned once with its run directory in the sweep directory, for a dry
    # run too (nothing is created): those plans are what gets submitted.
    sweep_dir = sweep_path(sweep_id)
    ready = prepare_points(prof, base, points, cluster, sweep_dir=sweep_dir,
                           on_warning=echo_warning)
    base, plans = ready.request, ready.plans
    if ready.notes is not None:
        _show_plans(ready, why, as_json, sweep_dir=sweep_dir)
        return

    def submitted(point: SweepPoint, sub: Submitted) -> None:
        click.echo(f"submitted {point.label}: job {sub.job_id} ({count(point.ranks, 'rank')} on "
                   f"{count(point.nodes, 'node')})", err=True)

    scheduler = cluster.scheduler
    record = start_sweep(prof, base, plans, sweep_dir=sweep_dir, concurrent=concurrent,
                         scheduler=scheduler, on_submitted=submitted, place=cluster.place)
    if not wait:
        if as_json:
            click.echo(json.dumps({"sweep_dir": str(sweep_dir), **record}))
        else:
            click.echo(f"sweep {sweep_id}: {len(plans)} jobs submitted; follow with "
                       f"`hpcdl results {sweep_dir}`")
        return
    bar = SweepBar(len(plans))
    try:
        outcome = finish_sweep(sweep_dir, sweep_id, scheduler=scheduler, place=cluster.place,
                               on_done=lambda row, t: bar.finished(done_line(row, t)),
                               on_progress=bar.status)
    except KeyboardInterrupt:
        bar.close()
        # Only the following stops; the jobs are Slurm's and go on.
        click.echo(f"\nstopped following; the jobs go on. Table so far and later: "
                   f"hpcdl results {sweep_dir}", err=True)
        raise SystemExit(130) from None
    finally:
        bar.close()
    rows = outcome.rows
    if as_json:
        click.echo(to_json(rows, {"sweep_id": sweep_id, "sweep_dir": str(sweep_dir)}))
    else:
        click.echo(format_table(rows))
        click.echo("wrote " + ", ".join(str(p) for p in outcome.written))
    if not outcome.ok:
        raise SystemExit(1)


def _show_plans(ready: PreparedPoints, why: str, as_json: bool, *, sweep_dir: Path) -> None:
    """What --dry-run prints: the points, their run directories and scripts as the
    submission would send them (``--json``: each point's plan.json and job script), and
    the notes of what was left unchecked (stderr)."""
    plans, cluster_dir = ready.plans, ready.cluster_dir
    planned = plans[0][1].spec.run_dir is not None  # a PBS profile's are for reading
    if as_json:
        click.echo(json.dumps({
            "partition": plans[0][1].spec.partition.name, "partition_reason": why,
            **({"sweep_dir": str(sweep_dir)} if planned else {}),
            **({"cluster_sweep_dir": cluster_dir} if cluster_dir is not None else {}),
            "points": [{**point_entry(point), "plan": plan.to_dict(), "job_script": plan.script}
                       for point, plan in plans]}, indent=2))
        return
    first = plans[0][1]
    if planned:
        click.echo(sweep_dir_line(sweep_dir, cluster_dir), err=True)
    for note in ready.notes or ():
        click.echo(f"# {note}", err=True)
    click.echo(f"partition {first.spec.partition.name} for every point ({why})")
    if first.launch.example_defaults:
        click.echo(defaults_line(first))
    for point, plan in plans:
        click.echo(f"{point.label:<24} {count(point.ranks, 'rank'):>9}  "
                   f"{plan.spec.cpus_per_task} CPUs/rank  time {plan.time}")
    click.echo(f"{len(plans)} jobs; each runs: {first.launch.launch_line}")


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
