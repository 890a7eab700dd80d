#!/usr/bin/env python3
"""Time to detect a cluster of N nodes: `hpcdl profiles detect` against real slurmctld's.

For each N a separate real Slurm cluster is started with scripts/sandbox.sh (its own
directory, ports and munge; no slurmdbd): 2 nodes with a slurmd, the other N-2
configured DOWN without one (Slurm still reports every one of them in scontrol, which
is what detection reads). Partitions: all (every node), gpu (the 2 live nodes), big
(the DOWN ones). Measured per N, median of --repeats:
  cli       `python -m hpcdl profiles detect` (what a user types; includes Python start-up)
  commands  the Slurm commands alone (hpcdl.schedulers.slurm.detect.capture_all)
  parse     parsing + writing + validating the profile (facts_from + describe)
Each cluster is stopped (sandbox.sh down) before the next starts, whatever happens.

    python3 bench/bench_detect.py [--nodes 2,64,512,2048] [--repeats 5] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import describe, facts_line  # noqa: E402
from hpcdl.schedulers.slurm.describe import describe as describe_profile  # noqa: E402
from hpcdl.schedulers.slurm.detect import capture_all, facts_from  # noqa: E402
from tests.own_cluster import cluster_env, free_port  # noqa: E402

SANDBOX = REPO / "scripts" / "sandbox.sh"


def shape(n: int) -> str:
    lines = [f"node g1 127.0.18.1 {free_port('127.0.18.1')} 8 4096 gpu:a100:4 up",
             f"node g2 127.0.18.2 {free_port('127.0.18.2')} 8 4096 gpu:a100:4 up"]
    fakes = n - 2
    for i in range(1, fakes + 1):  # DOWN, never contacted: address and port only fill the line
        lines.append(f"node f{i} 127.19.{i // 250}.{i % 250 + 1} {20000 + i} 8 4096 gpu:a100:4 down")
    every = "g1,g2" + (f",f[1-{fakes}]" if fakes else "")
    lines += [f"partition all {every} MaxTime=02:00:00 DefaultTime=00:10:00",
              "partition gpu g1,g2 MaxNodes=2 MaxTime=00:30:00"]
    if fakes:
        lines.append(f"partition big f[1-{fakes}] MaxTime=1-00:00:00")
    return "\n".join(lines) + "\n"


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def measure(n: int, repeats: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"hpcdl-bd{n}-", dir="/tmp"))
    env = cluster_env(folder, shape(n), f"bench{n}")
    full = {**os.environ, **env}
    try:
        t0 = time.monotonic()
        up = subprocess.run(["bash", str(SANDBOX), "up"], capture_output=True, text=True,
                            timeout=600, check=False, env=full)
        if up.returncode != 0:
            raise SystemExit(f"cluster of {n} nodes did not start:\n{up.stdout}\n{up.stderr}")
        start_s = time.monotonic() - t0
        cli, commands, parse = [], [], []
        saved = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = env["SLURM_CONF"]
        try:
            for _ in range(repeats):
                t0 = time.monotonic()
                res = subprocess.run([sys.executable, "-m", "hpcdl", "profiles", "detect"],
                                     capture_output=True, text=True, timeout=600, check=False,
                                     env=full, cwd=REPO)
                cli.append(time.monotonic() - t0)
                if res.returncode != 0:
                    raise SystemExit(f"detect failed on {n} nodes: {res.stderr}")
                t0 = time.monotonic()
                caps = capture_all()
                commands.append(time.monotonic() - t0)
                t0 = time.monotonic()
                found = describe_profile(facts_from(caps))
                parse.append(time.monotonic() - t0)
        finally:
            if saved is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = saved
        nodes_seen = len(facts_from(caps).nodes)
        return {"nodes": n, "nodes_in_scontrol": nodes_seen, "start_s": round(start_s, 2),
                "cli_s": round(median(cli), 3), "commands_s": round(median(commands), 3),
                "parse_s": round(median(parse), 3),
                "partitions": [p.name for p in found.profile.partitions],
                "profile_bytes": len(found.text)}
    finally:
        subprocess.run(["bash", str(SANDBOX), "down"], capture_output=True, text=True,
                       timeout=300, check=False, env=full)
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="2,64,512,2048", help="comma-separated node counts (>= 2)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("slurmctld"):
        raise SystemExit("needs root and Slurm's daemons (scripts/install-slurm.sh)")
    counts = [int(x) for x in args.nodes.split(",")]
    if min(counts) < 2:
        raise SystemExit("--nodes: every count must be at least 2 (two nodes run a slurmd)")
    rows = [measure(n, args.repeats) for n in counts]
    machine = describe(tools=("sinfo",))
    print(f"hpcdl profiles detect: time to detect a cluster of N nodes (median of {args.repeats})")
    print(f"machine: {facts_line(machine)}")
    print(f"{'nodes':>6} {'in scontrol':>11} {'cli s':>7} {'commands s':>10} {'parse s':>8} "
          f"{'start s':>8}")
    for r in rows:
        print(f"{r['nodes']:>6} {r['nodes_in_scontrol']:>11} {r['cli_s']:>7.3f} "
              f"{r['commands_s']:>10.3f} {r['parse_s']:>8.3f} {r['start_s']:>8.2f}")
    print("cli: python -m hpcdl profiles detect (Python start-up included); commands: scontrol x3, "
          "srun --mpi=list, sacctmgr (fails fast: no slurmdbd), apptainer --version; parse: "
          "parsing + writing + validating the profile")
    print(f"reproduce: python3 bench/bench_detect.py --nodes {args.nodes} --repeats {args.repeats}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
