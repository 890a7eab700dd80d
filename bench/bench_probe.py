#!/usr/bin/env python3
"""`hpcdl probe` on a 3-node cluster with a network namespace per node, healthy and with
one node's link rate-limited (tc tbf through `scripts/sandbox.sh shape NODE --rate MBIT`).

A cluster of its own is started beside the sandbox (own directory, ports, subnet, node
names; no slurmdbd) and stopped at the end, whatever happens. Per repeat, three probes in
the CPU image: healthy, with the last node limited to --rate Mbit/s, healthy again after
`shape --clear`. Printed: each probe's wall time (command to verdict), its exit status,
the nodes it named, the slow node's pair bus bandwidth against the limit, and the tables
of the first healthy and the first shaped probe (`hpcdl results RUN_DIR`). Needs root and
the built CPU image.

    python3 bench/bench_probe.py [--repeats 1] [--rate 200] [--sizes 4K,64K,1M,4M]
                                 [--image SIF] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import describe, facts_line  # noqa: E402
from tests.own_cluster import (  # noqa: E402
    cluster_env,
    cluster_profile,
    free_port,
    free_subnet,
    node_names,
    unique_prefix,
)

SANDBOX = REPO / "scripts" / "sandbox.sh"


def run(argv: list[str], env: dict[str, str], timeout: float = 300,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                         env={**os.environ, **env})
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout}{res.stderr}")
    return res


def probe(profile: Path, image: str, sizes: str, env: dict[str, str]) -> dict[str, Any]:
    """One `hpcdl probe --wait --json` on the cluster: its object, wall time and tables."""
    t0 = time.perf_counter()
    res = run([sys.executable, "-m", "hpcdl", "probe", "-p", str(profile), "-N", "3",
               "--image", image, "--sizes", sizes, "--wait", "--json"], env, check=False)
    wall = time.perf_counter() - t0
    out = json.loads(res.stdout.strip().splitlines()[-1])
    tables = run([sys.executable, "-m", "hpcdl", "results", out["run_dir"]], env).stdout
    return {"exit": res.returncode, "wall_s": wall, "out": out, "tables": tables}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rate", type=float, default=200.0, help="Mbit/s of the slowed link")
    parser.add_argument("--sizes", default="4K,64K,1M,4M")
    cache = os.environ.get("HPCDL_CACHE") or "/var/cache/hpcdl"
    parser.add_argument("--image", default=f"{cache}/images/pytorch-horovod-cpu.sif")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_probe: needs root (starts Slurm daemons, network namespaces)", file=sys.stderr)
        return 2
    if not Path(args.image).is_file():
        print(f"bench_probe: no image at {args.image} (make demo builds it)", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="hpcdl-bp-", dir="/tmp"))
    prefix = unique_prefix()
    subnet = free_subnet()
    names = node_names(prefix, 3)
    lines = [f"node {n} {subnet}.{10 + i} {free_port()} 8 4096 gpu:fake:4 up"
             for i, n in enumerate(names, 1)]
    lines.append(f"partition debug {','.join(names)} Default=YES MaxNodes=3 MaxTime=00:30:00")
    env = {**cluster_env(folder, "\n".join(lines) + "\n", f"bp{prefix}"),
           "HPCDL_RUNS": str(folder / "runs")}
    profile = folder / "profile.yaml"
    cluster_profile(folder, f"bp{prefix}", profile)
    limit_gbs = args.rate * 1e6 / 8 / 1e9
    slow = names[2]
    runs: list[dict[str, Any]] = []
    try:
        run(["bash", str(SANDBOX), "up"], env)
        for _ in range(args.repeats):
            for label in ("healthy", "shaped", "cleared"):
                if label == "shaped":
                    run(["bash", str(SANDBOX), "shape", slow, "--rate", f"{args.rate:g}"], env)
                if label == "cleared":
                    run(["bash", str(SANDBOX), "shape", slow, "--clear"], env)
                result = probe(profile, args.image, args.sizes, env)
                report = result["out"].get("probe") or {}
                pairs = {tuple(p["nodes"]): p["busbw_gbs"] for p in report.get("pairs", [])}
                runs.append({"label": label, "exit": result["exit"], "wall_s": result["wall_s"],
                             "named": report.get("verdict", {}).get("slow_nodes"),
                             "slow_pairs_gbs": [bw for k, bw in pairs.items() if slow in k],
                             "other_pairs_gbs": [bw for k, bw in pairs.items() if slow not in k],
                             "tables": result["tables"]})
    finally:
        run(["bash", str(SANDBOX), "down"], env, timeout=180, check=False)
        shutil.rmtree(folder, ignore_errors=True)
    machine = describe(packages=("torch",), tools=("slurmctld", "apptainer"))
    print(f"hpcdl probe: 3 nodes (a network namespace each), one rank per node, sizes "
          f"{args.sizes}; {slow} limited to {args.rate:g} Mbit/s ({limit_gbs:.4g} GB/s) in 'shaped'")
    print(f"machine: {facts_line(machine)}")
    print(f"{'probe':<8} {'exit':>4} {'wall s':>7}  {'named':<8} {'slow pairs GB/s (vs limit)':<32} "
          f"other pair GB/s")
    for r in runs:
        slow_pairs = ", ".join(f"{bw:.4g} ({bw / limit_gbs:.0%})" for bw in r["slow_pairs_gbs"])
        others = ", ".join(f"{bw:.3g}" for bw in r["other_pairs_gbs"])
        print(f"{r['label']:<8} {r['exit']:>4} {r['wall_s']:>7.1f}  {','.join(r['named'] or []) or '-':<8} "
              f"{slow_pairs:<32} {others}")
    for label in ("healthy", "shaped"):
        first = next(r for r in runs if r["label"] == label)
        print(f"\n--- {label} (first run) ---\n{first['tables']}", end="")
    print(f"\nreproduce: sudo python3 bench/bench_probe.py --repeats {args.repeats} "
          f"--rate {args.rate:g} --sizes {args.sizes}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": machine, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
