"""The live check: compare a profile (and a plan made from it) with the real cluster.

A profile is a claim about a cluster; ``scontrol show partition`` and ``sinfo``
are the truth. Before submitting, hpcdl checks the claims the request depends on:
a partition that does not exist, fewer GPUs or CPUs per node, fewer nodes or a
shorter max time than the profile says. Those that break the request are errors;
the others are warnings that the profile needs fixing. A job array's size limit
(MaxArraySize) comes from ``scontrol show config`` (read_config, max_array_size).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hpcdl.core.duration import format_time, parse_time
from hpcdl.errors import ValidationError
from hpcdl.profiles.schema import Partition, Profile
from hpcdl.schedulers.base import Demand
from hpcdl.schedulers.executor import LOCAL, Executor
from hpcdl.schedulers.launchers import launcher_for
from hpcdl.schedulers.slurm.parse import gpus_in_gres, parse_config, parse_key_values

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


def read_cluster(timeout: float = 30, ex: Executor = LOCAL) -> dict[str, ClusterPartition]:
    """Query the cluster. Raises ToolError when scontrol or sinfo fails."""
    sc = ex.run(["scontrol", "-o", "show", "partition"], timeout=timeout)
    si = ex.run(["sinfo", "-h", "-o", SINFO_FORMAT], timeout=timeout)
    return parse_partitions(sc.stdout, si.stdout)


CONFIG_ARGV = ("scontrol", "show", "config")


def read_config(timeout: float = 30, ex: Executor = LOCAL) -> dict[str, str]:
    """``scontrol show config`` as Key -> Value. Raises ToolError when scontrol fails."""
    return parse_config(ex.run(list(CONFIG_ARGV), timeout=timeout).stdout)


def max_array_size(config: Mapping[str, str]) -> int | None:
    """Slurm's MaxArraySize (task ids 0 to this minus 1; 0: job arrays are off), or None
    when the config does not say. Pure."""
    value = config.get("MaxArraySize", "").strip()
    return int(value) if value.isdigit() else None


def _node_limit(cp: ClusterPartition) -> int:
    return min(cp.max_nodes, cp.total_nodes) if cp.max_nodes is not None else cp.total_nodes


def compare(profile: Profile, cluster: dict[str, ClusterPartition],
            demand: Demand | None = None,
            partitions: Iterable[Partition] | None = None) -> tuple[list[str], list[str]]:
    """(errors, warnings): where ``profile`` claims more than ``cluster`` has.

    Errors are the differences that make ``demand`` impossible on the real cluster;
    every other overclaim of the checked partitions is a warning. Pure.
    """
    errors: list[str] = []
    warnings: list[str] = []
    names = ", ".join(sorted(cluster)) or "none"
    checked = list(partitions if partitions is not None else profile.partitions)
    for part in checked:
        need = demand if demand is not None and demand.partition == part.name else None
        sink = errors if need else warnings
        cp = cluster.get(part.name)
        who = f"profile {profile.name} partition {part.name}"
        if cp is None:
            sink.append(f"partition: {who} does not exist on the cluster (cluster partitions: {names})")
            continue
        # (claim, real, what the plan needs, label)
        checks: list[tuple[int | None, int | None, int | None, str]] = [
            (part.gpus_per_node, cp.gpus_per_node, need.gpus_per_node if need else None,
             "GPUs per node"),
            (part.cpus_per_node, cp.cpus_per_node, need.cpus_per_node if need else None,
             "CPUs per node"),
            (part.node_limit, _node_limit(cp), need.nodes if need else None, "nodes per job"),
        ]
        for claim, real, needed, label in checks:
            if claim is None or real is None or real >= claim:
                continue
            msg = f"{label}: {who} claims {claim}, the cluster has {real}"
            if needed is not None and needed > real:
                errors.append(f"{msg} (the request needs {needed})")
            else:
                warnings.append(msg)
        claim_s, real_s = part.max_seconds, cp.max_seconds
        if real_s is not None and (claim_s is None or claim_s > real_s):
            msg = (f"max time: {who} claims {part.max_time}, "
                   f"the cluster's limit is {format_time(real_s)}")
            need_s = need.time_seconds if need else None
            if need_s is not None and need_s > real_s:
                errors.append(f"{msg} (the request needs {format_time(need_s)})")
            else:
                warnings.append(msg)
    return errors, warnings


def check_demand(profile: Profile, demand: Demand,
                 cluster: dict[str, ClusterPartition] | None = None) -> list[str]:
    """Raise ValidationError when the cluster cannot run a job asking ``demand``
    although the profile says it can; return the warnings about its partition otherwise.
    """
    cluster = read_cluster() if cluster is None else cluster
    part = profile.partition(demand.partition)
    errors, warnings = compare(profile, cluster, demand, [part] if part else None)
    if errors:
        raise ValidationError(
            "live check: " + "; ".join(errors),
            hint=f"the profile does not match the cluster (scontrol show partition, sinfo): "
                 f"fix profile {profile.name} (hpcdl profiles show {profile.name})",
        )
    return warnings


# ---- profile vs cluster as a report (`hpcdl profiles diff`) --------------------------------


def as_cluster(detected: Profile) -> dict[str, ClusterPartition]:
    """A detected profile (hpcdl.schedulers.slurm.describe) in the shape ``compare`` checks. Pure."""
    return {
        p.name: ClusterPartition(
            name=p.name, max_nodes=p.max_nodes_per_job, max_seconds=p.max_seconds,
            total_nodes=p.nodes, gpus_per_node=p.gpus_per_node, cpus_per_node=p.cpus_per_node,
        )
        for p in detected.partitions
    }


def _release_differences(profile: Profile, detected: Profile) -> list[str]:
    """The release the job scripts follow (scheduler.release; unset renders 22.05's)
    against the one the cluster runs, and --requeue=expedite against its config."""
    out = []
    have, said = detected.scheduler.release, profile.scheduler.release
    if have is not None and (said or "22.05") != have:
        out.append(f"scheduler.release: profile says {said or 'nothing (22.05 scripts)'}, the "
                   f"cluster runs Slurm {have} (the job scripts follow the profile)")
    if detected.scheduler.requeue_expedite != profile.scheduler.requeue_expedite:
        out.append(f"scheduler.requeue_expedite: profile says "
                   f"{str(profile.scheduler.requeue_expedite).lower()}, the cluster "
                   f"{'enables' if detected.scheduler.requeue_expedite else 'does not enable'} "
                   f"--requeue=expedite")
    return out


def differences(profile: Profile, detected: Profile, *, mpi_offered: tuple[str, ...] | None = None,
                runtime_found: bool = True) -> list[str]:
    """Every way ``profile`` and the live cluster (``detected`` from it) disagree, one line
    each. Pure.

    Overclaims come from ``compare`` (what the live check before a submission warns
    about); on top of that: underclaims (the profile refuses what the cluster offers),
    GPU type, default partition, partitions missing from the profile, the srun MPI
    plugin (one ``mpi_offered`` by ``srun --mpi=list``; without the list, the detected
    choice), the container runtime (when one was found), the scheduler type and the
    Slurm release (with --requeue=expedite).
    """
    errors, warnings = compare(profile, as_cluster(detected))
    out = errors + warnings
    live = {p.name: p for p in detected.partitions}
    for part in profile.partitions:
        real = live.get(part.name)
        if real is None:
            continue  # compare() reported it
        who = f"partition {part.name}"
        pairs: list[tuple[str, object, object]] = [
            ("GPUs per node", part.gpus_per_node, real.gpus_per_node),
            ("CPUs per node", part.cpus_per_node, real.cpus_per_node),
            ("nodes per job", part.node_limit, real.node_limit),
        ]
        for label, claim, have in pairs:
            if isinstance(claim, int) and isinstance(have, int) and claim < have:
                out.append(f"{label}: {who}: profile says {claim}, the cluster has {have} "
                           f"(hpcdl refuses requests the cluster accepts)")
        claim_s, real_s = part.max_seconds, real.max_seconds
        if claim_s is not None and (real_s is None or claim_s < real_s):
            out.append(f"max time: {who}: profile says {part.max_time}, the cluster's limit is "
                       f"{format_time(real_s)}")
        if part.nodes != real.nodes:
            out.append(f"nodes: {who}: profile says {part.nodes} nodes, the cluster has {real.nodes}")
        if (part.gpu_type or None) != (real.gpu_type or None) and real.gpus_per_node:
            out.append(f"GPU type: {who}: profile says {part.gpu_type or 'none'}, the cluster's "
                       f"nodes have {real.gpu_type or 'mixed or untyped GPUs'}")
        if part.default != real.default:
            out.append(f"default: {who}: profile says default={str(part.default).lower()}, "
                       f"Slurm says {str(real.default).lower()}")
    missing = [p.name for p in detected.partitions if profile.partition(p.name) is None]
    if missing:
        out.append(f"partitions: the cluster has {', '.join(missing)}, the profile does not")
    if profile.scheduler.type != detected.scheduler.type:
        out.append(f"scheduler: profile says {profile.scheduler.type}, the cluster runs "
                   f"{detected.scheduler.type}")
    out += _release_differences(profile, detected)
    wanted = profile.mpi.srun_mpi
    if launcher_for(profile.mpi.launcher).passes_srun_mpi and wanted is not None:
        if mpi_offered is not None and wanted not in mpi_offered:
            out.append(f"mpi.srun_mpi: profile says {wanted}, srun --mpi=list offers "
                       f"{', '.join(mpi_offered) or 'nothing'}")
        elif mpi_offered is None and wanted != detected.mpi.srun_mpi:
            out.append(f"mpi.srun_mpi: profile says {wanted}, detected {detected.mpi.srun_mpi}")
    if runtime_found and profile.container.runtime != detected.container.runtime:
        out.append(f"container.runtime: profile says {profile.container.runtime}, this node has "
                   f"{detected.container.runtime}")
    return out
