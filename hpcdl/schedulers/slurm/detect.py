"""What a live Slurm cluster says about itself, for ``hpcdl profiles detect`` and ``diff``.

Two halves: pure parsers of ``scontrol -o show partition/node``, ``scontrol show
config``, ``srun --mpi=list``, ``sacctmgr -P show qos`` and a runtime's
``--version`` (tested on outputs captured from a real cluster), and ``gather()``,
which runs those commands through an Executor (this machine, or a login node over SSH:
``gather_remote``) and keeps each command's failure as a *gap* instead of raising, so a
partial cluster still gives a partial answer. Nothing here prints; the profile writer
lives beside it, in hpcdl.schedulers.slurm.describe.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hpcdl.errors import ToolError
from hpcdl.schedulers.executor import LOCAL, Executor, RemoteInputError
from hpcdl.schedulers.slurm.parse import parse_config

# "Key=" at the start of a token: Slurm's keys are CamelCase (gres/gpu=... inside a TRES
# value follows a comma, not a blank, so it is not a key here).
_KEY = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_]*)=")
_GRES_ITEM = re.compile(r"([A-Za-z0-9_.\-]+)(?::([A-Za-z0-9_.\-]+))?:(\d+)(?:\(.*\))?")
_RUNTIME_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?\S*)")


def parse_records(text: str) -> list[dict[str, str]]:
    """``scontrol -o show ...``: one record per line of ``Key=Value`` pairs.

    Values may contain blanks (``OS=Linux 6.1 #1 SMP``, ``Reason=Not responding``):
    a value runs until the next `` Key=``. Pure.
    """
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        keys = list(_KEY.finditer(line))
        rec = {}
        for i, m in enumerate(keys):
            end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
            rec[m.group(1)] = line[m.end():end].strip()
        if rec:
            out.append(rec)
    return out


@dataclass(frozen=True)
class Gres:
    """One GRES entry of a node: ``gpu:a100:4`` -> name gpu, type a100, count 4."""

    name: str
    type: str | None
    count: int


def parse_gres(text: str) -> list[Gres]:
    """A node's ``Gres=`` (``gpu:a100:4(S:0-1),gpu:v100:2``, ``gpu:2``, ``(null)``). Pure.

    Entries that are not NAME[:TYPE]:COUNT are skipped (a count of 0 is kept).
    """
    out: list[Gres] = []
    text = text.strip()
    if not text or text == "(null)":
        return out
    # Commas also appear inside the socket list "(S:0,1)": split only outside parentheses.
    depth, item, items = 0, "", []
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
        else:
            item += ch
    items.append(item)
    for raw in items:
        m = _GRES_ITEM.fullmatch(raw.strip())
        if m:
            out.append(Gres(m.group(1), m.group(2), int(m.group(3))))
    return out


@dataclass(frozen=True)
class Node:
    """One node as ``scontrol -o show node`` reports it."""

    name: str
    cpus: int
    memory_mb: int
    gres: tuple[Gres, ...]
    state: str                  # e.g. IDLE, DOWN*, IDLE+DRAIN, MIXED
    partitions: tuple[str, ...]
    reason: str = ""

    @property
    def gpus(self) -> int:
        return sum(g.count for g in self.gres if g.name == "gpu")

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({g.type or "untyped" for g in self.gres if g.name == "gpu" and g.count}))

    @property
    def usable(self) -> bool:
        """False when Slurm will not start jobs on it now (down, drained, failing...)."""
        return not any(bad in self.state for bad in ("DOWN", "DRAIN", "FAIL", "INVAL", "NOT_RESPONDING"))


def _int(text: str | None, default: int = 0) -> int:
    text = (text or "").strip()
    return int(text) if text.isdigit() else default


def parse_nodes(text: str) -> list[Node]:
    """``scontrol -o show node`` -> nodes. CPUs are the effective ones (CPUEfctv, 22.05+;
    CPUTot before). Pure."""
    out = []
    for rec in parse_records(text):
        name = rec.get("NodeName")
        if not name:
            continue
        parts = rec.get("Partitions", "")
        out.append(Node(
            name=name,
            cpus=_int(rec.get("CPUEfctv")) or _int(rec.get("CPUTot")),
            memory_mb=_int(rec.get("RealMemory")),
            gres=tuple(parse_gres(rec.get("Gres", ""))),
            state=rec.get("State", "UNKNOWN"),
            partitions=tuple(p for p in parts.split(",") if p and p != "(null)"),
            reason=rec.get("Reason", ""),
        ))
    return out


@dataclass(frozen=True)
class PartitionInfo:
    """One partition as ``scontrol -o show partition`` reports it (times as Slurm wrote them)."""

    name: str
    default: bool
    hidden: bool
    state: str            # UP, DOWN, DRAIN, INACTIVE
    max_time: str         # "00:30:00", "UNLIMITED"
    default_time: str | None  # None: not set (jobs without --time get MaxTime)
    max_nodes: int | None     # None: UNLIMITED
    total_nodes: int
    nodes: str            # Slurm's hostlist, e.g. "n[1-2]", "(null)"
    qos: str | None       # the partition QOS, None for N/A
    total_cpus: int = 0
    tres: str = ""        # "cpu=16,mem=8G,node=2,billing=16,gres/gpu=8"

    @property
    def total_gpus(self) -> int:
        for item in self.tres.split(","):
            key, _, value = item.partition("=")
            if key == "gres/gpu" and value.isdigit():
                return int(value)
        return 0


def parse_partitions(text: str) -> list[PartitionInfo]:
    """``scontrol -o show partition`` (with ``-a``: hidden ones too) -> partitions. Pure."""
    out = []
    for rec in parse_records(text):
        name = rec.get("PartitionName")
        if not name:
            continue
        default_time = rec.get("DefaultTime", "NONE")
        max_nodes = rec.get("MaxNodes", "UNLIMITED")
        qos = rec.get("QoS", "N/A")
        out.append(PartitionInfo(
            name=name,
            default=rec.get("Default", "NO").upper() == "YES",
            hidden=rec.get("Hidden", "NO").upper() == "YES",
            state=rec.get("State", "UP").upper(),
            max_time=rec.get("MaxTime", "UNLIMITED"),
            default_time=None if default_time.upper() in ("NONE", "") else default_time,
            max_nodes=int(max_nodes) if max_nodes.isdigit() else None,
            total_nodes=_int(rec.get("TotalNodes")),
            nodes=rec.get("Nodes", "(null)"),
            qos=None if qos in ("N/A", "(null)", "") else qos,
            total_cpus=_int(rec.get("TotalCPUs")),
            tres=rec.get("TRES", ""),
        ))
    return out


@dataclass(frozen=True)
class MpiPlugins:
    """``srun --mpi=list``: the plugin types offered and the PMIx versions."""

    types: tuple[str, ...]
    pmix_versions: tuple[str, ...]


def parse_mpi_list(text: str) -> MpiPlugins:
    """Both 22.05's layout ("MPI plugin types are...", one per tab-indented line,
    "specific pmix plugin versions available: pmix_v4") and 23.x's ("MPI plugin types
    are...\n\tnone\n\tpmix\nspecific pmix plugin versions available: pmix_v4,pmix_v5"),
    and before 21 "srun: NAME" lines, "srun: mpi/NAME" before 20, where a PMIx version
    is a type of its own ("srun: pmix_v3"). Pure; the one reader of this output (the
    doctor's host check too).
    """
    types: list[str] = []
    versions: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.lower().startswith("specific pmix plugin versions available:"):
            rest = stripped.split(":", 1)[1]
            versions += [v for v in re.split(r"[\s,]+", rest) if v]
            continue
        m = re.fullmatch(r"(?:srun:\s*)?(?:mpi/)?([A-Za-z0-9_]+)", stripped)
        if m:  # a header ("MPI plugin types are...") has spaces and dots: not a name
            types.append(m.group(1))
    versions += [t for t in types if re.fullmatch(r"pmix_v\d+", t) and t not in versions]
    return MpiPlugins(tuple(types), tuple(versions))


@dataclass(frozen=True)
class Qos:
    """Per-user limits of one QOS (``sacctmgr -P show qos``); None: no limit."""

    name: str
    max_jobs_per_user: int | None
    max_gpus_per_user: int | None
    max_wall: str | None


def parse_qos(text: str) -> dict[str, Qos]:
    """``sacctmgr -P show qos`` (a header line, then '|'-separated rows). Pure."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = lines[0].split("|")
    out = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split("|"), strict=False))
        name = row.get("Name", "")
        if not name:
            continue
        gpus = None
        for tres in row.get("MaxTRESPU", "").split(","):
            key, _, value = tres.partition("=")
            if key in ("gres/gpu", "gpu") and value.isdigit():
                gpus = int(value)
        jobs = row.get("MaxJobsPU", "")
        out[name] = Qos(name, int(jobs) if jobs.isdigit() else None, gpus,
                        row.get("MaxWall") or None)
    return out


def parse_runtime_version(text: str) -> str | None:
    """``apptainer --version`` ("apptainer version 1.4.5") -> "1.4.5". Pure."""
    m = _RUNTIME_VERSION.search(text)
    return m.group(1) if m else None


# ---- talking to the cluster ---------------------------------------------------------


@dataclass(frozen=True)
class Capture:
    """One command's output, or why there is none (``error``: one line)."""

    argv: tuple[str, ...]
    stdout: str = ""
    error: str | None = None


@dataclass(frozen=True)
class Runtime:
    """The container runtime found on this node (None fields: none found)."""

    name: str | None
    path: str | None
    version: str | None


@dataclass(frozen=True)
class ClusterFacts:
    """Everything detect/diff use, parsed; ``gaps`` say what could not be read and why."""

    partitions: list[PartitionInfo]
    nodes: list[Node]
    config: dict[str, str]
    mpi: MpiPlugins | None
    qos: dict[str, Qos] | None
    runtime: Runtime
    gaps: dict[str, str] = field(default_factory=dict)

    @property
    def cluster_name(self) -> str | None:
        return self.config.get("ClusterName")

    @property
    def slurm_version(self) -> str | None:
        return self.config.get("SLURM_VERSION")

    def nodes_of(self, partition: str) -> list[Node]:
        return [n for n in self.nodes if partition in n.partitions]


COMMANDS: dict[str, tuple[str, ...]] = {
    "partitions": ("scontrol", "-a", "-o", "show", "partition"),
    "nodes": ("scontrol", "-a", "-o", "show", "node"),
    "config": ("scontrol", "show", "config"),
    "mpi": ("srun", "--mpi=list"),
    # -n: no header line would lose the column names; keep it, parse by name.
    "qos": ("sacctmgr", "-P", "show", "qos"),
}

Runner = Callable[[tuple[str, ...], float], Capture]


def runner(executor: Executor) -> Runner:
    """A Runner whose commands run through ``executor``; a failing command (missing,
    timed out, non-zero exit, a lost connection) becomes a Capture with its first
    line as the error. A login node that refuses the user (RemoteInputError, a
    UserInputError) is not a gap: it propagates."""

    def run(argv: tuple[str, ...], timeout: float) -> Capture:
        try:
            res = executor.run(list(argv), timeout=timeout)
        except ToolError as exc:
            first = next((ln for ln in exc.message.splitlines() if ln.strip()), exc.message)
            return Capture(argv, error=first.strip())
        return Capture(argv, stdout=res.stdout)

    return run


def capture_all(timeout: float = 20, run: Runner | None = None,
                env_path: Callable[[str], str | None] | None = None, *,
                executor: Executor = LOCAL) -> dict[str, Capture]:
    """Run every command of ``COMMANDS`` plus the runtime's ``--version``, all through
    ``executor`` (``run`` and ``env_path`` replace its run and which); never raises
    but for a login node that refuses the user.

    When the partitions cannot be read the rest is not asked: an unreachable
    controller would make each command wait out its own connect timeout (~9 s).
    """
    run = run or runner(executor)
    env_path = env_path or executor.which
    out: dict[str, Capture] = {}
    for key, argv in COMMANDS.items():
        out[key] = run(argv, timeout)
        if key == "partitions" and out[key].error is not None:
            return out
    for name in ("apptainer", "singularity"):
        path = env_path(name)
        if path:
            out["runtime"] = run((path, "--version"), timeout)
            out["runtime_name"] = Capture((name,), stdout=name)
            break
    return out


def facts_from(captures: Mapping[str, Capture]) -> ClusterFacts:
    """Parse what ``capture_all`` returned. Pure: failures become ``gaps``.

    Raises ToolError only when the cluster cannot be read at all (scontrol missing,
    the controller unreachable): the partitions are the one thing a profile needs.
    """
    part = captures.get("partitions")
    if part is None or part.error is not None:
        why = part.error if part else "not run"
        hint = ("is Slurm installed and SLURM_CONF pointing at the cluster? "
                "(scontrol ping says whether the controller answers)")
        raise ToolError(f"cannot read the cluster: {why}", argv=list(COMMANDS["partitions"]), hint=hint)
    gaps: dict[str, str] = {}

    def text(key: str) -> str | None:
        cap = captures.get(key)
        if cap is None:
            return None
        if cap.error is not None:
            gaps[key] = cap.error
            return None
        return cap.stdout

    nodes_text = text("nodes")
    config_text = text("config")
    mpi_text = text("mpi")
    qos_text = text("qos")
    runtime_cap = captures.get("runtime")
    name_cap = captures.get("runtime_name")
    runtime = Runtime(None, None, None)
    if runtime_cap is not None and name_cap is not None:
        version = None if runtime_cap.error else parse_runtime_version(runtime_cap.stdout)
        if runtime_cap.error:
            gaps["runtime"] = runtime_cap.error
        runtime = Runtime(name_cap.stdout, runtime_cap.argv[0], version)
    else:
        gaps["runtime"] = "neither apptainer nor singularity is on PATH"
    return ClusterFacts(
        partitions=parse_partitions(part.stdout),
        nodes=parse_nodes(nodes_text) if nodes_text is not None else [],
        config=parse_config(config_text) if config_text is not None else {},
        mpi=parse_mpi_list(mpi_text) if mpi_text is not None else None,
        qos=parse_qos(qos_text) if qos_text is not None else None,
        runtime=runtime,
        gaps=gaps,
    )


def gather(timeout: float = 20, executor: Executor = LOCAL) -> ClusterFacts:
    """Read the live cluster (the one SLURM_CONF / /etc/slurm points at).

    Raises ToolError when the partitions cannot be read; every other failing command
    becomes a gap in the returned facts.
    """
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        # scontrol would retry for 60 s before saying the same.
        raise ToolError(f"cannot read the cluster: SLURM_CONF={conf} does not exist",
                        hint="point SLURM_CONF at the cluster's slurm.conf, or unset it")
    return facts_from(capture_all(timeout, executor=executor))


# The command detection cannot do without (the partitions); the others leave gaps.
REQUIRED = COMMANDS["partitions"][0]


def gather_remote(ex: Executor, timeout: float = 20) -> ClusterFacts:
    """Read the cluster behind a login node: every command over ``ex``'s one
    multiplexed connection, opened first with prompts allowed (a key's passphrase,
    2FA are asked once, not per command).

    Raises RemoteInputError (exit 2) for an unknown host, a refused key, or a login
    node whose non-interactive shell has no scontrol on its PATH (not the cluster's
    login node); RemoteError for an unreachable one; ToolError when the partitions
    cannot be read.
    """
    ex.connect()
    if ex.which(REQUIRED) is None:
        raise RemoteInputError(
            f"{ex.where}: Slurm's {REQUIRED} is not on the remote PATH "
            f"(of a non-interactive ssh shell there); is it the cluster's login node?",
            hint="a Slurm loaded by a module or a login profile is not seen by "
                 "`ssh HOST COMMAND`: put it on the PATH at the top of the remote "
                 "~/.bashrc (before its return for non-interactive shells)")
    return facts_from(capture_all(timeout, executor=ex))
