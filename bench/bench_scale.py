#!/usr/bin/env python3
"""The scaling study on the sandbox: `hpcdl scale` over 1 and 2 nodes x 1 and 2 ranks
per node, Horovod and DDP, in the CPU image, repeated; prints per point the median
images/sec, speedup and parallel efficiency against the 1-rank point of the same
sweep, and the gradient-sync share of a step, with the min-max over the repeats.

Each repeat is one whole sweep (8 jobs, one after another), so every efficiency is a
ratio of two runs measured minutes apart on the same machine.

    scripts/sandbox.sh up && scripts/build-image.sh
    python3 bench/bench_scale.py [--repeats 2] [--steps 40] [--batch-size 16] [--json-out F]

On the sandbox both "nodes" share this machine's cores: with 2 cores, 2 ranks already
use every core and 4 ranks oversubscribe them, so efficiency at 4 ranks is bounded by
50% before any communication cost.

With --planning, no cluster and no job: hpcdl's own cost at scale, median of --repeats:
  profile   render (hpcdl.sandbox.profile_data + YAML) and validate (load_profile_file)
            a profile whose partition has --profile-nodes nodes (default 4,096)
  plan      build_plan of one job on all those nodes, 4 ranks each (its sbatch script)
  scale     `python -m hpcdl scale --dry-run` (what a user types, Python start-up
            included) of --points points (default 500: node counts 1..125 x 1,2 GPUs
            x horovod,ddp) on that profile: every point checked and its plan built

    python3 bench/bench_scale.py --planning [--points 500] [--profile-nodes 4096] [--repeats 3]
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import SHARED_IMAGE, shared_tmp  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402


def sweep_argv(args: argparse.Namespace) -> list[str]:
    return ["hpcdl", "scale", "--profile", "sandbox", "--nodes", args.nodes, "--gpus", args.gpus,
            "--backend", args.backends, "--batch-size", str(args.batch_size), "--synthetic",
            "--image", str(args.image), "--cpus-per-task", "1",
            # Every size that matters is given: each -X replaces the sandbox profile's
            # default for it; the rest (--threads=1 --workers=0, as -c 1 gives anyway; --lr;
            # a smaller validation set) does not change what is measured.
            "-X", f"--arch={args.arch}", "-X", f"--image-size={args.image_size}",
            "-X", f"--max-steps={args.steps}", "-X", "--epochs=1",
            "-X", f"--synthetic-size={args.steps * args.batch_size * 4}",
            "-X", "--val-batches=1", "-X", "--num-classes=10", "-X", "--checkpoint-dir=",
            "--wait", "--json"]


def run_sweep(argv: list[str], runs: Path) -> dict[str, Any]:
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "hpcdl", *argv[1:]], capture_output=True,
                         text=True, timeout=3600, check=False,
                         env={**os.environ, "HPCDL_RUNS": str(runs)})
    if res.returncode != 0:
        raise SystemExit(f"sweep failed ({res.returncode}):\n{res.stdout[-3000:]}\n"
                         f"{res.stderr[-3000:]}")
    data = json.loads(res.stdout)
    data["seconds"] = round(time.time() - t0, 1)
    return data


def planning(args: argparse.Namespace) -> int:
    """hpcdl's own planning cost at scale (see the module): seconds, median of repeats."""
    import yaml

    from hpcdl import sandbox
    from hpcdl.plan import JobRequest, build_plan
    from hpcdl.profiles.loader import load_profile_file

    if args.points % 4:
        raise SystemExit(f"--points {args.points}: a multiple of 4 (node counts x 2 GPU counts x "
                         f"2 backends)")
    counts = args.points // 4
    if counts > args.profile_nodes:
        raise SystemExit(f"--points {args.points} needs {counts} node counts: more than "
                         f"--profile-nodes {args.profile_nodes}")
    base = yaml.safe_load((REPO / "hpcdl" / "profiles" / "bundled" / "sandbox.yaml").read_text())
    times: dict[str, list[float]] = {"profile": [], "plan": [], "scale": []}
    script_lines = 0
    # The dry run plans each point's run directory (creating none), which must be on a
    # path the profile's nodes share, as a submission's.
    tmp = shared_tmp("bench-plan-")
    try:
        path = tmp / "big.yaml"
        argv = [sys.executable, "-m", "hpcdl", "scale", "-p", str(path),
                "-N", ",".join(str(n) for n in range(1, counts + 1)), "-G", "1,2",
                "--backend", "horovod,ddp", "--synthetic", "--dry-run"]
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            data = sandbox.profile_data(base, args.profile_nodes, tmp)
            path.write_text(yaml.safe_dump(data, sort_keys=False))
            profile = load_profile_file(path)
            times["profile"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            plan = build_plan(profile, JobRequest.of(nodes=args.profile_nodes, gpus=4,
                                                  command=("true",)))
            times["plan"].append(time.perf_counter() - t0)
            script_lines = len(plan.script.splitlines())
            t0 = time.perf_counter()
            res = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                                 env={**os.environ, "HPCDL_RUNS": str(tmp / "runs")})
            times["scale"].append(time.perf_counter() - t0)
            if res.returncode != 0:
                raise SystemExit(f"hpcdl scale --dry-run failed ({res.returncode}):\n"
                                 f"{res.stdout[-2000:]}{res.stderr[-2000:]}")
            jobs = [line for line in res.stdout.splitlines() if " jobs; each runs" in line]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("machine: " + facts_line(describe(packages=("pydantic", "jinja2", "PyYAML"))))
    print(f"hpcdl planning cost at scale, median (min-max) of {args.repeats} repeats, seconds")
    print(f"{'what':<62} {'seconds':>20}")
    print(f"{f'render + validate a profile of {args.profile_nodes} nodes':<62} "
          f"{_spread(times['profile'], '{:.3f}'):>20}")
    print(f"{f'plan one job of {args.profile_nodes} nodes x 4 ranks ({script_lines} lines)':<62} "
          f"{_spread(times['plan'], '{:.3f}'):>20}")
    print(f"{f'hpcdl scale --dry-run, {args.points} points (CLI)':<62} "
          f"{_spread(times['scale'], '{:.2f}'):>20}")
    print(f"  ({jobs[0].split(';')[0] if jobs else '?'} planned per run)")
    print(f"reproduce: python3 bench/bench_scale.py --planning --points {args.points} "
          f"--profile-nodes {args.profile_nodes} --repeats {args.repeats}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"planning": times, "points": args.points,
                                             "profile_nodes": args.profile_nodes}, indent=2))
    return 0


def _spread(values: list[float], fmt: str) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--image", type=Path, default=SHARED_IMAGE,
                   help="a path the nodes see (default: %(default)s)")
    p.add_argument("--nodes", default="1,2", help="the sweep's node counts")
    p.add_argument("--gpus", default="1,2", help="the sweep's ranks per node")
    p.add_argument("--backends", default="horovod,ddp")
    p.add_argument("--json-out", type=Path)
    p.add_argument("--planning", action="store_true",
                   help="measure planning (profile, plan, scale --dry-run) instead of a sweep")
    p.add_argument("--points", type=int, default=500, help="--planning: points of the sweep")
    p.add_argument("--profile-nodes", type=int, default=4096,
                   help="--planning: nodes in the generated profile's partition")
    args = p.parse_args()
    if args.planning:
        return planning(args)
    if not args.image.exists():
        raise SystemExit(f"no image at {args.image}: run scripts/build-image.sh")
    argv = sweep_argv(args)
    print("machine: " + facts_line(describe(packages=("torch", "horovod"),
                                          tools=("apptainer", "sinfo", "mpirun"))))
    print("command: " + " ".join(argv))
    sweeps = []
    work = shared_tmp("bench-scale-")  # run directories: the nodes see only /home, /scratch
    try:
        for i in range(args.repeats):
            sweeps.append(run_sweep(argv, work / "runs"))
            print(f"repeat {i + 1}/{args.repeats}: {sweeps[-1]['sweep_id']} in "
                  f"{sweeps[-1]['seconds']} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by_label: dict[str, list[dict[str, Any]]] = {}
    for sweep in sweeps:
        for row in sweep["rows"]:
            by_label.setdefault(row["label"], []).append(row)
    print(f"\n{'point':<20} {'ranks':>5}  {'img/s':>20}  {'speedup':>18}  {'efficiency':>20}  "
          f"{'sync share':>20}")
    summary = []
    for label, rows in by_label.items():
        ok = [r for r in rows if r["state"] == "COMPLETED"]
        if len(ok) < len(rows):
            print(f"{label:<20} {rows[0]['ranks']:>5}  {len(rows) - len(ok)} of {len(rows)} "
                  f"repeats did not complete: {[r['state'] for r in rows]}")
        if not ok:
            continue
        cols = {key: [r[key] for r in ok if r[key] is not None]
                for key in ("images_per_sec", "speedup", "efficiency", "sync_share")}
        print(f"{label:<20} {ok[0]['ranks']:>5}  {_spread(cols['images_per_sec'], '{:.1f}'):>20}  "
              f"{_spread(cols['speedup'], '{:.2f}'):>18}  "
              f"{_spread([100 * e for e in cols['efficiency']], '{:.1f}%'):>20}  "
              f"{_spread([100 * s for s in cols['sync_share']], '{:.1f}%'):>20}")
        summary.append({"label": label, "ranks": ok[0]["ranks"], **{
            f"{k}_median": statistics.median(v) if v else None for k, v in cols.items()},
            "repeats": len(ok)})
    print("rerun: python3 bench/bench_scale.py " + " ".join(sys.argv[1:]))
    if args.json_out:
        args.json_out.write_text(json.dumps({"command": argv, "sweeps": sweeps,
                                             "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
