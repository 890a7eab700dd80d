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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import describe, one_line  # noqa: E402

DEFAULT_IMAGE = Path(os.environ.get("HPCDL_CACHE") or "/var/cache/hpcdl") / "images" / \
    "pytorch-horovod-cpu.sif"


def sweep_argv(args: argparse.Namespace) -> list[str]:
    return ["hpcdl", "scale", "--profile", "sandbox", "--nodes", "1,2", "--gpus", "1,2",
            "--backend", "horovod,ddp", "--batch-size", str(args.batch_size), "--synthetic",
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
    p.add_argument("--image", type=Path, default=DEFAULT_IMAGE)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    if not args.image.exists():
        raise SystemExit(f"no image at {args.image}: run scripts/build-image.sh")
    argv = sweep_argv(args)
    print("machine: " + one_line(describe(packages=("torch", "horovod"),
                                          tools=("apptainer", "sinfo", "mpirun"))))
    print("command: " + " ".join(argv))
    sweeps = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for i in range(args.repeats):
            sweeps.append(run_sweep(argv, Path(tmp)))
            print(f"repeat {i + 1}/{args.repeats}: {sweeps[-1]['sweep_id']} in "
                  f"{sweeps[-1]['seconds']} s", flush=True)
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
    if args.json_out:
        args.json_out.write_text(json.dumps({"command": argv, "sweeps": sweeps,
                                             "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
