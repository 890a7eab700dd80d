"""Click option parsing shared by the commands that build a job plan (submit, sweep,
scale, probe, alloc): each option declared once, in the section of ``--help`` that
names the part of the request it sets (placement, container, data, launch,
resilience, probe, hang, output). Click has no option groups of its own: an option
carries its section (``SectionOption``) and ``SectionedCommand`` prints one block per
section. One line of help per option where it fits; the details are in docs/guide."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from hpcdl.errors import ValidationError
from hpcdl.hang.actions import HANG_ACTIONS
from hpcdl.jobside.protocol import DEFAULT_SLOW_RATIO
from hpcdl.plan import BACKENDS, GPU_BINDS, LAUNCHERS
from hpcdl.probe.request import DEFAULT_SIZES

# The sections, in the order --help prints them (a command shows those it has).
PLACEMENT = "Placement and resources"
CONTAINER = "Container"
DATA = "Data"
LAUNCH = "Launch"
SWEEP = "Sweep"
RESILIENCE = "Resilience"
PROBE = "Probe"
HANG = "Hang watchdog"
OUTPUT = "Output"
OTHER = "Other"
ORDER = (PLACEMENT, CONTAINER, DATA, LAUNCH, SWEEP, RESILIENCE, PROBE, HANG, OUTPUT, OTHER)


def parse_env(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` pairs; the value is kept verbatim (quotes, newlines, ``$(...)``)."""
    pairs = []
    for item in values:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValidationError(f"env: {item!r} is not KEY=VALUE")
        pairs.append((key, value))
    return tuple(pairs)


class SectionOption(click.Option):
    """A click option that belongs to one section of its command's --help."""

    def __init__(self, *args: Any, section: str = OTHER, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.section = section


class SectionedCommand(click.Command):
    """A click command whose --help lists its options section by section."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                # --help itself goes with the output options.
                rows.setdefault(getattr(param, "section", OUTPUT), []).append(record)
        for title in sorted(rows, key=lambda t: ORDER.index(t) if t in ORDER else len(ORDER)):
            with formatter.section(f"{title} options" if title != OTHER else "Other options"):
                formatter.write_dl(rows[title])


# An option's declaration: its names and click's attributes, applied by ``section``.
Decl = tuple[tuple[str, ...], dict[str, Any]]
Decorator = Callable[[Any], Any]


def opt(*names: str, **attrs: Any) -> Decl:
    return names, attrs


def section(title: str, *decls: Decl) -> Decorator:
    """A decorator adding ``decls`` as options of section ``title``, in this order."""
    def apply(func: Any) -> Any:
        for names, attrs in reversed(decls):
            func = click.option(*names, cls=SectionOption, section=title, **attrs)(func)
        return func
    return apply


def sections(*decorators: Decorator) -> Decorator:
    """Several sections' decorators as one, applied in the order given."""
    def apply(func: Any) -> Any:
        for decorate in reversed(decorators):
            func = decorate(func)
        return func
    return apply


def with_(decls: dict[str, Decl], names: tuple[str, ...], overrides: dict[str, Decl | str]
          ) -> list[Decl]:
    """``names`` of ``decls``, each with its override where a command has one: a help
    text of its own (a string), or a declaration (another type, default or name)."""
    unknown = set(overrides) - set(names)
    assert not unknown, f"overrides for options not in the section: {unknown}"
    out = []
    for name in names:
        given = overrides.get(name, decls[name])
        if isinstance(given, str):
            given = (decls[name][0], {**decls[name][1], "help": given})
        out.append(given)
    return out


# ---- Placement and resources: where the job runs and what it asks for.
PLACEMENT_DECLS: dict[str, Decl] = {
    "profile": opt("--profile", "-p", "profile", metavar="NAME|PATH",
                   help="Cluster profile (default: $HPCDL_PROFILE; `hpcdl profiles list`)."),
    "partition": opt("--partition", metavar="NAME",
                     help="Partition (default: the smallest one that fits)."),
    "nodes": opt("--nodes", "-N", type=int, default=1, show_default=True,
                 help="Number of nodes."),
    "gpus": opt("--gpus", "-G", type=int, required=True,
                help="GPUs per node; one rank per GPU (-N 2 -G 4: 8 ranks)."),
    "time": opt("--time", "-t", metavar="HH:MM:SS",
                help="Wall time limit (HH:MM:SS, D-HH:MM:SS or minutes)."),
    "cpus_per_task": opt("--cpus-per-task", "-c", type=int,
                         help="CPUs per rank (default: the node's, shared by its GPUs)."),
    "job_name": opt("--job-name", "-J", help="Job name (as the scheduler shows it)."),
}


def placement(*names: str, **overrides: Decl | str) -> Decorator:
    """The placement and resource options ``names`` (default: all)."""
    names = names or tuple(PLACEMENT_DECLS)
    return section(PLACEMENT, *with_(PLACEMENT_DECLS, names, overrides))


# ---- Container: the image the ranks run in.
CONTAINER_DECLS: dict[str, Decl] = {
    "image": opt("--image", metavar="SIF", help="Run inside this Apptainer/Singularity image."),
    "no_image": opt("--no-image", is_flag=True,
                    help="Run natively, even when the profile names a default image."),
    "binds": opt("--bind", "-B", "binds", multiple=True, metavar="SRC[:DST]",
                 help="Bind a host path into the container (repeatable)."),
    "stage_image": opt("--stage-image/--no-stage-image", "stage_image", default=None,
                       help="Copy the image to each node's local scratch (sbcast) and run "
                            "that copy (default: the profile's container.stage)."),
}


def container(*names: str, **overrides: Decl | str) -> Decorator:
    names = names or tuple(CONTAINER_DECLS)
    return section(CONTAINER, *with_(CONTAINER_DECLS, names, overrides))


# ---- Data: what the bundled example reads.
DATA_DECLS: dict[str, Decl] = {
    "data": opt("--data", metavar="DIR",
                help="ImageNet-format dataset, or a packed DATA.sqfs (default: the "
                     "profile's, else synthetic)."),
    "synthetic": opt("--synthetic", is_flag=True,
                     help="Generated images, no dataset (even when the profile names one)."),
    "stage_data": opt("--stage-data", "stage_data", is_flag=True,
                      help="Copy a packed --data to each node's local scratch (sbcast) and "
                           "read that copy."),
}


def data(*names: str, **overrides: Decl | str) -> Decorator:
    names = names or tuple(DATA_DECLS)
    return section(DATA, *with_(DATA_DECLS, names, overrides))


# ---- Launch: what runs and how its ranks start.
LAUNCH_DECLS: dict[str, Decl] = {
    "backend": opt("--backend", type=click.Choice(BACKENDS), default="horovod",
                   show_default=True, help="Distributed backend of the bundled example."),
    "example_args": opt("--example-arg", "-X", "example_args", multiple=True, metavar="ARG",
                        help="Argument for the bundled example (repeatable; -X "
                             "--max-steps=20). Replaces the profile's default for the same "
                             "option."),
    "env": opt("--env", "-e", "env", multiple=True, metavar="KEY=VALUE",
               help="Export a variable to every rank (repeatable; the value verbatim)."),
    "launcher": opt("--launcher", type=click.Choice(LAUNCHERS),
                    help="How ranks start (default: the profile's mpi.launcher)."),
    "gpu_bind": opt("--gpu-bind", type=click.Choice(GPU_BINDS),
                    help="local-rank: each rank sees only its GPU (default: the profile's "
                         "mpi.gpu_bind, else none)."),
    "template": opt("--template", type=click.Path(dir_okay=False),
                    help="Jinja2 template instead of the bundled one."),
    "code": opt("--code", "code", type=click.Path(exists=True, file_okay=False, path_type=Path),
                help="Over SSH (login:): the directory copied with the run, where the job "
                     "starts (default: . when COMMAND's script is in it)."),
}


def launch(*names: str, **overrides: Decl | str) -> Decorator:
    names = names or tuple(LAUNCH_DECLS)
    return section(LAUNCH, *with_(LAUNCH_DECLS, names, overrides))


# ---- Resilience: surviving time limits, preemption, crashes and dead nodes.
RESILIENCE_DECLS: dict[str, Decl] = {
    "requeue": opt("--requeue/--no-requeue", default=None,
                   help="Checkpoint and requeue on a time limit, preemption or crash "
                        "(default: the profile's scheduler.requeue)."),
    "max_restarts": opt("--max-restarts", type=int, metavar="N",
                        help="Requeues or relaunches before the job is let end (default: "
                             "the profile's, 3); preemptions use up none."),
    "signal": opt("--signal", "signal", metavar="SIG@LEAD",
                  help="Signal and its lead in seconds before the time limit (default "
                       "USR2@120)."),
    "spares": opt("--spares", type=int, metavar="S",
                  help="S nodes more than --nodes; a failed node is replaced inside the "
                       "job (default: the profile's, 0)."),
    "chain": opt("--chain", type=int, default=1, show_default=True, metavar="N",
                 help="N jobs in a row (afterany), each resuming the previous one."),
}


def resilience(*names: str, **overrides: Decl | str) -> Decorator:
    names = names or tuple(RESILIENCE_DECLS)
    return section(RESILIENCE, *with_(RESILIENCE_DECLS, names, overrides))


# ---- Probe: an allreduce probe before the training (submit --probe-first).
probe_first = section(
    PROBE,
    opt("--probe-first/--no-probe-first", default=None,
        help="Probe the allocation first; a slow node stops the job (or, with --spares, "
             "is excluded) (default: the profile's scheduler.probe_first)."),
    opt("--probe-sizes", metavar="LIST",
        help=f"Message sizes of the probe (default {DEFAULT_SIZES})."),
    opt("--probe-slow-ratio", type=float, metavar="R",
        help=f"Slow below R of the median node's best link (default {DEFAULT_SLOW_RATIO})."))

# ---- Hang: the job's own watchdog.
hang = section(
    HANG,
    opt("--hang-timeout", "hang_timeout", metavar="SECONDS",
        help="No progress for SECONDS: the job dumps every rank's stack (py-spy), then "
             "acts (with or without --wait)."),
    opt("--hang-action", "hang_action", type=click.Choice(HANG_ACTIONS),
        help="After the diagnosis (default: cancel; relaunch with spares)."))

# ---- Output: what the command prints and writes, and whether it follows the job.
OUTPUT_DECLS: dict[str, Decl] = {
    "dry_run": opt("--dry-run", is_flag=True,
                   help="Print what a submission submits; write and submit nothing."),
    "run_dir": opt("--run-dir", "run_dir", type=click.Path(file_okay=False, path_type=Path),
                   help="Run directory (must not exist yet; default: a new one under "
                        "$HPCDL_RUNS)."),
    "as_json": opt("--json", "as_json", is_flag=True, help="Machine-readable output."),
    "wait": opt("--wait", "-w", is_flag=True,
                help="Follow the job to its end; exit with its exit code."),
}


def output(*names: str, **overrides: Decl | str) -> Decorator:
    names = names or tuple(OUTPUT_DECLS)
    return section(OUTPUT, *with_(OUTPUT_DECLS, names, overrides))
