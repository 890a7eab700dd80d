"""`hpcdl submit`: request -> validated plan -> script -> Slurm."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpcdl.cli import one_line, options
from hpcdl.cli.options import Output, ProbeFirst, SectionedCommand
from hpcdl.errors import ValidationError
from hpcdl.jobs.cluster import Cluster, connect
from hpcdl.jobs.flow import JobOutcome, SubmittedJob, submit_job
from hpcdl.jobs.prepare import open_cluster, prepare_job
from hpcdl.jobside.protocol import DEFAULT_SLOW_RATIO
from hpcdl.plan import (
    ContainerRequest,
    DataRequest,
    FilesRequest,
    HangRequest,
    JobPlan,
    JobRequest,
    LaunchRequest,
    PlacementRequest,
    ProbeRequest,
    ResilienceRequest,
    rules,
)
from hpcdl.probe.request import DEFAULT_SIZES, ProbeOptions, worker_args
from hpcdl.profiles import load_profile
from hpcdl.profiles.schema import Profile

if TYPE_CHECKING:
    from hpcdl.hang.diagnosis import Diagnosis
    from hpcdl.schedulers.base import Scheduler

# hpcdl.cli.display (the status line, how a job ended) is imported where a followed
# job is shown: it is not on the way to sbatch, whose start-up is most of hpcdl's own
# time (issue 31).

# Starts the line above each job-side file a dry run prints after the script (the
# arrow of `head FILE...`): a reader or a test finds where each file begins.
JOB_FILE_HEADER = "# ==>"


@click.command(cls=SectionedCommand, context_settings={"ignore_unknown_options": False})
@options.placement()
@options.container()
@options.data()
@options.launch()
@options.resilience()
@options.probe_first
@options.hang
@options.output(
    dry_run="Print the script (stdout) and the files it runs (stderr), or the plan "
            "(--json); write nothing.",
    run_dir="Run directory (must not exist yet; default: a new one under $HPCDL_RUNS); "
            "--dry-run shows its script.",
    wait="Follow the job; exit with its exit code (124 when it hit its time limit).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND ...]")
def submit(profile: str | None, placement: PlacementRequest, container: ContainerRequest,
           data: DataRequest, launch: LaunchRequest, resilience: ResilienceRequest,
           probe_first: ProbeFirst, hang: HangRequest, files: FilesRequest, output: Output,
           command: tuple[str, ...]) -> None:
    """Validate a training job against the cluster profile, render it, submit it.

    Without COMMAND the job runs the bundled ResNet-50 example with --backend,
    the profile's defaults for it (its examples: section; the sandbox's are sized
    for two CPU cores) and then your -X arguments, which replace those defaults; it
    runs in any image: the examples are bound in from the host. Every rank gets
    torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...),
    so a script written for torchrun runs unchanged; Horovod/MPI scripts too. The image
    is --image, else the profile's container.default_image (--no-image: native).
    For a PBS profile (polaris) --dry-run prints a PBS Pro script; hpcdl does not
    submit to PBS.

    From a laptop: a profile with a login: node (e.g. sandbox-remote) runs every
    Slurm command there over one SSH connection, copies the run directory (and
    --code) to the cluster with rsync, and pulls results back into the local one;
    --image names an image copied there with `hpcdl push` or a path on the cluster.

    Every request is checked before anything is written: GPUs per node, nodes,
    wall time and CPUs against the partition's limits (exit 2 with the field,
    the value and the limit when it cannot run).

    \b
    Examples:
      hpcdl submit --profile neuron --nodes 2 --gpus 4 --dry-run
      hpcdl submit -p sandbox -N 2 -G 4 --image img.sif --wait
      hpcdl submit -p sandbox -N 1 -G 2 -- python3 train.py --epochs 3
      hpcdl submit -p sandbox -N 2 -G 2 --image img.sif --launcher torchrun -- python3 ddp.py
    """
    prof = load_profile(profile)
    # The one handle on the cluster: where its commands run and its run directories
    # live; it answers every question that turns on where the cluster is.
    run_dir = Path(files.run_dir) if files.run_dir is not None else None
    cluster = open_cluster(prof, "submit", dry_run=output.dry_run, run_dir=run_dir)
    placement, probe = _probe_part(prof, placement, probe_first)
    request = JobRequest(placement=placement, container=container, data=data,
                         launch=replace(launch, command=command), resilience=resilience,
                         hang=hang, probe=probe, files=files)
    ready = prepare_job(prof, request, cluster, on_warning=echo_warning)
    if ready.notes is not None:
        print_dry_run(ready.plan, as_json=output.as_json, notes=ready.notes)
        return
    status = submit_and_show(prof, ready.plan, wait=output.wait, as_json=output.as_json,
                             conn=ready.conn)
    if status:
        raise SystemExit(status)


def _probe_part(prof: Profile, placement: PlacementRequest, given: ProbeFirst
                ) -> tuple[PlacementRequest, ProbeRequest]:
    """The probe part of `submit` (--probe-first and its options) and the placement it
    measures: the profile's default decided, the worker's arguments made. Raises
    ValidationError."""
    first, placement = rules.probe_first(prof, placement, given.first)
    for name, value in (("probe-sizes", given.sizes), ("probe-slow-ratio", given.slow_ratio)):
        if value is not None and not first:
            raise ValidationError(f"{name}: only with --probe-first")
    if not first:
        return placement, ProbeRequest()
    args = worker_args(ProbeOptions(
        sizes=given.sizes or DEFAULT_SIZES,
        slow_ratio=DEFAULT_SLOW_RATIO if given.slow_ratio is None else given.slow_ratio), prof)
    return placement, ProbeRequest(args=args, first=True)


def echo_warning(text: str) -> None:
    """A warning of the job layer (hpcdl.jobs.prepare's on_warning), on stderr."""
    click.echo(f"warning: {text}", err=True)


def print_dry_run(plan: JobPlan, *, as_json: bool, notes: Sequence[str] = ()) -> None:
    """What --dry-run prints: the plan as JSON, or the notes (stderr: ``notes``, then the
    plan's own), the script (stdout: job.sbatch byte for byte) and after it each file
    of the run the script runs (stderr, each under a header naming its path; byte for
    byte what is staged)."""
    if as_json:
        click.echo(json.dumps(plan.to_dict(), indent=2))
        return
    for note in notes:
        click.echo(f"# {note}", err=True)
    for warning in plan.warnings:
        echo_warning(warning)
    click.echo(f"# partition {plan.spec.partition.name}: {plan.partition_reason}", err=True)
    if plan.container.image_source == "profile default_image":
        click.echo(f"# image {plan.container.image}: the profile's container.default_image "
                   "(--image overrides, --no-image runs natively)", err=True)
    click.echo(f"# launcher {plan.launch.launcher}; GPU binding {plan.launch.gpu_bind}", err=True)
    spec, container = plan.spec, plan.container
    if spec.spares:
        click.echo(f"# nodes: {spec.nodes} for the training + {spec.spares} spare"
                   f"{'s' if spec.spares > 1 else ''} = {spec.allocated_nodes} allocated "
                   f"(--no-kill); a failed node is replaced inside the job", err=True)
    if container.staged_image:
        click.echo(f"# image staged with sbcast to each node's {container.staged_image}; the "
                   "ranks run that copy", err=True)
    if container.staged_data:
        click.echo(f"# dataset staged with sbcast to each node's {container.staged_data}; the "
                   "ranks read that copy", err=True)
    if plan.hang is not None:
        click.echo(f"# hang watchdog (in the job, with or without --wait): no progress for "
                   f"{plan.hang.timeout:g} s -> py-spy stacks of every rank in hang/, then "
                   f"{plan.hang.action}", err=True)
    if plan.launch.example_defaults:
        click.echo(f"# {defaults_line(plan)}", err=True)
    click.echo(plan.script, nl=False)
    for path, text in plan.job_script_paths():
        click.echo(f"{JOB_FILE_HEADER} {path} (written with the run; the script runs it)",
                   err=True)
        click.echo(text, nl=False, err=True)


def defaults_line(plan: JobPlan) -> str:
    """Where the bundled example's extra arguments come from (not a silent surprise)."""
    return (f"example defaults from profile {plan.spec.profile.name}: "
            f"{' '.join(plan.launch.example_defaults)} (a -X for the same option replaces one)")


def submit_and_show(prof: Profile, plan: JobPlan, *, wait: bool, as_json: bool,
                    timeout: float | None = None, probe: bool = False,
                    conn: Cluster | None = None) -> int:
    """Submit ``plan`` and print the job id; with ``wait`` follow the job, showing its
    status line and what the hang watchdog finds, and print how it ended.

    Returns the process exit code (0 once submitted; with ``wait`` the job's; for a
    probe job, ``probe``, 2 when a node refused the probe's input).
    ``conn``: the profile's scheduler and run place (default: connect(prof)).
    Raises ValidationError, SubmitError, ToolError (see hpcdl.jobs.flow).
    """
    conn = conn or connect(prof)
    scheduler = conn.scheduler
    job = submit_job(prof, plan, scheduler=scheduler, watch=wait, place=conn.place)
    sub = job.submitted
    for warning in (*plan.warnings, *sub.warnings):
        echo_warning(warning)
    spec = plan.spec
    info: dict[str, object] = {
        "job_id": sub.job_id, "run_dir": str(sub.run_dir), "partition": spec.partition.name,
        "nodes": spec.nodes, "ntasks": spec.ntasks, "job_name": spec.job_name}
    if sub.chain:
        info["chain"] = list(sub.chain)
    if not as_json:
        click.echo(f"Submitted job {sub.job_id} to partition {spec.partition.name} "
                   f"({spec.nodes} nodes x {spec.tasks_per_node} ranks); run dir {sub.run_dir}")
        if sub.chain:
            click.echo(f"chain of {len(sub.chain)} jobs (--dependency=afterany): "
                       f"{' -> '.join(sub.chain)}")
    if sub.place.remote:
        # Lazy: the display module is for showing a job, not on the way to sbatch.
        from hpcdl.cli.display import size_text

        info["cluster_run_dir"] = spec.run_dir
        info["bytes_moved"] = sub.moved
        if not as_json:
            click.echo(f"copied the run directory to {sub.place.describe()} "
                       f"({size_text(sub.moved)} moved)", err=True)
    if not wait:
        if as_json:
            click.echo(json.dumps(info))
        return 0
    return _follow(prof, plan, job, info, scheduler=scheduler, as_json=as_json,
                   timeout=timeout, probe=probe)


def _follow(prof: Profile, plan: JobPlan, job: SubmittedJob, info: dict[str, object], *,
            scheduler: Scheduler, as_json: bool, timeout: float | None, probe: bool) -> int:
    """submit_and_show's --wait: follow ``job`` to its end, showing its status line and
    what the hang watchdog finds, and print how it ended (``info``: the submission's
    facts, for --json). Returns the exit code."""
    # Lazy: following a job (and showing it) is only --wait's; see the note at the top.
    from hpcdl.cli.display import StatusLine, hang_lines, lost_line, print_job_end
    from hpcdl.jobs.flow import follow_job
    from hpcdl.report import write_run_report

    sub = job.submitted
    line = StatusLine(sub.last_job_id, quiet=as_json)

    def shown(diagnosis: Diagnosis) -> None:
        # The diagnosis in a few lines when the watchdog fires (with --json it is in the
        # JSON at the end).
        line.close()
        if not as_json:
            for text in hang_lines(diagnosis, sub.run):
                click.echo(text, err=True)

    try:
        outcome = follow_job(prof, job, scheduler=scheduler, on_poll=line, on_hang=shown,
                             timeout=timeout, probe=probe, on_lost=lost_line(line),
                             write_report=write_run_report)
    finally:
        line.close()
    if outcome.report_error is not None:
        click.echo(f"warning: report: not written ({outcome.report_error}); try "
                   f"`hpcdl report {sub.run_dir}`", err=True)
    final, code = outcome.final, outcome.exit_status
    if as_json:
        click.echo(json.dumps(_outcome_record(info, outcome)))
        return code
    if outcome.probe_error is not None:  # a node refused the probe's input: the one line that says why
        click.echo(f"job {final.job_id}: {final.state}, exit code {final.exit_code}; "
                   f"run directory {sub.run_dir}")
        click.echo(f"error: probe: {one_line(outcome.probe_error)}", err=True)
        return code
    part = prof.partition(plan.spec.partition.name)
    print_job_end(final, sub.run_dir, outcome.logs, outcome.record,
                  max_time=part.max_time if part else None, attempts=outcome.attempts,
                  hang=outcome.hang, html=outcome.report, straggler=outcome.straggler,
                  steps=outcome.steps, nodes=plan.spec.nodes, recoveries=outcome.recoveries,
                  excluded=outcome.excluded, scheduler=scheduler)
    return code


def _outcome_record(info: dict[str, object], outcome: JobOutcome) -> dict[str, object]:
    """What `submit --wait --json` prints: the submission's facts (``info``), the job's
    record and how it ended."""
    hang = outcome.hang.to_dict() if outcome.hang is not None else None
    tried = outcome.attempts
    return {**info, **outcome.record, "exit_status": outcome.exit_status,
            "steps_completed": outcome.steps,
            **({"attempts": [a.to_dict() for a in tried]} if tried else {}),
            **({"recoveries": [r.to_dict() for r in outcome.recoveries]}
               if outcome.recoveries else {}),
            **({"excluded_nodes": outcome.excluded} if outcome.excluded else {}),
            **({"hang": hang} if hang else {}),
            "report": str(outcome.report) if outcome.report else None,
            "straggler": outcome.straggler}
