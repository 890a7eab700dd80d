#!/usr/bin/env python3
"""Benchmark of the CPU image: build time, no-op rebuild time, size, and the container
overhead of a short training step (native vs inside the image, paired).

    python3 bench/bench_image.py                 # full build (--force) + everything else
    python3 bench/bench_image.py --no-full-build # reuse the image, measure the rest

Goals: no-op rebuild < 1 s; container/native throughput ratio >= 0.98.
Needs Apptainer, the wheelhouse (scripts/build-image.sh --prepare-only) and torch on the
host. Prints measured figures only, with the machine and the command.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import describe, facts_line  # noqa: E402

SPEC = "pytorch-horovod-cpu"

# The training step: a small CNN on 32x32 inputs, fixed seed, fixed threads; prints
# images/s over the timed steps (after warm-up) as one JSON line.
TRAIN = r"""
import json, sys, time
import torch
steps, warmup, batch, threads = (int(a) for a in sys.argv[1:5])
torch.set_num_threads(threads)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Flatten(), torch.nn.Linear(64 * 8 * 8, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(batch, 3, 32, 32)
y = torch.randint(0, 10, (batch,))
def step():
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss
for _ in range(warmup):
    step()
t0 = time.perf_counter()
for _ in range(steps):
    loss = step()
dt = time.perf_counter() - t0
print("BENCH " + json.dumps({"images_per_sec": steps * batch / dt, "seconds": dt,
      "torch": torch.__version__, "loss": float(loss.detach())}), flush=True)
"""


def sh(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          stdin=subprocess.DEVNULL)


def hpcdl_build(output: Path, *extra: str, timeout: float = 3600) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = sh([sys.executable, "-m", "hpcdl", "build", SPEC, "-o", str(output), "--json", *extra],
           timeout)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"hpcdl build failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return wall, json.loads(r.stdout)


def train(argv_prefix: list[str], script: Path, args: argparse.Namespace) -> float:
    r = sh([*argv_prefix, str(script), str(args.steps), str(args.warmup), str(args.batch),
            str(args.threads)], timeout=900)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("BENCH ")), None)
    if r.returncode != 0 or line is None:
        sys.exit(f"training step failed: {' '.join(argv_prefix)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return float(json.loads(line[6:])["images_per_sec"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path,
                    default=Path(os.environ.get("HPCDL_CACHE") or "/var/cache/hpcdl")
                    / "bench" / f"{SPEC}.sif", help="image the benchmark builds (not the cached one)")
    ap.add_argument("--no-full-build", action="store_true", help="reuse --output if up to date")
    ap.add_argument("--noop-runs", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=10, help="native/container pairs")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", dest="json_out", type=Path, help="also write the figures here")
    args = ap.parse_args()
    runtime = shutil.which("apptainer") or shutil.which("singularity")
    if not runtime:
        sys.exit("no apptainer/singularity on PATH (scripts/install-apptainer.sh)")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    figures: dict = {"machine": facts_line(describe()), "runtime": runtime}

    # 1. Full build (forced: the content hash would otherwise make it a no-op).
    if args.no_full_build:
        wall, res = hpcdl_build(args.output)
        figures["full_build_s"] = round(wall, 1) if res["built"] else "not measured (reused)"
    else:
        wall, res = hpcdl_build(args.output, "--force")
        figures["full_build_s"] = round(wall, 1)
    figures["image_bytes"] = args.output.stat().st_size

    # 2. No-op rebuilds: the whole CLI (python start-up, render, hash, compare).
    noop = []
    for _ in range(args.noop_runs):
        wall, res = hpcdl_build(args.output, timeout=120)
        if res["built"]:
            sys.exit("a rebuild was not a no-op: the project changed during the benchmark")
        noop.append(wall)
    figures["noop_rebuild_s"] = {"median": round(statistics.median(noop), 3),
                                 "min": round(min(noop), 3), "max": round(max(noop), 3)}

    # 3. Native vs container, paired and alternating (A B, B A, ...) to cancel drift.
    with tempfile.TemporaryDirectory(prefix="hpcdl-bench-", dir="/tmp") as tmp:
        script = Path(tmp) / "train_step.py"
        script.write_text(TRAIN)
        native = [sys.executable]
        contained = [runtime, "exec", str(args.output), "python3"]
        train(native, script, args)  # warm the page cache on both sides once
        train(contained, script, args)
        pairs = []
        for i in range(args.pairs):
            order = [("native", native), ("container", contained)]
            if i % 2:
                order.reverse()
            got = {name: train(prefix, script, args) for name, prefix in order}
            pairs.append(got)
    ratios = [p["container"] / p["native"] for p in pairs]
    figures["train"] = {
        "config": f"small CNN 32x32, batch {args.batch}, {args.steps} steps after {args.warmup} "
                  f"warm-up, {args.threads} threads, 1 process",
        "native_img_s": [round(p["native"]) for p in pairs],
        "container_img_s": [round(p["container"]) for p in pairs],
        "ratio_per_pair": [round(r, 3) for r in ratios],
        "ratio_median": round(statistics.median(ratios), 3),
        # Best run of each side: less sensitive to other load on a shared machine.
        "ratio_best": round(max(p["container"] for p in pairs) / max(p["native"] for p in pairs), 3),
    }

    t = figures["train"]
    print(f"machine   : {figures['machine']}")
    print(f"runtime   : {runtime}")
    print(f"command   : python3 bench/bench_image.py {' '.join(sys.argv[1:])}".rstrip())
    full = figures["full_build_s"]
    print(f"full build (--force)        : {full if isinstance(full, str) else f'{full} s'}")
    n = figures["noop_rebuild_s"]
    print(f"no-op rebuild (CLI, n={args.noop_runs})   : median {n['median']} s "
          f"(min {n['min']}, max {n['max']}; goal < 1 s)")
    print(f"image size                  : {figures['image_bytes'] / 2**20:.0f} MiB")
    print(f"training step               : {t['config']}")
    print("  pair  native img/s  container img/s  ratio")
    for i, (a, b, r) in enumerate(zip(t["native_img_s"], t["container_img_s"], t["ratio_per_pair"], strict=True)):
        print(f"  {i + 1:>4}  {a:>12}  {b:>15}  {r:>5}")
    print(f"  median ratio container/native: {t['ratio_median']} (goal >= 0.98); "
          f"best/best: {t['ratio_best']}")
    if args.json_out:
        args.json_out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
