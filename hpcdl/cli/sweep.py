"""`hpcdl sweep`: a hyperparameter sweep of the bundled example or a COMMAND as one Slurm
job array (hpcdl.sweep.arrays), optionally followed to its comparison table; and
`--retry-failed SWEEP_DIR`, the failed points alone as a new array."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpcdl.cli import options
from hpcdl.cli.display import SweepBar, sweep_dir_line
from hpcdl.cli.options import SWEEP, Output, SectionedCommand, opt
from hpcdl.cli.submit import JOB_FILE_HEADER, defaults_line, echo_warning
from hpcdl.errors import ValidationError
from hpcdl.jobs.place import HERE, RunPlace
from hpcdl.plan import (
    ContainerRequest,
    DataRequest,
    FilesRequest,
    JobRequest,
    LaunchRequest,
    PlacementRequest,
    ResilienceRequest,
)

if TYPE_CHECKING:
    from hpcdl.sweep.arrays import ArrayPlan


@dataclass(frozen=True)
class SweepOptions:
    """The sweep part: where the points come from and how many run at once."""

    params: tuple[str, ...] = ()
    points_file: Path | None = None
    random_count: int | None = None
    seed: int = 0
    max_concurrent: int | None = None
    retry: Path | None = None


@click.command(cls=SectionedCommand)
@options.placement(
    nodes="Nodes of every point.",
    gpus=opt("--gpus", "-G", type=int, help="GPUs per node of every point (one rank per GPU)."),
    time="Wall time limit of each point.",
    job_name="The array's job name (default: hpcdl-sweep-<id>).")
@options.container("image", "no_image", "binds")
@options.data("data", "synthetic")
@options.launch("backend", "example_args", "env", "launcher", "gpu_bind", "template")
@options.section(
    SWEEP,
    opt("--param", "params", multiple=True, metavar="NAME=V1,V2",
        help="A parameter and its values (repeatable; every combination): --NAME=V for the "
             "example, {NAME} in COMMAND. With --random: NAME=log:LOW:HIGH or lin:LOW:HIGH."),
    opt("--points", "points_file", type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE.yaml", help="The points as a YAML list of NAME: value mappings."),
    opt("--random", "random_count", type=int, metavar="N",
        help="N points drawn from the --param ranges instead of the grid."),
    opt("--seed", type=int, default=0, show_default=True, help="Seed for --random."),
    opt("--max-concurrent", type=int, metavar="M",
        help="At most M points at once (default: the partition's max_jobs_per_user)."),
    opt("--retry-failed", "retry", type=click.Path(exists=True, file_okay=False,
                                                   path_type=Path),
        metavar="SWEEP_DIR", help="Submit SWEEP_DIR's failed points again as one new array."),
    part="sweep_opts", build=SweepOptions)
@options.resilience("requeue", "max_restarts", "signal", "spares",
            requeue="Each task checkpoints and requeues itself alone, by its task id "
                    "(default: the profile's scheduler.requeue).",
            spares="Each task allocates S nodes more and replaces a failed one (default: "
                   "the profile's, 0).")
@options.output("dry_run", "as_json", "wait",
        dry_run="Print the points and the array script; write and submit nothing.",
        wait="Follow every task, then print the comparison table.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND ...]")
def sweep(profile: str | None, placement: PlacementRequest, container: ContainerRequest,
          data: DataRequest, launch: LaunchRequest, sweep_opts: SweepOptions,
          resilience: ResilienceRequest, files: FilesRequest, output: Output,
          command: tuple[str, ...]) -> None:
    """Run a hyperparameter sweep as one Slurm job array.

    Every point (a combination of the --param values, a --points file's entry or a
    --random draw) is planned and checked against the profile before anything is
    written (exit 2 naming the point, the field and the limit; the number of points
    against the cluster's MaxArraySize, read from scontrol show config when Slurm
    answers here, and the profile's max_array_size); then one sbatch
    --array submits them all into one sweep directory under $HPCDL_RUNS, a run
    directory per point (point-000/...). `hpcdl results SWEEP_DIR` compares them
    (--sort COLUMN), `hpcdl report` draws them, `hpcdl track` exports them;
    `hpcdl status|cancel JOBID` takes the array or one task (JOBID_TASK).
    With a profile that names a login node (login:), from a laptop, it goes as
    `hpcdl submit` does: the sweep directory is copied to the cluster's login.runs
    and each point's files are pulled back as it ends.

    \b
    Examples:
      hpcdl sweep -p sandbox -N 1 -G 1 --synthetic --param lr=0.1,0.05 --param wd=1e-4,5e-5
      hpcdl sweep -p sandbox -G 1 --max-concurrent 2 --param lr=0.1,0.01 -- python3 train.py --lr {lr}
      hpcdl sweep -p sandbox -G 1 --random 20 --param lr=log:1e-4:1e-1 --seed 1 --dry-run
      hpcdl sweep --retry-failed runs/sweep-20261126-101500-ab12 --wait
    """
    from hpcdl.jobs.prepare import open_cluster
    from hpcdl.profiles import load_profile
    from hpcdl.sweep import arrays
    from hpcdl.sweep import params as sweep_params
    from hpcdl.sweep.grid import new_sweep_id, sweep_path
    from hpcdl.sweep.prepare import prepare_array

    if sweep_opts.retry is not None:
        _check_retry(sweep_opts, resilience, placement, command, dry_run=output.dry_run)
        _retry(sweep_opts.retry, max_concurrent=sweep_opts.max_concurrent, wait=output.wait,
               as_json=output.as_json)
        return
    # (--gpus is optional for --retry-failed alone: the points are the sweep's)
    if placement.gpus is None:
        raise ValidationError("gpus: -G/--gpus N is required (GPUs per node of every point)")
    prof = load_profile(profile)
    # The one handle on the cluster (a PBS profile's: --dry-run only).
    dry_run, as_json, wait = output.dry_run, output.as_json, output.wait
    cluster = open_cluster(prof, "sweep", dry_run=dry_run)
    known = None if command else sweep_params.example_options()
    points = _points(sweep_opts, known)
    sweep_id = new_sweep_id()
    job_name = files.job_name or f"hpcdl-sweep-{sweep_id.rsplit('-', 1)[-1]}"
    base = JobRequest(placement=placement, container=container, data=data,
                      launch=replace(launch, command=command), resilience=resilience,
                      files=replace(files, job_name=job_name))
    # As submit: over a login: profile the image and code as the cluster sees them, and
    # every point's run directory mapped to the cluster's.
    ready = prepare_array(prof, base, points, cluster, sweep_dir=sweep_path(sweep_id),
                          max_concurrent=sweep_opts.max_concurrent, on_warning=echo_warning)
    plan, cluster_dir = ready.plan, ready.cluster_dir
    if dry_run:
        _show(plan, as_json, notes=ready.notes or [], cluster_dir=cluster_dir)
        return
    record = arrays.submit_array(prof, plan, scheduler=cluster.scheduler, place=cluster.place)
    array_id = record["arrays"][0]["job_id"]
    if not as_json:
        click.echo(f"submitted array {array_id}: {len(points)} points (--array={plan.array}; "
                   f"{plan.limit_reason}) into {plan.sweep_dir}", err=True)
        if cluster_dir is not None:
            click.echo(f"copied the sweep directory to {cluster.place.describe()} "
                       f"({cluster_dir})", err=True)
    if not wait:
        info = {"sweep_dir": str(plan.sweep_dir), "array_job_id": array_id,
                "array": plan.array, "points": len(points)}
        if cluster_dir is not None:
            info["cluster_sweep_dir"] = cluster_dir
        click.echo(json.dumps(info) if as_json else
                   f"sweep {sweep_id}: array job {array_id}; follow with `hpcdl results "
                   f"{plan.sweep_dir}`")
        return
    _follow(plan.sweep_dir, cluster.scheduler, len(points), as_json, place=cluster.place)


def _check_retry(sweep: SweepOptions, resilience: ResilienceRequest,
                 placement: PlacementRequest, command: tuple[str, ...], *,
                 dry_run: bool) -> None:
    """--retry-failed takes the sweep's points and scripts as they are. Raises
    ValidationError."""
    if (sweep.params or sweep.points_file or sweep.random_count or command or dry_run
            or resilience.requeue is not None or resilience.max_restarts is not None
            or resilience.signal is not None or placement.spares is not None):
        raise ValidationError("retry-failed: takes only --max-concurrent, --wait, --json "
                              "(the points and their scripts, --requeue and --spares "
                              "included, are the sweep's)")


def _points(opts: SweepOptions, known: frozenset[str] | None) -> list[Any]:
    from hpcdl.sweep import params as sweep_params

    params, points_file, random_count = opts.params, opts.points_file, opts.random_count
    given = sum(1 for x in (bool(params) and random_count is None, points_file,
                            random_count is not None) if x)
    if given != 1:
        raise ValidationError("param: give --param NAME=V1,V2 (a grid), --points FILE.yaml, "
                              "or --random N with --param ranges; exactly one of them")
    if points_file is not None:
        return sweep_params.load_points(points_file, known=known)
    if random_count is not None:
        if not params:
            raise ValidationError("random: needs --param NAME=log:LOW:HIGH (or lin:, or a list)")
        return sweep_params.sample(list(params), random_count, opts.seed, known=known)
    return sweep_params.grid([sweep_params.parse_param(p, known=known) for p in params])


def _show(plan: ArrayPlan, as_json: bool, *, notes: list[str], cluster_dir: str | None) -> None:
    """What --dry-run prints: the points and the array script with the paths the
    submission uses (the cluster's, ``cluster_dir``, over a login: profile), and
    ``notes``: what the dry run left unchecked (stderr)."""
    first = plan.plans[0]
    facts = first.to_dict()  # requeue, max_restarts, signal (SIG@LEAD), spares as plan.json
    if as_json:
        click.echo(json.dumps({
            "sweep_dir": str(plan.sweep_dir),
            **({"cluster_sweep_dir": cluster_dir} if cluster_dir is not None else {}),
            "array": plan.array,
            "max_concurrent": plan.max_concurrent, "partition": plan.plans[0].spec.partition.name,
            "size_limit": plan.size_limit or None,
            "requeue": facts["requeue"],
            "max_restarts": facts["max_restarts"] if facts["requeue"] else None,
            "signal": facts["signal"], "spares": facts["spares"],
            "points": [{"index": p.index, "params": p.params, "run_dir": pl.spec.run_dir,
                        "launch_line": pl.launch.launch_line, "job_script": pl.script}
                       for p, pl in zip(plan.points, plan.plans, strict=True)],
            "script": plan.script}, indent=2))
        return
    click.echo(f"# {len(plan.points)} points, one job array with tasks {plan.array} "
               f"({plan.limit_reason}); partition {first.spec.partition.name}: "
               f"{first.partition_reason}",
               err=True)
    if plan.size_limit:
        click.echo(f"# {plan.size_limit}", err=True)
    click.echo(sweep_dir_line(plan.sweep_dir, cluster_dir), err=True)
    for note in notes:
        click.echo(f"# {note}", err=True)
    if first.launch.example_defaults:
        click.echo(f"# {defaults_line(first)}", err=True)
    for line in _resilience_lines(facts):
        click.echo(f"# {line}", err=True)
    for point, pl in zip(plan.points, plan.plans, strict=True):
        click.echo(f"# point {point.index}: {point.describe()}: {pl.launch.launch_line}", err=True)
    click.echo(plan.script, nl=False)
    if facts["requeue"] or facts["spares"]:
        # The requeue and the node guard live in each point's own job script, which the
        # array's task runs: point 0's, byte for byte (the others differ in their values).
        from hpcdl.jobs.rundir import RUN_FILES

        click.echo(f"{JOB_FILE_HEADER} {first.spec.run_dir}/{RUN_FILES.script} (point 0's job "
                   f"script, which its task runs; every point has its own, differing only in its "
                   f"values; --json has each)", err=True)
        click.echo(first.script, nl=False, err=True)


def _resilience_lines(plan: dict[str, Any]) -> list[str]:
    """What --requeue and --spares do per task (the dry run's notes), from a point's
    plan.json facts."""
    lines = []
    if plan["requeue"]:
        lines.append(f"requeue: each task on SIG{plan['signal']} checkpoints and requeues itself "
                     f"alone, at most {plan['max_restarts']} times "
                     f"after a time limit or a crash, resuming from its point's newest "
                     f"checkpoint; its attempts go to its point's attempts.tsv under its task "
                     f"id (123_4)")
    if plan["spares"]:
        lines.append(f"spares: each task allocates {plan['nodes']} + {plan['spares']} nodes; a node "
                     f"that fails is replaced inside the task")
    return lines


def _follow(sweep_dir: Path, scheduler: Any, total: int, as_json: bool, *,
            place: RunPlace = HERE) -> None:
    """Follow every task to its end (each point's files pulled back from ``place`` as
    it ends), then print the comparison table."""
    from hpcdl.sweep import arrays
    from hpcdl.sweep.compare import format_table, to_json
    from hpcdl.sweep.run import follow_sweep

    bar = SweepBar(total)
    try:
        follow_sweep(sweep_dir, scheduler=scheduler, place=place,
                     on_done=lambda p, t: bar.finished(
                         f"{p.entry['label']}: {(p.record or {}).get('state', p.state)} "
                         f"after {t:.0f} s"))
    except KeyboardInterrupt:
        bar.close()
        click.echo(f"\nstopped following; the tasks go on. Later: hpcdl results {sweep_dir}",
                   err=True)
        raise SystemExit(130) from None
    finally:
        bar.close()
    rows, names = arrays.table(sweep_dir, scheduler=scheduler, query=False)
    click.echo(to_json(rows, {"sweep_dir": str(sweep_dir)}) if as_json
               else format_table(rows, names))
    if any(r["state"] != "COMPLETED" for r in rows):
        raise SystemExit(1)


def _retry(sweep_dir: Path, *, max_concurrent: int | None, wait: bool, as_json: bool) -> None:
    from hpcdl.sweep import arrays
    from hpcdl.sweep.run import connection_for

    conn = connection_for(sweep_dir)  # through the login node its points' profile names
    scheduler = conn.scheduler
    indices, array_id = arrays.retry_failed(sweep_dir, scheduler=scheduler,
                                            max_concurrent=max_concurrent, place=conn.place)
    if not indices:
        click.echo(json.dumps({"sweep_dir": str(sweep_dir), "retried": []}) if as_json
                   else f"{sweep_dir}: no failed point (points still queued or running are "
                        f"left alone)")
        return
    if not as_json or not wait:
        text = (json.dumps({"sweep_dir": str(sweep_dir), "retried": indices,
                            "array_job_id": array_id}) if as_json else
                f"resubmitted {len(indices)} failed point(s) {','.join(map(str, indices))} as "
                f"array {array_id}")
        click.echo(text, err=wait)
    if wait:
        _follow(sweep_dir, scheduler, len(arrays.read_array_sweep(sweep_dir)["points"]), as_json,
                place=conn.place)
