"""The hang watchdog's decisions, pure: when a job counts as silent, what the stack
collection runs on a node, how py-spy's dumps read, and which rank is not where the
others are. No I/O here (hpcdl.jobside.hangwatch does the polling, collecting and
writing, inside the job; hpcdl.cli.display prints), so every rule is unit-tested with
fake stacks. Job-side (standard library only): the watchdog runs in the allocation,
where hpcdl's dependencies are not installed; hpcdl.hang.diagnosis re-exports it.

Progress (hpcdl.jobside.hangwatch.progress): the ranks' heartbeats (hpcdl.jobside.
steps.beat, one file per rank rewritten at most once a second by the bundled examples'
training loops); for a script that writes none, any file of the run directory (the job's
slurm-J.out/.err, checkpoints): a script that prints a line per step or per epoch needs
nothing special. ``Silence`` turns a series
of such fingerprints into "no progress for N seconds"; the clock starts when the job
runs, so time in the queue is never silence.

Diagnosis: every rank's main-thread stack (py-spy, innermost frame first) is placed
by its innermost frame; the largest group (ties: the group waiting in a collective)
is where the others are, and every rank elsewhere is named with the frame it is in.
Ranks that wait in a collective while one computes or sleeps are the classic case:
the one outside the collective holds everyone up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Where the watchdog's py-spy appears inside the image: the host's static binary is
# bound there read-only, so an image without py-spy still works.
CONTAINER_PY_SPY = "/opt/.hpcdl-py-spy"
# $0 of the node-side collection script (what `ps` shows on the node).
COLLECTOR_NAME = "hpcdl-stacks"
_BEGIN, _END, _RANK = "@@hpcdl-stack", "@@hpcdl-end", "@@hpcdl-rank"
# hpcdl.hang.actions.DEFAULT_HANG_ACTION, which the job side cannot import (a layer above;
# tests/unit/hang/test_hang.py checks they agree).
DEFAULT_HANG_ACTION = "cancel"

# Run on each node by `srun --overlap` (inside the image when the job has one): one
# py-spy dump per rank of the node, delimited so the client can split them. POSIX sh,
# constant text: the py-spy path and RANK:PID pairs arrive as arguments, never spliced.
# A torchrun agent (spec nN) has its workers as children: their RANK is read from
# /proc/PID/environ (same user; best effort: without tr/sed a worker keeps its pid).
NODE_SCRIPT = f"""\
py=$1
shift
for spec do
  pid=${{spec#*:}}
  echo "{_BEGIN} ${{spec%%:*}} $pid"
  "$py" dump --pid "$pid" --subprocesses --full-filenames 2>&1
  rc=$?
  case $spec in
    n*)
      for child in $(cat /proc/"$pid"/task/*/children 2>/dev/null); do
        r=$(tr "\\000" "\\n" < /proc/"$child"/environ 2>/dev/null | sed -n "s/^RANK=//p")
        [ -n "$r" ] && echo "{_RANK} $child $r"
      done ;;
  esac
  echo "{_END} $rc"
done
"""

_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_PID_LINE = re.compile(r"(?P<node>\S+) (?P<pid>[0-9]+)")
_RANK_FILE = re.compile(r"(?P<kind>rank|node)-(?P<index>[0-9]+)")


# ---- which processes are the ranks --------------------------------------------------


@dataclass(frozen=True)
class RankPid:
    """One process the rank wrapper recorded: ``rank`` (or, under torchrun, the node's
    agent: ``rank`` is then the node index and ``agent`` is True), its node and pid."""

    rank: int
    node: str
    pid: int
    agent: bool = False

    @property
    def label(self) -> str:
        return f"node {self.rank} agent" if self.agent else f"rank {self.rank}"

    @property
    def spec(self) -> str:
        """How NODE_SCRIPT names it in its arguments and output: "R", or "nN" for an agent."""
        return f"n{self.rank}" if self.agent else str(self.rank)

    @property
    def own_rank(self) -> int | None:
        """The rank of a rank process; None for a torchrun agent (its workers have ranks)."""
        return None if self.agent else self.rank


def parse_pid_file(name: str, text: str) -> RankPid | None:
    """One file of the run directory's pids/ (``rank-R`` or ``node-N``: "NODE PID").
    None for anything else (a file still being written, a stray name)."""
    m = _RANK_FILE.fullmatch(name)
    line = _PID_LINE.fullmatch(text.strip())
    if not m or not line or not _NODE.fullmatch(line["node"]):
        return None
    return RankPid(int(m["index"]), line["node"], int(line["pid"]), m["kind"] == "node")


def by_node(pids: Sequence[RankPid]) -> dict[str, list[RankPid]]:
    """The recorded processes grouped by node, in rank order."""
    out: dict[str, list[RankPid]] = {}
    for p in sorted(pids, key=lambda p: (p.agent, p.rank)):
        out.setdefault(p.node, []).append(p)
    return out


def node_command(pids: Sequence[RankPid], py_spy: str, *, runtime: str | None = None,
                 image: str | None = None) -> list[str]:
    """What ``srun --overlap`` runs on one node to dump its ranks: NODE_SCRIPT, in the
    job's image when it has one (``runtime exec`` with the host's ``py_spy`` bound at
    CONTAINER_PY_SPY: the image's own paths resolve as the ranks see them), else natively.
    """
    specs = [f"{p.spec}:{p.pid}" for p in pids]
    if image and runtime:
        return [runtime, "exec", "-B", f"{py_spy}:{CONTAINER_PY_SPY}:ro", image,
                "/bin/sh", "-c", NODE_SCRIPT, COLLECTOR_NAME, CONTAINER_PY_SPY, *specs]
    return ["/bin/sh", "-c", NODE_SCRIPT, COLLECTOR_NAME, py_spy, *specs]


# ---- py-spy's text dump ---------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One Python frame: function, file (as py-spy names it) and line."""

    function: str
    file: str
    line: int

    @property
    def short_file(self) -> str:
        """The file without the install prefix: ``torch/distributed/x.py``, ``train.py``."""
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in self.file:
                return self.file.split(marker, 1)[1]
        return self.file.rsplit("/", 1)[-1]

    @property
    def where(self) -> str:
        return f"{self.function} ({self.short_file}:{self.line})"

    @property
    def is_library(self) -> bool:
        """Installed packages and the standard library (not the user's own code)."""
        f = self.file
        return ("/site-packages/" in f or "/dist-packages/" in f or f.startswith("<")
                or bool(re.search(r"/lib/python3[0-9.]*/", f)))


@dataclass(frozen=True)
class Thread:
    tid: int
    name: str
    idle: bool
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class Process:
    """One process of a py-spy dump (several with --subprocesses)."""

    pid: int
    command: str
    parent: int | None
    threads: tuple[Thread, ...]

    @property
    def main(self) -> Thread | None:
        """The main thread: named MainThread, else the one whose id is the pid."""
        for t in self.threads:
            if t.name == "MainThread":
                return t
        for t in self.threads:
            if t.tid == self.pid:
                return t
        return self.threads[0] if self.threads else None

    @property
    def is_torchrun_agent(self) -> bool:
        return "torch.distributed.run" in self.command or "torchrun" in self.command


_PROCESS = re.compile(r"Process (?P<pid>[0-9]+): (?P<command>.*)")
_PARENT = re.compile(r"Parent Process (?P<pid>[0-9]+): .*")
_THREAD = re.compile(r'Thread (?P<tid>0x[0-9A-Fa-f]+|[0-9]+) \((?P<state>[a-z]+)\)(?:: "(?P<name>.*)")?')
_FRAME = re.compile(r"\s+(?P<function>.+?) \((?P<file>.+):(?P<line>[0-9]+)\)")


def parse_dump(text: str) -> list[Process]:
    """py-spy dump's text (``--subprocesses``: processes separated by a rule) ->
    processes with their threads' frames, innermost first. Lines it does not know
    (locals, the Python version) are skipped. Pure."""
    procs: list[Process] = []
    pid, command, parent = 0, "", None
    threads: list[Thread] = []
    thread: dict[str, Any] | None = None

    def close_thread() -> None:
        nonlocal thread
        if thread is not None:
            threads.append(Thread(thread["tid"], thread["name"], thread["idle"],
                                  tuple(thread["frames"])))
        thread = None

    def close_process() -> None:
        nonlocal threads
        close_thread()
        if pid:
            procs.append(Process(pid, command, parent, tuple(threads)))
        threads = []

    for line in text.splitlines():
        if m := _PROCESS.fullmatch(line):
            close_process()
            pid, command, parent = int(m["pid"]), m["command"], None
        elif m := _PARENT.fullmatch(line):
            parent = int(m["pid"])
        elif m := _THREAD.fullmatch(line):
            close_thread()
            tid = m["tid"]
            thread = {"tid": int(tid, 16) if tid.startswith("0x") else int(tid),
                      "name": m["name"] or "", "idle": m["state"] == "idle", "frames": []}
        elif thread is not None and (m := _FRAME.fullmatch(line)):
            thread["frames"].append(Frame(m["function"], m["file"], int(m["line"])))
    close_process()
    return procs


@dataclass(frozen=True)
class NodeDump:
    """One rank's part of a node's collection output: py-spy's text and exit code."""

    spec: str  # "R" (a rank) or "nN" (a torchrun agent on node N)
    pid: int
    text: str
    returncode: int | None  # None: the output ended before py-spy did


def split_node_output(output: str) -> list[NodeDump]:
    """NODE_SCRIPT's output -> one NodeDump per rank it dumped. Pure."""
    dumps: list[NodeDump] = []
    current: tuple[str, int] | None = None
    lines: list[str] = []
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == _BEGIN and parts[2].isdigit():
            if current:
                dumps.append(NodeDump(current[0], current[1], "\n".join(lines), None))
            current, lines = (parts[1], int(parts[2])), []
        elif len(parts) == 2 and parts[0] == _END and current:
            code = int(parts[1]) if parts[1].isdigit() else None
            dumps.append(NodeDump(current[0], current[1], "\n".join(lines), code))
            current, lines = None, []
        elif current:
            lines.append(line)
    if current:
        dumps.append(NodeDump(current[0], current[1], "\n".join(lines), None))
    return dumps


# ---- the stacks the diagnosis compares -------------------------------------------------


@dataclass(frozen=True)
class RankStack:
    """One rank's main-thread stack (innermost first), or why there is none."""

    label: str  # "rank 3", or "node 1 pid 4242" for a torchrun worker
    node: str
    pid: int
    frames: tuple[Frame, ...] = ()
    error: str = ""
    rank: int | None = None


def rank_stacks(pids: Sequence[RankPid], dumps: Mapping[str, Sequence[NodeDump]],
                errors: Mapping[str, str] | None = None) -> list[RankStack]:
    """Every recorded process's stack from the nodes' dumps (``dumps``: node -> its
    NodeDumps; ``errors``: node -> why its collection failed). A torchrun agent
    stands for its worker processes (its children in the dump). Pure."""
    errors = errors or {}
    out: list[RankStack] = []
    for p in sorted(pids, key=lambda p: (p.agent, p.rank)):
        found = next((d for d in dumps.get(p.node, ()) if d.spec == p.spec and d.pid == p.pid),
                     None)
        if found is None:
            why = errors.get(p.node) or "no dump came back from the node"
            out.append(RankStack(p.label, p.node, p.pid, error=why, rank=p.own_rank))
            continue
        procs = parse_dump(found.text)
        own = next((q for q in procs if q.pid == p.pid), None)
        if own is None or own.main is None:
            last = (found.text.strip().splitlines() or ["py-spy printed nothing"])[-1]
            out.append(RankStack(p.label, p.node, p.pid, error=last.strip()[:200],
                                 rank=p.own_rank))
            continue
        if p.agent or own.is_torchrun_agent:
            workers = [q for q in procs if q.parent == own.pid and q.main is not None]
            ranks = worker_ranks(found.text)
            for q in workers:
                assert q.main is not None
                rank = ranks.get(q.pid)
                label = (f"rank {rank}" if rank is not None else
                         f"node {p.rank} pid {q.pid}" if p.agent else f"rank {p.rank} pid {q.pid}")
                out.append(RankStack(label, p.node, q.pid, q.main.frames, rank=rank))
            if workers:
                continue
        out.append(RankStack(p.label, p.node, p.pid, own.main.frames, rank=p.own_rank))
    return out


def worker_ranks(text: str) -> dict[int, int]:
    """pid -> RANK of a torchrun agent's workers, from NODE_SCRIPT's rank lines. Pure."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == _RANK and parts[1].isdigit() and parts[2].isdigit():
            out[int(parts[1])] = int(parts[2])
    return out


# Frames that mean "waiting for the other ranks": torch.distributed, Horovod, MPI.
_COMM_FILES = ("torch/distributed/", "horovod/", "mpi4py/", "deepspeed/comm/",
               "torch/nn/parallel/distributed.py")


def in_collective(frames: Sequence[Frame]) -> bool:
    """True when a communication library is on the stack (the rank waits for others)."""
    return any(any(marker in f.file for marker in _COMM_FILES) for f in frames)


def user_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame of the user's own code (not an installed package, not the
    standard library): where the script called what it is waiting in."""
    return next((f for f in frames if not f.is_library), None)


@dataclass(frozen=True)
class Place:
    """A group of ranks whose innermost frame is the same."""

    where: str
    ranks: tuple[str, ...]
    in_collective: bool
    called_from: str | None  # the user's frame (None when the innermost is the user's)


@dataclass(frozen=True)
class Straggler:
    """A rank that is not where the others are."""

    label: str
    node: str
    pid: int
    frame: str  # the innermost frame: "main (train.py:21)"
    function: str
    file: str
    line: int
    in_collective: bool
    user_frame: str | None


@dataclass(frozen=True)
class Diagnosis:
    """What the watchdog concluded; to_dict() is diagnosis.json, lines() diagnosis.txt."""

    job_id: str
    silent_s: float
    timeout_s: float
    summary: str
    stragglers: tuple[Straggler, ...]
    places: tuple[Place, ...]
    missing: tuple[tuple[str, str], ...] = ()  # (label, why there is no stack)
    action: str = DEFAULT_HANG_ACTION
    cancelled: bool = False
    # action relaunch: the node the relaunch leaves out ("" when the diagnosis points at
    # no single node), and whether the job was asked to relaunch.
    relaunch_without: str = ""
    relaunched: bool = False
    collect_s: float = 0.0
    silent_since: float = 0.0  # epoch seconds: the last progress seen
    detected_at: float = 0.0  # epoch seconds: the diagnosis was complete
    # What the silence was read from: "heartbeat" (the ranks' own, hpcdl.jobside.heartbeat)
    # or "run directory" (its files, for a script that writes no heartbeat).
    progress: str = ""
    dumps: tuple[str, ...] = field(default=())  # files written beside the diagnosis

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["missing"] = [{"label": label, "error": why} for label, why in self.missing]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Diagnosis:
        """A diagnosis back from to_dict()'s JSON (diagnosis.json, which the job's own
        watchdog wrote): keys it does not know are left out. Raises ValueError (KeyError,
        TypeError) for one that is not a diagnosis."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        kw["stragglers"] = tuple(Straggler(**s) for s in data.get("stragglers", ()))
        kw["places"] = tuple(Place(p["where"], tuple(p["ranks"]), bool(p["in_collective"]),
                                   p.get("called_from")) for p in data.get("places", ()))
        kw["missing"] = tuple((m["label"], m["error"]) for m in data.get("missing", ()))
        kw["dumps"] = tuple(data.get("dumps", ()))
        return cls(**kw)

    def lines(self) -> list[str]:
        """A few lines for a person: the summary, every place, the ranks without a stack."""
        out = [f"job {self.job_id}: no progress for {self.silent_s:.0f} s "
               f"(--hang-timeout {self.timeout_s:g}): {self.summary}"]
        for place in self.places:
            via = f", called from {place.called_from}" if place.called_from else ""
            tag = " [in a collective]" if place.in_collective else ""
            out.append(f"  {', '.join(place.ranks)}: {place.where}{via}{tag}")
        for label, why in self.missing:
            out.append(f"  {label}: no stack ({why})")
        return out


def suspect_node(diag: Diagnosis) -> str:
    """The one node every straggler runs on, or "" (none, or several nodes)."""
    nodes = {s.node for s in diag.stragglers}
    return nodes.pop() if len(nodes) == 1 else ""


def _rank_key(label: str) -> tuple[int, str]:
    nums = re.findall(r"[0-9]+", label)
    return (int(nums[0]) if nums else 1 << 30, label)


def diagnose(stacks: Sequence[RankStack], *, job_id: str, silent_s: float, timeout_s: float,
             action: str = DEFAULT_HANG_ACTION) -> Diagnosis:
    """Name the ranks that are not where the others are. Pure.

    Ranks are grouped by their innermost frame; the largest group is where the others
    are (a tie goes to the group waiting in a collective, then to the lowest rank).
    Everyone outside it is a straggler, those outside any collective first.
    """
    have = sorted((s for s in stacks if s.frames), key=lambda s: _rank_key(s.label))
    missing = tuple((s.label, s.error or "empty stack") for s in stacks if not s.frames)
    groups: dict[Frame, list[RankStack]] = {}
    for s in have:
        groups.setdefault(s.frames[0], []).append(s)

    def place(frame: Frame, members: list[RankStack]) -> Place:
        uf = user_frame(members[0].frames)
        return Place(frame.where, tuple(m.label for m in members),
                     in_collective(members[0].frames),
                     uf.where if uf is not None and uf != frame else None)

    ordered = sorted(groups.items(), key=lambda kv: (
        -len(kv[1]), not in_collective(kv[1][0].frames), _rank_key(kv[1][0].label)))
    places = tuple(place(f, m) for f, m in ordered)
    stragglers: list[Straggler] = []
    for frame, members in ordered[1:]:
        for s in members:
            uf = user_frame(s.frames)
            stragglers.append(Straggler(s.label, s.node, s.pid, frame.where, frame.function,
                                        frame.file, frame.line, in_collective(s.frames),
                                        uf.where if uf is not None else None))
    stragglers.sort(key=lambda s: (s.in_collective, _rank_key(s.label)))
    if not have:
        summary = "no rank's stack could be read"
    elif not stragglers:
        where = places[0]
        summary = (f"all {len(where.ranks)} ranks are at {where.where}"
                   + (" in a collective: none of them is behind; suspect the network or a "
                      "peer that died" if where.in_collective else ""))
    else:
        main = places[0]
        named = "; ".join(
            f"{s.label} ({s.node}, pid {s.pid}) is in {s.frame}"
            + ("" if s.in_collective else " outside any collective") for s in stragglers)
        summary = (f"{named}, while {', '.join(main.ranks)} "
                   f"{'wait' if len(main.ranks) > 1 else 'waits'} in {main.where}"
                   + (f" (called from {main.called_from})" if main.called_from else ""))
    if missing and have:
        summary += f"; no stack from {', '.join(label for label, _ in missing)}"
    return Diagnosis(job_id=job_id, silent_s=silent_s, timeout_s=timeout_s, summary=summary,
                     stragglers=tuple(stragglers), places=places, missing=missing,
                     action=action)


# ---- silence -------------------------------------------------------------------------


Fingerprint = frozenset[tuple[str, int, int]]


class Silence:
    """How long a job has shown no progress, from fingerprints of its run directory
    (hpcdl.jobs.watchdog.fingerprint) taken at each poll. The clock starts when the job is
    first seen running and restarts whenever the fingerprint changes (or the job is
    not running: queued again after a requeue). Pure: the caller passes the time."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.last: Fingerprint | None = None

    def observe(self, now: float, running: bool, fingerprint: Fingerprint) -> float:
        """Seconds without progress as of ``now`` (0 while not running)."""
        if not running:
            self.since, self.last = None, None
            return 0.0
        if self.since is None or fingerprint != self.last:
            self.since, self.last = now, fingerprint
        return now - self.since
