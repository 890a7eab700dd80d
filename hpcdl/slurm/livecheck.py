"""The live check: compare a profile (and a plan made from it) with the real cluster.

A profile is a claim about a cluster; ``scontrol show partition`` and ``sinfo``
are the truth. Before submitting, hpcdl checks the claims the request depends on:
a partition that does not exist, fewer GPUs or CPUs per node, fewer nodes or a
shorter max time than the profile says. Those that break the request are errors;
the others are warnings that the profile needs fixing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hpcdl import proc
from hpcdl.errors import ValidationError
from hpcdl.plan import JobPlan
from hpcdl.profiles.schema import Partition, Profile
from hpcdl.slurm.parse import gpus_in_gres, parse_key_values
from hpcdl.slurmtime import format_time, parse_time

SINFO_FORMAT = "%R|%G|%c|%D"


@dataclass(frozen=True)
class ClusterPartition:
    """What the cluster says about one partition (min over its node groups)."""

    name: str
    max_nodes: int | None      # None: UNLIMITED
    max_seconds: int | None    # None: UNLIMITED
    total_nodes: int
    gpus_per_node: int
    cpus_per_node: int


def parse_partitions(scontrol_out: str, sinfo_out: str) -> dict[str, ClusterPartition]:
    """Pure: ``scontrol -o show partition`` + ``sinfo -h -o SINFO_FORMAT`` -> partitions."""
    gpus: dict[str, int] = {}
    cpus: dict[str, int] = {}
    for line in sinfo_out.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4:
            continue
        name, gres, ncpu, _nodes = parts
        name = name.rstrip("*")
        g = gpus_in_gres(gres)
        gpus[name] = min(gpus.get(name, g), g)
        c = _int(ncpu.rstrip("+")) or 0
        cpus[name] = min(cpus.get(name, c), c)
    out = {}
    for line in scontrol_out.splitlines():
        kv = parse_key_values(line)
        pname = kv.get("PartitionName")
        if not pname:
            continue
        max_time = kv.get("MaxTime", "UNLIMITED")
        out[pname] = ClusterPartition(
            name=pname,
            max_nodes=_int(kv.get("MaxNodes", "UNLIMITED")),
            max_seconds=None if max_time.upper() == "UNLIMITED" else parse_time(max_time),
            total_nodes=_int(kv.get("TotalNodes", "0")) or 0,
            gpus_per_node=gpus.get(pname, 0),
            cpus_per_node=cpus.get(pname, 0),
        )
    return out


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def read_cluster(timeout: float = 30) -> dict[str, ClusterPartition]:
    """Query the cluster. Raises ToolError when scontrol or sinfo fails."""
    sc = proc.run(["scontrol", "-o", "show", "partition"], timeout=timeout)
    si = proc.run(["sinfo", "-h", "-o", SINFO_FORMAT], timeout=timeout)
    return parse_partitions(sc.stdout, si.stdout)


def _node_limit(cp: ClusterPartition) -> int:
    return min(cp.max_nodes, cp.total_nodes) if cp.max_nodes is not None else cp.total_nodes


def compare(profile: Profile, cluster: dict[str, ClusterPartition],
            plan: JobPlan | None = None,
            partitions: Iterable[Partition] | None = None) -> tuple[list[str], list[str]]:
    """(errors, warnings): where ``profile`` claims more than ``cluster`` has.

    Errors are the differences that make ``plan`` impossible on the real cluster;
    every other overclaim of the checked partitions is a warning. Pure.
    """
    errors: list[str] = []
    warnings: list[str] = []
    names = ", ".join(sorted(cluster)) or "none"
    checked = list(partitions if partitions is not None else profile.partitions)
    for part in checked:
        in_plan = plan is not None and plan.partition == part.name
        sink = errors if in_plan else warnings
        cp = cluster.get(part.name)
        who = f"profile {profile.name} partition {part.name}"
        if cp is None:
            sink.append(f"partition: {who} does not exist on the cluster (cluster partitions: {names})")
            continue
        # (claim, real, what the plan needs, label)
        checks: list[tuple[int | None, int | None, int | None, str]] = [
            (part.gpus_per_node, cp.gpus_per_node, plan.gpus_per_node if in_plan and plan else None,
             "GPUs per node"),
            (part.cpus_per_node, cp.cpus_per_node,
             plan.cpus_per_task * plan.tasks_per_node if in_plan and plan else None,
             "CPUs per node"),
            (part.node_limit, _node_limit(cp), plan.nodes if in_plan and plan else None,
             "nodes per job"),
        ]
        for claim, real, need, label in checks:
            if claim is None or real is None or real >= claim:
                continue
            msg = f"{label}: {who} claims {claim}, the cluster has {real}"
            if need is not None and need > real:
                errors.append(f"{msg} (the request needs {need})")
            else:
                warnings.append(msg)
        claim_s, real_s = part.max_seconds, cp.max_seconds
        if real_s is not None and (claim_s is None or claim_s > real_s):
            msg = (f"max time: {who} claims {part.max_time}, "
                   f"the cluster's limit is {format_time(real_s)}")
            need_s = parse_time(plan.time) if in_plan and plan else None
            if need_s is not None and need_s > real_s:
                errors.append(f"{msg} (the request needs {plan.time})" if plan else msg)
            else:
                warnings.append(msg)
    return errors, warnings


def check_plan(profile: Profile, plan: JobPlan,
               cluster: dict[str, ClusterPartition] | None = None) -> list[str]:
    """Raise ValidationError when the cluster cannot run ``plan`` although the profile
    says it can; return the warnings about the plan's partition otherwise.
    """
    cluster = read_cluster() if cluster is None else cluster
    part = profile.partition(plan.partition)
    errors, warnings = compare(profile, cluster, plan, [part] if part else None)
    if errors:
        raise ValidationError(
            "live check: " + "; ".join(errors),
            hint=f"the profile does not match the cluster (scontrol show partition, sinfo): "
                 f"fix profile {profile.name} (hpcdl profiles show {profile.name})",
        )
    return warnings
