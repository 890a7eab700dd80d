"""What the user asked for (``JobRequest``) and the checks that need no profile.

A request holds raw input (the CLI's strings); ``check_request`` refuses malformed
values with one line naming the field, the value and the limit. The plan built from it
holds the typed, checked values (hpcdl.plan.jobplan).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from hpcdl.core.tokens import (
    BIND,
    BIND_SOURCE,
    CONTROL,
    ENV_NAME,
    PATH,
    REQUEUE_SIGNAL,
    check_field,
    check_token,
)
from hpcdl.errors import ValidationError
from hpcdl.hang.actions import HANG_ACTIONS
from hpcdl.plan import rules
from hpcdl.plan.command import LaunchRequest
from hpcdl.plan.container import ContainerRequest
from hpcdl.plan.data import DataRequest, Reader
from hpcdl.plan.jobplan import FilesRequest
from hpcdl.plan.partition import PlacementRequest
from hpcdl.plan.probe import ProbeRequest
from hpcdl.plan.resilience import HangRequest, ResilienceRequest
from hpcdl.profiles.schema import Backend, GpuBind, Launcher
from hpcdl.schedulers.launchers import REGISTRY, launcher_for

# How the container runtime runs here (hpcdl.container.runtime detects it on the host).
RuntimeMode = Literal["setuid", "unprivileged", "root"]
# The values a request may name, in the order errors and --help list them.
BACKENDS: tuple[Backend, ...] = ("horovod", "ddp")
# Every registered launcher (hpcdl.schedulers.launchers), in its order.
LAUNCHERS = cast(tuple[Launcher, ...], tuple(REGISTRY))
GPU_BINDS: tuple[GpuBind, ...] = ("none", "local-rank")


# Which part each flat field of ``JobRequest.of`` goes to, and its name there.
FLAT_FIELDS: dict[str, tuple[str, str]] = {
    "nodes": ("placement", "nodes"), "gpus": ("placement", "gpus"),
    "partition": ("placement", "partition"), "time": ("placement", "time"),
    "cpus_per_task": ("placement", "cpus_per_task"), "spares": ("placement", "spares"),
    "image": ("container", "image"), "no_image": ("container", "no_image"),
    "binds": ("container", "binds"), "stage_image": ("container", "stage"),
    "data": ("data", "path"), "synthetic": ("data", "synthetic"),
    "stage_data": ("data", "stage"),
    "backend": ("launch", "backend"), "launcher": ("launch", "launcher"),
    "gpu_bind": ("launch", "gpu_bind"), "env": ("launch", "env"),
    "command": ("launch", "command"), "example_args": ("launch", "example_args"),
    "requeue": ("resilience", "requeue"), "max_restarts": ("resilience", "max_restarts"),
    "signal": ("resilience", "signal"), "chain": ("resilience", "chain"),
    "hang_timeout": ("hang", "timeout"), "hang_action": ("hang", "action"),
    "probe": ("probe", "args"), "probe_first": ("probe", "first"),
    "job_name": ("files", "job_name"), "run_dir": ("files", "run_dir"),
    "template": ("files", "template"), "code_dir": ("files", "code_dir"),
}
_PARTS = {"placement": PlacementRequest, "container": ContainerRequest, "data": DataRequest,
          "launch": LaunchRequest, "resilience": ResilienceRequest, "hang": HangRequest,
          "probe": ProbeRequest, "files": FilesRequest}


@dataclass(frozen=True)
class JobRequest:
    """What the user asked for, before any check: one part per part of the plan
    (hpcdl.plan.jobplan.JobPlan), each planned by its own module. The CLI builds each
    part from its options (hpcdl.cli.options); ``of`` builds them from flat fields."""

    placement: PlacementRequest = field(default_factory=PlacementRequest)
    container: ContainerRequest = field(default_factory=ContainerRequest)
    data: DataRequest = field(default_factory=DataRequest)
    launch: LaunchRequest = field(default_factory=LaunchRequest)
    resilience: ResilienceRequest = field(default_factory=ResilienceRequest)
    hang: HangRequest = field(default_factory=HangRequest)
    # The allreduce probe's worker arguments (hpcdl.probe.request.worker_args).
    # Without ``first`` the probe is the job (`hpcdl probe`); with it, a first step
    # that stops the job on a bad node before COMMAND (`hpcdl submit --probe-first`).
    probe: ProbeRequest = field(default_factory=ProbeRequest)
    files: FilesRequest = field(default_factory=FilesRequest)

    def __post_init__(self) -> None:
        # The facts one part takes from another, set here once: whether the job is the
        # probe (the placement then adds no spares, the launch runs the worker) and who
        # reads the dataset (the probe, a COMMAND or the bundled example).
        probe_only = self.probe.args is not None and not self.probe.first
        reader: Reader = ("probe" if probe_only else
                          "command" if self.launch.command else "example")
        for name, part, value in (("placement", self.placement, {"measures": probe_only}),
                                  ("launch", self.launch, {"probe_only": probe_only}),
                                  ("data", self.data, {"reader": reader})):
            if any(getattr(part, key) != given for key, given in value.items()):
                object.__setattr__(self, name, replace(part, **value))

    @classmethod
    def of(cls, **flat: Any) -> JobRequest:
        """A request from flat fields (nodes=2, image=..., probe=ARGS, ...), each routed
        to its part (``FLAT_FIELDS``): a shorthand for tests, benchmarks and scripts."""
        return cls(**{part: _PARTS[part](**fields) for part, fields in _route(flat).items()})

    def amended(self, **flat: Any) -> JobRequest:
        """This request with flat fields replaced in their parts (as ``of`` takes them)."""
        return replace(self, **{part: replace(getattr(self, part), **fields)
                                for part, fields in _route(flat).items()})

    @property
    def probe_only(self) -> bool:
        """The job is `hpcdl probe`: the probe worker instead of a COMMAND or example."""
        return self.launch.probe_only

    @property
    def runs_example(self) -> bool:
        """The job's command is the bundled example (no COMMAND, not a probe job)."""
        return not self.launch.command and not self.probe_only


def _route(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Flat fields grouped by the part each goes to, under its name there (KeyError: no
    such field)."""
    parts: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        part, name = FLAT_FIELDS[key]
        parts.setdefault(part, {})[name] = value
    return parts


def _fail(message: str) -> ValidationError:
    return ValidationError(message)


def _no_nul(field_name: str, value: str) -> None:
    # Free text is quoted wherever it lands, but no argv or environment can carry NUL.
    if "\0" in value:
        raise _fail(f"{field_name}: {value!r} holds a NUL character, which no command can take")


def check_request(req: JobRequest) -> None:
    """Malformed values, independent of any profile, in the order the refusals have
    always come (the first broken rule is the one named). Raises ValidationError."""
    place, cont, launch, files, res = (req.placement, req.container, req.launch, req.files,
                                       req.resilience)
    # Each part's own checks are its module's (hpcdl.plan.partition, hpcdl.plan.data),
    # called here in the order the refusals have always come.
    place.check_sizes()
    if launch.backend not in BACKENDS:
        raise _fail(f"backend: {launch.backend!r} is not one of {', '.join(BACKENDS)}")
    if launch.launcher is not None:
        launcher_for(launch.launcher)  # refuses a name no launcher has
    if launch.gpu_bind is not None and launch.gpu_bind not in GPU_BINDS:
        raise _fail(f"gpu-bind: {launch.gpu_bind!r} is not one of {', '.join(GPU_BINDS)}")
    if cont.image and cont.no_image:
        raise _fail(f"no-image: --no-image and --image {cont.image!r} exclude each other")
    place.check_time()
    if files.job_name is not None:
        if not files.job_name.strip():
            raise _fail("job-name: must not be empty")
        if CONTROL.search(files.job_name):
            raise _fail(
                f"job-name: control characters (newline, tab) cannot be part of a job "
                f"name (got {files.job_name!r})"
            )
    place.check_partition()
    if cont.image is not None:
        check_field("image", cont.image, PATH)
    req.data.check_path()  # the data part's own checks are its (hpcdl.plan.data)
    if files.template is not None:
        check_field("template", files.template, PATH)
    if files.run_dir is not None:  # bound into the container (and its job/ at /hpcdl)
        check_field("run-dir", files.run_dir, BIND_SOURCE)
    for key, value in launch.env:
        if not ENV_NAME.pattern or not ENV_NAME.pattern.fullmatch(key):
            raise _fail(f"env: {key!r} is not a valid variable name (use KEY=VALUE)")
        _no_nul(f"env {key}", value)
    for arg in launch.command:
        _no_nul("command", arg)
    if req.probe.args is not None:
        rules.probe_nodes(place, probe_first=req.probe.first)
        for arg in req.probe.args:
            _no_nul("probe", arg)
        rules.example_args_not_for_probe(launch.example_args, probe_only=req.probe_only)
    elif req.probe.first:
        raise _fail("probe-first: no probe arguments in the request")
    for arg in launch.example_args:
        _no_nul("example-arg", arg)
    rules.example_args_not_for_command(launch.example_args, launch.command)
    if res.signal is not None:
        check_field("signal", res.signal, REQUEUE_SIGNAL)
    if res.max_restarts is not None and res.max_restarts < 0:
        raise _fail(f"max-restarts: must be 0 or more (got {res.max_restarts})")
    if res.chain < 1:
        raise _fail(f"chain: must be at least 1 job (got {res.chain})")
    place.check_spares()
    rules.spares_for_training(place, probe_only=req.probe_only, chain=res.chain)
    if res.chain > 1 and res.requeue:
        raise _fail(f"chain: --chain {res.chain} is for clusters without requeue; "
                    f"it excludes --requeue")
    _check_hang(req.hang, res.chain)
    req.data.check_alone()
    for bind in cont.binds:
        try:
            check_token(bind, BIND)
        except ValueError as exc:
            raise _fail(f"bind: {bind!r} is not SRC[:DST] (no commas, no control characters)") from exc


def _check_hang(hang: HangRequest, chain: int) -> None:
    """--hang-timeout / --hang-action. Raises ValidationError."""
    if hang.timeout is None:
        if hang.action is not None:
            raise _fail(f"hang-action: {hang.action!r} needs --hang-timeout SECONDS")
        return
    if not hang.timeout > 0 or math.isinf(hang.timeout):
        raise _fail(f"hang-timeout: must be more than 0 seconds (got {hang.timeout:g})")
    if hang.action is not None and hang.action not in HANG_ACTIONS:
        raise _fail(f"hang-action: {hang.action!r} is not one of {', '.join(HANG_ACTIONS)}")
    rules.hang_follows_one_job(chain)
