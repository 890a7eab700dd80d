#!/usr/bin/env python3
"""End to end on the sandbox: the same short training job natively under srun (host
Python, host Horovod) and inside the CPU image (srun --mpi=pmix apptainer exec --nv),
both submitted with `hpcdl submit --wait`, in alternating pairs.

Per run it records
  images/sec        the example's own throughput (first step excluded)
  submit->script    hpcdl submit invoked -> the example's run() entered on rank 0
                    (sbatch, scheduling, srun, container start, Python start-up; torch
                    is imported inside run(), so its import counts in the next figure)
  submit->step 1    hpcdl submit invoked -> first training step began on rank 0
                    (the above + torch and Horovod imports, world set-up, model, broadcast,
                    data loader)
  total             hpcdl submit invoked -> it returned (job ended, result parsed)
and prints medians side by side with the container/native throughput ratio (goal >= 0.98).

    scripts/sandbox.sh up && scripts/build-image.sh
    python3 bench/bench_e2e.py [--pairs 3] [--steps 20] [--backend horovod|ddp] [--json-out F]
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


def submit(args: argparse.Namespace, image: Path | None) -> dict[str, Any]:
    """One `hpcdl submit --wait --json` run; returns the timings of interest."""
    argv = [sys.executable, "-m", "hpcdl", "submit", "--profile", "sandbox",
            "--nodes", str(args.nodes), "--gpus", str(args.gpus), "--cpus-per-task", "1",
            "--backend", args.backend, "--synthetic", "--wait", "--json",
            "--job-name", f"bench-e2e-{'image' if image else 'native'}",
            # Every size that matters is given: each -X replaces the sandbox profile's
            # default for it; the rest (--threads=1 --workers=0, as -c 1 gives anyway; --lr;
            # a smaller validation set) does not change what is measured.
            "-X", f"--arch={args.arch}", "-X", f"--image-size={args.image_size}",
            "-X", f"--batch-size={args.batch_size}", "-X", f"--max-steps={args.steps}",
            "-X", "--epochs=1", "-X", f"--synthetic-size={args.steps * args.batch_size * 64}",
            "-X", "--synthetic-val-size=64", "-X", "--num-classes=10"]
    if image:
        argv[4:4] = ["--image", str(image)]
    t0 = time.time()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    total = time.time() - t0
    if res.returncode != 0:
        raise SystemExit(f"run failed ({res.returncode}): {' '.join(argv)}\n"
                         f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    result = json.loads(res.stdout.strip().splitlines()[-1])["hpcdl_result"]
    return {"images_per_sec": result["images_per_sec"],
            "to_start_s": result["started_at"] - t0,
            "to_first_step_s": result["first_step_at"] - t0,
            "total_s": total, "world_size": result["world_size"], "nodes": result["nodes"]}


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="training steps per run")
    ap.add_argument("--backend", choices=("horovod", "ddp"), default="horovod")
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=2, help="ranks per node")
    ap.add_argument("--image", type=Path, default=SHARED_IMAGE,
                    help="a path the nodes see (default: %(default)s)")
    ap.add_argument("--warmups", type=int, default=1,
                    help="untimed runs each way first (0 for a smoke run)")
    ap.add_argument("--json-out", help="also write every run's figures here")
    args = ap.parse_args()
    if not shutil.which("sbatch"):
        print("sbatch not found: start the sandbox first (scripts/sandbox.sh up)", file=sys.stderr)
        return 1
    if not args.image.exists():  # a SIF file, or a --sandbox directory image
        print(f"no image at {args.image}: scripts/build-image.sh builds it", file=sys.stderr)
        return 1

    work = shared_tmp("hpcdl-bench-e2e-")  # the nodes see only /home and /scratch
    os.environ["HPCDL_RUNS"] = str(work / "runs")
    if args.warmups:
        print(f"warm-up: {args.warmups} run(s) each (page cache, first contact with slurmctld)",
              flush=True)
    for _ in range(args.warmups):
        submit(args, None)
        submit(args, args.image)
    native: list[dict[str, Any]] = []
    image: list[dict[str, Any]] = []
    for i in range(args.pairs):
        order = ((native, None), (image, args.image))
        for runs, img in order if i % 2 == 0 else order[::-1]:
            runs.append(submit(args, img))
            r = runs[-1]
            print(f"pair {i + 1}/{args.pairs} {'image ' if img else 'native'}: "
                  f"{r['images_per_sec']:.2f} img/s, first step after {r['to_first_step_s']:.1f} s, "
                  f"total {r['total_s']:.1f} s", flush=True)

    ratios = [b["images_per_sec"] / a["images_per_sec"] for a, b in zip(native, image, strict=True)]
    ranks = native[0]["world_size"]
    print(f"\nhpcdl end to end on the sandbox: {args.arch} {args.image_size}px, batch {args.batch_size}"
          f"/rank, {args.steps} steps, {args.backend}, {ranks} ranks on {args.nodes} nodes, "
          f"{args.pairs} pairs (medians)")
    print(f"{'':<24}{'native srun':>14}{'in image':>14}{'image/native':>14}")
    for label, key, fmt in (("images/sec", "images_per_sec", "{:>14.2f}"),
                            ("submit -> script (s)", "to_start_s", "{:>14.1f}"),
                            ("submit -> step 1 (s)", "to_first_step_s", "{:>14.1f}"),
                            ("submit -> result (s)", "total_s", "{:>14.1f}")):
        a, b = median(native, key), median(image, key)
        print(f"{label:<24}" + fmt.format(a) + fmt.format(b) + f"{b / a:>14.3f}")
    print(f"throughput ratio per pair (image/native): {', '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f} (goal >= 0.98)")
    print("machine: " + facts_line(describe(packages=("torch", "horovod"),
                                           tools=("sbatch", "apptainer"))))
    print("reproduce: python3 bench/bench_e2e.py " + " ".join(sys.argv[1:]))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "native": native,
             "image": image, "ratios": ratios}, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
