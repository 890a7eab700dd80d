"""`hpcdl submit` and `hpcdl alloc`: request -> validated plan -> script -> Slurm."""

from __future__ import annotations

import json

import click

from hpcdl.cli.options import example_options, launch_options, parse_env, request_options
from hpcdl.plan import BACKENDS, JobRequest, build_plan
from hpcdl.preflight import check_inputs
from hpcdl.profiles import load_profile


@click.command(context_settings={"ignore_unknown_options": False})
@request_options
@click.option("--backend", type=click.Choice(BACKENDS), default="horovod", show_default=True,
              help="Distributed backend of the bundled example.")
@example_options
@launch_options
@click.option("--dry-run", is_flag=True, help="Print the script (or with --json the plan); write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--wait", "-w", is_flag=True,
              help="Follow the job to its end; exit with the job's exit code.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND ...]")
def submit(profile: str | None, partition: str | None, nodes: int, gpus: int, time: str | None,
           cpus_per_task: int | None, job_name: str | None, template: str | None,
           image: str | None, backend: str, env: tuple[str, ...], binds: tuple[str, ...],
           data: str | None, synthetic: bool, example_args: tuple[str, ...], no_image: bool,
           launcher: str | None, gpu_bind: str | None, dry_run: bool, as_json: bool, wait: bool,
           command: tuple[str, ...]) -> None:
    """Validate a training job against the cluster profile, render it, submit it.

    Without COMMAND the job runs the bundled ResNet-50 example with --backend (in any
    image: the examples are bound in from the host). Every rank gets torchrun's
    variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...), so a
    script written for torchrun runs unchanged; Horovod/MPI scripts too. The image is
    --image, else the profile's container.default_image (--no-image: native).
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
    request = JobRequest(
        nodes=nodes, gpus=gpus, partition=partition, time=time, cpus_per_task=cpus_per_task,
        job_name=job_name, image=image, backend=backend, env=parse_env(env), binds=binds,
        command=command, data=data, synthetic=synthetic, example_args=example_args, template=template,
        no_image=no_image, launcher=launcher, gpu_bind=gpu_bind,
    )
    plan = build_plan(prof, request)  # validates: raises before anything is written
    if dry_run:
        if as_json:
            click.echo(json.dumps(plan.to_dict(), indent=2))
            return
        for warning in plan.warnings:
            click.echo(f"warning: {warning}", err=True)
        click.echo(f"# partition {plan.partition}: {plan.partition_reason}", err=True)
        if plan.image_source == "profile default_image":
            click.echo(f"# image {plan.image}: the profile's container.default_image "
                       "(--image overrides, --no-image runs natively)", err=True)
        click.echo(f"# launcher {plan.launcher}; GPU binding {plan.gpu_bind}", err=True)
        click.echo(plan.script, nl=False)
        return
    check_inputs(request, image=plan.image)
    # Real submission lives with the Slurm adapter (run directory, sbatch, follow).
    from hpcdl.slurm.jobs import submit_request

    code = submit_request(prof, request, plan, wait=wait, as_json=as_json)
    if code:
        raise SystemExit(code)


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
    request = JobRequest(nodes=nodes, gpus=gpus, partition=partition, time=time,
                         cpus_per_task=cpus_per_task, job_name=job_name or "interactive",
                         command=command, template=template)
    plan = build_alloc(prof, request)
    if dry_run:
        click.echo(f"# partition {plan.partition}: {plan.partition_reason}", err=True)
        click.echo(plan.script, nl=False)
        return
    raise SystemExit(run_alloc(plan))
