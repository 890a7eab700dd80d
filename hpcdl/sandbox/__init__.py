"""The local Slurm sandbox as data. ``hpcdl.sandbox.cluster`` is the model (nodes,
partitions, ports, directory; the default two-node cluster is its DEFAULT_SHAPE) and
the shape file format; ``hpcdl.sandbox.render`` renders the cluster's slurm.conf,
gres.conf, /etc/hosts block and the bundled `sandbox` profile; scripts/sandbox.sh runs
the daemons.

This module: clusters of N nodes (`hpcdl sandbox up --nodes N`): their shape, the
environment that points sandbox.sh and Slurm's own commands at the cluster, and the
profile that matches it. Pure: the CLI picks the runtime facts (a free subnet and
slurmctld port), writes the files and runs sandbox.sh.

An N-node cluster lives in its own directory (``/var/lib/hpcdl-sandbox-Nn``), so the
shared two-node sandbox keeps running beside it; its nodes are named ``sNnI`` (s32n1 ..
s32n32), which no other cluster size uses, because every cluster's names go into
/etc/hosts while it runs.
"""

from __future__ import annotations

import random
import re
import shlex
from pathlib import Path
from typing import Any

from hpcdl.errors import ValidationError
from hpcdl.sandbox import cluster as model

DEFAULT_DIR = Path(model.DEFAULT_DIR)
# A cluster lives in one /24 whose .1 is the bridge; nodes take .11 onwards.
FIRST_HOST = 11
MAX_NODES = 200
# Each slurmd listens in its own network namespace, so the ports only need to differ
# from each other (they are also what `scontrol show node` reports).
FIRST_SLURMD_PORT = 17001
# Each node as the default sandbox's first node; its partition as the default's.
_LIKE = model.DEFAULT_SHAPE.nodes[0]
_DEFAULT_PARTITION = next(p for p in model.DEFAULT_SHAPE.partitions if p.default)
ENV_FILE = "sandbox.env"
SHAPE_FILE = "shape.txt"
_SUBNET = re.compile(r"10\.(\d{1,3})\.(\d{1,3})")
_ENV_LINE = re.compile(r"([A-Z][A-Z0-9_]*)=(\S+)")


# Slurm releases a sandbox runs beside the host's own (22.05, bookworm's packages): each
# from a root filesystem of the Debian release that packages it (scripts/slurm-rootfs.sh).
RELEASES = ("24.11", "26.05")


def check_release(release: str) -> None:
    """Raises ValidationError unless ``release`` is one RELEASES names."""
    if release not in RELEASES:
        raise ValidationError(f"slurm: release {release!r} has no sandbox here (known: "
                              f"{', '.join(RELEASES)}; without --slurm: the host's 22.05)")


def _tag(release: str) -> str:
    """24.11 -> 2411: names (nodes, cluster) take no dots."""
    return release.replace(".", "")


def check_nodes(nodes: int) -> None:
    """Raises ValidationError unless 1 <= ``nodes`` <= MAX_NODES."""
    if not 1 <= nodes <= MAX_NODES:
        raise ValidationError(f"nodes: {nodes} is not 1 to {MAX_NODES} (a sandbox cluster's "
                              f"nodes share one /24 of addresses)")


def pick_subnet(ip_addr_output: str, rng: random.Random | None = None) -> str:
    """A ``10.A.B`` /24 (A from 80 to 127) in which no interface holds an address, from
    the output of ``ip -o -4 addr show``. Raises ValidationError when none is left."""
    used = {".".join(word.split("/")[0].split(".")[:3])
            for line in ip_addr_output.splitlines() for word in line.split()[3:4]}
    rng = rng or random.Random()
    for _ in range(1000):
        subnet = f"10.{rng.randint(80, 127)}.{rng.randint(0, 255)}"
        if subnet not in used:
            return subnet
    raise ValidationError("subnet: no free 10.80-127.x.0/24 for a sandbox cluster's nodes")


# A release's cluster (--slurm 24.11) is one per release, of any size: its own directory,
# cluster name, profile and node names (v2411n1 ...), so it runs beside the host
# release's clusters and every other release's.
def cluster_dir(nodes: int, release: str | None = None) -> Path:
    return Path(f"{DEFAULT_DIR}-{release}" if release else f"{DEFAULT_DIR}-{nodes}n")


def cluster_name(nodes: int, release: str | None = None) -> str:
    return f"hpcdl-slurm{_tag(release)}" if release else f"hpcdl-sandbox-{nodes}n"


def profile_name(nodes: int, release: str | None = None) -> str:
    return f"sandbox-{release}" if release else f"sandbox-{nodes}n"


def node_names(nodes: int, release: str | None = None) -> list[str]:
    prefix = f"v{_tag(release)}n" if release else f"s{nodes}n"
    return [f"{prefix}{i}" for i in range(1, nodes + 1)]


def _partition(nodes: int, names: list[str] | None) -> model.Partition:
    """The one partition of an N-node cluster: like the default sandbox's default one
    (debug), over all nodes."""
    return model.Partition(name=_DEFAULT_PARTITION.name,
                           nodes=",".join(names) if names else None, default=True,
                           max_nodes=nodes, max_time=_DEFAULT_PARTITION.max_time,
                           default_time=_DEFAULT_PARTITION.default_time, preempt_mode="OFF")


# The default sandbox's preempting pair: urgent's jobs requeue lowprio's (GraceTime to
# checkpoint). A release's cluster has them too, over all its nodes, so the release
# matrix preempts for real (tests/integration/test_slurm_matrix_requeue.py).
_PREEMPTION = tuple(p for p in model.DEFAULT_SHAPE.partitions if p.name in ("lowprio", "urgent"))


def _partitions(nodes: int, names: list[str] | None,
                release: str | None) -> tuple[model.Partition, ...]:
    """An N-node cluster's partitions: debug (``_partition``); for another release also
    lowprio and urgent (``_PREEMPTION``) over the same nodes, MaxNodes=N."""
    first = _partition(nodes, names)
    if not release:
        return (first,)
    return (first, *(model.Partition(**{**p.model_dump(), "nodes": first.nodes,
                                         "max_nodes": nodes}) for p in _PREEMPTION))


def shape(nodes: int, subnet: str, release: str | None = None) -> model.Shape:
    """``nodes`` nodes in ``subnet`` (``10.A.B``), each like the default sandbox's first
    node and up with a slurmd, and one partition (see ``_partition``) over all of them,
    MaxNodes=N. Raises ValidationError for a node count or subnet out of range."""
    check_nodes(nodes)
    m = _SUBNET.fullmatch(subnet)
    if m is None or not all(0 <= int(part) <= 255 for part in m.groups()):
        raise ValidationError(f"subnet: {subnet!r} is not 10.A.B (a /24 without its last octet)")
    names = node_names(nodes, release)
    return model.Shape(
        # Built anew, not model_copy'd: a copy would skip the checks of its fields.
        nodes=tuple(model.Node(**{**_LIKE.model_dump(), "name": name,
                                  "address": f"{subnet}.{FIRST_HOST + i}",
                                  "port": FIRST_SLURMD_PORT + i})
                    for i, name in enumerate(names)),
        partitions=_partitions(nodes, names, release))


def shape_text(nodes: int, subnet: str, release: str | None = None) -> str:
    """The shape file (HPCDL_SANDBOX_SHAPE) of :func:`shape`."""
    return shape(nodes, subnet, release).shape_text()


def environment(folder: Path, nodes: int, ctld_port: int, release: str | None = None,
                slurm_root: str | None = None, expedite: bool = False,
                accounting_ports: tuple[int, int] | None = None) -> dict[str, str]:
    """What sandbox.sh (up, down, status, shape) and Slurm's commands need to find the
    cluster in ``folder``: its directory and shape, its slurmctld port and name, and
    SLURM_CONF; for another release, the root filesystem its Slurm runs from.

    Accounting: with ``accounting_ports`` (slurmdbd's port, MariaDB's), the cluster runs
    its own slurmdbd and MariaDB on them, as the host's 22.05 sandbox does (a release
    cluster: its `sacct` is what hpcdl's status and results read); without, none (an
    N-node cluster for scale: slurmdbd and MariaDB per cluster cost more than its nodes)."""
    env = {"HPCDL_SANDBOX_DIR": str(folder), "HPCDL_SANDBOX_SHAPE": str(folder / SHAPE_FILE),
           "HPCDL_SANDBOX_CTLD_PORT": str(ctld_port),
           "HPCDL_SANDBOX_CLUSTER": cluster_name(nodes, release),
           "HPCDL_SANDBOX_ACCOUNTING": "none",
           "SLURM_CONF": str(folder / "etc" / "slurm.conf")}
    if accounting_ports:
        dbd, db = accounting_ports
        env.update({"HPCDL_SANDBOX_ACCOUNTING": "slurmdbd",
                    "HPCDL_SANDBOX_DBD_PORT": str(dbd), "HPCDL_SANDBOX_DB_PORT": str(db)})
    if slurm_root:
        env["HPCDL_SANDBOX_SLURM_ROOT"] = slurm_root
    if expedite:  # the release has --requeue=expedite: slurm.conf enables it
        env["HPCDL_SANDBOX_EXPEDITE"] = "yes"
    return env


def commands_dir(folder: Path) -> Path:
    """A release cluster's wrappers of its Slurm commands (scripts/sandbox.sh writes
    them): its profile's scheduler.commands."""
    return folder / "bin"


def env_file_text(env: dict[str, str]) -> str:
    """``KEY=VALUE`` lines a shell can source (``set -a; . FILE; set +a``)."""
    return "".join(f"{key}={shlex.quote(value)}\n" for key, value in sorted(env.items()))


def parse_env_file(text: str) -> dict[str, str]:
    """The environment ``env_file_text`` wrote. Raises ValidationError for any other line."""
    env = {}
    for number, line in enumerate(text.splitlines(), 1):
        m = _ENV_LINE.fullmatch(line.strip())
        if m is None:
            raise ValidationError(f"{ENV_FILE} line {number}: {line!r} is not KEY=VALUE")
        env[m.group(1)] = m.group(2)
    return env


# The default sandbox's TmpFS, as the bundled profile binds it (scripts/sandbox.sh).
DEFAULT_TMPFS = f"{model.DEFAULT_DIR}/tmp"


def cluster_binds(binds: list[str], folder: Path) -> list[str]:
    """The bundled sandbox profile's container binds for the cluster in ``folder``: its
    own TmpFS (where Slurm's PMIx keeps each job's directory) instead of the default
    sandbox's; the others (the shared /scratch) as they are."""
    return [str(folder / "tmp") if b == DEFAULT_TMPFS else b for b in binds]


def cluster_profile(base: dict[str, Any], shape: model.Shape, folder: Path, name: str,
                    description: str) -> dict[str, Any]:
    """The profile of the cluster of ``shape`` in ``folder``: the bundled sandbox
    profile ``base`` (its container, MPI, environment and example defaults) with the
    shape's partitions (hpcdl.sandbox.cluster.profile_partitions) and the cluster's own
    TmpFS bound into the container (Slurm's PMIx keeps each job's directory there)."""
    return _profile(base, model.profile_partitions(shape), folder, name, description)


def profile_data(base: dict[str, Any], nodes: int, folder: Path,
                 release: str | None = None, pmix: bool = False,
                 expedite: bool = False) -> dict[str, Any]:
    """The profile of the ``nodes``-node cluster in ``folder`` (`--nodes N`): its one
    partition over nodes like the default sandbox's. Any ``nodes`` (bench/bench_scale.py
    plans for 4,096), no addresses needed. For another ``release`` (`--slurm`), its
    Slurm commands are the cluster's wrappers (scheduler.commands), its release is
    recorded (scheduler.release), and ``pmix`` says whether its root has a working
    mpi/pmix plugin (root_has_pmix)."""
    how = f"--slurm {release} --nodes {nodes}" if release else f"--nodes {nodes}"
    data = _profile(base, [model.profile_partition(p, [_LIKE] * nodes)
                           for p in _partitions(nodes, None, release)],
                    folder, profile_name(nodes, release),
                    f"Local {nodes}-node Slurm {release or ''}{' ' if release else ''}sandbox "
                    f"in {folder} (hpcdl sandbox up {how})")
    if release:
        data["scheduler"] = {**(data.get("scheduler") or {}),
                             "commands": str(commands_dir(folder)), "release": release}
        # Its slurm.conf enables --requeue=expedite where the release has it
        # (``expedite``, Cluster.expedited_requeue): the profile says so, and --requeue
        # renders it.
        if expedite:
            data["scheduler"]["requeue_expedite"] = True
        # 24.11's root has mpi/pmix reading the root's own PMIx (scripts/slurm-rootfs.sh,
        # pmix_path); forky's 26.05 package is built without the plugin: its ranks start
        # without a PMI (torch.distributed needs none; Open MPI here speaks only PMIx).
        if not pmix:
            data["mpi"] = {**(data.get("mpi") or {}), "srun_mpi": "none"}
    return data


def root_has_pmix(slurm_root: str | None) -> bool:
    """Whether the release root ``slurm_root`` has an mpi/pmix plugin that finds the
    root's own PMIx (scripts/slurm-rootfs.sh leaves ROOT/hpcdl/pmix-link then)."""
    return bool(slurm_root) and (Path(str(slurm_root)) / "hpcdl" / "pmix-link").is_file()


def _profile(base: dict[str, Any], partitions: list[dict[str, Any]], folder: Path, name: str,
             description: str) -> dict[str, Any]:
    data = dict(base)
    data["name"] = name
    data["description"] = description
    data["partitions"] = partitions
    container = dict(data.get("container") or {})
    container["binds"] = cluster_binds(list(container.get("binds") or []), folder)
    data["container"] = container
    return data
