#!/usr/bin/env python3
"""`hpcdl probe` on a 3-node cluster with a network namespace per node: how far apart
healthy nodes' ratios spread over repeated probes, against a node whose link is
rate-limited (tc tbf through `scripts/sandbox.sh shape NODE --rate MBIT`), to choose
--slow-ratio's default (hpcdl.jobside.protocol.DEFAULT_SLOW_RATIO) with a margin both sides.

A cluster of its own is started beside the sandbox (bench.common.own_cluster: own
directory, ports, subnet, node names, run directories under /scratch; no slurmdbd) and
stopped at the end, whatever happens. In the CPU image, one rank per node: --repeats
healthy probes, then --shaped probes with the last node limited to --rate Mbit/s, then
one after `shape --clear`. Each node's ratio is the verdict's: its best link over the
median node's best link. Printed: each probe's wall time (command to verdict), exit
status, the nodes it named and every node's ratio; then per node and state the ratio's
min/median/max, the healthy minimum against the shaped node's maximum, the threshold
halfway between them (geometric mean) and the margin of --slow-ratio on each side; and
the tables of the first healthy and the first shaped probe. Needs root and the image
on the shared /scratch (the nodes see only /home and /scratch; the tests publish it).

    sudo python3 bench/bench_probe.py [--repeats 10] [--shaped 3] [--rate 200]
         [--sizes 4K,64K,1M] [--slow-ratio R] [--image SIF] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import SANDBOX, own_cluster, run  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402
from hpcdl.jobside.protocol import DEFAULT_SLOW_RATIO  # noqa: E402

NODES = 3
PROBE_TIMEOUT = 600  # s: a shaped probe took ~20 s; the job may queue behind nothing here


# ---- pure parts (tests/unit/project/test_bench_probe.py) ------------------------------
def ratio_summary(ratios: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per node, over probes (each a verdict's ``node_ratio``: node -> best link over the
    median node's best): ``{"n", "min", "median", "max"}``. A node missing from a probe
    is left out of that probe's figures."""
    by_node: dict[str, list[float]] = {}
    for probe in ratios:
        for node, ratio in probe.items():
            by_node.setdefault(node, []).append(float(ratio))
    return {node: {"n": len(values), "min": min(values), "median": statistics.median(values),
                   "max": max(values)} for node, values in sorted(by_node.items())}


def threshold_margins(healthy_min: float, shaped_max: float, threshold: float
                      ) -> dict[str, float]:
    """How a threshold sits between the lowest ratio a healthy node reached and the
    highest a slow (shaped) node reached: ``midpoint`` (their geometric mean: the same
    factor of margin on each side), ``healthy_margin`` (healthy_min / threshold: how much
    further a healthy node may fall before it is named) and ``slow_margin`` (threshold /
    shaped_max: how much faster a slow link may be and still be named); a margin below 1
    is a wrong verdict seen. Raises ValueError for a ratio or threshold not > 0."""
    if min(healthy_min, shaped_max, threshold) <= 0:
        raise ValueError(f"ratios and threshold must be > 0: healthy {healthy_min}, "
                         f"shaped {shaped_max}, threshold {threshold}")
    return {"midpoint": math.sqrt(healthy_min * shaped_max),
            "healthy_margin": healthy_min / threshold, "slow_margin": threshold / shaped_max}


# ---- the measurement -----------------------------------------------------------------
def probe(cluster: dict[str, Any], args: argparse.Namespace, label: str) -> dict[str, Any]:
    """One `hpcdl probe --wait --json` on the cluster: what it named, its ratios, pairs."""
    t0 = time.perf_counter()
    res = run([sys.executable, "-m", "hpcdl", "probe", "-p", str(cluster["profile"]),
               "-N", str(NODES), "--image", str(args.image), "--sizes", args.sizes,
               "--slow-ratio", f"{args.slow_ratio:g}", "--wait", "--json"],
              cluster["env"], timeout=PROBE_TIMEOUT, check=False)
    wall = time.perf_counter() - t0
    lines = res.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"hpcdl probe printed nothing (exit {res.returncode}):\n"
                           f"{res.stderr[-3000:]}")
    out = json.loads(lines[-1])
    report = out.get("probe") or {}
    if "verdict" not in report:
        raise RuntimeError(f"hpcdl probe gave no verdict (exit {res.returncode}):\n"
                           f"{res.stdout[-3000:]}{res.stderr[-3000:]}")
    verdict = report["verdict"]
    return {"label": label, "exit": res.returncode, "wall_s": round(wall, 2),
            "named": verdict["slow_nodes"], "ratios": verdict["node_ratio"],
            "pairs": {"-".join(p["nodes"]): p["busbw_gbs"] for p in report["pairs"]},
            "run_dir": out["run_dir"]}


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str, dict[str, str]]:
    """Every probe on a cluster of its own; also the shaped node and the first healthy
    and shaped probes' tables (`hpcdl results`)."""
    runs: list[dict[str, Any]] = []
    tables: dict[str, str] = {}
    with own_cluster(NODES, "bp") as cluster:
        slow = cluster["nodes"][-1]

        def one(label: str) -> None:
            runs.append(probe(cluster, args, label))
            if label not in tables:
                tables[label] = run([sys.executable, "-m", "hpcdl", "results",
                                     runs[-1]["run_dir"]], cluster["env"]).stdout
            print(f"  {label} {len(runs)}: exit {runs[-1]['exit']}, "
                  f"{runs[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)

        for _ in range(args.repeats):
            one("healthy")
        if args.shaped:
            run(["bash", str(SANDBOX), "shape", slow, "--rate", f"{args.rate:g}"],
                cluster["env"])
            try:
                for _ in range(args.shaped):
                    one("shaped")
            finally:
                run(["bash", str(SANDBOX), "shape", slow, "--clear"], cluster["env"])
            one("cleared")
    return runs, slow, tables


def report(runs: list[dict[str, Any]], slow: str, args: argparse.Namespace) -> dict[str, Any]:
    """Print the probes and the ratios' spread; returns the summary."""
    nodes = sorted({n for r in runs for n in r["ratios"]})
    print(f"{'probe':<8} {'exit':>4} {'wall s':>6}  {'named':<6} "
          + " ".join(f"{n:>7}" for n in nodes) + "   pair GB/s")
    for r in runs:
        print(f"{r['label']:<8} {r['exit']:>4} {r['wall_s']:>6.1f}  "
              f"{','.join(r['named']) or '-':<6} "
              + " ".join(f"{r['ratios'].get(n, math.nan):>7.3f}" for n in nodes) + "   "
              + ", ".join(f"{bw:.3g}" for bw in r["pairs"].values()))
    healthy = [r["ratios"] for r in runs if r["label"] in ("healthy", "cleared")]
    shaped = [r["ratios"] for r in runs if r["label"] == "shaped"]
    summary: dict[str, Any] = {"healthy": ratio_summary(healthy),
                               "shaped": ratio_summary(shaped)}
    print("\nnode ratio (best link / median node's best): n, min / median / max")
    for state, table in summary.items():
        for node, s in table.items():
            role = " (rate-limited)" if state == "shaped" and node == slow else ""
            print(f"  {state:<8} {node}{role}: {s['n']:.0f}, {s['min']:.3f} / "
                  f"{s['median']:.3f} / {s['max']:.3f}")
    healthy_min = min((s["min"] for s in summary["healthy"].values()), default=None)
    shaped_max = summary["shaped"].get(slow, {}).get("max")
    summary.update(healthy_min=healthy_min, shaped_max=shaped_max)
    if healthy_min is not None and shaped_max is not None and healthy_min > 0 and shaped_max > 0:
        m = threshold_margins(healthy_min, shaped_max, args.slow_ratio)
        summary.update(m)
        print(f"\nlowest healthy ratio {healthy_min:.3f}, highest rate-limited {shaped_max:.3f}: "
              f"halfway (geometric) {m['midpoint']:.3f}; --slow-ratio {args.slow_ratio:g} "
              f"leaves x{m['healthy_margin']:.2f} to the healthy minimum and "
              f"x{m['slow_margin']:.2f} to the slow maximum")
    wrong = sum(1 for r in runs if r["label"] != "shaped" and r["named"]) + sum(
        1 for r in runs if r["label"] == "shaped" and r["named"] != [slow])
    summary["wrong_verdicts"] = wrong
    print(f"wrong verdicts at --slow-ratio {args.slow_ratio:g}: {wrong} of {len(runs)}")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="healthy probes")
    parser.add_argument("--shaped", type=int, default=3,
                        help="probes with the last node rate-limited (0: none)")
    parser.add_argument("--rate", type=float, default=200.0, help="Mbit/s of the slowed link")
    parser.add_argument("--sizes", default="4K,64K,1M")
    parser.add_argument("--slow-ratio", type=float, default=DEFAULT_SLOW_RATIO,
                        help="the probe's threshold (default: hpcdl's)")
    parser.add_argument("--image", type=Path,
                        default=Path("/scratch/images/pytorch-horovod-cpu.sif"))
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_probe: needs root (starts Slurm daemons, network namespaces)", file=sys.stderr)
        return 2
    if not args.image.is_file():
        print(f"bench_probe: no image at {args.image} (the integration tests publish it "
              f"there; the nodes see only /home and /scratch)", file=sys.stderr)
        return 2
    if args.repeats < 1 or args.shaped < 0:
        print("bench_probe: --repeats 1 or more, --shaped 0 or more", file=sys.stderr)
        return 2
    runs, slow, tables = measure(args)
    machine = describe(packages=("torch",), tools=("sbatch", "apptainer"))
    limit_gbs = args.rate * 1e6 / 8 / 1e9
    print(f"hpcdl probe: {NODES} nodes (a network namespace each), one rank per node, sizes "
          f"{args.sizes}, --slow-ratio {args.slow_ratio:g}; {slow} limited to {args.rate:g} "
          f"Mbit/s ({limit_gbs:.4g} GB/s) in 'shaped'")
    print(f"machine: {facts_line(machine)}")
    summary = report(runs, slow, args)
    for label, text in tables.items():
        if label != "cleared":
            print(f"\n--- {label} (first run) ---\n{text}", end="")
    print(f"\nreproduce: sudo PYTHONPATH={REPO} python3 bench/bench_probe.py --repeats "
          f"{args.repeats} --shaped {args.shaped} --rate {args.rate:g} --sizes {args.sizes} "
          f"--slow-ratio {args.slow_ratio:g}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": machine, "runs": runs,
                                             "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
