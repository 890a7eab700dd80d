"""`hpcdl probe`'s options -> the worker's command line, checked before any job exists.

Pure: values are validated here (one-line ValidationError naming the option, the value
and the limit) and become argv tokens, which the plan shell-quotes like any command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from hpcdl.errors import ValidationError
from hpcdl.jobside import protocol
from hpcdl.profiles.schema import Profile

# Small enough for a 2-core sandbox in seconds, large enough that the last size is
# bandwidth-bound on a real interconnect (nccl-tests' curves flatten from ~64 MB).
DEFAULT_SIZES = "64K,1M,16M,128M"
# torch.distributed backends the probe can measure (the training example's horovod/ddp
# are hpcdl.plan.BACKENDS).
DIST_BACKENDS = ("auto", "gloo", "nccl")
MPI_MODES = ("auto", "on", "off")
# Above 8 nodes the probe measures about N pairs (ring, then suspects), each a process
# group that every rank creates: 4,096 nodes are ~4,100 groups, fewer than every pair of
# 91 nodes. The schedule is unit-tested to 4,096; it has run on 32 sandbox nodes.
MAX_NODES = 4096


@dataclass(frozen=True)
class ProbeOptions:
    """What the user asked the probe to do; None: the profile's (or the worker's) default."""

    sizes: str = DEFAULT_SIZES
    iters: int = 5
    warmup: int = 2
    backend: str = "auto"
    mpi: str = "auto"
    ifname: str | None = None
    slow_ratio: float = protocol.DEFAULT_SLOW_RATIO


def check_nodes(nodes: int) -> None:
    """The probe measures links between nodes. Raises ValidationError below 2 nodes."""
    if nodes < 2:
        raise ValidationError(
            f"nodes: the probe measures the links between nodes: it needs 2 or more (got {nodes})",
            hint="hpcdl probe -p PROFILE -N 2 (3 or more to name which node is slow)")
    if nodes > MAX_NODES:
        raise ValidationError(f"nodes: {nodes} exceeds the probe's {MAX_NODES} nodes "
                              f"(it creates a process group per measured pair on every rank)")


def worker_args(opts: ProbeOptions, profile: Profile) -> tuple[str, ...]:
    """The worker's arguments: ``opts`` checked, the profile's interconnect filled in
    (expected bus bandwidth; socket_ifname unless --ifname). Raises ValidationError."""
    try:
        sizes = protocol.parse_sizes(opts.sizes)
    except protocol.ProbeInputError as err:
        raise ValidationError(f"sizes: {err}") from None
    if not 1 <= opts.iters <= protocol.MAX_ITERS:
        raise ValidationError(f"iters: {opts.iters} is not 1 to {protocol.MAX_ITERS}")
    if not 0 <= opts.warmup <= protocol.MAX_ITERS:
        raise ValidationError(f"warmup: {opts.warmup} is not 0 to {protocol.MAX_ITERS}")
    if opts.backend not in DIST_BACKENDS:
        raise ValidationError(f"backend: {opts.backend!r} is not one of {', '.join(DIST_BACKENDS)}")
    if opts.mpi not in MPI_MODES:
        raise ValidationError(f"mpi: {opts.mpi!r} is not one of {', '.join(MPI_MODES)}")
    if not 0 < opts.slow_ratio < 1:
        raise ValidationError(f"slow-ratio: {opts.slow_ratio} is not between 0 and 1 "
                              f"(a node below this share of the median is slow)")
    ifname = opts.ifname or profile.interconnect.socket_ifname
    if ifname is not None and not protocol.IFNAME_SPEC.fullmatch(ifname):
        raise ValidationError(f"ifname: {ifname!r} is not an interface name or a "
                              f"NCCL_SOCKET_IFNAME list (e.g. ib0, eth, =eth0, ^docker,lo)")
    args = ["--sizes", ",".join(protocol.format_size(s) for s in sizes),
            "--iters", str(opts.iters), "--warmup", str(opts.warmup),
            "--backend", opts.backend, "--mpi", opts.mpi, "--slow-ratio", f"{opts.slow_ratio:g}"]
    if ifname:
        args += ["--ifname", ifname]
    if profile.interconnect.expected_busbw_gbs is not None:
        args += ["--expected-gbs", f"{profile.interconnect.expected_busbw_gbs:g}"]
    return tuple(args)


def worker_path(in_image: bool, package_dir: str, job_project_dir: PurePosixPath) -> str:
    """Where the job finds the worker: bound read-only under ``job_project_dir`` in an
    image, hpcdl's own package directory on the host otherwise."""
    if in_image:
        return str(job_project_dir / "hpcdl" / "jobside" / "probe_worker.py")
    return str(PurePosixPath(package_dir) / "jobside" / "probe_worker.py")
