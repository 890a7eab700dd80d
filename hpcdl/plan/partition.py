"""The request's placement part (nodes, GPUs, partition, time, CPUs, spares), its own
checks, which partition it runs on, and the sizes derived from it: tasks per node, CPUs
per task, the job's time, the spare nodes, and the template block spare nodes fill (the
node guard, guard_block). Pure; raises ValidationError naming the limit broken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from hpcdl.core.duration import format_time, parse_time
from hpcdl.core.templating import shell_join
from hpcdl.core.tokens import NAME, check_field
from hpcdl.errors import ValidationError
from hpcdl.jobside.requeue import CHECKPOINT_ENV
from hpcdl.launch.nodes import NODES_FILE, guard_exports, probe_slow_path
from hpcdl.plan.jobplan import job_script_path
from hpcdl.profiles.schema import Partition, Profile
from hpcdl.schedulers.base import JobSpec


@dataclass(frozen=True)
class PlacementRequest:
    """The request's placement part, as given: what the job asks of its partition.
    ``gpus`` is GPUs per node; ``measures``: the job is the probe, which measures the
    nodes it is given (no spares by default)."""

    nodes: int = 1
    gpus: int = 0
    partition: str | None = None
    time: str | None = None
    cpus_per_task: int | None = None
    spares: int | None = None  # None: the profile's scheduler.spares
    measures: bool = False

    @cached_property
    def time_seconds(self) -> float | None:
        """--time in seconds, parsed once: None without --time, ``math.inf`` for
        'infinite'/'UNLIMITED'. Raises ValueError (check_request words it) when ``time``
        is not hpcdl's duration syntax."""
        if self.time is None:
            return None
        seconds = parse_time(self.time)
        return math.inf if seconds is None else seconds

    # Its own checks (check_request calls each where its refusal has always come).
    # Each raises ValidationError naming the option, the value and the limit.

    def check_sizes(self) -> None:
        """--nodes, --gpus and --cpus-per-task are counts."""
        if self.nodes < 1:
            raise _fail(f"nodes: must be at least 1 (got {self.nodes})")
        if self.gpus < 0:
            raise _fail(f"gpus: must be 0 or more GPUs per node (got {self.gpus})")
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise _fail(f"cpus-per-task: must be at least 1 (got {self.cpus_per_task})")

    def check_time(self) -> None:
        """--time is hpcdl's duration syntax."""
        if self.time is not None:
            try:
                self.time_seconds  # noqa: B018 (parses --time: raises ValueError)
            except ValueError as exc:
                raise _fail(f"time: {exc}") from exc

    def check_partition(self) -> None:
        """--partition is a name (it goes into the script)."""
        if self.partition is not None:
            check_field("partition", self.partition, NAME)

    def check_spares(self) -> None:
        """--spares is a count (what it may go with is hpcdl.plan.rules's)."""
        if self.spares is not None and self.spares < 0:
            raise _fail(f"spares: must be 0 or more spare nodes (got {self.spares})")


def _fail(message: str) -> ValidationError:
    return ValidationError(message)


def _requested_seconds(req: PlacementRequest) -> float | None:
    """The requested time in seconds: None when none was asked for, ``math.inf`` for
    'infinite'/'UNLIMITED' (which a partition with a time limit cannot take)."""
    return req.time_seconds if req.time else None


def job_spares(profile: Profile, req: PlacementRequest) -> int:
    """Spare nodes of the job: --spares, else the profile's scheduler.spares for a
    training job (a probe measures the nodes it is given)."""
    if req.spares is not None:
        return req.spares
    return 0 if req.measures else profile.scheduler.spares


def _problems(part: Partition, req: PlacementRequest, cpus_per_task: int,
              seconds: float | None, spares: int = 0) -> list[str]:
    """Every limit of ``part`` the request breaks, as 'field: value vs limit' lines
    (``spares`` more nodes are allocated than the training runs on)."""
    out = []
    nodes = req.nodes + spares
    asked = f"{req.nodes} + {spares} spares = {nodes}" if spares else str(nodes)
    if req.gpus > part.gpus_per_node:
        out.append(
            f"gpus: {req.gpus} GPUs per node exceeds partition {part.name}'s "
            f"{part.gpus_per_node} GPUs per node"
        )
    if nodes > part.node_limit:
        out.append(
            f"nodes: {asked} exceeds partition {part.name}'s limit of "
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
    total_gpus = nodes * req.gpus
    if part.max_gpus_per_user is not None and total_gpus > part.max_gpus_per_user:
        out.append(
            f"gpus: {asked} nodes x {req.gpus} GPUs = {total_gpus} exceeds partition "
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


def choose_partition(profile: Profile, req: PlacementRequest) -> tuple[Partition, str]:
    """The requested partition, or the smallest that fits. Raises ValidationError."""
    seconds = _requested_seconds(req)
    spares = job_spares(profile, req)

    def cpt(part: Partition) -> int:
        return req.cpus_per_task or default_cpus_per_task(part, req.gpus)

    fits = [
        p for p in profile.partitions if not _problems(p, req, cpt(p), seconds, spares)
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
        problems = _problems(part, req, cpt(part), seconds, spares)
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
            key=lambda ip: (len(_problems(ip[1], req, cpt(ip[1]), seconds, spares)),
                        -ip[1].node_limit, -ip[1].gpus_per_node),
        )
        closest = ranked[0][1]
        first = _problems(closest, req, cpt(closest), seconds, spares)[0]
        raise _fail(f"{first} (no partition of profile {profile.name} fits; partitions that fit: none)")
    order = {p.name: i for i, p in enumerate(profile.partitions)}
    best = min(fits, key=lambda p: _size_key(p, order[p.name]))
    return best, f"smallest partition that fits (candidates: {fit_names})"


def job_time(profile: Profile, part: Partition, req: PlacementRequest) -> int | None:
    """The job's time limit in seconds (None: unlimited): --time, else the profile's
    default_time capped at the partition's max_time. A scheduler dialect spells it."""
    seconds = _requested_seconds(req)
    if seconds is not None:
        return None if math.isinf(seconds) else int(seconds)
    default = profile.scheduler.default_seconds
    limit = part.max_seconds
    if default is not None and limit is not None and default > limit:
        default = limit
    return default


def guard_block(profile: Profile, spec: JobSpec, relaunches: int, run_dir: str | None,
                *, image: bool, master_addr: bool, probe_first: bool) -> dict[str, Any] | None:
    """What the template's node guard block needs (None without spares): at most
    ``relaunches`` relaunches (hpcdl.plan.resilience.max_restarts), ``image``,
    ``master_addr`` (the script derives it), ``probe_first`` (the probe step names the
    slow nodes)."""
    if not spec.spares:
        return None
    nodes_file = job_script_path(run_dir, NODES_FILE)
    exports = guard_exports(profile, tasks_per_node=spec.tasks_per_node,
                            gpus=spec.gpus_per_node, max_relaunches=relaunches,
                            nodes_file=nodes_file, image=image, master_addr=master_addr,
                            probe_slow=probe_slow_path(run_dir) if probe_first else None)
    if spec.requeue is None and run_dir:
        # A relaunch resumes as a requeued attempt does: the contract's checkpoint directory
        # (the requeue block exports it when there is one).
        exports.insert(0, (CHECKPOINT_ENV, shell_join([f"{run_dir}/checkpoints"])))
    return {
        "nodes": spec.nodes, "spares": spec.spares, "allocated": spec.allocated_nodes,
        "max_relaunches": relaunches, "requeue": spec.requeue is not None,
        "file_q": shell_join([nodes_file]),
        "exports": exports,
    }
