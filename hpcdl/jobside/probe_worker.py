"""hpcdl's allreduce probe: the script every rank of an `hpcdl probe` job runs (and the
first step of `hpcdl submit --probe-first`).

    python3 probe_worker.py --sizes 4K,64K,1M --iters 5 [--warmup 2]
                            [--backend auto|gloo|nccl] [--mpi auto|on|off] [--ifname eth0]
                            [--slow-ratio 0.15] [--expected-gbs 12.5] [--slow-nodes-out FILE]

Standalone: the standard library at import, torch (and mpi4py + numpy for the MPI
sweep, when present) inside ``main``; hpcdl itself is not needed in the image. The job
binds hpcdl's package read-only at /hpcdl/hpcdl, like the bundled examples, and the
report line, the arguments' syntax and limits and the exit status are
hpcdl.jobside.protocol's (stdlib only; found from this file's own location when it is
run as a script). Rank and world come from torchrun's
variables, which hpcdl's rank-env wrapper sets under srun.

What it measures, in this order:
1. the whole allocation: torch.distributed all_reduce (SUM, float32) of every size,
   NCCL on GPUs, Gloo on CPUs;
2. pairs of nodes (the first rank of each node): all_reduce of the largest size.
   Up to ``SEQUENTIAL_PAIRS_UP_TO`` nodes every pair, one at a time; beyond, each node
   with its two ring neighbours (2-3 rounds of disjoint pairs), then each node that
   both its links call slow against a good node (one at a time for up to 8 such
   nodes, else 1-2 rounds of disjoint pairs): at most 11 rounds and about N pairs,
   whatever N. Each round twice (``PAIR_PASSES``), each pair keeping its faster pass;
3. with MPI (mpi4py present and the ranks started with PMI, e.g. srun --mpi=pmix):
   MPI_Allreduce of every size over the whole allocation. Horovod is not used: its
   CPU allreduce in hpcdl's images runs over Gloo (HOROVOD_CPU_OPERATIONS=GLOO), which
   (1) already measures; mpi4py measures MPI's own transport.

Time per size: the median over ``--iters`` timed calls (after ``--warmup`` untimed
ones) of the slowest rank's time for that call. algbw = bytes / time; busbw = algbw x
2(n-1)/n for n ranks, as nccl-tests reports allreduce (the bytes each rank moves over
its link). GB/s are 10^9 bytes per second.

Slow nodes (``verdict``): each node's best pair (its fastest link) against the median
node's best; a node whose best link is below ``--slow-ratio`` (default 0.15) of that is
named: all its links are slow, so the node (its NIC, cable, switch port or load) is the
common factor. With two nodes there is one link and no second opinion: it is compared
with the profile's expected bandwidth (``--expected-gbs``) and called slow without
naming an end.

``--slow-nodes-out FILE`` (a job's node guard, ``submit --spares --probe-first``): rank 0
also writes the named nodes there, one ``NODE<TAB>why`` line each (empty: none), so the
guard can exclude them without reading JSON in bash.

Exit status (rank 0's; the others exit 0 once it is decided): 0 no slow node, 1 a slow
node named (or a slow link between two nodes), 2 bad input (every rank that finds it):
a world of one rank, an --ifname that matches no interface of a node, bad sizes. The
error is also one line on stderr and in the report line.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

if __name__ == "__main__":
    # Run as a script (in a job): hpcdl.jobside.protocol from the hpcdl tree this file is
    # part of (bound at /hpcdl/hpcdl in a job, or a checkout or installed package), so
    # writer and parser always match; a python path that holds another hpcdl does not win.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from hpcdl.jobside import protocol  # noqa: E402
from hpcdl.jobside.protocol import (  # noqa: E402
    DEFAULT_SLOW_RATIO,
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_SLOW,
    IFNAME_SPEC,
    MAX_ITERS,
    ProbeInputError,
    parse_sizes,
)

EXIT_GRACE_S = 2.0
# Up to this many nodes every pair runs, one at a time (28 pairs for 8 nodes); beyond,
# the ring of neighbours in 2-3 rounds of disjoint pairs, then the suspects against good
# nodes, one at a time up to this many suspects, else in 1-2 rounds of disjoint pairs
# (pair_rounds, confirm_rounds): at most 11 rounds and about N pairs for any N, where
# every pair would be N(N-1)/2.
SEQUENTIAL_PAIRS_UP_TO = 8
# Every pair is measured in this many passes and keeps its fastest: load on a shared
# machine only ever slows a measurement down, so one disturbed pass does not make a
# healthy link look slow, while a slow link is slow in every pass.
PAIR_PASSES = 2
# Variables that decide which interface and transport NCCL, Gloo and MPI use.
TRANSPORT_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_DISABLE",
                 "NCCL_NET", "NCCL_P2P_DISABLE", "NCCL_ALGO", "NCCL_PROTO",
                 "OMPI_MCA_btl", "OMPI_MCA_pml", "OMPI_MCA_btl_tcp_if_include", "UCX_NET_DEVICES")


# ---- pure parts (the unit tests use them too) ------------------------------------
def bus_factor(ranks: int) -> float:
    """nccl-tests' allreduce bus factor 2(n-1)/n: the share of the buffer each rank
    sends (and receives) in a bandwidth-optimal allreduce. Raises ValueError for < 1."""
    if ranks < 1:
        raise ValueError(f"ranks: {ranks} (at least 1)")
    return 2 * (ranks - 1) / ranks


def bandwidths(size: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 B/s) of an allreduce of ``size`` bytes over ``ranks``
    ranks that took ``seconds``. Raises ValueError for a time that is not positive."""
    if seconds <= 0:
        raise ValueError(f"seconds: {seconds} (must be > 0)")
    algbw = size / seconds / 1e9
    return algbw, algbw * bus_factor(ranks)


def pair_rounds(nodes: int, sequential_up_to: int = SEQUENTIAL_PAIRS_UP_TO
                ) -> list[list[tuple[int, int]]]:
    """The first pairs the probe measures, as rounds run one after another. Up to
    ``sequential_up_to`` nodes: every pair, one a round. Beyond: the ring of node
    indices, i with i+1 (N-1 with 0), in rounds of disjoint pairs: 2 rounds for even N,
    3 for odd N (an odd ring cannot be split into two sets of disjoint pairs). Each node
    then has two links measured, two opinions about it; ``confirm_rounds`` settles the
    nodes that both opinions call slow. Pairs are (low, high)."""
    if nodes < 2:
        return []
    if nodes <= sequential_up_to:
        return [[(a, b)] for a in range(nodes) for b in range(a + 1, nodes)]
    rounds = [[(i, i + 1) for i in range(0, nodes - 1, 2)],
              [(i, i + 1) for i in range(1, nodes - 1, 2)]]
    closing = (0, nodes - 1)
    if nodes % 2:
        rounds.append([closing])
    else:
        rounds[1].append(closing)
    return [sorted(r) for r in rounds]


def best_links(nodes: int, pair_bw: dict[tuple[int, int], float]) -> list[float]:
    """Each node index's fastest measured link (0.0 for a node with none): one pass."""
    best = [0.0] * nodes
    for (a, b), bw in pair_bw.items():
        best[a] = max(best[a], bw)
        best[b] = max(best[b], bw)
    return best


def confirm_rounds(nodes: int, pair_bw: dict[tuple[int, int], float],
                   slow_ratio: float = DEFAULT_SLOW_RATIO,
                   one_at_a_time_up_to: int = SEQUENTIAL_PAIRS_UP_TO
                   ) -> list[list[tuple[int, int]]]:
    """The second step above ``SEQUENTIAL_PAIRS_UP_TO`` nodes: which pairs to measure
    after the ring (``pair_bw``: bus bandwidth of the ring's pairs by node index).

    A suspect is a node whose best link so far is below ``slow_ratio`` of the median
    node's best, as ``verdict`` would name it. On a ring that is a slow node, a good
    node whose two neighbours are both slow, or a good node that two busy rounds
    happened to slow down. A node with a good link is good (a slow node's every link
    is slow), so each suspect is measured against a good node it has not met, the
    fastest one free: a slow suspect stays slow, a good one gets a good link and is
    cleared. Up to ``one_at_a_time_up_to`` suspects, one pair a round: the pair has the
    network (and, on a shared machine, the cores) to itself, so a good node is not
    kept slow by its neighbours' traffic. More suspects share rounds of disjoint pairs:
    they are at most half the nodes (at least half are at or above the median), so
    the good nodes outnumber them: one round, and a second only when a suspect's only
    free good nodes were its own ring neighbours (at most 2 suspects then). At most
    max(``one_at_a_time_up_to``, 2) rounds. Empty when there is no suspect, or no
    reference (every link measured 0)."""
    best = best_links(nodes, pair_bw)
    reference = statistics.median(best) if best else 0.0
    if reference <= 0:
        return []
    suspects = [n for n in range(nodes) if best[n] < slow_ratio * reference]
    good = sorted((n for n in range(nodes) if best[n] >= slow_ratio * reference),
                  key=lambda n: (-best[n], n))
    measured = {(min(a, b), max(a, b)) for a, b in pair_bw}

    def partner(suspect: int, taken: set[int]) -> int | None:
        return next((g for g in good if g not in taken
                     and (min(suspect, g), max(suspect, g)) not in measured), None)

    rounds: list[list[tuple[int, int]]] = []
    if len(suspects) <= one_at_a_time_up_to:
        for suspect in suspects:
            other = partner(suspect, set())
            if other is not None:
                rounds.append([(min(suspect, other), max(suspect, other))])
        return rounds
    waiting = suspects
    while waiting and good:
        used: set[int] = set()
        pairs, later = [], []
        for suspect in waiting:
            other = partner(suspect, used)
            if other is None:
                later.append(suspect)
                continue
            used.add(other)
            pairs.append((min(suspect, other), max(suspect, other)))
        if not pairs:  # no good node left that each of them has not met: nothing to add
            break
        rounds.append(sorted(pairs))
        measured.update(pairs)
        waiting = later
    return rounds


def verdict(nodes: Sequence[str], pair_bw: dict[tuple[str, str], float], *,
            slow_ratio: float = DEFAULT_SLOW_RATIO,
            expected_gbs: float | None = None) -> dict[str, Any]:
    """Which nodes are slow, from the bus bandwidth of each tested node pair.

    Each node's *best* link (the fastest of its pairs) is compared with the median
    node's best link; below ``slow_ratio`` of it, the node is named: every link it has
    is slow, so the node is the common factor. A node with one slow link and one good
    link is not named (its peer on the slow link is, if all of that peer's links are
    slow). Two nodes have one link and no second opinion: it is compared with
    ``expected_gbs`` (the profile's) and reported as a slow link, no node named.

    Returns ``{"slow_nodes", "slow_links", "node_best_gbs", "node_ratio",
    "reference_gbs", "reference", "slow_ratio", "bad", "message"}``; ``bad``: exit 1.
    Raises ValueError for fewer than 2 nodes or a pair naming an unknown node.
    """
    if len(nodes) < 2:
        raise ValueError(f"nodes: {len(nodes)} (the verdict needs 2 or more)")
    index = {n: i for i, n in enumerate(nodes)}
    for a, b in pair_bw:
        if a not in index or b not in index:
            raise ValueError(f"pair {a}-{b}: not among the nodes {', '.join(nodes)}")
    # One pass over the pairs: 4,096 nodes' ring is read in milliseconds.
    by_index = best_links(len(nodes), {(index[a], index[b]): bw for (a, b), bw in pair_bw.items()})
    best = {n: by_index[i] for i, n in enumerate(nodes)}
    out: dict[str, Any] = {"slow_ratio": slow_ratio, "node_best_gbs": best,
                           "slow_nodes": [], "slow_links": [], "bad": False}
    if len(nodes) == 2:
        link = pair_bw.get((nodes[0], nodes[1]), pair_bw.get((nodes[1], nodes[0]), 0.0))
        name = f"{nodes[0]}-{nodes[1]}"
        if expected_gbs is None:
            out.update(reference_gbs=None, reference="none", node_ratio={},
                       message=f"2 nodes, one link ({name}, {link:.3g} GB/s): nothing to compare "
                               f"it with (the profile gives no interconnect.expected_busbw_gbs); "
                               f"probe 3 or more nodes to name a slow node")
            return out
        ratio = link / expected_gbs
        out.update(reference_gbs=expected_gbs, reference="profile",
                   node_ratio={n: ratio for n in nodes})
        if ratio < slow_ratio:
            out.update(bad=True, slow_links=[[nodes[0], nodes[1]]],
                       message=f"link {name} is slow: {link:.3g} GB/s, {ratio:.0%} of the "
                               f"profile's expected {expected_gbs:.3g} GB/s (threshold "
                               f"{slow_ratio:.0%}); with 2 nodes either end may be the cause: "
                               f"a third node is needed to tell which")
        else:
            out["message"] = (f"link {name}: {link:.3g} GB/s, {ratio:.0%} of the profile's "
                              f"expected {expected_gbs:.3g} GB/s: no slow link")
        return out
    reference = statistics.median(best.values())
    ratios = {n: (bw / reference if reference > 0 else 0.0) for n, bw in best.items()}
    slow = [n for n in nodes if ratios[n] < slow_ratio]
    links = [[a, b] for (a, b), bw in sorted(pair_bw.items())
             if reference > 0 and bw / reference < slow_ratio]
    out.update(reference_gbs=reference, reference="median node", node_ratio=ratios,
               slow_nodes=slow, slow_links=links, bad=bool(slow))
    if slow:
        named = "; ".join(f"{n}: best link {best[n]:.3g} GB/s, {ratios[n]:.0%}" for n in slow)
        out["message"] = (f"slow node{'s' if len(slow) > 1 else ''} {', '.join(slow)} ({named} "
                          f"of the median node's {reference:.3g} GB/s; threshold "
                          f"{slow_ratio:.0%}): every link of {'these nodes' if len(slow) > 1 else 'it'} "
                          f"is slow")
    else:
        low = min(nodes, key=lambda n: ratios[n])
        out["message"] = (f"no slow node: every node's best link is at least {slow_ratio:.0%} "
                          f"of the median node's {reference:.3g} GB/s (lowest: {low}, "
                          f"{ratios[low]:.0%})")
    return out


def match_interfaces(spec: str, names: Sequence[str]) -> list[str]:
    """The interfaces of ``names`` that NCCL_SOCKET_IFNAME syntax ``spec`` selects:
    prefixes (``eth`` matches eth0), exact names after ``=``, and after ``^`` every
    interface except those prefixes (loopback too, as NCCL does only when named)."""
    if spec.startswith("^"):
        excluded = spec[1:].split(",")
        return [n for n in names if not any(n.startswith(p) for p in excluded)]
    if spec.startswith("="):
        wanted = spec[1:].split(",")
        return [n for n in names if n in wanted]
    prefixes = spec.split(",")
    return [n for n in names if any(n.startswith(p) for p in prefixes)]


def gloo_interface(chosen: Sequence[str]) -> str:
    """The one interface Gloo gets (it takes whole names, not NCCL's prefixes): the first
    of ``chosen`` that is not loopback, which would keep every rank on its own node.
    Raises ValueError when ``chosen`` is empty."""
    if not chosen:
        raise ValueError("no interface to choose from")
    return next((n for n in chosen if n != "lo"), chosen[0])


def parse_nccl_debug(text: str) -> dict[str, str]:
    """The transport and interface NCCL chose, from its NCCL_DEBUG=INFO lines:
    ``NET/IB : Using [0]mlx5_0:1/IB ...`` or ``NET/Socket : Using [0]eth0:10.0.0.1<0>``
    and ``Using network IB|Socket``. Empty when the lines are not there."""
    facts: dict[str, str] = {}
    m = re.search(r"Using network (\S+)", text)
    if m:
        facts["transport"] = m.group(1)
    m = re.search(r"NET/(\w+) ?: Using (\[\d+\]\S+(?: \[\d+\]\S+)*)", text)
    if m:
        facts.setdefault("transport", m.group(1))
        facts["devices"] = m.group(2)
    return facts


# ---- the measurement (torch inside) ----------------------------------------------
def _interfaces() -> dict[str, str]:
    """Interface name -> IPv4 address (Linux ioctl SIOCGIFADDR; '' when it has none)."""
    import fcntl
    import struct

    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
                out[name] = socket.inet_ntoa(raw[20:24])
            except OSError:
                out[name] = ""
    return out


def _route_to(addr: str) -> str:
    """The local address the kernel uses toward ``addr`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((socket.gethostbyname(addr), 9))
            return str(sock.getsockname()[0])
    except OSError:
        return ""


def _sig(value: float, digits: int = 4) -> float:
    """``value`` to ``digits`` significant digits: the report line stays short."""
    return float(f"{value:.{digits}g}")


def node_name() -> str:
    """Slurm's name for this node, else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _fail(message: str, report: Callable[[dict[str, Any]], None]) -> int:
    print(f"hpcdl probe: {message}", file=sys.stderr, flush=True)
    report({"error": message, "exit_code": EXIT_BAD_INPUT})
    return EXIT_BAD_INPUT


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hpcdl-probe-worker", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4K,64K,1M")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument("--mpi", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--ifname")
    parser.add_argument("--slow-ratio", type=float, default=DEFAULT_SLOW_RATIO)
    parser.add_argument("--expected-gbs", type=float)
    parser.add_argument("--slow-nodes-out")
    return parser.parse_args(argv)


def slow_node_lines(judged: dict[str, Any]) -> str:
    """``--slow-nodes-out``'s text: one ``NODE<TAB>why`` line per node the verdict names."""
    reference = judged.get("reference_gbs")
    return "".join(
        f"{node}\tprobe: slow: best link {judged['node_best_gbs'][node]:.3g} GB/s, "
        f"{judged['node_ratio'][node]:.0%} of the median node's"
        + (f" {reference:.3g} GB/s" if reference else "") + "\n"
        for node in judged["slow_nodes"])


def write_slow_nodes(path: str, judged: dict[str, Any]) -> None:
    """Write ``slow_node_lines`` to ``path`` whole or not at all (the guard reads it
    after the step; a half-written list would keep a slow node in)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(slow_node_lines(judged))
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the probe in this rank; returns the exit status (see the module)."""
    args = _arguments(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))

    def report(obj: dict[str, Any]) -> None:
        line = protocol.probe_line({"node": node_name(), "rank": rank, **obj})
        run_dir = os.environ.get("HPCDL_RUN_DIR")
        if "error" in obj and run_dir:
            try:
                protocol.write_probe_error(run_dir, rank, line)
            except OSError:
                pass  # the stdout line below is then the only copy
        print(line, flush=True)

    try:
        sizes = parse_sizes(args.sizes)
        if not 1 <= args.iters <= MAX_ITERS or not 0 <= args.warmup <= MAX_ITERS:
            raise ProbeInputError(f"iters {args.iters}, warmup {args.warmup}: 1 to {MAX_ITERS} "
                                  f"timed, 0 to {MAX_ITERS} untimed")
        if not 0 < args.slow_ratio < 1:
            raise ProbeInputError(f"slow-ratio {args.slow_ratio}: between 0 and 1 (exclusive)")
    except ProbeInputError as err:
        return _fail(str(err), report)
    if world < 2:
        return _fail(f"world size {world}: an allreduce probe needs 2 or more ranks "
                     f"(request 2 or more nodes)", report)
    env_ifname = None
    if args.ifname:
        if not IFNAME_SPEC.fullmatch(args.ifname):
            return _fail(f"--ifname {args.ifname!r}: not an interface name or "
                         f"NCCL_SOCKET_IFNAME list", report)
        names = [name for _, name in socket.if_nameindex()]
        chosen = match_interfaces(args.ifname, names)
        if not chosen:
            return _fail(f"--ifname {args.ifname}: no interface of node {node_name()} matches "
                         f"(it has {', '.join(names)})", report)
        os.environ["NCCL_SOCKET_IFNAME"] = args.ifname
        os.environ["GLOO_SOCKET_IFNAME"] = env_ifname = gloo_interface(chosen)
    return _measure(args, sizes, rank, world, report, env_ifname)


def result_row(size: int, seconds: float, ranks: int, algorithm: str) -> dict[str, Any]:
    """One measured allreduce as the report line holds it (torch's and MPI's alike)."""
    algbw, busbw = bandwidths(size, seconds, ranks)
    return {"size": size, "algorithm": algorithm, "ranks": ranks, "time_s": _sig(seconds),
            "algbw_gbs": _sig(algbw), "busbw_gbs": _sig(busbw)}


def node_layout(everyone: Sequence[dict[str, Any]]) -> tuple[list[str], dict[str, int]]:
    """(nodes, leaders) from every rank's facts: the node names in the order the ranks are
    laid out (NODE_RANK, then rank) and each node's first rank, which measures its pairs."""
    nodes: list[str] = []
    leaders: dict[str, int] = {}
    for info in sorted(everyone, key=lambda i: (i["node_rank"], i["rank"])):
        if info["node"] not in leaders:
            nodes.append(info["node"])
            leaders[info["node"]] = info["rank"]
    return nodes, leaders


def ring_pair_mode(ring_rounds: int, extra: Sequence[Sequence[tuple[int, int]]],
                   measured: int, nodes: int) -> str:
    """The report's ``pair_mode`` above ``SEQUENTIAL_PAIRS_UP_TO`` nodes: how the ring's
    rounds and the suspects' rounds (``extra``) went, and how many of all pairs that is."""
    suspects = sum(len(r) for r in extra)
    return (f"ring neighbours in {ring_rounds} rounds of disjoint pairs"
            + (f", then {suspects} suspect node{'s' if suspects > 1 else ''} against "
               f"good nodes in {len(extra)} round{'s' if len(extra) > 1 else ''}"
               if extra else "") + f": {measured} of "
            f"{nodes * (nodes - 1) // 2} pairs")


def _read_nccl_log(path: str | None) -> dict[str, str]:
    """``parse_nccl_debug`` of the NCCL_DEBUG file this rank asked for, which it then
    removes; empty when there is none (NCCL_DEBUG was set by the user, or Gloo ran)."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            facts = parse_nccl_debug(fh.read())
        os.remove(path)
    except OSError:
        return {}
    return facts


class _Collectives:
    """torch.distributed for one probe: the backend, the device, the Gloo group that facts
    and results travel over, and the timed allreduce every measurement uses."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.args, self.rank, self.world = torch, dist, args, rank, world
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        backend = args.backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
        self.backend = backend
        self.nccl_log: str | None = None
        if backend == "nccl":
            torch.cuda.set_device(self.local_rank % max(torch.cuda.device_count(), 1))
            if "NCCL_DEBUG" not in os.environ:  # to read which transport NCCL chose
                self.nccl_log = f"/tmp/hpcdl-probe-nccl.{os.getpid()}.log"
                os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET",
                                  NCCL_DEBUG_FILE=self.nccl_log)
        self.device = torch.device("cuda") if backend == "nccl" else torch.device("cpu")
        self.label = f"torch.distributed {backend} all_reduce"
        self.meta: Any = None  # the Gloo group, once started (None: the default group)

    def start(self) -> None:
        self.dist.init_process_group(self.backend, rank=self.rank, world_size=self.world)
        # Facts and results travel over Gloo even when the data goes over NCCL.
        self.meta = self.dist.new_group(backend="gloo") if self.backend == "nccl" else None

    def sync(self) -> None:
        # NCCL's all_reduce returns before the GPU is done: time to its end.
        if self.backend == "nccl":
            self.torch.cuda.synchronize()

    def timed(self, size: int, group: Any) -> float:
        """The median over --iters calls of the slowest rank's time for an allreduce of
        ``size`` bytes in ``group`` (None: every rank), after --warmup untimed calls."""
        torch, dist = self.torch, self.dist
        tensor = torch.ones(size // 4, dtype=torch.float32, device=self.device)
        for _ in range(self.args.warmup):
            dist.all_reduce(tensor, group=group)
        dist.barrier(group=group)
        times = []
        for _ in range(self.args.iters):
            self.sync()
            t0 = time.perf_counter()
            dist.all_reduce(tensor, group=group)
            self.sync()
            times.append(time.perf_counter() - t0)
        slowest = torch.tensor(times, dtype=torch.float64, device=self.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        return float(statistics.median(slowest.tolist()))

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` from every rank, in rank order (over the Gloo group)."""
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, obj, group=self.meta)
        return out

    def transport(self, everyone: Sequence[dict[str, Any]], leaders: dict[str, int],
                  nccl_facts: dict[str, str]) -> dict[str, Any]:
        """The report's ``transport``: versions, NCCL's chosen transport (``nccl_facts``,
        from ``_read_nccl_log``), and each node's interface as its first rank saw it."""
        torch = self.torch
        return {
            "backend": self.backend, "torch": torch.__version__,
            "nccl": (".".join(map(str, torch.cuda.nccl.version()))
                     if self.backend == "nccl" else None),
            # torch's Gloo process group has one transport, TCP; NCCL's is read from
            # its own INFO lines (IB, Socket, ...).
            **({"transport": "TCP"} if self.backend == "gloo" else nccl_facts),
            "nodes": [{k: info[k] for k in ("node", "interface", "address", "env")}
                      for info in everyone if info["rank"] == leaders[info["node"]]],
        }

    def finish(self) -> None:
        self.dist.barrier(group=self.meta)
        self.dist.destroy_process_group()


class _PairProbe:
    """The node pairs' measurements: every pair's allreduce of the largest size between
    the two nodes' first ranks, in rounds; every rank creates every group, in one order."""

    def __init__(self, coll: _Collectives, nodes: list[str], leaders: dict[str, int],
                 size: int) -> None:
        self.coll, self.nodes, self.leaders, self.size = coll, nodes, leaders, size

    def measure(self, rounds: list[list[tuple[int, int]]]) -> list[dict[str, Any]]:
        """Every pair of ``rounds`` (node indices), each round ``PAIR_PASSES`` times,
        keeping each pair's faster pass; every rank gets every pair's row."""
        coll, nodes, leaders = self.coll, self.nodes, self.leaders
        groups = {}
        for pairs_now in rounds:
            for a, b in pairs_now:
                groups[(a, b)] = coll.dist.new_group([leaders[nodes[a]], leaders[nodes[b]]])
        best: dict[tuple[str, str], dict[str, Any]] = {}
        for _ in range(PAIR_PASSES):
            for pairs_now in rounds:
                for a, b in pairs_now:
                    if coll.rank not in (leaders[nodes[a]], leaders[nodes[b]]):
                        continue
                    result = {"nodes": [nodes[a], nodes[b]],
                              **result_row(self.size, coll.timed(self.size, groups[(a, b)]), 2,
                                           coll.label)}
                    key = (nodes[a], nodes[b])
                    if coll.rank == leaders[nodes[a]] and (
                            key not in best or result["busbw_gbs"] > best[key]["busbw_gbs"]):
                        best[key] = result
                coll.dist.barrier(group=coll.meta)
        return [p for part in coll.gather(list(best.values())) for p in part]

    def measure_all(self, slow_ratio: float) -> tuple[list[dict[str, Any]], str]:
        """(every measured pair's row, the report's ``pair_mode``): see ``pair_rounds``
        and ``confirm_rounds`` for which pairs."""
        nodes = self.nodes
        rounds = pair_rounds(len(nodes))
        measured = self.measure(rounds)
        if len(nodes) <= SEQUENTIAL_PAIRS_UP_TO:
            return measured, "one pair at a time"
        # Every rank holds the ring's results now and derives the same second rounds.
        index = {n: i for i, n in enumerate(nodes)}
        ring_bw = {(index[p["nodes"][0]], index[p["nodes"][1]]): p["busbw_gbs"] for p in measured}
        extra = confirm_rounds(len(nodes), ring_bw, slow_ratio)
        measured += self.measure(extra)
        return measured, ring_pair_mode(len(rounds), extra, len(measured), len(nodes))


def _measure(args: argparse.Namespace, sizes: tuple[int, ...], rank: int, world: int,
             report: Callable[[dict[str, Any]], None], gloo_ifname: str | None) -> int:
    coll = _Collectives(args, rank, world)
    started = time.monotonic()
    coll.start()
    # Who is where: node order as the ranks are laid out (NODE_RANK), first rank per node.
    me = {"rank": rank, "node": node_name(), "node_rank": int(os.environ.get("NODE_RANK", "0")),
          "local_rank": coll.local_rank, **_facts(gloo_ifname)}
    everyone = coll.gather(me)
    nodes, leaders = node_layout(everyone)
    whole = [result_row(size, coll.timed(size, None), world, coll.label) for size in sizes]
    pair_size = sizes[-1]
    measured, pair_mode = _PairProbe(coll, nodes, leaders, pair_size).measure_all(args.slow_ratio)
    all_pairs = sorted(measured, key=lambda p: p["nodes"])
    nccl_facts = _read_nccl_log(coll.nccl_log)  # every rank: each removes its own file
    mpi = _mpi_sweep(args.mpi, sizes, args.iters, args.warmup, world)
    elapsed = time.monotonic() - started
    pair_bw = {(p["nodes"][0], p["nodes"][1]): p["busbw_gbs"] for p in all_pairs}
    judged = verdict(nodes, pair_bw, slow_ratio=args.slow_ratio, expected_gbs=args.expected_gbs)
    code = EXIT_SLOW if judged["bad"] else EXIT_OK
    if rank == 0 and args.slow_nodes_out:
        write_slow_nodes(args.slow_nodes_out, judged)
    if rank == 0:
        report({
            "backend": coll.backend, "world_size": world, "nodes": nodes,
            "ranks_per_node": world // len(nodes), "sizes": list(sizes), "iters": args.iters,
            "warmup": args.warmup, "allreduce": whole, "pairs": all_pairs,
            "pair_size": pair_size,
            "pair_mode": pair_mode,
            "mpi": mpi, "expected_gbs": args.expected_gbs, "verdict": judged,
            "transport": coll.transport(everyone, leaders, nccl_facts),
            "elapsed_s": round(elapsed, 3), "exit_code": code})
    coll.finish()
    if rank != 0:
        return EXIT_OK  # rank 0's status is the verdict
    if code != EXIT_OK:
        # srun --kill-on-bad-exit ends the step at the first non-zero exit: the other
        # ranks, past the last barrier, exit first (else they die of SIGTERM, and the
        # step's status is 143 rather than the verdict).
        time.sleep(EXIT_GRACE_S)
    return code


def _facts(gloo_ifname: str | None) -> dict[str, Any]:
    """This rank's interface toward the rendezvous host and the transport variables."""
    addresses = _interfaces()
    local = _route_to(os.environ.get("MASTER_ADDR", "127.0.0.1"))
    if gloo_ifname:
        interface, address = gloo_ifname, addresses.get(gloo_ifname, "")
    else:
        interface = next((n for n, a in addresses.items() if a and a == local), "")
        address = local
    env = {k: os.environ[k] for k in TRANSPORT_ENV if k in os.environ}
    return {"interface": interface, "address": address, "env": env}


def _mpi_sweep(mode: str, sizes: tuple[int, ...], iters: int, warmup: int,
               world: int) -> dict[str, Any]:
    """MPI_Allreduce over the whole allocation with mpi4py, or why not."""
    started_by_pmi = any(k in os.environ for k in ("PMIX_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"))
    if mode == "off":
        return {"skipped": "--mpi off"}
    if mode == "auto" and not started_by_pmi:
        return {"skipped": "ranks not started with PMI (srun --mpi=pmix, mpirun)"}
    try:
        import numpy as np
        from mpi4py import MPI
    except ImportError as exc:
        return {"skipped": f"mpi4py/numpy not importable ({exc})"}
    comm = MPI.COMM_WORLD
    if comm.Get_size() != world:
        return {"skipped": f"MPI sees {comm.Get_size()} ranks, torch {world}"}
    rows = []
    for size in sizes:
        send = np.ones(size // 4, dtype=np.float32)
        recv = np.empty_like(send)
        for _ in range(warmup):
            comm.Allreduce(send, recv, op=MPI.SUM)
        comm.Barrier()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            comm.Allreduce(send, recv, op=MPI.SUM)
            times.append(time.perf_counter() - t0)
        slowest = np.array(times)
        comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
        seconds = float(statistics.median(slowest.tolist()))
        rows.append(result_row(size, seconds, world, "mpi4py MPI_Allreduce"))
    library = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
    return {"library": library, "allreduce": rows}


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # past torch's teardown: the ranks leave together (see EXIT_GRACE_S)

