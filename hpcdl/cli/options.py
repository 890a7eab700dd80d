"""Click option parsing shared by the commands that build a job plan."""

from __future__ import annotations

import click

from hpcdl.jobside.errors import ValidationError
from hpcdl.plan import GPU_BINDS, LAUNCHERS


def parse_env(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` pairs; the value is kept verbatim (quotes, newlines, ``$(...)``)."""
    pairs = []
    for item in values:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValidationError(f"env: {item!r} is not KEY=VALUE")
        pairs.append((key, value))
    return tuple(pairs)


def request_options(func):  # type: ignore[no-untyped-def]
    """The options every plan-building command takes (submit, alloc)."""
    options = [
        click.option("--profile", "-p", "profile", metavar="NAME|PATH",
                     help="Cluster profile (default: $HPCDL_PROFILE). See `hpcdl profiles list`."),
        click.option("--partition", metavar="NAME",
                     help="Partition; default: the smallest one that fits the request."),
        click.option("--nodes", "-N", type=int, default=1, show_default=True, help="Number of nodes."),
        click.option("--gpus", "-G", type=int, required=True,
                     help="GPUs per node; one rank per GPU (--nodes 2 --gpus 4 runs 8 ranks)."),
        click.option("--time", "-t", metavar="HH:MM:SS",
                     help="Wall time limit (HH:MM:SS, D-HH:MM:SS or minutes)."),
        click.option("--cpus-per-task", "-c", type=int,
                     help="CPUs per rank; default: the node's CPUs shared between its GPUs."),
        click.option("--job-name", "-J", help="Job name (as the scheduler shows it)."),
        click.option("--template", type=click.Path(dir_okay=False),
                     help="Use this Jinja2 template instead of the bundled one."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def launch_options(func):  # type: ignore[no-untyped-def]
    """How ranks start and where they run (submit, scale); defaults come from the profile."""
    options = [
        click.option("--no-image", is_flag=True,
                     help="Run natively, even when the profile names a container.default_image."),
        click.option("--launcher", type=click.Choice(LAUNCHERS),
                     help="How ranks start (default: the profile's mpi.launcher): srun (one task "
                          "per rank), torchrun (one torchrun per node via srun, c10d rendezvous "
                          "on the first node), mpirun, horovodrun."),
        click.option("--gpu-bind", type=click.Choice(GPU_BINDS),
                     help="none: every rank sees its node's GPUs and uses GPU LOCAL_RANK; "
                          "local-rank: CUDA_VISIBLE_DEVICES narrowed to that one GPU (default: "
                          "the profile's mpi.gpu_bind, else none)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def example_options(func):  # type: ignore[no-untyped-def]
    """Where and on what the bundled example runs (submit, scale)."""
    options = [
        click.option("--image", metavar="SIF", help="Run inside this Apptainer/Singularity image."),
        click.option("--env", "-e", "env", multiple=True, metavar="KEY=VALUE",
                     help="Export a variable to every rank (repeatable). Values are passed verbatim."),
        click.option("--bind", "-B", "binds", multiple=True, metavar="SRC[:DST]",
                     help="Bind a host path into the container (repeatable)."),
        click.option("--data", metavar="DIR",
                     help="ImageNet-format dataset for the bundled example (default: the "
                          "profile's, else synthetic data)."),
        click.option("--synthetic", is_flag=True,
                     help="Bundled example on generated images (no dataset), even when the "
                          "profile names one."),
        click.option("--example-arg", "-X", "example_args", multiple=True, metavar="ARG",
                     help="Extra argument for the bundled example (repeatable), e.g. "
                          "-X --arch=resnet18 -X --max-steps=20. Replaces the profile's "
                          "default for the same option (see --dry-run)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func
