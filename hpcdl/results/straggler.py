"""The straggler verdict: which rank, or node, the others wait for. Pure.

In synchronous data-parallel training every rank's step ends at the same allreduce,
so their wall step times are equal; a slow rank shows instead in its own work: the
others finish theirs and wait in the gradient sync. So the measure is each rank's
*busy time* per step, from its per-step metrics (hpcdl.jobside.steps): the wait for
its batch plus forward/backward, without the time it waited for the others
(``data_s + compute_s`` = ``data_s + step_s - sync_s``). The first step of each
attempt (warm-up: allocator, thread pools, first collectives) is left out.

A rank is slow when its median busy time is at least ``threshold`` times the median
of the other ranks' medians (and at least ``min_gap_s`` more, so that microsecond
noise on tiny steps names nobody). A node is slow when every rank on it is slow and
there is another node to compare it with: then the node (its CPUs, GPUs, a noisy
neighbour) is the common factor and is named instead of its ranks.

No rank or node is named where a node's ranks outnumber its cores (the union of the CPUs
its ranks may run on, from their metrics' start lines): there the ranks time-share the
cores, the scheduler's slices decide which one finishes last, and a "slow" rank says
nothing about its node (8 ranks on a 2-core machine). The verdict says so instead.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

DEFAULT_THRESHOLD = 1.25
MIN_GAP_S = 0.002


def busy_seconds(rec: Mapping[str, Any]) -> float | None:
    """A step record's busy time (data wait + forward/backward), or None when it lacks
    the figures."""
    data, compute = rec.get("data_s"), rec.get("compute_s")
    if compute is None and isinstance(rec.get("step_s"), (int, float)) \
            and isinstance(rec.get("sync_s"), (int, float)):
        compute = max(0.0, rec["step_s"] - rec["sync_s"])
    if not isinstance(compute, (int, float)) or isinstance(compute, bool):
        return None
    return float(compute) + (float(data) if isinstance(data, (int, float)) else 0.0)


def _timed(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``steps`` without the first step of each attempt (warm-up)."""
    first: dict[Any, int] = {}
    for rec in steps:
        key = rec.get("attempt")
        if key not in first or rec["step"] < first[key]:
            first[key] = rec["step"]
    timed = [r for r in steps if r["step"] != first.get(r.get("attempt"))]
    return timed or steps


def rank_medians(metrics: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per rank: rank, host, steps measured, median busy/step/sync seconds (ranks
    without a usable step are left out)."""
    out = []
    for rank in sorted(metrics):
        steps = _timed(list(metrics[rank].get("steps") or []))
        busy = [b for b in (busy_seconds(r) for r in steps) if b is not None]
        if not busy:
            continue
        step = [float(r["step_s"]) for r in steps if isinstance(r.get("step_s"), (int, float))]
        sync = [float(r["sync_s"]) for r in steps if isinstance(r.get("sync_s"), (int, float))]
        out.append({"rank": rank, "host": metrics[rank].get("host"), "steps": len(busy),
                    "busy_s": round(statistics.median(busy), 6),
                    "step_s": round(statistics.median(step), 6) if step else None,
                    "sync_s": round(statistics.median(sync), 6) if sync else None})
    return out


def oversubscribed(metrics: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The nodes whose ranks outnumber their cores: [{"host", "ranks", "cores"}], where
    a node's cores are the union of the CPUs its ranks may run on (``cpus`` in
    read_metrics). A node with a rank that did not record its CPUs is left out."""
    nodes: dict[str, list[Any]] = {}
    for rank in metrics.values():
        nodes.setdefault(str(rank.get("host")), []).append(rank.get("cpus"))
    out = []
    for host, cpus in sorted(nodes.items()):
        if host == "None" or any(not isinstance(c, list) for c in cpus):
            continue
        cores = len({c for rank_cpus in cpus for c in rank_cpus})
        if 0 < cores < len(cpus):
            out.append({"host": host, "ranks": len(cpus), "cores": cores})
    return out


def verdict(metrics: Mapping[int, Mapping[str, Any]], *, threshold: float = DEFAULT_THRESHOLD,
            min_gap_s: float = MIN_GAP_S) -> dict[str, Any]:
    """The straggler verdict over every rank's metrics (hpcdl.jobside.steps.read_metrics).

    Returns {"measure", "threshold", "ranks" (rank_medians, each with its ``ratio`` to
    the others), "slow_ranks", "slow_nodes", "found", "oversubscribed" (see that
    function), "message"}. ``found`` is False (and ``message`` says why) with fewer than
    two ranks to compare, or where a node's ranks outnumber its cores.
    """
    ranks = rank_medians(metrics)
    out: dict[str, Any] = {"measure": "median busy time per step (data wait + "
                                      "forward/backward, without the gradient-sync wait)",
                           "threshold": threshold, "ranks": ranks, "slow_ranks": [],
                           "slow_nodes": [], "found": False,
                           "oversubscribed": oversubscribed(metrics)}
    if len(ranks) < 2:
        out["message"] = ("no per-step metrics: nothing to compare" if not ranks else
                          "one rank with metrics: nothing to compare it with")
        return out
    if out["oversubscribed"]:
        nodes = ", ".join(f"{n['host']} runs {n['ranks']} ranks on {n['cores']} "
                          f"core{'s' if n['cores'] != 1 else ''}" for n in out["oversubscribed"])
        out["message"] = (f"no straggler named: the ranks outnumber the cores ({nodes}), so "
                          "they take turns on them and their step times measure that sharing, "
                          "not a slow rank or node")
        return out
    for row in ranks:
        others = statistics.median(r["busy_s"] for r in ranks if r is not row)
        row["others_s"] = round(others, 6)
        row["ratio"] = round(row["busy_s"] / others, 3) if others > 0 else None
        row["slow"] = bool(others > 0 and row["busy_s"] >= threshold * others
                           and row["busy_s"] - others >= min_gap_s)
    slow = [r for r in ranks if r["slow"]]
    hosts: dict[str, list[dict[str, Any]]] = {}
    for row in ranks:
        hosts.setdefault(str(row["host"]), []).append(row)
    slow_nodes = []
    if len(hosts) > 1 and len(slow) < len(ranks):
        for host, members in sorted(hosts.items()):
            if host != "None" and all(m["slow"] for m in members):
                others = statistics.median(r["busy_s"] for r in ranks if r["host"] != host)
                node_s = statistics.median(m["busy_s"] for m in members)
                slow_nodes.append({"host": host, "ranks": [m["rank"] for m in members],
                                   "busy_s": round(node_s, 6), "others_s": round(others, 6),
                                   "ratio": round(node_s / others, 3) if others > 0 else None})
    on_slow_nodes = {r for n in slow_nodes for r in n["ranks"]}
    out["slow_nodes"] = slow_nodes
    out["slow_ranks"] = [{k: r[k] for k in ("rank", "host", "busy_s", "others_s", "ratio")}
                         for r in slow if r["rank"] not in on_slow_nodes]
    out["found"] = bool(slow_nodes or out["slow_ranks"])
    out["message"] = _message(out, len(ranks))
    return out


def _message(out: dict[str, Any], n: int) -> str:
    parts = []
    for node in out["slow_nodes"]:
        ranks = ", ".join(str(r) for r in node["ranks"])
        parts.append(f"node {node['host']} is slow: all its ranks ({ranks}) take "
                     f"{node['busy_s']:.3f} s per step, {node['ratio']:.2f}x the other "
                     f"nodes' {node['others_s']:.3f} s")
    for r in out["slow_ranks"]:
        parts.append(f"rank {r['rank']} on {r['host'] or 'an unknown node'} is slow: "
                     f"{r['busy_s']:.3f} s per step, {r['ratio']:.2f}x the other ranks' "
                     f"{r['others_s']:.3f} s")
    if not parts:
        return (f"no straggler: every one of {n} ranks is within {out['threshold']:g}x "
                f"of the others' median busy time per step")
    return ("straggler: " + "; ".join(parts)
            + f" (threshold {out['threshold']:g}x; the other ranks wait for it in the "
              "gradient sync)")
