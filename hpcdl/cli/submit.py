"""`hpcdl submit` and `hpcdl alloc`: request -> validated plan -> script -> Slurm."""

from __future__ import annotations

import json

import click

from hpcdl import pbs
from hpcdl.cli.options import example_options, parse_env, request_options
from hpcdl.plan import BACKENDS, JobPlan, JobRequest, build_plan
from hpcdl.preflight import check_inputs, image_arch_facts
from hpcdl.profiles import load_profile


@click.command(context_settings={"ignore_unknown_options": False})
@request_options
@click.option("--backend", type=click.Choice(BACKENDS), default="horovod", show_default=True,
              help="Distributed backend of the bundled example.")
@example_options
@click.option("--dry-run", is_flag=True, help="Print the script (or with --json the plan); write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--wait", "-w", is_flag=True,
              help="Follow the job to its end; exit with the job's exit code (124 when it hit "
                   "its time limit, as timeout(1)).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND ...]")
def submit(profile: str | None, partition: str | None, nodes: int, gpus: int, time: str | None,
           cpus_per_task: int | None, job_name: str | None, template: str | None,
           image: str | None, backend: str, env: tuple[str, ...], binds: tuple[str, ...],
           data: str | None, synthetic: bool, example_args: tuple[str, ...], dry_run: bool, as_json: bool, wait: bool,
           command: tuple[str, ...]) -> None:
    """Validate a training job against the cluster profile, render it, submit it.

    Without COMMAND the job runs the bundled ResNet-50 example with --backend,
    the profile's defaults for it (its examples: section; the sandbox's are sized
    for two CPU cores) and then your -X arguments, which replace those defaults.
    For a PBS profile (polaris) --dry-run prints a PBS Pro script; hpcdl does not
    submit to PBS.

    Every request is checked before anything is written: GPUs per node, nodes,
    wall time and CPUs against the partition's limits (exit 2 with the field,
    the value and the limit when it cannot run).

    \b
    Examples:
      hpcdl submit --profile neuron --nodes 2 --gpus 4 --dry-run
      hpcdl submit -p sandbox -N 2 -G 4 --image img.sif --wait
      hpcdl submit -p sandbox -N 1 -G 2 -- python3 train.py --epochs 3
    """
    prof = load_profile(profile)
    if not dry_run:
        pbs.refuse(prof, "submit")  # a PBS profile's script is for reading (exit 2)
    request = JobRequest(
        nodes=nodes, gpus=gpus, partition=partition, time=time, cpus_per_task=cpus_per_task,
        job_name=job_name, image=image, backend=backend, env=parse_env(env), binds=binds,
        command=command, data=data, synthetic=synthetic, example_args=example_args, template=template,
    )
    # Reads the image's build record (its GPU architectures) for the plan's check.
    plan = build_plan(prof, request, image_arch_facts(image))  # raises before anything is written
    if dry_run:
        if as_json:
            click.echo(json.dumps(plan.to_dict(), indent=2))
            return
        for warning in plan.warnings:
            click.echo(f"warning: {warning}", err=True)
        click.echo(f"# partition {plan.partition}: {plan.partition_reason}", err=True)
        if plan.example_defaults:
            click.echo(f"# {defaults_line(plan)}", err=True)
        click.echo(plan.script, nl=False)
        return
    check_inputs(request)
    # Real submission lives with the Slurm adapter (run directory, sbatch, follow).
    from hpcdl.slurm.jobs import submit_request

    code = submit_request(prof, request, plan, wait=wait, as_json=as_json)
    if code:
        raise SystemExit(code)


def defaults_line(plan: JobPlan) -> str:
    """Where the bundled example's extra arguments come from (not a silent surprise)."""
    return (f"example defaults from profile {plan.profile}: {' '.join(plan.example_defaults)} "
            f"(a -X for the same option replaces one)")


@click.command()
@request_options
@click.option("--dry-run", is_flag=True, help="Print the salloc command script; run nothing.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND ...]")
def alloc(profile: str | None, partition: str | None, nodes: int, gpus: int, time: str | None,
          cpus_per_task: int | None, job_name: str | None, template: str | None, dry_run: bool,
          command: tuple[str, ...]) -> None:
    """Allocate nodes for interactive work (salloc), checked like `submit`.

    Without COMMAND salloc opens a shell in the allocation; with it, salloc runs
    COMMAND there and returns its exit code.

    \b
    Examples:
      hpcdl alloc -p neuron -N 2 -G 4 -t 2:00:00 --dry-run
      hpcdl alloc -p sandbox -N 2 -G 4 -- srun hostname
    """
    from hpcdl.alloc import build_alloc, run_alloc

    prof = load_profile(profile)
    pbs.refuse(prof, "alloc", dry_run_helps=False)  # salloc means Slurm
    request = JobRequest(nodes=nodes, gpus=gpus, partition=partition, time=time,
                         cpus_per_task=cpus_per_task, job_name=job_name or "interactive",
                         command=command, template=template)
    plan = build_alloc(prof, request)
    if dry_run:
        click.echo(f"# partition {plan.partition}: {plan.partition_reason}", err=True)
        click.echo(plan.script, nl=False)
        return
    raise SystemExit(run_alloc(plan))
