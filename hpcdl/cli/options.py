"""Click option parsing shared by the commands that build a job plan (submit, sweep,
scale, probe, alloc): each option declared once, in the section of ``--help`` that
names the part of the request it sets (placement, container, data, launch,
resilience, probe, hang, output). Click has no option groups of its own: an option
carries its section (``SectionOption``) and ``SectionedCommand`` prints one block per
section. One line of help per option where it fits; the details are in docs/guide.

An option also names the part it sets (``part``, and its ``field`` there):
``SectionedCommand`` folds the values of each part's options into that part, a frozen
object (hpcdl.plan's PlacementRequest, ContainerRequest, ...), and the command gets
one keyword per part instead of one per option. Most sections are one part; the
exceptions are said where the option is declared (--job-name, --template, --code and
--run-dir set the files part, --spares the placement's)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from hpcdl.errors import ValidationError
from hpcdl.hang.actions import HANG_ACTIONS, parse_seconds
from hpcdl.jobside.protocol import DEFAULT_SLOW_RATIO
from hpcdl.plan import (
    BACKENDS,
    GPU_BINDS,
    LAUNCHERS,
    ContainerRequest,
    DataRequest,
    FilesRequest,
    HangRequest,
    LaunchRequest,
    PlacementRequest,
    ResilienceRequest,
)
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


def hang_seconds(text: str | None) -> float | None:
    """--hang-timeout as seconds (the job watches itself: with or without --wait, from
    here or over SSH). Raises ValidationError."""
    if text is None:
        return None
    try:
        return parse_seconds("hang-timeout", text)
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc


@dataclass(frozen=True)
class Output:
    """The output part: what the command prints and whether it follows the job."""

    dry_run: bool = False
    as_json: bool = False
    wait: bool = False


@dataclass(frozen=True)
class ProbeFirst:
    """The probe options of `submit` (--probe-first; None: the profile's default)."""

    first: bool | None = None
    sizes: str | None = None
    slow_ratio: float | None = None


def _launch(env: tuple[str, ...] = (), **fields: Any) -> LaunchRequest:
    return LaunchRequest(env=parse_env(env), **fields)


def _hang(timeout: str | None = None, action: str | None = None) -> HangRequest:
    return HangRequest(timeout=hang_seconds(timeout), action=action)


def _files(run_dir: Path | None = None, code_dir: Path | None = None,
           **fields: Any) -> FilesRequest:
    # The run directory as the plan names it (absolute); --code as given.
    return FilesRequest(run_dir=str(run_dir.resolve()) if run_dir is not None else None,
                        code_dir=str(code_dir) if code_dir is not None else None, **fields)


# How each part is made from its options' values (``field=value``), raw as click gives
# them: a part that needs a conversion (KEY=VALUE pairs, seconds, paths) says it here.
Builder = Callable[..., Any]
BUILDERS: dict[str, Builder] = {
    "placement": PlacementRequest, "container": ContainerRequest, "data": DataRequest,
    "launch": _launch, "resilience": ResilienceRequest, "hang": _hang, "files": _files,
    "output": Output, "probe_first": ProbeFirst,
}


class SectionOption(click.Option):
    """A click option that belongs to one section of its command's --help, and sets
    ``field`` of the request part ``part`` (None: the command takes it as it is)."""

    def __init__(self, *args: Any, section: str = OTHER, part: str | None = None,
                 field: str | None = None, build: Builder | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.section = section
        self.part = part
        self.field = field or self.name
        self.build = build or (BUILDERS[part] if part is not None else None)


def fold(params: list[click.Parameter], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (click's, by option name) with each part's options folded into that
    part: ``{"nodes": 2, "gpus": 4, ...}`` becomes ``{"placement": PlacementRequest(
    nodes=2, gpus=4, ...)}``. Raises ValidationError where a part's conversion does."""
    out = dict(values)
    fields: dict[str, dict[str, Any]] = {}
    builders: dict[str, Builder] = {}
    for param in params:
        if isinstance(param, SectionOption) and param.part is not None and param.build:
            fields.setdefault(param.part, {})[str(param.field)] = out.pop(str(param.name))
            builders[param.part] = param.build
    for part, given in fields.items():
        out[part] = builders[part](**given)
    return out


class SectionedCommand(click.Command):
    """A click command whose --help lists its options section by section, and whose
    callback gets each request part whole (``fold``)."""

    def invoke(self, ctx: click.Context) -> Any:
        ctx.params = fold(self.get_params(ctx), ctx.params)
        return super().invoke(ctx)

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


def section(title: str, *decls: Decl, part: str | None = None,
            build: Builder | None = None) -> Decorator:
    """A decorator adding ``decls`` as options of section ``title``, in this order,
    each setting ``part`` (built by ``build``, default BUILDERS[part]) unless its
    declaration names another part (or None: the command takes it as it is)."""
    def apply(func: Any) -> Any:
        for names, attrs in reversed(decls):
            own = {} if "part" in attrs else {"part": part, "build": build}
            func = click.option(*names, cls=SectionOption, section=title, **own, **attrs)(func)
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
    text of its own (a string), or a declaration (another type, default or name; it
    sets the part the option it replaces sets, unless it names its own)."""
    unknown = set(overrides) - set(names)
    assert not unknown, f"overrides for options not in the section: {unknown}"
    out = []
    for name in names:
        given = overrides.get(name, decls[name])
        if isinstance(given, str):
            given = (decls[name][0], {**decls[name][1], "help": given})
        elif "part" not in given[1]:
            base = decls[name][1]
            sets: dict[str, Any] = {key: base[key] for key in ("part", "field", "build")
                                    if key in base}
            given = (given[0], {**sets, **given[1]})
        out.append(given)
    return out


# ---- Placement and resources: where the job runs and what it asks for.
PLACEMENT_DECLS: dict[str, Decl] = {
    "profile": opt("--profile", "-p", "profile", metavar="NAME|PATH", part=None,
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
    # (the files part's: the run directory is named after it)
    "job_name": opt("--job-name", "-J", part="files",
                    help="Job name (as the scheduler shows it)."),
}


def placement(*names: str, **overrides: Decl | str) -> Decorator:
    """The placement and resource options ``names`` (default: all)."""
    names = names or tuple(PLACEMENT_DECLS)
    return section(PLACEMENT, *with_(PLACEMENT_DECLS, names, overrides), part="placement")


# ---- Container: the image the ranks run in.
CONTAINER_DECLS: dict[str, Decl] = {
    "image": opt("--image", metavar="SIF", help="Run inside this Apptainer/Singularity image."),
    "no_image": opt("--no-image", is_flag=True,
                    help="Run natively, even when the profile names a default image."),
    "binds": opt("--bind", "-B", "binds", multiple=True, metavar="SRC[:DST]",
                 help="Bind a host path into the container (repeatable)."),
    "stage_image": opt("--stage-image/--no-stage-image", "stage_image", default=None,
                       field="stage",
                       help="Copy the image to each node's local scratch (sbcast) and run "
                            "that copy (default: the profile's container.stage)."),
}


def container(*names: str, **overrides: Decl | str) -> Decorator:
    names = names or tuple(CONTAINER_DECLS)
    return section(CONTAINER, *with_(CONTAINER_DECLS, names, overrides), part="container")


# ---- Data: what the bundled example reads.
DATA_DECLS: dict[str, Decl] = {
    "data": opt("--data", metavar="DIR", field="path",
                help="ImageNet-format dataset, or a packed DATA.sqfs (default: the "
                     "profile's, else synthetic)."),
    "synthetic": opt("--synthetic", is_flag=True,
                     help="Generated images, no dataset (even when the profile names one)."),
    "stage_data": opt("--stage-data", "stage_data", is_flag=True, field="stage",
                      help="Copy a packed --data to each node's local scratch (sbcast) and "
                           "read that copy."),
}


def data(*names: str, **overrides: Decl | str) -> Decorator:
    names = names or tuple(DATA_DECLS)
    return section(DATA, *with_(DATA_DECLS, names, overrides), part="data")


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
    # --template and --code set the files part (what is written with the run).
    "template": opt("--template", type=click.Path(dir_okay=False), part="files",
                    help="Jinja2 template instead of the bundled one."),
    "code": opt("--code", "code", type=click.Path(exists=True, file_okay=False, path_type=Path),
                part="files", field="code_dir",
                help="Over SSH (login:): the directory copied with the run, where the job "
                     "starts (default: . when COMMAND's script is in it)."),
}


def launch(*names: str, **overrides: Decl | str) -> Decorator:
    names = names or tuple(LAUNCH_DECLS)
    return section(LAUNCH, *with_(LAUNCH_DECLS, names, overrides), part="launch")


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
    # (the placement part's: spares are nodes of the allocation)
    "spares": opt("--spares", type=int, metavar="S", part="placement",
                  help="S nodes more than --nodes; a failed node is replaced inside the "
                       "job (default: the profile's, 0)."),
    "chain": opt("--chain", type=int, default=1, show_default=True, metavar="N",
                 help="N jobs in a row (afterany), each resuming the previous one."),
}


def resilience(*names: str, **overrides: Decl | str) -> Decorator:
    names = names or tuple(RESILIENCE_DECLS)
    return section(RESILIENCE, *with_(RESILIENCE_DECLS, names, overrides), part="resilience")


# ---- Probe: an allreduce probe before the training (submit --probe-first).
probe_first = section(
    PROBE,
    opt("--probe-first/--no-probe-first", default=None, field="first",
        help="Probe the allocation first; a slow node stops the job (or, with --spares, "
             "is excluded) (default: the profile's scheduler.probe_first)."),
    opt("--probe-sizes", metavar="LIST", field="sizes",
        help=f"Message sizes of the probe (default {DEFAULT_SIZES})."),
    opt("--probe-slow-ratio", type=float, metavar="R", field="slow_ratio",
        help=f"Slow below R of the median node's best link (default {DEFAULT_SLOW_RATIO})."),
    part="probe_first")

# ---- Hang: the job's own watchdog.
hang = section(
    HANG,
    opt("--hang-timeout", "hang_timeout", metavar="SECONDS", field="timeout",
        help="No progress for SECONDS: the job dumps every rank's stack (py-spy), then "
             "acts (with or without --wait)."),
    opt("--hang-action", "hang_action", type=click.Choice(HANG_ACTIONS), field="action",
        help="After the diagnosis (default: cancel; relaunch with spares)."),
    part="hang")

# ---- Output: what the command prints and writes, and whether it follows the job.
OUTPUT_DECLS: dict[str, Decl] = {
    "dry_run": opt("--dry-run", is_flag=True,
                   help="Print what a submission submits; write and submit nothing."),
    # (the files part's)
    "run_dir": opt("--run-dir", "run_dir", type=click.Path(file_okay=False, path_type=Path),
                   part="files",
                   help="Run directory (must not exist yet; default: a new one under "
                        "$HPCDL_RUNS)."),
    "as_json": opt("--json", "as_json", is_flag=True, help="Machine-readable output."),
    "wait": opt("--wait", "-w", is_flag=True,
                help="Follow the job to its end; exit with its exit code."),
}


def output(*names: str, **overrides: Decl | str) -> Decorator:
    names = names or tuple(OUTPUT_DECLS)
    return section(OUTPUT, *with_(OUTPUT_DECLS, names, overrides), part="output")
