"""The sandbox cluster as data: its nodes and partitions (the *shape*), and the settings
that place one cluster beside another on this machine (directory, name, ports). This is
the one description of the default two-node cluster (``DEFAULT_SHAPE``); slurm.conf,
gres.conf, slurmdbd.conf, the /etc/hosts block and the bundled ``sandbox`` profile are
rendered from it (hpcdl.sandbox.render), and scripts/sandbox.sh only runs what needs
root (daemons, namespaces, veths, tc, mounts).

The shape file format (``HPCDL_SANDBOX_SHAPE``, written by tests/own_cluster.py, bench/
and ``hpcdl sandbox up --nodes N``) is one line per node or partition::

    node NAME ADDRESS PORT CPUS MEM_MB GRES STATE      GRES: gpu:TYPE:COUNT or -
                                                      STATE: up | down (no slurmd) |
                                                      nogres (a slurmd, no gres.conf line)
    partition NAME NODES|- [Key=Value ...]             Keys: see PARTITION_KEYS

Pure: no file or environment is read here except through ``Cluster.from_env``'s
arguments. Every value that reaches slurm.conf or a shell is a checked token
(``re.fullmatch``); errors are hpcdl ValidationErrors with one line each.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic import ValidationError as PydanticError

from hpcdl.core.tokens import Kind, check_token, checker
from hpcdl.errors import ValidationError

_NODE_NAME = re.compile(r"[a-z][a-z0-9]*")
_PARTITION_NAME = re.compile(r"[a-z][a-z0-9_]*")
NODE_NAME = Kind("node name", _NODE_NAME, "n1")
PARTITION_NAME = Kind("partition name", _PARTITION_NAME, "debug")
# A Slurm hostlist: names and ranges, e.g. n1,n2 or f[1-100].
NODE_LIST = Kind("node list", re.compile(r"[a-z][a-z0-9]*(\[\d+-\d+\])?(,[a-z][a-z0-9]*(\[\d+-\d+\])?)*"),
                 "n1,n2")
IPV4 = Kind("IPv4 address", re.compile(r"\d{1,3}(\.\d{1,3}){3}"), "10.77.0.11")
GPU_TYPE = Kind("GPU type", re.compile(r"[a-z0-9]+"), "fake")
TIME = Kind("Slurm time", re.compile(r"\d+(:\d{2}){0,2}|\d+-\d+(:\d{2}){0,2}|UNLIMITED|INFINITE"),
            "00:30:00")
CLUSTER_NAME = Kind("cluster name", re.compile(r"[a-z][a-z0-9_-]*"), "hpcdl-sandbox")
# Written into slurm.conf and shell lines unquoted: no spaces, nothing a shell expands.
DIRECTORY = Kind("absolute directory (letters, digits, . _ - + /)", re.compile(r"/[A-Za-z0-9._+/-]*"),
                 "/var/lib/hpcdl-sandbox")
HOST_NAME = Kind("host name", re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*"), "vm")

NodeName = Annotated[str, checker(NODE_NAME)]
Port = Annotated[int, Field(ge=1, le=65535)]

DEFAULT_DIR = "/var/lib/hpcdl-sandbox"
DEFAULT_NAME = "hpcdl-sandbox"
# Clear of Slurm's and MariaDB's default ports, so a site's own daemons may run beside it.
DEFAULT_CTLD_PORT, DEFAULT_DBD_PORT, DEFAULT_DB_PORT = 16817, 16819, 16306


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Node(_Frozen):
    """One slurmd: its name (also its hostname in its UTS namespace), its address (in
    its own network namespace, or a loopback address), its slurmd port, what it
    advertises (CPUs, memory: not a consumable resource) and its fake GPUs."""

    name: NodeName
    address: Annotated[str, checker(IPV4)]
    port: Port
    cpus: Annotated[int, Field(ge=1)]
    memory_mb: Annotated[int, Field(ge=1)]
    gpus: Annotated[int, Field(ge=0)] = 0
    gpu_type: Annotated[str, checker(GPU_TYPE)] | None = None
    state: Literal["up", "down", "nogres"] = "up"

    @model_validator(mode="after")
    def _gres(self) -> Node:
        if (self.gpus > 0) != (self.gpu_type is not None):
            raise ValueError(f"node {self.name}: gpus and gpu_type go together")
        return self

    @property
    def gres(self) -> str | None:
        """Slurm's Gres= value (``gpu:fake:4``), None without GPUs."""
        return f"gpu:{self.gpu_type}:{self.gpus}" if self.gpus else None

    @property
    def has_slurmd(self) -> bool:
        return self.state != "down"

    @property
    def octets(self) -> tuple[int, ...]:
        return tuple(int(part) for part in self.address.split("."))


class Partition(_Frozen):
    """One partition, with the limits that hpcdl's checks meet and its preemption:
    ``nodes`` is a Slurm hostlist (None: a partition without nodes)."""

    name: Annotated[str, checker(PARTITION_NAME)]
    nodes: Annotated[str, checker(NODE_LIST)] | None
    default: bool = False
    max_nodes: Annotated[int, Field(ge=1)] | None = None
    max_time: Annotated[str, checker(TIME)] | None = None
    default_time: Annotated[str, checker(TIME)] | None = None
    priority_tier: Annotated[int, Field(ge=0, le=65533)] | None = None
    preempt_mode: Literal["OFF", "REQUEUE", "CANCEL"] | None = None
    grace_time: Annotated[int, Field(ge=0)] | None = None
    hidden: bool = False
    state: Literal["UP", "DOWN", "DRAIN", "INACTIVE"] = "UP"

    def node_names(self) -> list[str]:
        """The hostlist expanded (``f[1-3]`` -> f1, f2, f3)."""
        names: list[str] = []
        for item in re.findall(r"[a-z][a-z0-9]*(?:\[\d+-\d+\])?", self.nodes or ""):
            m = re.fullmatch(r"([a-z][a-z0-9]*)\[(\d+)-(\d+)\]", item)
            if m is None:
                names.append(item)
            else:
                names += [f"{m.group(1)}{i}" for i in range(int(m.group(2)), int(m.group(3)) + 1)]
        return names

    def slurm_line(self) -> str:
        """The partition's slurm.conf line: options in one fixed order, State last."""
        words = [f"PartitionName={self.name}"]
        if self.nodes is not None:
            words.append(f"Nodes={self.nodes}")
        options = [("Default", "YES" if self.default else None), ("MaxNodes", self.max_nodes),
                   ("MaxTime", self.max_time), ("DefaultTime", self.default_time),
                   ("PriorityTier", self.priority_tier), ("PreemptMode", self.preempt_mode),
                   ("GraceTime", self.grace_time), ("Hidden", "YES" if self.hidden else None),
                   ("State", self.state)]
        words += [f"{key}={value}" for key, value in options if value is not None]
        return " ".join(words)


# The shape file's partition options: Slurm's name -> the model's field.
PARTITION_KEYS = {"Default": "default", "MaxNodes": "max_nodes", "MaxTime": "max_time",
                  "DefaultTime": "default_time", "PriorityTier": "priority_tier",
                  "PreemptMode": "preempt_mode", "GraceTime": "grace_time", "Hidden": "hidden",
                  "State": "state"}
_PRINTABLE = re.compile(r"[\x20-\x7e]+")
_INT_KEYS = {"MaxNodes", "PriorityTier", "GraceTime"}
_BOOL_KEYS = {"Default", "Hidden"}


def network_problem(nodes: tuple[Node, ...]) -> str | None:
    """Why the nodes' addresses cannot make one cluster, or None. Either every node is
    on a loopback address (127.0.0.0/8: no network namespaces), or all are in one /24
    whose .1 is the cluster's bridge (where slurmctld listens)."""
    subnet = None
    loopback = False
    for node in nodes:
        a, b, c, d = node.octets
        if max(a, b, c, d) > 255:
            return f"bad shape line: node {node.name}: address {node.address} is not an IPv4 address"
        if a == 127:
            loopback = True
            continue
        prefix = f"{a}.{b}.{c}"
        subnet = subnet or prefix
        if prefix != subnet:
            return (f"bad shape line: node {node.name}: address {node.address} is outside the "
                    f"cluster's subnet {subnet}.0/24 (all nodes in one /24)")
        if not 2 <= d <= 254:
            return (f"bad shape line: node {node.name}: address {node.address} must end in "
                    f"2-254 (.1 is the bridge)")
    if loopback and subnet:
        return (f"bad shape: node addresses mix 127.0.0.0/8 (no network namespaces) and "
                f"{subnet}.0/24 (one namespace per node)")
    return None


class Shape(_Frozen):
    """The cluster's nodes and partitions: what a shape file holds."""

    nodes: tuple[Node, ...] = Field(min_length=1)
    partitions: tuple[Partition, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> Shape:
        for kind, names in (("node", [n.name for n in self.nodes]),
                            ("partition", [p.name for p in self.partitions])):
            twice = sorted(name for name, count in Counter(names).items() if count > 1)
            if twice:
                raise ValueError(f"bad shape: {kind} {twice[0]} is listed twice")
        problem = network_problem(self.nodes)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def netns(self) -> bool:
        """True: each node in its own network namespace; False: loopback addresses."""
        return self.nodes[0].octets[0] != 127

    @property
    def subnet(self) -> str:
        """The nodes' /24 without its last octet (``10.77.0``); empty in loopback mode."""
        return self.nodes[0].address.rsplit(".", 1)[0] if self.netns else ""

    @property
    def ctld_address(self) -> str:
        """Where slurmctld (and slurmdbd) listen: the bridge's .1, or 127.0.0.1."""
        return f"{self.subnet}.1" if self.netns else "127.0.0.1"

    def shape_text(self) -> str:
        """The shape file that parses back to this shape."""
        lines = [f"node {n.name} {n.address} {n.port} {n.cpus} {n.memory_mb} {n.gres or '-'} "
                 f"{n.state}" for n in self.nodes]
        for p in self.partitions:
            # The file format's options are slurm.conf's, minus the State=UP it adds.
            words = p.slurm_line().split()[1:]
            if p.nodes is None:
                words.insert(0, "-")
            else:
                words[0] = p.nodes
            if words[-1] == "State=UP":
                words.pop()
            lines.append(" ".join(["partition", p.name, *words]))
        return "\n".join(lines) + "\n"


def _node_line(name: str, rest: list[str], line: str) -> Node:
    if len(rest) != 6 or not re.fullmatch(r"\d+", rest[1] + rest[2] + rest[3]) \
            or not re.fullmatch(r"-|gpu:[a-z0-9]+:\d+", rest[4]):
        raise ValidationError(f"bad shape line: {line}")
    addr, port, cpus, mem, gres, state = rest
    gpu_type, gpus = (None, 0) if gres == "-" else (gres.split(":")[1], int(gres.split(":")[2]))
    try:
        return Node(name=name, address=addr, port=int(port), cpus=int(cpus), memory_mb=int(mem),
                    gpus=gpus, gpu_type=gpu_type if gpus else None, state=state)  # type: ignore[arg-type]
    except PydanticError as err:
        raise ValidationError(f"bad shape line: {line}: {_first(err)}") from err


def _partition_line(name: str, rest: list[str], line: str) -> Partition:
    if not rest:
        raise ValidationError(f"bad shape line: {line}")
    fields: dict[str, object] = {"name": name, "nodes": None if rest[0] == "-" else rest[0]}
    for word in rest[1:]:
        key, eq, value = word.partition("=")
        if not eq or key not in PARTITION_KEYS:
            raise ValidationError(f"bad shape line: {line}: {word!r} is not one of "
                                  f"{', '.join(k + '=' for k in PARTITION_KEYS)}")
        if key in _INT_KEYS:
            if not re.fullmatch(r"\d{1,9}", value):
                raise ValidationError(f"bad shape line: {line}: {key} {value!r} is not a number")
            fields[PARTITION_KEYS[key]] = int(value)
        elif key in _BOOL_KEYS:
            if value not in ("YES", "NO"):
                raise ValidationError(f"bad shape line: {line}: {key} {value!r} is not YES or NO")
            fields[PARTITION_KEYS[key]] = value == "YES"
        else:
            fields[PARTITION_KEYS[key]] = value
    try:
        return Partition(**fields)  # type: ignore[arg-type]
    except PydanticError as err:
        raise ValidationError(f"bad shape line: {line}: {_first(err)}") from err


def _first(err: PydanticError) -> str:
    """pydantic's first complaint, one line, with the field's name."""
    e = err.errors()[0]
    where = ".".join(str(p) for p in e["loc"])
    msg = str(e["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def parse_shape(text: str) -> Shape:
    """The shape in ``text`` (see the module's docstring). Raises ValidationError with
    one line naming the bad line (as sandbox.sh's own parser did)."""
    nodes: list[Node] = []
    partitions: list[Partition] = []
    for raw in text.splitlines():
        words = raw.split()
        if not words or words[0].startswith("#"):
            continue
        line = " ".join(words)
        if not _PRINTABLE.fullmatch(line):
            raise ValidationError(f"bad shape line: {line!r}: not printable ASCII")
        kind, name, rest = words[0], (words[1:] or [""])[0], words[2:]
        if kind == "node" and _NODE_NAME.fullmatch(name):
            nodes.append(_node_line(name, rest, line))
        elif kind == "partition" and _PARTITION_NAME.fullmatch(name):
            partitions.append(_partition_line(name, rest, line))
        else:
            raise ValidationError(f"bad shape line: {line}")
    if not nodes:
        raise ValidationError("bad shape: no node lines")
    problem = network_problem(tuple(nodes))
    if problem:
        raise ValidationError(problem)
    try:
        return Shape(nodes=tuple(nodes), partitions=tuple(partitions))
    except PydanticError as err:
        raise ValidationError(_first(err)) from err


# The default sandbox: two nodes of 8 CPUs, 4096 MB and 4 fake GPUs each, and
# partitions for what hpcdl's tests and demo need. The bundled `sandbox` profile is
# generated from this (tests/unit/sandbox/test_sandbox_model.py keeps the committed file equal).
_EVERY = "n1,n2"
DEFAULT_SHAPE = Shape(
    nodes=(Node(name="n1", address="10.77.0.11", port=16821, cpus=8, memory_mb=4096,
                gpus=4, gpu_type="fake"),
           Node(name="n2", address="10.77.0.12", port=16822, cpus=8, memory_mb=4096,
                gpus=4, gpu_type="fake")),
    partitions=(
        Partition(name="debug", nodes=_EVERY, default=True, max_nodes=2, max_time="00:30:00",
                  default_time="00:10:00", preempt_mode="OFF"),
        Partition(name="gpu", nodes=_EVERY, max_nodes=2, max_time="02:00:00",
                  default_time="00:10:00", preempt_mode="OFF"),
        Partition(name="short", nodes=_EVERY, max_nodes=1, max_time="00:05:00",
                  default_time="00:05:00", preempt_mode="OFF"),
        # What urgent preempts: its jobs are requeued, their batch shell gets its --signal
        # at once and GraceTime seconds to checkpoint (`hpcdl submit --requeue`'s tests).
        Partition(name="lowprio", nodes=_EVERY, max_nodes=2, max_time="00:10:00",
                  default_time="00:05:00", priority_tier=1, preempt_mode="REQUEUE",
                  grace_time=60),
        # PreemptMode=OFF here and on debug, gpu, short: only lowprio's jobs are preempted.
        Partition(name="urgent", nodes=_EVERY, max_nodes=2, max_time="00:05:00",
                  default_time="00:02:00", priority_tier=10, preempt_mode="OFF"),
    ),
)


def profile_partition(p: Partition, nodes: Sequence[Node]) -> dict[str, Any]:
    """A profile's entry for partition ``p`` over ``nodes`` (not empty), sized by its
    smallest node: what every node of it can run."""
    entry: dict[str, Any] = {"name": p.name, "nodes": len(nodes),
                             "gpus_per_node": min(n.gpus for n in nodes)}
    types = {n.gpu_type for n in nodes if n.gpu_type}
    if len(types) == 1:
        entry["gpu_type"] = types.pop()
    entry["cpus_per_node"] = min(n.cpus for n in nodes)
    if min(n.memory_mb for n in nodes) >= 1024:
        entry["mem_per_node_gb"] = min(n.memory_mb for n in nodes) // 1024
    if p.max_nodes is not None and p.max_nodes < len(nodes):
        entry["max_nodes_per_job"] = p.max_nodes
    limit = p.max_time or "infinite"
    entry["max_time"] = "infinite" if limit in ("UNLIMITED", "INFINITE") else limit
    if p.default:
        entry["default"] = True
    return entry


def profile_partitions(shape: Shape) -> list[dict[str, Any]]:
    """The profile's partitions for ``shape``: each partition with nodes that takes
    jobs (State=UP)."""
    parts = []
    for p in shape.partitions:
        names = set(p.node_names())
        nodes = [n for n in shape.nodes if n.name in names]
        if nodes and p.state == "UP":
            parts.append(profile_partition(p, nodes))
    return parts


class Cluster(_Frozen):
    """A shape placed on this machine: its directory (state, config, logs), Slurm
    cluster name, ports, and whether it runs accounting (slurmdbd + MariaDB)."""

    shape: Shape
    dir: Annotated[str, checker(DIRECTORY)] = DEFAULT_DIR
    name: Annotated[str, checker(CLUSTER_NAME)] = DEFAULT_NAME
    ctld_port: Port = DEFAULT_CTLD_PORT
    dbd_port: Port = DEFAULT_DBD_PORT
    db_port: Port = DEFAULT_DB_PORT
    accounting: Literal["slurmdbd", "none"] = "slurmdbd"
    # Another Slurm release's root filesystem (scripts/slurm-rootfs.sh): its daemons and
    # commands run from there, its plugins too; None: the host's own Slurm.
    slurm_root: Annotated[str, checker(DIRECTORY)] | None = None
    # slurm.conf enables --requeue=expedite (SlurmctldParameters=enable_expedited_requeue):
    # on a release that has it (25.11 on: `hpcdl sandbox up --slurm` asks the release
    # table), as a site that wants the batch host's death requeued at the front would.
    expedited_requeue: bool = False

    @property
    def plugin_dir(self) -> str | None:
        """The release root's plugin directory (slurm.conf PluginDir): the daemons' own
        compiled-in one is the host's."""
        return f"{self.slurm_root}/usr/lib/x86_64-linux-gnu/slurm-wlm" if self.slurm_root else None

    @property
    def tag(self) -> str:
        """6 hex digits of the directory's SHA-1: every cluster directory has its own
        bridge, veths and namespaces (within Linux's 15-character interface names), and
        `down` finds exactly its own again, even after a crash."""
        return hashlib.sha1(self.dir.encode()).hexdigest()[:6]

    @property
    def bridge(self) -> str:
        return f"hsb-{self.tag}"

    def netns_of(self, node: str) -> str:
        return f"hpcdl-{self.tag}-{node}"

    def veth_of(self, node: str) -> str:
        """The host end of the node's veth: its index in the shape, from 1."""
        index = [n.name for n in self.shape.nodes].index(node)
        return f"hsv-{self.tag}-{index + 1}"

    @property
    def munge_socket(self) -> str:
        return f"{self.dir}/run/munge/munge.socket.2"

    @classmethod
    def from_env(cls, environ: Mapping[str, str], shape_text: str | None = None) -> Cluster:
        """The cluster sandbox.sh's environment names: HPCDL_SANDBOX_DIR, _CLUSTER,
        _CTLD_PORT, _DBD_PORT, _DB_PORT, _ACCOUNTING (each with its default), and the
        shape ``shape_text`` (the file HPCDL_SANDBOX_SHAPE names; None: DEFAULT_SHAPE).
        Raises ValidationError naming the variable and its value."""
        shape = DEFAULT_SHAPE if shape_text is None else parse_shape(shape_text)
        fields: dict[str, object] = {"shape": shape}
        for var, field in _ENV_FIELDS.items():
            value = environ.get(f"HPCDL_SANDBOX_{var}")
            if not value:
                continue
            if field == "expedited_requeue":
                if value not in ("yes", "no"):
                    raise ValidationError(f"HPCDL_SANDBOX_{var}: {value!r} is not yes or no")
                fields[field] = value == "yes"
            elif field.endswith("port"):
                if not re.fullmatch(r"\d{1,5}", value):
                    raise ValidationError(f"HPCDL_SANDBOX_{var}: {value!r} is not a port (1-65535)")
                fields[field] = int(value)
            else:
                fields[field] = value
        try:
            return cls(**fields)  # type: ignore[arg-type]
        except PydanticError as err:
            field = str(err.errors()[0]["loc"][0])
            var = next(v for v, f in _ENV_FIELDS.items() if f == field)
            raise ValidationError(f"HPCDL_SANDBOX_{var}: {fields[field]!r}: "
                                  f"{_first(err).split(': ', 1)[-1]}") from err


# sandbox.sh's environment (HPCDL_SANDBOX_NAME) -> Cluster's field.
_ENV_FIELDS = {"DIR": "dir", "CLUSTER": "name", "ACCOUNTING": "accounting",
               "CTLD_PORT": "ctld_port", "DBD_PORT": "dbd_port", "DB_PORT": "db_port",
               "SLURM_ROOT": "slurm_root", "EXPEDITE": "expedited_requeue"}


def check_host(name: str) -> str:
    """This machine's short host name, as slurm.conf's SlurmctldHost takes it."""
    try:
        return check_token(name, HOST_NAME)
    except ValueError as err:
        raise ValidationError(f"host name: {err}") from err
