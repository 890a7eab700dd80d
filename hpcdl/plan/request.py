"""What the user asked for (``JobRequest``) and the checks that need no profile.

A request holds raw input (the CLI's strings); ``check_request`` refuses malformed
values with one line naming the field, the value and the limit. The plan built from it
holds the typed, checked values (hpcdl.plan.jobplan).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, cast

from hpcdl.core.tokens import (
    BIND,
    BIND_SOURCE,
    CONTROL,
    ENV_NAME,
    NAME,
    PATH,
    REQUEUE_SIGNAL,
    Kind,
    check_token,
)
from hpcdl.errors import ValidationError
from hpcdl.hang.actions import HANG_ACTIONS
from hpcdl.plan import rules
from hpcdl.plan.command import LaunchRequest
from hpcdl.plan.container import ContainerRequest
from hpcdl.plan.data import DataRequest
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


@dataclass(frozen=True)
class JobRequest:
    """What the user asked for, before any check. ``gpus`` is GPUs per node."""

    nodes: int = 1
    gpus: int = 0
    partition: str | None = None
    time: str | None = None
    cpus_per_task: int | None = None
    job_name: str | None = None
    image: str | None = None
    backend: str = "horovod"
    env: tuple[tuple[str, str], ...] = ()
    binds: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    data: str | None = None
    synthetic: bool = False  # the bundled example on generated data, whatever the profile says
    example_args: tuple[str, ...] = ()
    template: str | None = None
    run_dir: str | None = None
    launcher: str | None = None  # default: the profile's mpi.launcher
    no_image: bool = False  # run natively even when the profile names a default_image
    gpu_bind: str | None = None  # default: the profile's mpi.gpu_bind
    # Checkpoint on a signal and requeue (None: the profile's scheduler.requeue),
    # or a chain of N jobs (--dependency=afterany) for clusters that do not requeue.
    requeue: bool | None = None
    max_restarts: int | None = None
    signal: str | None = None  # SIG@LEAD; default: the profile's scheduler.requeue_signal
    chain: int = 1
    # The allreduce probe's worker arguments (hpcdl.probe.request.worker_args).
    # Without probe_first the probe is the job (`hpcdl probe`); with it, a first step
    # that stops the job on a bad node before COMMAND (`hpcdl submit --probe-first`).
    probe: tuple[str, ...] | None = None
    probe_first: bool = False

    # The hang watchdog of `submit --wait` (hpcdl.jobs.watchdog): seconds without
    # progress before it collects stacks, and what it does then (cancel, leave).
    hang_timeout: float | None = None
    hang_action: str | None = None
    # Copy the image to every node's local scratch with sbcast before the ranks start
    # (--stage-image); None: the profile's container.stage.
    stage_image: bool | None = None
    # Copy the packed --data file to every node's local scratch with sbcast (--stage-data).
    stage_data: bool = False
    # The user's code directory on this machine (submit --code), copied into the run
    # directory's code/ and the job started there: for a cluster reached over SSH.
    code_dir: str | None = None
    # Spare nodes beyond ``nodes`` in the allocation (--spares; None: the profile's
    # scheduler.spares): a failed node is replaced inside the job (hpcdl.launch.nodes).
    spares: int | None = None

    @cached_property
    def placement(self) -> PlacementRequest:
        """The placement part (hpcdl.plan.partition): nodes, GPUs, partition, time, CPUs,
        spares; made once per request (its --time is parsed once)."""
        return PlacementRequest(nodes=self.nodes, gpus=self.gpus, partition=self.partition,
                                time=self.time, cpus_per_task=self.cpus_per_task,
                                spares=self.spares, measures=self.probe_only)

    @property
    def time_seconds(self) -> float | None:
        """--time in seconds (the placement part's, parsed once)."""
        return self.placement.time_seconds

    @property
    def probe_only(self) -> bool:
        """The job is `hpcdl probe`: the probe worker instead of a COMMAND or example."""
        return self.probe is not None and not self.probe_first

    @property
    def runs_example(self) -> bool:
        """The job's command is the bundled example (no COMMAND, not a probe job)."""
        return not self.command and not self.probe_only

    @property
    def launch(self) -> LaunchRequest:
        """The launch part (hpcdl.plan.command): what every rank runs and how it starts."""
        return LaunchRequest(backend=self.backend, launcher=self.launcher,
                             gpu_bind=self.gpu_bind, env=self.env, command=self.command,
                             example_args=self.example_args, probe_only=self.probe_only)

    @property
    def probe_request(self) -> ProbeRequest:
        """The probe part (hpcdl.plan.probe): the worker's arguments, a first step or not."""
        return ProbeRequest(args=self.probe, first=self.probe_first)

    @property
    def files(self) -> FilesRequest:
        """The files part (hpcdl.plan.jobplan): job name, run directory, template, code."""
        return FilesRequest(job_name=self.job_name, run_dir=self.run_dir,
                            template=self.template, code_dir=self.code_dir)

    @property
    def container(self) -> ContainerRequest:
        """The container part (hpcdl.plan.container): the image, binds, staging."""
        return ContainerRequest(image=self.image, no_image=self.no_image, binds=self.binds,
                                stage=self.stage_image)

    @property
    def resilience(self) -> ResilienceRequest:
        """The resilience part (hpcdl.plan.resilience): requeue or chain."""
        return ResilienceRequest(requeue=self.requeue, max_restarts=self.max_restarts,
                                 signal=self.signal, chain=self.chain)

    @property
    def hang(self) -> HangRequest:
        """The hang part (hpcdl.plan.resilience): the watchdog's timeout and action."""
        return HangRequest(timeout=self.hang_timeout, action=self.hang_action)

    @property
    def dataset(self) -> DataRequest:
        """The data part (hpcdl.plan.data): --data, --synthetic, --stage-data and who
        reads the data (the probe, a COMMAND or the bundled example)."""
        return DataRequest(path=self.data, synthetic=self.synthetic, stage=self.stage_data,
                           reader=("probe" if self.probe_only else
                                   "command" if self.command else "example"))


def _fail(message: str) -> ValidationError:
    return ValidationError(message)


def _check(field_name: str, value: str, kind: Kind) -> None:
    try:
        check_token(value, kind)
    except ValueError as exc:
        raise _fail(f"{field_name}: {exc}") from exc


def _no_nul(field_name: str, value: str) -> None:
    # Free text is quoted wherever it lands, but no argv or environment can carry NUL.
    if "\0" in value:
        raise _fail(f"{field_name}: {value!r} holds a NUL character, which no command can take")


def check_request(req: JobRequest) -> None:
    """Malformed values, independent of any profile. Raises ValidationError."""
    if req.nodes < 1:
        raise _fail(f"nodes: must be at least 1 (got {req.nodes})")
    if req.gpus < 0:
        raise _fail(f"gpus: must be 0 or more GPUs per node (got {req.gpus})")
    if req.cpus_per_task is not None and req.cpus_per_task < 1:
        raise _fail(f"cpus-per-task: must be at least 1 (got {req.cpus_per_task})")
    if req.backend not in BACKENDS:
        raise _fail(f"backend: {req.backend!r} is not one of {', '.join(BACKENDS)}")
    if req.launcher is not None:
        launcher_for(req.launcher)  # refuses a name no launcher has
    if req.gpu_bind is not None and req.gpu_bind not in GPU_BINDS:
        raise _fail(f"gpu-bind: {req.gpu_bind!r} is not one of {', '.join(GPU_BINDS)}")
    if req.image and req.no_image:
        raise _fail(f"no-image: --no-image and --image {req.image!r} exclude each other")
    if req.time is not None:
        try:
            req.time_seconds  # noqa: B018 (parses --time: raises ValueError)
        except ValueError as exc:
            raise _fail(f"time: {exc}") from exc
    if req.job_name is not None:
        if not req.job_name.strip():
            raise _fail("job-name: must not be empty")
        if CONTROL.search(req.job_name):
            raise _fail(
                f"job-name: control characters (newline, tab) cannot be part of a job "
                f"name (got {req.job_name!r})"
            )
    if req.partition is not None:
        _check("partition", req.partition, NAME)
    for name, path in (("image", req.image), ("data", req.data), ("template", req.template)):
        if path is not None:
            _check(name, path, PATH)
    if req.run_dir is not None:  # bound into the container (and its job/ at /hpcdl)
        _check("run-dir", req.run_dir, BIND_SOURCE)
    for key, value in req.env:
        if not ENV_NAME.pattern or not ENV_NAME.pattern.fullmatch(key):
            raise _fail(f"env: {key!r} is not a valid variable name (use KEY=VALUE)")
        _no_nul(f"env {key}", value)
    for arg in req.command:
        _no_nul("command", arg)
    if req.probe is not None:
        rules.probe_nodes(req.nodes, req.spares, probe_first=req.probe_first)
        for arg in req.probe:
            _no_nul("probe", arg)
        rules.example_args_not_for_probe(req.example_args, probe_only=req.probe_only)
    elif req.probe_first:
        raise _fail("probe-first: no probe arguments in the request")
    for arg in req.example_args:
        _no_nul("example-arg", arg)
    rules.example_args_not_for_command(req.example_args, req.command)
    if req.signal is not None:
        _check("signal", req.signal, REQUEUE_SIGNAL)
    if req.max_restarts is not None and req.max_restarts < 0:
        raise _fail(f"max-restarts: must be 0 or more (got {req.max_restarts})")
    if req.chain < 1:
        raise _fail(f"chain: must be at least 1 job (got {req.chain})")
    if req.spares is not None and req.spares < 0:
        raise _fail(f"spares: must be 0 or more spare nodes (got {req.spares})")
    rules.spares_for_training(req.spares, probe_only=req.probe_only, chain=req.chain)
    if req.chain > 1 and req.requeue:
        raise _fail(f"chain: --chain {req.chain} is for clusters without requeue; "
                    f"it excludes --requeue")
    _check_hang(req)
    if req.synthetic and req.data:
        raise _fail(f"synthetic: --synthetic and --data {req.data!r} exclude each other")
    for bind in req.binds:
        try:
            check_token(bind, BIND)
        except ValueError as exc:
            raise _fail(f"bind: {bind!r} is not SRC[:DST] (no commas, no control characters)") from exc


def _check_hang(req: JobRequest) -> None:
    """--hang-timeout / --hang-action. Raises ValidationError."""
    if req.hang_timeout is None:
        if req.hang_action is not None:
            raise _fail(f"hang-action: {req.hang_action!r} needs --hang-timeout SECONDS")
        return
    if not req.hang_timeout > 0 or math.isinf(req.hang_timeout):
        raise _fail(f"hang-timeout: must be more than 0 seconds (got {req.hang_timeout:g})")
    if req.hang_action is not None and req.hang_action not in HANG_ACTIONS:
        raise _fail(f"hang-action: {req.hang_action!r} is not one of {', '.join(HANG_ACTIONS)}")
    rules.hang_follows_one_job(req.chain)
