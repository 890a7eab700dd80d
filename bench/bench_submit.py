#!/usr/bin/env python3
"""Submission overhead: `hpcdl submit` (render + validate + live check + run dir + sbatch)
against plain `sbatch` of the same rendered script, on the sandbox cluster.

Paired runs, order alternating inside each pair so drift hits both sides alike.
Three comparisons, each against plain `sbatch --parsable SCRIPT` measured in the same pair:
  cli      `python -m hpcdl submit -p sandbox ...`: what a user types (includes Python start-up)
  library  hpcdl.jobs.submit.submit() in this process: hpcdl's own work + sbatch
  wait     `hpcdl submit --wait` vs `sbatch --wait`: submit and follow the job to its end
Prints medians side by side with ratios, the machine, and the command to reproduce.

    python3 bench/bench_submit.py [--pairs 20] [--wait-pairs 5] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import shared_tmp  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402
from hpcdl.jobs.submit import plan_run, submit  # noqa: E402
from hpcdl.launch.staging import stage  # noqa: E402
from hpcdl.plan import JobRequest, build_plan  # noqa: E402
from hpcdl.profiles import load_profile  # noqa: E402
from hpcdl.schedulers.slurm.adapter import SlurmScheduler  # noqa: E402

NODES, GPUS = 2, 4
COMMAND = ("true",)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(argv: list[str], timeout: float = 120) -> None:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if res.returncode != 0:
        raise SystemExit(f"failed ({res.returncode}): {' '.join(argv)}\n{res.stderr}")


def paired(n: int, a: Callable[[], object], b: Callable[[], object]) -> tuple[list[float], list[float]]:
    ta, tb = [], []
    for i in range(n):
        if i % 2 == 0:
            ta.append(timed(a))
            tb.append(timed(b))
        else:
            tb.append(timed(b))
            ta.append(timed(a))
    return ta, tb


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20, help="pairs for cli and library")
    ap.add_argument("--wait-pairs", type=int, default=5, help="pairs for submit --wait")
    ap.add_argument("--json-out", help="also write the raw timings here")
    args = ap.parse_args()
    if not shutil.which("sbatch"):
        print("sbatch not found: start the sandbox first (scripts/sandbox.sh up)", file=sys.stderr)
        return 1

    work = shared_tmp("hpcdl-bench-submit-")  # the nodes see only /home and /scratch
    os.environ["HPCDL_RUNS"] = str(work / "runs")
    profile = load_profile("sandbox")
    req = JobRequest(nodes=NODES, gpus=GPUS, command=COMMAND, job_name="bench",
                     run_dir=str(work / "plain"))
    (work / "plain").mkdir()
    plan = build_plan(profile, req)  # the same script hpcdl submits (logs to work/plain)
    script = work / "plain" / "job.sbatch"
    script.write_text(plan.script)
    stage(work / "plain", plan.files.job_files, plan.files.job_scripts)  # the files the script runs
    plain = SlurmScheduler().submit_argv(script, plan.spec.job_name)
    cli = [sys.executable, "-m", "hpcdl", "submit", "-p", "sandbox", "-N", str(NODES),
           "-G", str(GPUS), "-J", "bench", "--", *COMMAND]
    lib_req = JobRequest(nodes=NODES, gpus=GPUS, command=COMMAND, job_name="bench")

    def library() -> None:
        submit(profile, plan_run(profile, lib_req), scheduler=SlurmScheduler(profile.name))

    run(plain)  # warm-up: first contact with slurmctld, page cache
    run(cli)
    rows = []
    t_cli, t_sb1 = paired(args.pairs, lambda: run(cli), lambda: run(plain))
    rows.append(("cli: hpcdl submit", t_cli, t_sb1))
    t_lib, t_sb2 = paired(args.pairs, library, lambda: run(plain))
    rows.append(("library: submit()", t_lib, t_sb2))
    if args.wait_pairs:
        t_w, t_sw = paired(args.wait_pairs, lambda: run([*cli[:4], "--wait", *cli[4:]], 300),
                           lambda: run([plain[0], "--wait", *plain[1:]], 300))
        rows.append(("wait: submit --wait", t_w, t_sw))

    info = describe(tools=("sbatch",))
    print("hpcdl submission overhead vs plain sbatch (sandbox, "
          f"{NODES} nodes x {GPUS} GPUs, command {' '.join(COMMAND)})")
    print(f"{'comparison':<26} {'n':>3} {'hpcdl median':>13} {'sbatch median':>14} {'ratio':>7}")
    out = []
    for name, ta, tb in rows:
        ma, mb = statistics.median(ta), statistics.median(tb)
        print(f"{name:<26} {len(ta):>3} {ma * 1000:>10.1f} ms {mb * 1000:>11.1f} ms "
              f"{ma / mb:>7.2f}")
        out.append({"comparison": name, "n": len(ta), "hpcdl_median_s": ma,
                    "sbatch_median_s": mb, "ratio": ma / mb, "hpcdl_s": ta, "sbatch_s": tb})
    print("goal: ratio <= 1.5")
    print("machine: " + facts_line(info))
    print(f"reproduce: scripts/sandbox.sh up && python3 bench/bench_submit.py --pairs {args.pairs} "
          f"--wait-pairs {args.wait_pairs}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": info, "results": out}, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
