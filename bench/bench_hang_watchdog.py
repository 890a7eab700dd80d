#!/usr/bin/env python3
"""The hang watchdog's time from a hang to its diagnosis, on the sandbox cluster.

Submits tests/integration/hang/gloo_hang.py (a plain gloo script: every rank does a few
all_reduce steps, then one rank sleeps while the others wait in the next all_reduce)
with `hpcdl submit --wait --json --hang-timeout T` in the CPU image, and splits the time
from the sleeping rank's HANG_START line to the written diagnosis into

  silent      the silence the watchdog measured (>= T; it counts from the poll that
              saw the last change: the rank's HANG_START line)
  collect     srun --overlap + apptainer exec + py-spy on every node, in parallel
  rest        the rest: the poll lag at both ends (the follow loop polls at least
              every T/10, at most once a second), scancel, writing hang/

It prints them per run and their medians, the machine, and the command to rerun.

    python3 bench/bench_hang_watchdog.py [--runs 3] [--timeout 10] [--image SIF]
        [--nodes 2] [--gpus 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import SHARED_IMAGE, shared_copy, shared_tmp  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402

SCRIPT = REPO / "tests" / "integration" / "hang" / "gloo_hang.py"


def one_run(runs: Path, script: Path, args: argparse.Namespace, i: int) -> dict[str, float]:
    argv = [sys.executable, "-m", "hpcdl", "submit", "-p", "sandbox", "-N", str(args.nodes),
            "-G", str(args.gpus), "-c", "1", "--image", str(args.image),
            "--job-name", f"bench-hang-{i}", "--hang-timeout", str(args.timeout), "--wait",
            "--json", "--", "python3", str(script), "--steps", "3", "--slow-rank",
            str(args.nodes * max(args.gpus, 1) - 1)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False,
                         env={**os.environ, "HPCDL_RUNS": str(runs)})
    if not res.stdout.strip():
        raise SystemExit(f"run {i}: hpcdl submit printed nothing (exit {res.returncode}):\n"
                         f"{res.stderr[-3000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    hang = out.get("hang")
    if not hang:
        raise SystemExit(f"run {i}: no diagnosis (state {out.get('state')}):\n{res.stderr}")
    log = (Path(out["run_dir"]) / f"slurm-{out['job_id']}.out").read_text()
    starts = [float(line.split()[2]) for line in log.splitlines() if "HANG_START" in line]
    if not starts:
        # The job went quiet for --timeout before its hang began: the ranks' start-up
        # (image, torch import) outlasted it on a loaded machine. Not a figure of a hang.
        raise SystemExit(f"run {i}: diagnosed before the hang began (start-up longer than "
                         f"--timeout {args.timeout:g} s; rerun with a longer one): "
                         f"{json.dumps(hang)[:600]}")
    started = starts[0]
    total = hang["detected_at"] - started
    return {"total_s": total, "timeout_s": float(args.timeout),
            "silent_s": hang["silent_s"], "collect_s": hang["collect_s"],
            "rest_s": total - hang["silent_s"] - hang["collect_s"], "silence_before_hang_s":
            max(0.0, started - hang["silent_since"]), "straggler": hang["stragglers"][0]["label"],
            "frame": hang["stragglers"][0]["frame"], "state": out["state"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=10.0, help="--hang-timeout (s)")
    parser.add_argument("--image", type=Path, default=SHARED_IMAGE,
                        help="a path the nodes see (default: %(default)s)")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=2, help="ranks per node (fake GPUs)")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    rows = []
    # The nodes see only /home and /scratch: the run directories and the script go there.
    work = shared_tmp("bench-hang-")
    try:
        script = shared_copy(SCRIPT, work)
        for i in range(args.runs):
            row = one_run(work / "runs", script, args, i)
            rows.append(row)
            print(f"run {i}: {row['total_s']:.1f} s from the hang to the diagnosis "
                  f"(silent {row['silent_s']:.1f} + collect {row['collect_s']:.1f} + rest "
                  f"{row['rest_s']:.1f}); {row['straggler']} in {row['frame']}; job "
                  f"{row['state']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in rows)
           for k in ("total_s", "silent_s", "collect_s", "rest_s")}
    ranks = args.nodes * max(args.gpus, 1)
    print(f"\nhang -> diagnosis, median of {args.runs} ({args.nodes} nodes x "
          f"{max(args.gpus, 1)} ranks = {ranks}, --hang-timeout {args.timeout:g}): "
          f"{med['total_s']:.1f} s: silent {med['silent_s']:.1f} s + {med['collect_s']:.1f} s "
          f"collecting {ranks} stacks + {med['rest_s']:.1f} s polls, scancel, files")
    print(f"machine: {facts_line(describe(packages=('py-spy',), tools=('apptainer', 'srun')))}")
    print("rerun: python3 bench/bench_hang_watchdog.py " + " ".join(sys.argv[1:]))
    if args.json_out:
        args.json_out.write_text(json.dumps({"runs": rows, "median": med,
                                             "machine": describe()}, indent=2))


if __name__ == "__main__":
    main()
