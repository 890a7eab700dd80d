"""A user's request, checked against a cluster profile, becomes a frozen JobPlan.

``build_plan`` is pure: it decides everything (partition, tasks, CPUs, time,
the launch argv and the rendered script) and raises ValidationError naming the
field, the value and the limit before anything is written or submitted.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any, Literal

from hpcdl import __version__
from hpcdl.errors import ValidationError
from hpcdl.gpuarch import ImageArchFacts, check_partition
from hpcdl.hang import DEFAULT_HANG_ACTION, HANG_ACTIONS
from hpcdl.jobside import JOB_DIR_NAME, job_dir, job_side_files
from hpcdl.launch.rankenv import (
    PORT_LISTENED,
    PORT_PICK_FILE,
    RANK_ENV_FILE,
    SCRIPT_VARIABLE,
    WRAPPER_NAME,
    port_pick_file,
    port_pick_lines,
    rank_env_file,
    rank_env_script,
)
from hpcdl.launch.world import PORT_BASE, PORT_SPAN
from hpcdl.profiles.schema import Partition, Profile
from hpcdl.requeue import (
    CHECKPOINT_ENV,
    EXIT_REQUEUE,
    FLAG_ENV,
    FLAG_NAME,
    PROGRESS_ENV,
    PROGRESS_NAME,
    wait_seconds,
)
from hpcdl.resources import PACKAGE_DIR, examples_dir
from hpcdl.schedulers.pbs import script as pbs
from hpcdl.slurmtime import format_time, parse_time
from hpcdl.templating import Raw, render_template, shell_join
from hpcdl.tokens import (
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

# Values Slurm's #SBATCH parser takes as they are; others go in double quotes.
_PLAIN_SBATCH = re.compile(r"[A-Za-z0-9_.,:@%+=/\-]+")

Backend = Literal["horovod", "ddp"]
# How the container runtime runs here (hpcdl.container.runtime detects it on the host).
RuntimeMode = Literal["setuid", "unprivileged", "root"]
# Unprivileged Apptainer puts each rank in its own user namespace. There Open MPI's
# single-copy transfer between ranks of a node (CMA, process_vm_readv) fails, and Horovod
# hangs in its first broadcast: ranks copy through shared memory instead. And PMIx's
# shared-memory datastore (gds ds12, locks made by slurmstepd) fails on every rank with
# "PMIX ERROR ... gds_ds12_lock_pthread.c": its hash datastore needs no shared lock.
UNPRIVILEGED_MPI_ENV: tuple[tuple[str, str], ...] = (
    ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
    ("PMIX_MCA_gds", "hash"),
)
BACKENDS: tuple[str, ...] = ("horovod", "ddp")
LAUNCHERS: tuple[str, ...] = ("srun", "torchrun", "mpirun", "horovodrun")
GPU_BINDS: tuple[str, ...] = ("none", "local-rank")

# Where a job sees the bundled examples and the stdlib-only hpcdl modules they import
# (hpcdl.errors, hpcdl.launch.world, hpcdl.data.imagefolder): staged into the run
# directory (hpcdl.jobside) and bound read-only from there at job time (from the
# installed hpcdl when the plan has no run directory), so the examples run in any image
# (a site's NGC image has no copy
# of hpcdl; images built from containers/*.yaml carry one in /opt/hpcdl) and always
# match the hpcdl that rendered the job.
JOB_PROJECT_DIR = PurePosixPath("/hpcdl")
DEFAULT_EXAMPLE = "resnet50_imagenet.py"


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
    # Issue 15: checkpoint on a signal and requeue (None: the profile's scheduler.requeue),
    # or a chain of N jobs (--dependency=afterany) for clusters that do not requeue.
    requeue: bool | None = None
    max_restarts: int | None = None
    signal: str | None = None  # SIG@LEAD; default: the profile's scheduler.requeue_signal
    chain: int = 1
    # Issue 18: the allreduce probe's worker arguments (hpcdl.probe.request.worker_args).
    # Without probe_first the probe is the job (`hpcdl probe`); with it, a first step
    # that stops the job on a bad node before COMMAND (`hpcdl submit --probe-first`).
    probe: tuple[str, ...] | None = None
    probe_first: bool = False

    # Issue 18: the hang watchdog of `submit --wait` (hpcdl.watchdog): seconds without
    # progress before it collects stacks, and what it does then (cancel, leave).
    hang_timeout: float | None = None
    hang_action: str | None = None
    # Copy the image to every node's local scratch with sbcast before the ranks start
    # (--stage-image); None: the profile's container.stage.
    stage_image: bool | None = None

    @property
    def probe_only(self) -> bool:
        """The job is `hpcdl probe`: the probe worker instead of a COMMAND or example."""
        return self.probe is not None and not self.probe_first

    @property
    def runs_example(self) -> bool:
        """The job's command is the bundled example (no COMMAND, not a probe job)."""
        return not self.command and not self.probe_only


@dataclass(frozen=True)
class JobPlan:
    """Everything decided about one job; ``script`` is exactly what gets submitted."""

    profile: str
    cluster_type: str
    partition: str
    partition_reason: str
    nodes: int
    gpus_per_node: int
    tasks_per_node: int
    ntasks: int
    cpus_per_task: int
    time: str
    job_name: str
    backend: str
    image: str | None
    env: tuple[tuple[str, str], ...]
    binds: tuple[str, ...]
    command: tuple[str, ...]
    launch_line: str
    output: str
    error: str
    run_dir: str | None
    script: str
    warnings: tuple[str, ...] = field(default=())
    # The profile's defaults for the bundled example that are on its command line
    # (those a -X did not replace); empty for a custom COMMAND.
    example_defaults: tuple[str, ...] = field(default=())
    launcher: str = "srun"
    gpu_bind: str = "none"
    image_source: str | None = None  # "--image" or "profile default_image"
    master_addr: str = ""  # as the script sets it (a shell expression when derived)
    master_port: str = ""
    # Requeue: the job checkpoints on ``signal`` (SIG@LEAD) and requeues itself
    # up to ``max_restarts`` times; ``chain`` > 1: that many jobs resume one another.
    requeue: bool = False
    max_restarts: int = 0
    signal: str | None = None
    chain: int = 1
    probe: tuple[str, ...] | None = None
    probe_first: bool = False
    probe_line: str | None = None  # the --probe-first step, as the script runs it
    hang_timeout: float | None = None  # the watchdog's silence limit (s); None: no watchdog
    hang_action: str | None = None  # cancel or leave
    # Files copied into RUN_DIR/job at submission (hpcdl.jobside), relative to it.
    job_files: tuple[str, ...] = ()
    # Files rendered for this job and written into RUN_DIR/job at submission, executable:
    # (path relative to job/, text). The script runs them (the rank wrapper, the port pick).
    job_scripts: tuple[tuple[str, str], ...] = ()
    container_mode: str | None = None  # RuntimeMode of an image run, when it was known
    # The command creates $HPCDL_PROGRESS_FILE after its first step (the bundled example;
    # any command under --requeue/--chain, by the contract): no file means no step.
    records_steps: bool = False
    # Image staging: "sbcast" (each node's copy, where the ranks run it from) or "none";
    # staged_image is the copy's path as the script names it (holds $SLURM_JOB_ID).
    stage: str = "none"
    staged_image: str | None = None
    hpcdl_version: str = __version__

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["env"] = dict(self.env)
        data["binds"] = list(self.binds)
        data["command"] = list(self.command)
        data["warnings"] = list(self.warnings)
        data["example_defaults"] = list(self.example_defaults)
        data["probe"] = None if self.probe is None else list(self.probe)
        data["job_files"] = list(self.job_files)
        data["job_scripts"] = dict(self.job_scripts)
        return data

    def job_script_paths(self) -> list[tuple[str, str]]:
        """(path as the script names it, text) of each of ``job_scripts``: in the run
        directory's job/, or without one (a dry run's preview) in ./job/ beside the logs."""
        return [(job_script_path(self.run_dir, rel), text) for rel, text in self.job_scripts]


def job_script_path(run_dir: str | None, rel: str) -> str:
    """Where the job finds its job-side file ``rel`` (relative to job/): in the run
    directory, or relative to where sbatch runs the script when the plan has none."""
    return f"{job_dir(run_dir) if run_dir else './' + JOB_DIR_NAME}/{rel}"


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
    if req.launcher is not None and req.launcher not in LAUNCHERS:
        raise _fail(f"launcher: {req.launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if req.gpu_bind is not None and req.gpu_bind not in GPU_BINDS:
        raise _fail(f"gpu-bind: {req.gpu_bind!r} is not one of {', '.join(GPU_BINDS)}")
    if req.image and req.no_image:
        raise _fail(f"no-image: --no-image and --image {req.image!r} exclude each other")
    if req.time is not None:
        try:
            parse_time(req.time)
        except ValueError as exc:
            raise _fail(f"time: {exc}") from exc
    if req.job_name is not None:
        if not req.job_name.strip():
            raise _fail("job-name: must not be empty")
        if CONTROL.search(req.job_name):
            raise _fail(
                f"job-name: control characters (newline, tab) cannot be part of a Slurm job "
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
        from hpcdl.probe.request import check_nodes

        check_nodes(req.nodes)
        for arg in req.probe:
            _no_nul("probe", arg)
        if req.probe_only and req.example_args:
            raise _fail("example-arg: applies to the bundled example, not to the probe")
    elif req.probe_first:
        raise _fail("probe-first: no probe arguments in the request")
    for arg in req.example_args:
        _no_nul("example-arg", arg)
    if req.example_args and req.command:
        raise _fail("example-arg: only applies to the bundled example, not to a COMMAND")
    if req.signal is not None:
        _check("signal", req.signal, REQUEUE_SIGNAL)
    if req.max_restarts is not None and req.max_restarts < 0:
        raise _fail(f"max-restarts: must be 0 or more (got {req.max_restarts})")
    if req.chain < 1:
        raise _fail(f"chain: must be at least 1 job (got {req.chain})")
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
    if req.chain > 1:
        raise _fail(f"hang-timeout: the watchdog follows one job; --chain {req.chain} "
                    f"submits {req.chain}")


def _requested_seconds(req: JobRequest) -> float | None:
    """The requested time in seconds: None when none was asked for, ``math.inf`` for
    'infinite'/'UNLIMITED' (which a partition with a time limit cannot take)."""
    if not req.time:
        return None
    seconds = parse_time(req.time)
    return math.inf if seconds is None else seconds


def _problems(part: Partition, req: JobRequest, cpus_per_task: int, seconds: float | None) -> list[str]:
    """Every limit of ``part`` the request breaks, as 'field: value vs limit' lines."""
    out = []
    if req.gpus > part.gpus_per_node:
        out.append(
            f"gpus: {req.gpus} GPUs per node exceeds partition {part.name}'s "
            f"{part.gpus_per_node} GPUs per node"
        )
    if req.nodes > part.node_limit:
        out.append(
            f"nodes: {req.nodes} exceeds partition {part.name}'s limit of "
            f"{part.node_limit} nodes per job"
        )
    limit = part.max_seconds
    if seconds is not None and limit is not None and seconds > limit:
        shown = "infinite" if math.isinf(seconds) else format_time(int(seconds))
        out.append(f"time: {shown} exceeds partition {part.name}'s max time {part.max_time}")
    tasks = tasks_per_node(req.gpus)
    if cpus_per_task * tasks > part.cpus_per_node:
        out.append(
            f"cpus-per-task: {cpus_per_task} x {tasks} tasks per node = {cpus_per_task * tasks} "
            f"exceeds partition {part.name}'s {part.cpus_per_node} CPUs per node"
        )
    total_gpus = req.nodes * req.gpus
    if part.max_gpus_per_user is not None and total_gpus > part.max_gpus_per_user:
        out.append(
            f"gpus: {req.nodes} nodes x {req.gpus} GPUs = {total_gpus} exceeds partition "
            f"{part.name}'s per-user limit of {part.max_gpus_per_user} GPUs"
        )
    return out


def tasks_per_node(gpus: int) -> int:
    """One rank per GPU; a CPU-only job runs one rank per node."""
    return max(gpus, 1)


def default_cpus_per_task(part: Partition, gpus: int) -> int:
    """The node's CPUs shared evenly between its GPUs (ZIH's rule: maxCPUs / #GPUs)."""
    share = part.cpus_per_node // max(part.gpus_per_node, 1)
    return max(1, min(share, part.cpus_per_node // tasks_per_node(gpus)))


def _size_key(part: Partition, order: int) -> tuple[int, int, int, int, int]:
    return (part.gpus_per_node, part.cpus_per_node, part.nodes, 0 if part.default else 1, order)


def choose_partition(profile: Profile, req: JobRequest) -> tuple[Partition, str]:
    """The requested partition, or the smallest that fits. Raises ValidationError."""
    seconds = _requested_seconds(req)

    def cpt(part: Partition) -> int:
        return req.cpus_per_task or default_cpus_per_task(part, req.gpus)

    fits = [
        p for p in profile.partitions if not _problems(p, req, cpt(p), seconds)
    ]
    fit_names = ", ".join(p.name for p in fits) or "none"
    if req.partition is not None:
        part = profile.partition(req.partition)
        if part is None:
            names = ", ".join(p.name for p in profile.partitions)
            raise _fail(
                f"partition: {req.partition!r} is not a partition of profile {profile.name} "
                f"(partitions: {names})"
            )
        problems = _problems(part, req, cpt(part), seconds)
        if problems:
            raise _fail(f"{problems[0]} (partitions that fit: {fit_names})")
        return part, "requested"
    if not fits:
        most = max(p.gpus_per_node for p in profile.partitions)
        if req.gpus > most:
            largest = [p.name for p in profile.partitions if p.gpus_per_node == most]
            where = f"partition{'s' if len(largest) > 1 else ''} {', '.join(largest)}"
            raise _fail(
                f"gpus: {req.gpus} GPUs per node exceeds the largest nodes of profile "
                f"{profile.name}, {most} GPUs per node ({where})"
            )
        ranked = sorted(
            enumerate(profile.partitions),
            key=lambda ip: (len(_problems(ip[1], req, cpt(ip[1]), seconds)),
                        -ip[1].node_limit, -ip[1].gpus_per_node),
        )
        closest = ranked[0][1]
        first = _problems(closest, req, cpt(closest), seconds)[0]
        raise _fail(f"{first} (no partition of profile {profile.name} fits; partitions that fit: none)")
    order = {p.name: i for i, p in enumerate(profile.partitions)}
    best = min(fits, key=lambda p: _size_key(p, order[p.name]))
    return best, f"smallest partition that fits (candidates: {fit_names})"


def job_time(profile: Profile, part: Partition, req: JobRequest) -> str:
    if req.time:
        return format_time(parse_time(req.time))
    default = parse_time(profile.scheduler.default_time)
    limit = part.max_seconds
    if default is not None and limit is not None and default > limit:
        default = limit
    return format_time(default)


def _option_name(arg: str) -> str | None:
    """``--lr`` for "--lr" and "--lr=0.1"; None for a value ("0.1")."""
    return arg.split("=", 1)[0] if arg.startswith("--") else None


def example_defaults(profile: Profile, req: JobRequest,
                     example: str = DEFAULT_EXAMPLE) -> tuple[str, ...]:
    """The profile's default arguments for the bundled ``example`` that stay on its
    command line: ``examples.args``, then ``examples.per_example[example]`` (which
    replaces an option args also sets), minus every option the user's -X sets again.

    Dropping them, rather than relying on argparse's "the last one wins", keeps the
    launch line honest and also lets -X replace a flag default. Empty for a COMMAND
    and for a probe job.
    """
    if not req.runs_example:
        return ()
    per_example = tuple(profile.examples.per_example.get(example, ()))
    specific = {_option_name(a) for a in per_example}
    shared = tuple(a for a in profile.examples.args if _option_name(a) not in specific)
    user = {_option_name(a) for a in req.example_args}
    return tuple(a for a in shared + per_example if _option_name(a) not in user)


def _default_command(profile: Profile, req: JobRequest) -> list[str]:
    image = job_image(profile, req)[0]
    base = (JOB_PROJECT_DIR / "examples" if image else
            PurePosixPath(job_dir(req.run_dir)) / "examples" if req.run_dir else examples_dir())
    cmd = [profile.python, str(base / DEFAULT_EXAMPLE), "--backend", req.backend]
    data = None if req.synthetic else req.data or profile.paths.imagenet
    cmd += ["--data", data] if data else ["--synthetic"]
    if req.run_dir:  # checkpoints belong with the run that wrote them
        cmd += ["--checkpoint-dir", f"{req.run_dir}/checkpoints"]
    if _requeue_mode(profile, req):  # every attempt continues where the last one stopped
        cmd += ["--resume"]
    # The user's -X last: after the profile's defaults, so argparse's "last one wins"
    # agrees with example_defaults() having dropped the defaults they replace.
    return cmd + list(example_defaults(profile, req)) + list(req.example_args)


def _probe_command(profile: Profile, req: JobRequest, image: str | None) -> list[str]:
    """The probe worker with its arguments (``req.probe``), where the job sees it."""
    from hpcdl.probe.request import worker_path

    package = job_dir(req.run_dir) + "/hpcdl" if req.run_dir else str(PACKAGE_DIR)
    return [profile.python, worker_path(bool(image), package, JOB_PROJECT_DIR),
            *(req.probe or ())]


def job_image(profile: Profile, req: JobRequest) -> tuple[str | None, str | None]:
    """The image the ranks run in and where it came from (``--image`` or the profile's
    ``container.default_image``); (None, None) for a native run."""
    if req.image:
        return req.image, "--image"
    if req.no_image or not profile.container.default_image:
        return None, None
    return profile.container.default_image, "profile default_image"


_PYTHON = re.compile(r"python[0-9.]*")


def _torchrun_tokens(profile: Profile, req: JobRequest, command: list[str]) -> list[str]:
    """``python -m torch.distributed.run`` (= torchrun, without relying on its entry point
    being on PATH) for one node; ``--no-python`` runs COMMAND as given in each worker."""
    python = command[0] if _PYTHON.fullmatch(PurePosixPath(command[0]).name) else profile.python
    return [python, "-m", "torch.distributed.run", f"--nnodes={req.nodes}",
            f"--nproc-per-node={tasks_per_node(req.gpus)}", "--rdzv-backend=c10d",
            Raw('--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"'), Raw('--rdzv-id="$SLURM_JOB_ID"'),
            "--no-python"]


def _launcher_tokens(profile: Profile, req: JobRequest, launcher: str,
                     cpus_per_task: int) -> list[str]:
    """The Slurm launcher that starts the ranks (or one torchrun agent per node)."""
    if launcher in ("srun", "torchrun"):
        # --label prefixes every output line with its task id, so a crash can be
        # traced to the rank that printed it (see hpcdl.results).
        tokens: list[str] = [Raw("srun"), Raw("--label")]
        # One crashed rank ends the step: without this the other ranks wait in their
        # next collective until the time limit (the classic "my job hangs").
        tokens.append(Raw("--kill-on-bad-exit=1"))
        if launcher == "torchrun":
            # One torchrun per node, with the CPUs of all the ranks it starts.
            tasks = tasks_per_node(req.gpus)
            tokens += [Raw(f"--nodes={req.nodes}"), Raw(f"--ntasks={req.nodes}"),
                       Raw("--ntasks-per-node=1"), Raw(f"--cpus-per-task={cpus_per_task * tasks}")]
        elif profile.mpi.srun_mpi:
            tokens.append(Raw(f"--mpi={profile.mpi.srun_mpi}"))
        return tokens
    if launcher == "mpirun":
        return [Raw("mpirun"), Raw("-np"), Raw('"$SLURM_NTASKS"')]
    # horovodrun: needs the host list, written by the script into $HPCDL_HOSTFILE
    return [Raw("horovodrun"), Raw("-np"), Raw('"$SLURM_NTASKS"'),
            Raw("--hostfile"), Raw('"$HPCDL_HOSTFILE"')]


def _rank_tokens(profile: Profile, req: JobRequest, command: list[str], launcher: str,
                 image: str | None) -> list[str]:
    """What the launcher starts on every rank: the container (if any), the rank-env
    wrapper (a file of the run under Slurm, inline in the PBS script), torchrun (if it is
    the launcher) and the command."""
    tokens: list[str] = []
    if image:
        runtime = profile.container.binary or profile.container.runtime
        tokens += [runtime, "exec"]
        if profile.container.nv:
            tokens.append("--nv")
        for bind in _container_binds(profile, req):
            tokens += ["-B", bind]
        if not req.command:
            tokens += ["--env", f"PYTHONPATH={JOB_PROJECT_DIR}"]
        tokens.append(image)
    # Every rank (or torchrun agent) starts through the rank-env wrapper. Under Slurm it is
    # a file of the run, seen at the same path in a container (the run directory is bound)
    # or read from ./job without a run directory. A PBS script carries it in a variable;
    # ${...:?}: a custom template that does not define it fails loudly instead of running
    # `sh -c ""` (nothing) successfully.
    if profile.scheduler.type == "pbs":
        tokens += [Raw("/bin/sh"), Raw("-c"), Raw(f'"${{{SCRIPT_VARIABLE}:?}}"'), Raw(WRAPPER_NAME)]
    else:
        tokens += [Raw("/bin/sh"), job_script_path(req.run_dir, RANK_ENV_FILE)]
    if launcher == "torchrun":
        tokens += _torchrun_tokens(profile, req, command)
    return tokens + command


def _container_binds(profile: Profile, req: JobRequest) -> list[str]:
    """Every -B of an image run, in order: the site's, node-local scratch (where
    --stage-to copies), the user's, the run directory (logs and checkpoints: the ranks
    must see it) and the job-side files."""
    scratch = profile.paths.local_scratch
    site = [*profile.container.binds,
            *([scratch] if scratch and scratch not in profile.container.binds else [])]
    return [*site, *req.binds, *([req.run_dir] if req.run_dir else []), *_project_binds(req)]


def _project_binds(req: JobRequest) -> list[str]:
    """The read-only bind that brings the bundled examples (and the hpcdl modules they
    import, or the probe worker) into the container: the run directory's staged copy, or
    without a run directory the installed hpcdl's files; none for a user's COMMAND."""
    if req.command:
        return []
    if req.run_dir:
        return [f"{job_dir(req.run_dir)}:{JOB_PROJECT_DIR}:ro"]
    return [f"{examples_dir()}:{JOB_PROJECT_DIR}/examples:ro",
            f"{PACKAGE_DIR}:{JOB_PROJECT_DIR}/hpcdl:ro"]


# How many ports after the derived MASTER_PORT the batch shell tries when that one is
# taken on the first node (a service, another job): enough for any real node.
PORT_TRIES = 64


def master_values(env: tuple[tuple[str, str], ...],
                  scheduler: str = "slurm") -> tuple[str | None, str | None]:
    """Shell expressions for MASTER_ADDR and MASTER_PORT, None where the profile or
    --env sets the variable (an explicit value wins).

    MASTER_ADDR: the first node of the allocation (the batch shell runs there; the name
    resolves on real clusters). MASTER_PORT: PORT_BASE + job id % PORT_SPAN, so jobs
    sharing a node use different ports (the same rule as hpcdl.launch.world). PBS names
    the nodes in $PBS_NODEFILE and the job id with its server ("123.server").
    """
    names = {k for k, _ in env}
    if scheduler == "pbs":
        first, job_id = '"$(head -n 1 "$PBS_NODEFILE")"', "${PBS_JOBID%%.*}"
    else:
        first, job_id = '"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"', "SLURM_JOB_ID"
    addr = None if "MASTER_ADDR" in names else first
    port = None if "MASTER_PORT" in names else f"$(({PORT_BASE} + {job_id} % {PORT_SPAN}))"
    return addr, port


def launch_notes(req: JobRequest, launcher: str, gpu_bind: str, image: str | None,
                 image_source: str | None, addr: str | None, port: str | None) -> list[str]:
    """What the launch line does, for the comment above it (shown by --dry-run).
    ``addr``/``port``: master_values() (None where the profile or --env sets them)."""
    tasks = tasks_per_node(req.gpus)
    notes = []
    if launcher == "torchrun":
        notes.append(f"launcher torchrun: one torchrun per node (srun --ntasks-per-node=1), each "
                     f"starting {tasks} ranks; c10d rendezvous at $MASTER_ADDR:$MASTER_PORT.")
    else:
        notes.append(f"launcher {launcher}: one process per rank; the wrapper derives the "
                     "variables from its per-rank variables.")
    notes.append("MASTER_ADDR: " + ("the first node of the allocation." if addr else
                                    "set by the profile or --env (it wins)."))
    notes.append("MASTER_PORT: " + (f"{PORT_BASE} + job id % {PORT_SPAN}, so jobs sharing a "
                                    "node do not collide (below the ephemeral port range); "
                                    "the next free one if something on the first node "
                                    "listens on it."
                                    if port else "set by the profile or --env (it wins)."))
    if not req.gpus:
        notes.append("GPUs: none requested.")
    elif launcher == "torchrun" or gpu_bind == "none":
        notes.append(f"GPUs: every rank sees the {req.gpus} GPUs of its node and uses GPU "
                     "LOCAL_RANK (torch.cuda.set_device(LOCAL_RANK), as torchrun and Horovod "
                     "scripts do).")
    else:
        notes.append(f"GPUs: each rank sees one GPU, number LOCAL_RANK of its node's {req.gpus} "
                     "(CUDA_VISIBLE_DEVICES narrowed by the wrapper; --gpu-bind none keeps all).")
    if image:
        origin = ("the profile's container.default_image; --image overrides, --no-image "
                  "runs natively" if image_source == "profile default_image" else "--image")
        notes.append(f"image: {image} ({origin}).")
        origin = "the run directory's copy (job/)" if req.run_dir else "the host"
        if req.probe_only:
            notes.append(f"the probe worker (hpcdl/probe/worker.py: stdlib + torch) comes from "
                         f"{origin}, bound read-only at {JOB_PROJECT_DIR} (the image needs no "
                         f"copy of hpcdl).")
        elif not req.command:
            notes.append(f"the bundled example comes from {origin}, bound read-only at "
                         f"{JOB_PROJECT_DIR} (the image needs no copy of hpcdl).")
    return notes


def scheduler_options(
    profile: Profile, part: Partition, req: JobRequest, cpus_per_task: int, time: str
) -> list[str]:
    """The Slurm options shared by sbatch (#SBATCH lines) and salloc (argv), in order."""
    options = [
        f"--partition={part.name}",
        f"--nodes={req.nodes}",
        f"--ntasks-per-node={tasks_per_node(req.gpus)}",
    ]
    if req.gpus:
        options.append(
            f"--gres=gpu:{req.gpus}" if profile.scheduler.gpu_request == "gres"
            else f"--gpus-per-node={req.gpus}"
        )
    options += [f"--cpus-per-task={cpus_per_task}", f"--time={time}"]
    if profile.scheduler.account:
        options.append(f"--account={profile.scheduler.account}")
    if profile.scheduler.qos:
        options.append(f"--qos={profile.scheduler.qos}")
    options += [f"--{k}={v}" for k, v in profile.scheduler.extra_options.items()]
    return options


# ---- requeue -------------------------------------------------------------------
def _requeue_mode(profile: Profile, req: JobRequest) -> bool:
    """True when the job checkpoints on a signal: --requeue (or the profile's default)
    or a --chain of jobs."""
    requeue = profile.scheduler.requeue if req.requeue is None else req.requeue
    return req.chain > 1 or (requeue and profile.scheduler.type == "slurm")


def requeue_signal(profile: Profile, req: JobRequest) -> tuple[str, int]:
    """(signal name, lead seconds) of --signal, or of the profile's default."""
    name, lead = (req.signal or profile.scheduler.requeue_signal).split("@")
    return name, int(lead)


def requeue_options(profile: Profile, req: JobRequest) -> list[str]:
    """The sbatch options of a requeueable job: the signal goes to the batch shell
    (B:), which forwards it to the ranks and requeues; --open-mode=append keeps every
    attempt's output in one log (Slurm truncates it on a requeue otherwise). A chain's
    jobs are separate jobs with their own logs and are not requeued."""
    if not _requeue_mode(profile, req):
        return []
    name, lead = requeue_signal(profile, req)
    options = [f"--signal=B:{name}@{lead}"]
    if req.chain == 1:
        options += ["--requeue", "--open-mode=append"]
    return options


def _requeue_context(profile: Profile, req: JobRequest) -> dict[str, Any]:
    """What the template's requeue block needs (empty when the job does not requeue)."""
    if not _requeue_mode(profile, req):
        return {"requeue": None}
    name, lead = requeue_signal(profile, req)
    run_dir = shell_join([req.run_dir]) if req.run_dir else '"$SLURM_SUBMIT_DIR"'
    max_restarts = (profile.scheduler.max_restarts if req.max_restarts is None
                    else req.max_restarts)
    return {"requeue": {
        "signal": name, "lead": lead, "wait_s": wait_seconds(lead),
        "run_dir": run_dir, "flag_env": FLAG_ENV, "flag_name": FLAG_NAME,
        "checkpoint_env": CHECKPOINT_ENV, "exit_requeue": EXIT_REQUEUE,
        "progress_env": PROGRESS_ENV,
        "max_restarts": max_restarts if req.chain == 1 else 0, "chain": req.chain,
    }}


def _sbatch_job_name(name: str) -> str:
    """The job name as #SBATCH can carry it (the exact one goes on sbatch's argv)."""
    return _sbatch_value(name.replace('"', "'"))


def _sbatch_value(value: str) -> str:
    """``value`` as one argument of an ``#SBATCH`` line.

    sbatch's #SBATCH parser splits at whitespace and understands double quotes (no
    escapes), not shell quoting; a value with a double quote or a control character
    cannot be carried (the profile schema and check_request refuse them first).
    Raises ValidationError.
    """
    if '"' in value or CONTROL.search(value):
        raise _fail(f"#SBATCH value {value!r}: a double quote or control character "
                    f"cannot be carried in an #SBATCH line")
    return value if _PLAIN_SBATCH.fullmatch(value) else f'"{value}"'


def _sbatch_option(option: str) -> str:
    """``--key=value`` for an ``#SBATCH`` line: the value quoted as sbatch parses it."""
    key, sep, value = option.partition("=")
    return f"{key}{sep}{_sbatch_value(value)}" if sep else option


def build_plan(profile: Profile, req: JobRequest,
               image_facts: ImageArchFacts | None = None,
               runtime_mode: RuntimeMode | None = None) -> JobPlan:
    """Validate ``req`` against ``profile`` and render its sbatch script.

    ``image_facts`` (from hpcdl.preflight.image_arch_facts, which reads the image's
    build record) lets the plan refuse a partition whose GPU type the image's torch has
    no kernels for; without it that check is not made. ``runtime_mode``: how the
    container runtime runs on the cluster (the profile's container.mode, or detected on
    this host); "unprivileged" adds what MPI needs across per-rank user namespaces.

    Raises ValidationError (bad value, over a limit, a GPU the image cannot run on) or
    RenderError (template).
    """
    check_request(req)
    part, reason = choose_partition(profile, req)
    arch = check_partition(part.name, part.gpu_type, req.gpus, image_facts)
    if arch.error:
        raise ValidationError(
            arch.error,
            hint="pick a partition with a GPU type in that list (--partition), or an image "
            "whose torch was built for it (older GPUs need a CUDA 12 build, e.g. the NGC "
            "spec pytorch-horovod-gpu)",
        )
    tasks = tasks_per_node(req.gpus)
    cpus = req.cpus_per_task or default_cpus_per_task(part, req.gpus)
    job_name = req.job_name or f"hpcdl-{req.backend}"
    launcher = req.launcher or profile.mpi.launcher
    gpu_bind = req.gpu_bind or profile.mpi.gpu_bind
    if req.probe is not None and profile.scheduler.type != "slurm":
        raise _fail(f"probe: the probe starts its ranks with srun; profile {profile.name} is "
                    f"{profile.scheduler.type}")
    if req.probe_only and launcher != "srun":
        raise _fail(f"launcher: the probe starts one rank per task with srun (got {launcher})")
    if launcher == "torchrun" and req.runs_example and req.backend == "horovod":
        raise _fail("launcher: torchrun starts ranks without MPI, which the bundled example's "
                    "--backend horovod needs: use --backend ddp, or --launcher srun")
    image, image_source = job_image(profile, req)
    check_shared_paths(profile, req, image)
    stage = image_stage(profile, req, image)
    # What the ranks run: the image where it is, or the node's copy, whose path holds
    # the job id and so is only known to the script ($HPCDL_IMAGE, set by it).
    rank_image = Raw('"$HPCDL_IMAGE"') if stage else image
    if req.probe_only:
        command = _probe_command(profile, req, image)
    else:
        command = list(req.command) or _default_command(profile, req)
    if profile.scheduler.type == "pbs":  # PBS Pro: #PBS lines and mpiexec (hpcdl.schedulers.pbs)
        if launcher == "torchrun":
            raise _fail("launcher: torchrun starts one agent per node through srun; a PBS "
                        "profile launches every rank with mpiexec (use --launcher mpirun)")
        template = "pbs.sh.j2"
        pbs_directives = pbs.directives(
            profile, part, nodes=req.nodes, gpus=req.gpus, tasks_per_node=tasks,
            cpus_per_task=cpus, time=job_time(profile, part, req), run_dir=req.run_dir)
        prefix = pbs.mpiexec_tokens(ntasks=req.nodes * tasks, tasks_per_node=tasks,
                                    cpus_per_task=cpus)
    else:
        template, pbs_directives = "sbatch.sh.j2", []
        prefix = _launcher_tokens(profile, req, launcher, cpus)
    if launcher == profile.mpi.launcher:  # the profile's arguments are for its launcher
        prefix += list(profile.mpi.launcher_args)
    launch = shell_join(prefix + _rank_tokens(profile, req, command, launcher, rank_image))
    probe_line = None
    if req.probe is not None and req.probe_first:
        # Its own srun step with the worker bound in, whatever COMMAND's launcher is.
        probe_req = replace(req, command=())
        probe_line = shell_join(_launcher_tokens(profile, probe_req, "srun", cpus) + _rank_tokens(
            profile, probe_req, _probe_command(profile, req, image), "srun", rank_image))
    log_dir = req.run_dir or "."
    output, error = f"{log_dir}/slurm-%j.out", f"{log_dir}/slurm-%j.err"
    omp = cpus if profile.env.omp_num_threads == "cpus-per-task" else profile.env.omp_num_threads
    env = tuple(profile.env.vars.items()) + tuple(req.env)
    mode = (runtime_mode if profile.container.mode == "auto" else profile.container.mode) \
        if image else None
    if mode == "unprivileged":  # what the user or profile sets wins
        env += tuple((k, v) for k, v in UNPRIVILEGED_MPI_ENV if k not in dict(env))
    warnings = pbs.warnings(profile) if profile.scheduler.type == "pbs" else []
    if arch.warning:
        warnings.append(arch.warning)
    time = job_time(profile, part, req)
    master_addr, master_port = master_values(env, profile.scheduler.type)
    wrapper_mode: Literal["ranks", "torchrun"] = "torchrun" if launcher == "torchrun" else "ranks"
    wrapper_options = {"gpu_bind": gpu_bind == "local-rank" and req.gpus > 0,
                       "record_pid": req.hang_timeout is not None}
    wrapper = rank_env_script(wrapper_mode, **wrapper_options)
    port_range = {"base": PORT_BASE, "span": PORT_SPAN, "tries": PORT_TRIES}
    # Under Slurm the wrapper and the port pick are files of the run (the PBS script,
    # which hpcdl does not submit, carries them inline: see _rank_tokens).
    job_scripts: tuple[tuple[str, str], ...] = ()
    if profile.scheduler.type != "pbs":
        job_scripts = ((RANK_ENV_FILE, rank_env_file(wrapper_mode, **wrapper_options)),)
        if master_port:
            job_scripts += ((PORT_PICK_FILE, port_pick_file(master_port, **port_range)),)
    hang_exports, hang_warnings = _hang_exports(req, env, time, log_dir)
    warnings += hang_warnings
    context = {
        "profile": profile,
        "job_name": _sbatch_job_name(job_name),
        "job_name_q": shell_join([job_name]),
        "options": [
            *(_sbatch_option(o) for o in scheduler_options(profile, part, req, cpus, time)),
            *(_sbatch_option(o) for o in requeue_options(profile, req)),
            f"--output={_sbatch_value(output)}",
            f"--error={_sbatch_value(error)}",
        ],
        "nodes": req.nodes,
        "tasks_per_node": tasks,
        "ntasks": req.nodes * tasks,
        "modules": profile.modules,
        "cpus_per_task": cpus,
        "omp_num_threads": omp,
        "exports": [(k, shell_join([v])) for k, v in (*env, *hang_exports)]
                   + _run_dir_exports(req, image),
        "backend": req.backend,
        "image_q": shell_join([image]) if image else None,
        "launcher": launcher,
        "launch_notes": launch_notes(req, launcher, gpu_bind, image, image_source,
                                     master_addr, master_port)
                        + ([f"image staged: each node's copy {stage['shown']} (sbcast, "
                            "below), removed at the end."] if stage else []),
        "stage": stage,
        "master_addr": master_addr,
        "master_port": master_port,
        "port_base": PORT_BASE,
        "port_span": PORT_SPAN,
        "port_tries": PORT_TRIES,
        "port_listened": PORT_LISTENED,
        "port_pick": port_pick_lines(master_port, **port_range).rstrip("\n") if master_port else "",
        "port_pick_path": shell_join([job_script_path(req.run_dir, PORT_PICK_FILE)]),
        "rank_env_variable": SCRIPT_VARIABLE,
        "rank_env_q": shell_join([wrapper]),
        "launch_line": launch,
        "probe_line": probe_line,
        "pbs_directives": pbs_directives,
        "pbs_job_name": pbs.job_name(job_name),
        **_requeue_context(profile, req),
        **_progress_context(profile, req),
    }
    script = render_template(
        template,
        context,
        template_file=req.template,
        template_dirs=[profile.template_dir] if profile.template_dir else (),
    )
    return JobPlan(
        profile=profile.name,
        cluster_type=profile.scheduler.type,
        partition=part.name,
        partition_reason=reason,
        nodes=req.nodes,
        gpus_per_node=req.gpus,
        tasks_per_node=tasks,
        ntasks=req.nodes * tasks,
        cpus_per_task=cpus,
        time=time,
        job_name=job_name,
        backend=req.backend,
        image=image,
        env=env,
        binds=tuple(_container_binds(profile, req)) if image else req.binds,
        command=tuple(command),
        launch_line=launch,
        output=output,
        error=error,
        run_dir=req.run_dir,
        script=script,
        warnings=tuple(warnings),
        example_defaults=example_defaults(profile, req),
        launcher=launcher,
        gpu_bind=gpu_bind,
        image_source=image_source,
        master_addr=master_addr or dict(env)["MASTER_ADDR"],
        master_port=master_port or dict(env)["MASTER_PORT"],
        probe=req.probe,
        probe_first=req.probe_first,
        probe_line=probe_line,
        hang_timeout=req.hang_timeout,
        hang_action=(req.hang_action or DEFAULT_HANG_ACTION) if req.hang_timeout is not None else None,
        job_files=job_side_files() if req.run_dir else (),
        job_scripts=job_scripts,
        container_mode=mode,
        **_plan_requeue(profile, req),
        records_steps=_records_steps(profile, req),
        stage="sbcast" if stage else "none",
        staged_image=stage["shown"] if stage else None,
    )


def image_stage(profile: Profile, req: JobRequest, image: str | None) -> dict[str, str] | None:
    """How the script stages the image with sbcast (the template's ``stage``), or None.

    --stage-image, else the profile's container.stage. Staging needs an image and the
    profile's node-local scratch; asked for explicitly without them it is refused (a
    profile default simply does not apply to a native run). The copy's name holds the
    job id: two jobs on one node never share, overwrite or remove each other's copy.
    Raises ValidationError.
    """
    wanted = profile.container.stage == "sbcast" if req.stage_image is None else req.stage_image
    if not wanted:
        return None
    source = "--stage-image" if req.stage_image else "container.stage: sbcast"
    if not image:
        if req.stage_image is None:
            return None
        raise _fail("stage-image: no image to stage (give --image, or a profile with "
                    "container.default_image; --no-image runs natively)")
    local = profile.paths.local_scratch
    if not local:
        raise _fail(f"stage-image: profile {profile.name} has no paths.local_scratch (the "
                    f"node-local directory {source} copies the image to)")
    if profile.scheduler.type != "slurm":
        raise _fail(f"stage-image: staging uses Slurm's sbcast; profile {profile.name} is "
                    f"{profile.scheduler.type}")
    head, tail = f"{local.rstrip('/')}/hpcdl-", f"-{PurePosixPath(image).name}"
    return {"local_q": shell_join([local]),
            "dest": shell_join([head]) + '"$SLURM_JOB_ID"' + shell_join([tail]),
            "shown": f"{head}$SLURM_JOB_ID{tail}"}


def _run_dir_exports(req: JobRequest, image: str | None) -> list[tuple[str, str]]:
    """What the job is told of its run directory, rendered: HPCDL_RUN_DIR for any script
    (per-step metrics go there, hpcdl.results.steps; the staged job-side files are in its
    job/); and for the bundled example or the probe run natively, those staged files on
    PYTHONPATH ahead of whatever the job has (the nodes need not see the hpcdl that
    submitted)."""
    if not req.run_dir:
        return []
    exports = [("HPCDL_RUN_DIR", shell_join([req.run_dir]))]
    if not image and not req.command:
        exports.append(("PYTHONPATH",
                        shell_join([job_dir(req.run_dir)]) + "${PYTHONPATH:+:$PYTHONPATH}"))
    return exports


def check_shared_paths(profile: Profile, req: JobRequest, image: str | None) -> None:
    """Refuse what the compute nodes cannot see: a run directory, image, dataset or
    --bind source outside the profile's paths.shared (no check when it lists none)."""
    shared = profile.paths.shared
    if not shared:
        return
    # In a container --data is the container's path (a --bind makes it); natively the host's.
    data = (None if req.synthetic or not req.runs_example or image
            else req.data or profile.paths.imagenet)
    checks = [("--run-dir", req.run_dir), ("--image", image), ("--data", data),
              *(("--bind", b.split(":", 1)[0]) for b in req.binds)]
    for name, path in checks:
        if path and not on_shared_path(path, shared):
            raise _fail(f"{name}: {path} is not on a path the compute nodes share (profile "
                        f"{profile.name}: paths.shared = {', '.join(shared)}): the nodes "
                        f"cannot see it")


def on_shared_path(path: str, shared: list[str]) -> bool:
    """``path`` (made absolute against the current directory) is one of ``shared`` or
    below one of them."""
    where = PurePosixPath(os.path.normpath(os.path.abspath(path)))
    return any(where == PurePosixPath(s) or PurePosixPath(s) in where.parents for s in shared)


def _hang_exports(req: JobRequest, env: tuple[tuple[str, str], ...], time: str,
                  log_dir: str) -> tuple[list[tuple[str, str]], list[str]]:
    """With --hang-timeout: where the rank wrapper records the ranks' pids, and
    PYTHONUNBUFFERED (a Python rank's prints must reach the log as they happen: the
    log growing is progress); a warning when the job's time limit comes first."""
    if req.hang_timeout is None:
        return [], []
    exports = [("HPCDL_PID_DIR", f"{log_dir}/pids")]
    if "PYTHONUNBUFFERED" not in dict(env):
        exports.append(("PYTHONUNBUFFERED", "1"))
    limit = parse_time(time)
    warnings = []
    if limit is not None and req.hang_timeout >= limit:
        warnings.append(f"hang-timeout: {req.hang_timeout:g} s is not shorter than the job's "
                        f"time limit {time}: the watchdog cannot fire before it")
    return exports, warnings


def _plan_requeue(profile: Profile, req: JobRequest) -> dict[str, Any]:
    if not _requeue_mode(profile, req):
        return {}
    ctx = _requeue_context(profile, req)["requeue"]
    return {"requeue": req.chain == 1, "max_restarts": ctx["max_restarts"],
            "signal": f"{ctx['signal']}@{ctx['lead']}", "chain": req.chain}


def _progress_context(profile: Profile, req: JobRequest) -> dict[str, Any]:
    """Where the job records that an attempt completed its first step
    ($HPCDL_PROGRESS_FILE, hpcdl/requeue.py): in the run directory (beside attempts.tsv
    when a requeued job has none). Slurm only: a PBS script is not submitted by hpcdl."""
    if profile.scheduler.type != "slurm":
        return {"progress": None}
    if req.run_dir:
        path = shell_join([f"{req.run_dir}/{PROGRESS_NAME}"])
    elif _requeue_mode(profile, req):
        path = f'"$SLURM_SUBMIT_DIR"/{PROGRESS_NAME}'
    else:
        return {"progress": None}
    return {"progress": {"env": PROGRESS_ENV, "path": path}}


def _records_steps(profile: Profile, req: JobRequest) -> bool:
    """Whether a missing progress file means "no step completed": the bundled example
    writes it; so does any script under --requeue/--chain (the requeue contract). A
    custom COMMAND without them may never write it."""
    return (profile.scheduler.type == "slurm" and bool(req.run_dir)
            and (req.runs_example or _requeue_mode(profile, req)))
