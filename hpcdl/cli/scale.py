"""`hpcdl scale`: submit a scaling sweep (nodes x GPUs x backend x batch), optionally
follow it. Its table is `hpcdl results` (hpcdl.cli.results)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from hpcdl.cli.display import SweepBar, done_line, sweep_dir_line
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
from hpcdl.plan import JobRequest
from hpcdl.profiles import load_profile
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
    base = JobRequest.of(partition=partition, time=time, cpus_per_task=cpus_per_task,
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
