#!/usr/bin/env python3
"""Start-up cost of the rank-env wrapper (hpcdl.launch.rankenv) that every rank of a job
goes through: `/bin/sh RUN_DIR/job/bin/hpcdl-rank-env CMD` (a Slurm job's staged file)
and `/bin/sh -c WRAPPER hpcdl-rank-env CMD` (a PBS script's inline copy) against running
CMD (/bin/true) directly, for an ordinary rank and for the rank that hosts the
rendezvous (which also looks for a listener on MASTER_PORT in /proc/net/tcp{,6}, whose
size it reports).

    python3 bench/bench_rankenv.py [--runs 300] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import describe  # noqa: E402
from hpcdl.launch.rankenv import WRAPPER_NAME, rank_env_file, rank_env_script  # noqa: E402

RANK_ENV = {"PATH": "/usr/bin:/bin", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
            "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "MASTER_PORT": "15031"}


def median_ms(argv: list[str], env: dict[str, str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    inline = ["/bin/sh", "-c", rank_env_script(), WRAPPER_NAME, "/bin/true"]
    with tempfile.TemporaryDirectory(prefix="hpcdl-bench-") as folder:
        staged = Path(folder) / WRAPPER_NAME
        staged.write_text(rank_env_file())
        measure(args, ["/bin/sh", str(staged), "/bin/true"], inline)


def measure(args: argparse.Namespace, wrapper: list[str], inline: list[str]) -> None:
    other = {**RANK_ENV, "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}
    host = {**RANK_ENV, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    sockets = sum(len(Path(f).read_text().splitlines()) - 1
                  for f in ("/proc/net/tcp", "/proc/net/tcp6") if Path(f).exists())
    result = {
        "direct_ms": median_ms(["/bin/true"], other, args.runs),
        "wrapped_rank_ms": median_ms(wrapper, other, args.runs),
        "wrapped_rendezvous_rank_ms": median_ms(wrapper, host, args.runs),
        "inline_rank_ms": median_ms(inline, other, args.runs),
        "tcp_sockets": sockets,
        "runs": args.runs,
        "machine": describe(),
    }
    print(f"medians of {args.runs} runs: /bin/true {result['direct_ms']:.1f} ms; through the "
          f"staged wrapper file {result['wrapped_rank_ms']:.1f} ms (a rank), "
          f"{result['wrapped_rendezvous_rank_ms']:.1f} ms (the rendezvous rank, "
          f"{sockets} TCP sockets on this host); inline (sh -c, PBS) "
          f"{result['inline_rank_ms']:.1f} ms (a rank)")
    print(f"machine: {json.dumps(result['machine'])}")
    print("rerun: python3 bench/bench_rankenv.py --runs", args.runs)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
