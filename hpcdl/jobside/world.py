"""Who am I in the job? Rank and world size from whichever launcher started us.

One answer for torchrun, Open MPI's ``mpirun`` (and ``horovodrun``, which uses it or
Gloo), and Slurm's ``srun``, so the same training script runs under all of them.
This module is imported inside the container image with only ``PYTHONPATH`` set, so
it imports nothing but the standard library (and ``hpcdl.jobside.errors``, itself stdlib-only).

Precedence, most specific first (an ``mpirun`` inside an ``sbatch`` job sees both
Open MPI and Slurm variables; the Open MPI ones describe the processes it started):
torchrun -> Open MPI -> Horovod (Gloo) -> Slurm -> single process.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpcdl.jobside.errors import ConfigError

# Ports derived from a job id land in [PORT_BASE, PORT_BASE + PORT_SPAN): above the
# well-known/registered services people run on clusters (< 15000) and below Linux's
# default ephemeral range (32768-60999), so an outgoing connection cannot hold it.
PORT_BASE = 15000
PORT_SPAN = 15000
DEFAULT_PORT = 29500  # torch.distributed's own default

_BRACKET = re.compile(r"\[([^\[\]]*)\]")
# HPCDL_RANK_FROM values the rank-env wrapper writes -> the launcher they stand for.
_WRAPPED = {"slurm": "slurm", "openmpi": "openmpi", "horovod": "horovod", "pmi": "pmi"}


@dataclass(frozen=True)
class World:
    """This process's place in the job.

    ``launcher`` is one of ``torchrun``, ``openmpi``, ``horovod``, ``slurm``, ``single``.
    """

    rank: int
    world_size: int
    local_rank: int
    local_size: int
    nodes: int
    master_addr: str
    master_port: int
    launcher: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0


def expand_hostlist(spec: str) -> list[str]:
    """Expand Slurm hostlist syntax: ``n[1-2]``, ``gpu[01-03,07]``, ``a1,b[2-3]``,
    ``r[1-2]-n[1-2]`` (several ranges multiply, in Slurm's order).

    Zero padding of a range is kept (``01-03`` -> 01, 02, 03).
    Raises ConfigError on unbalanced brackets or a malformed range.
    """
    spec = spec.strip()
    if not spec:
        return []
    hosts: list[str] = []
    for item in _split_top_level(spec):
        hosts.extend(_expand_one(item, spec))
    return hosts


def _split_top_level(spec: str) -> list[str]:
    items: list[str] = []
    depth = start = 0
    for i, ch in enumerate(spec):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ConfigError(f"hostlist {spec!r}: nested '[' at position {i}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"hostlist {spec!r}: unmatched ']' at position {i}")
        elif ch == "," and depth == 0:
            items.append(spec[start:i])
            start = i + 1
    if depth != 0:
        raise ConfigError(f"hostlist {spec!r}: unclosed '['")
    items.append(spec[start:])
    return [s.strip() for s in items if s.strip()]


def _expand_one(item: str, spec: str) -> list[str]:
    match = _BRACKET.search(item)
    if match is None:
        if "[" in item or "]" in item:
            raise ConfigError(f"hostlist {spec!r}: malformed item {item!r}")
        return [item]
    prefix, suffix = item[: match.start()], item[match.end() :]
    out: list[str] = []
    for value in _expand_ranges(match.group(1), spec):
        # The suffix may hold more bracket groups: expand it recursively.
        out.extend(prefix + value + rest for rest in _expand_one(suffix, spec) or [""])
    return out


def _expand_ranges(body: str, spec: str) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise ConfigError(f"hostlist {spec!r}: bad range {part!r}")
        lo_s, hi_s = m.group(1), m.group(2)
        if hi_s is None:
            values.append(lo_s)
            continue
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise ConfigError(f"hostlist {spec!r}: range {part!r} runs backwards")
        width = len(lo_s)
        values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values


def parse_tasks_per_node(spec: str) -> list[int]:
    """Expand ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) to one count per node.

    Raises ConfigError when it is malformed.
    """
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            raise ConfigError(f"SLURM_TASKS_PER_NODE={spec!r}: cannot parse {part!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def port_from_job_id(job_id: str | int) -> int:
    """A port for the rendezvous, stable for a job and different across concurrent jobs.

    Raises ConfigError when the id holds no digits.
    """
    digits = re.sub(r"\D", "", str(job_id))
    if not digits:
        raise ConfigError(f"job id {job_id!r} holds no digits to derive a port from")
    return PORT_BASE + int(digits) % PORT_SPAN


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise ConfigError(f"{name} is not set")
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def _port(env: Mapping[str, str], fallback: int) -> int:
    port = _int(env, "MASTER_PORT", fallback)
    if not 0 < port < 65536:
        raise ConfigError(f"MASTER_PORT={port} is outside 1-65535")
    return port


def _slurm_first_host(env: Mapping[str, str]) -> str | None:
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    hosts = expand_hostlist(nodelist)
    return hosts[0] if hosts else None


def _slurm_nodes(env: Mapping[str, str]) -> int | None:
    for name in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        if env.get(name):
            return _int(env, name)
    return None


def _slurm_port(env: Mapping[str, str]) -> int | None:
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    return port_from_job_id(job_id) if job_id else None


def _nodes_from(world_size: int, local_size: int) -> int:
    # Exact when every node runs the same number of ranks (the usual layout).
    return max(1, -(-world_size // max(1, local_size)))


def _from_torchrun(env: Mapping[str, str]) -> World:
    world_size = _int(env, "WORLD_SIZE")
    local_size = _int(env, "LOCAL_WORLD_SIZE", world_size)
    nodes = _int(env, "GROUP_WORLD_SIZE", 0) or _nodes_from(world_size, local_size)
    return World(
        rank=_int(env, "RANK"),
        world_size=world_size,
        local_rank=_int(env, "LOCAL_RANK", 0),
        local_size=local_size,
        nodes=nodes,
        master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
        master_port=_port(env, DEFAULT_PORT),
        # hpcdl's rank-env wrapper (hpcdl.launch.rankenv) sets torchrun's variables
        # under srun/mpirun too, and names where it took them from.
        launcher=_WRAPPED.get(env.get("HPCDL_RANK_FROM", ""), "torchrun"),
    )


def _from_openmpi(env: Mapping[str, str]) -> World:
    world_size = _int(env, "OMPI_COMM_WORLD_SIZE")
    local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1)
    nodes = _nodes_from(world_size, local_size)
    # mpirun does not tell where rank 0 runs. Inside Slurm the first node of the
    # allocation hosts it (mpirun's default mapping); elsewhere MASTER_ADDR must be
    # passed (-x MASTER_ADDR) for multi-node runs, and loopback suffices on one node.
    addr = env.get("MASTER_ADDR") or _slurm_first_host(env)
    if not addr:
        if nodes > 1:
            raise ConfigError(
                "mpirun across nodes without MASTER_ADDR: cannot tell where rank 0 runs",
            )
        addr = "127.0.0.1"
    job = env.get("OMPI_MCA_ess_base_jobid") or env.get("SLURM_JOB_ID")
    fallback = port_from_job_id(job) if job and re.search(r"\d", job) else DEFAULT_PORT
    return World(
        rank=_int(env, "OMPI_COMM_WORLD_RANK"),
        world_size=world_size,
        local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
        local_size=local_size,
        nodes=nodes,
        master_addr=addr,
        master_port=_port(env, fallback),
        launcher="openmpi",
    )


def _from_horovod(env: Mapping[str, str]) -> World:
    world_size = _int(env, "HOROVOD_SIZE")
    local_size = _int(env, "HOROVOD_LOCAL_SIZE", 1)
    nodes = _int(env, "HOROVOD_CROSS_SIZE", 0) or _nodes_from(world_size, local_size)
    addr = env.get("MASTER_ADDR") or env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR") or "127.0.0.1"
    return World(
        rank=_int(env, "HOROVOD_RANK"),
        world_size=world_size,
        local_rank=_int(env, "HOROVOD_LOCAL_RANK", 0),
        local_size=local_size,
        nodes=nodes,
        master_addr=addr,
        # The Gloo rendezvous port belongs to horovodrun: never reuse it.
        master_port=_port(env, DEFAULT_PORT),
        launcher="horovod",
    )


def _from_slurm(env: Mapping[str, str]) -> World:
    world_size = _int(env, "SLURM_NTASKS", 0) or _int(env, "SLURM_NPROCS", 1)
    node_id = _int(env, "SLURM_NODEID", 0)
    if env.get("SLURM_NTASKS_PER_NODE"):
        local_size = _int(env, "SLURM_NTASKS_PER_NODE")
    elif env.get("SLURM_TASKS_PER_NODE"):
        per_node = parse_tasks_per_node(env["SLURM_TASKS_PER_NODE"])
        if node_id >= len(per_node):
            raise ConfigError(
                f"SLURM_NODEID={node_id} but SLURM_TASKS_PER_NODE="
                f"{env['SLURM_TASKS_PER_NODE']!r} lists {len(per_node)} nodes"
            )
        local_size = per_node[node_id]
    else:
        local_size = world_size
    nodes = _slurm_nodes(env) or _nodes_from(world_size, local_size)
    addr = env.get("MASTER_ADDR") or _slurm_first_host(env) or "127.0.0.1"
    return World(
        rank=_int(env, "SLURM_PROCID"),
        world_size=world_size,
        local_rank=_int(env, "SLURM_LOCALID", 0),
        local_size=local_size,
        nodes=nodes,
        master_addr=addr,
        master_port=_port(env, _slurm_port(env) or DEFAULT_PORT),
        launcher="slurm",
    )


def detect_world(env: Mapping[str, str] | None = None) -> World:
    """Read the launcher's variables from ``env`` (default: ``os.environ``).

    Raises ConfigError when a launcher's variables are malformed or inconsistent.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _from_torchrun(env)
    elif "OMPI_COMM_WORLD_RANK" in env:
        world = _from_openmpi(env)
    elif "HOROVOD_RANK" in env and "HOROVOD_SIZE" in env:
        world = _from_horovod(env)
    elif "SLURM_PROCID" in env and ("SLURM_NTASKS" in env or "SLURM_NPROCS" in env):
        world = _from_slurm(env)
    else:
        world = World(
            rank=0,
            world_size=1,
            local_rank=0,
            local_size=1,
            nodes=1,
            master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
            master_port=_port(env, DEFAULT_PORT),
            launcher="single",
        )
    _check(world)
    return world


def _check(world: World) -> None:
    if world.world_size < 1:
        raise ConfigError(f"{world.launcher}: world size {world.world_size} must be >= 1")
    if not 0 <= world.rank < world.world_size:
        raise ConfigError(
            f"{world.launcher}: rank {world.rank} outside world size {world.world_size}"
        )
    if not 0 <= world.local_rank < max(1, world.local_size):
        raise ConfigError(
            f"{world.launcher}: local rank {world.local_rank} outside local size {world.local_size}"
        )


def torch_env(world: World) -> dict[str, str]:
    """The variables torch.distributed's ``env://`` init reads, for ``world``."""
    return {
        "RANK": str(world.rank),
        "WORLD_SIZE": str(world.world_size),
        "LOCAL_RANK": str(world.local_rank),
        "LOCAL_WORLD_SIZE": str(world.local_size),
        "MASTER_ADDR": world.master_addr,
        "MASTER_PORT": str(world.master_port),
    }


def export_torch_env(world: World, env: dict[str, str] | None = None) -> dict[str, str]:
    """Set RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT in ``env`` (default
    ``os.environ``) so ``torch.distributed.init_process_group("env://")`` works under any
    launcher. Returns the variables it set."""
    values = torch_env(world)
    target = os.environ if env is None else env
    target.update(values)
    return values
