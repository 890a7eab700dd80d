"""`hpcdl scale`: submit a scaling sweep (nodes x GPUs x backend x batch), optionally
follow it. Its table is `hpcdl results` (hpcdl.cli.results)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import click

from hpcdl.cli import options
from hpcdl.cli.display import SweepBar, done_line, sweep_dir_line
from hpcdl.cli.options import SWEEP, Output, SectionedCommand, opt
from hpcdl.cli.submit import defaults_line, echo_warning
from hpcdl.jobs.cluster import Cluster
from hpcdl.jobs.prepare import open_cluster
from hpcdl.jobs.submit import Submitted
from hpcdl.plan import (
    ContainerRequest,
    DataRequest,
    FilesRequest,
    JobRequest,
    LaunchRequest,
    PlacementRequest,
)
from hpcdl.profiles import load_profile
from hpcdl.profiles.schema import Profile
from hpcdl.results.table import count, format_table, to_json
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
    sweep_path,
)
from hpcdl.sweep.prepare import PreparedPoints, prepare_points


@dataclass(frozen=True)
class ScaleAxes:
    """The scaling sweep's axes (every combination is a point) and whether its points
    may run at the same time."""

    nodes: tuple[int, ...]
    gpus: tuple[int, ...]
    backends: tuple[str, ...]
    batches: tuple[int, ...] | None
    concurrent: bool


def _axes(nodes: str, gpus: str, backends: str, batches: str | None,
          concurrent: bool) -> ScaleAxes:
    """The axes from their LIST options. Raises ValidationError naming the option."""
    return ScaleAxes(nodes=parse_int_list("nodes", nodes),
                     gpus=parse_int_list("gpus", gpus, minimum=0),
                     backends=parse_backends(backends),
                     batches=parse_int_list("batch-size", batches) if batches else None,
                     concurrent=concurrent)


@click.command(cls=SectionedCommand)
@options.placement(
    partition="Partition of every point (default: the smallest that fits the "
              "largest point).",
    nodes=opt("--nodes", "-N", "nodes_text", default="1", show_default=True, metavar="LIST",
              part="axes", field="nodes", build=_axes,
              help="Node counts to sweep, e.g. 1,2,4."),
    gpus=opt("--gpus", "-G", "gpus_text", required=True, metavar="LIST",
             part="axes", field="gpus", build=_axes,
             help="GPUs per node to sweep (one rank per GPU), e.g. 1,2,4."),
    time="Wall time limit of each point's job.",
    job_name="Job name the points share (default: hpcdl-scale-<id>).")
@options.container("image", "no_image", "binds")
@options.data("data", "synthetic")
@options.launch("example_args", "env", "launcher", "gpu_bind", "template")
@options.section(
    SWEEP,
    opt("--backend", "backends_text", default="horovod", show_default=True, field="backends",
        metavar="LIST", help="Backends to sweep: horovod, ddp or horovod,ddp."),
    opt("--batch-size", "batch_text", metavar="LIST", field="batches",
        help="Per-rank batch sizes to sweep (default: the example's 32)."),
    opt("--concurrent", is_flag=True,
        help="Let the points run at the same time (default: one after another)."),
    part="axes", build=_axes)
@options.output("dry_run", "as_json", "wait",
        dry_run="Show the points and their run directories (--json: each plan and "
                "script); submit nothing.",
        wait="Follow every point, then print the table and write the results and "
             "plot.")
def scale(profile: str | None, placement: PlacementRequest, axes: ScaleAxes,
          container: ContainerRequest, data: DataRequest, launch: LaunchRequest,
          files: FilesRequest, output: Output) -> None:
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
    prof = load_profile(profile)
    cluster = open_cluster(prof, "scale", dry_run=output.dry_run)  # PBS: --dry-run only
    sweep_id = new_sweep_id()
    job_name = files.job_name or default_job_name(sweep_id)
    base = JobRequest(placement=placement, container=container, data=data, launch=launch,
                      files=replace(files, job_name=job_name))
    check_base(base, sweeping_batch=axes.batches is not None)
    points = expand(axes.backends, axes.nodes, axes.gpus, axes.batches)
    base, why = pin_partition(prof, base, points)  # one partition: comparable speedups
    # Each point planned once with its run directory in the sweep directory, for a dry
    # run too (nothing is created): those plans are what gets submitted.
    sweep_dir = sweep_path(sweep_id)
    ready = prepare_points(prof, base, points, cluster, sweep_dir=sweep_dir,
                           on_warning=echo_warning)
    if ready.notes is not None:
        _show_plans(ready, why, output.as_json, sweep_dir=sweep_dir)
        return
    _run(prof, ready, cluster, sweep_id, sweep_dir, concurrent=axes.concurrent,
         as_json=output.as_json, wait=output.wait)


def _run(prof: Profile, ready: PreparedPoints, cluster: Cluster, sweep_id: str,
         sweep_dir: Path, *, concurrent: bool, as_json: bool, wait: bool) -> None:
    """Submit the planned points (``ready``) into ``sweep_dir``; with ``wait`` follow
    them and print the table."""
    base, plans = ready.request, ready.plans

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
