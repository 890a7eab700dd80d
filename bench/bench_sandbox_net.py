#!/usr/bin/env python3
"""What the sandbox's network namespaces cost: scripts/sandbox.sh with a namespace per node
(addresses in a 10.x.y.0/24 on a bridge) against the old way (loopback addresses in the
host's network), same shape otherwise.

For each mode and repeat a separate two-node cluster is started (own directory, ports,
node names; no slurmdbd, so the figures are munge + slurmctld + 2 slurmd + the network),
with the Slurm packages already installed. Measured, median of --repeats:
  up s       `scripts/sandbox.sh up` until both nodes are idle (wall clock)
  job s      a 2-node job: `srun -N2 -n2 hostname`
  mpi s      a 2-node MPI job: `srun -N2 -n2 --mpi=pmix python3 -c <mpi4py Allreduce of 64 MiB>`
  down s     `scripts/sandbox.sh down` (daemons, then namespaces, veths, bridge, hosts block)
Each cluster is stopped before the next starts, whatever happens. Needs root.

    python3 bench/bench_sandbox_net.py [--repeats 3] [--json-out FILE]
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
from tests.own_cluster import (  # noqa: E402
    cluster_env,
    free_port,
    free_subnet,
    node_names,
    unique_prefix,
)

SANDBOX = REPO / "scripts" / "sandbox.sh"
MPI_PROG = ("from mpi4py import MPI; import numpy as np; c = MPI.COMM_WORLD; "
            "a = np.ones(8 * 1024 * 1024); b = np.empty_like(a); c.Allreduce(a, b); "
            "assert b[0] == c.size")


def timed(argv: list[str], env: dict[str, str], timeout: float = 300) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                         env={**os.environ, **env})
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout}{res.stderr}")
    return took


def one_cluster(netns: bool) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="hpcdl-bn-", dir="/tmp"))
    prefix = unique_prefix()
    if netns:
        subnet = free_subnet()
        addrs = [f"{subnet}.11", f"{subnet}.12"]
    else:
        addrs = ["127.0.21.1", "127.0.21.2"]
    names = node_names(prefix, 2)
    env = cluster_env(folder, f"node {names[0]} {addrs[0]} {free_port()} 8 4096 - up\n"
                              f"node {names[1]} {addrs[1]} {free_port()} 8 4096 - up\n"
                              f"partition debug {names[0]},{names[1]} Default=YES "
                              "MaxTime=00:30:00\n", f"bn{prefix}")
    try:
        up = timed(["bash", str(SANDBOX), "up"], env)
        job = timed(["srun", "-N2", "-n2", "-t", "1", "hostname"], env)
        mpi = timed(["srun", "-N2", "-n2", "--mpi=pmix", "-t", "2", sys.executable, "-c", MPI_PROG],
                    env)
        down = timed(["bash", str(SANDBOX), "down"], env)
        return {"up_s": up, "job_s": job, "mpi_s": mpi, "down_s": down}
    finally:
        subprocess.run(["bash", str(SANDBOX), "down"], capture_output=True, text=True,
                       timeout=180, check=False, env={**os.environ, **env})
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_sandbox_net: needs root (starts Slurm daemons, network namespaces)",
              file=sys.stderr)
        return 2
    machine = describe()
    for key, argv in (("slurm", ["slurmctld", "-V"]), ("iproute2", ["ip", "-V"])):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        machine[key] = (out.stdout or out.stderr).strip().splitlines()[0]
    results: dict[str, Any] = {}
    for mode in ("loopback", "netns"):
        runs = [one_cluster(mode == "netns") for _ in range(args.repeats)]
        results[mode] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        results[mode]["runs"] = runs
    print(f"scripts/sandbox.sh: cost of a network namespace per node (2 nodes, no slurmdbd; "
          f"median of {args.repeats})")
    print(f"machine: {facts_line(machine)}")
    print(f"{'mode':<9} {'up s':>6} {'job s':>6} {'mpi s':>6} {'down s':>7}")
    for mode, r in results.items():
        print(f"{mode:<9} {r['up_s']:>6.2f} {r['job_s']:>6.2f} {r['mpi_s']:>6.2f} {r['down_s']:>7.2f}")
    print("up: until both nodes are idle; job: srun -N2 -n2 hostname; mpi: srun -N2 -n2 "
          "--mpi=pmix mpi4py Allreduce of 64 MiB; down: daemons, then the network")
    print(f"reproduce: sudo python3 bench/bench_sandbox_net.py --repeats {args.repeats}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": machine, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
