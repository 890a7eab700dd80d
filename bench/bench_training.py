#!/usr/bin/env python3
"""Training throughput of ResNet-18 at small resolution: 1 rank vs 2 ranks, Horovod vs
DDP, measured side by side in one run, 1 thread per rank.

Each configuration runs ``examples/synthetic_benchmark.py`` under its real launcher
(torchrun for DDP, horovodrun --gloo for Horovod, and mpirun for Horovod over MPI),
``--repeats`` times, interleaved so that background load hits every configuration
alike; the median is reported. Scaling efficiency = 2-rank throughput / (2 x 1-rank
throughput) of the same backend.

  python3 bench/bench_training.py                       # defaults below
  python3 bench/bench_training.py --image-size 64 --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import describe  # noqa: E402
from hpcdl.core.proc import run  # noqa: E402

BENCH = ROOT / "examples" / "synthetic_benchmark.py"


def configs(ranks: list[int], with_mpi: bool) -> list[tuple[str, str, int]]:
    """(label, launcher, ranks) in the order they run within a repeat."""
    out = []
    for n in ranks:
        out.append((f"ddp/torchrun x{n}", "torchrun", n))
        out.append((f"horovod/gloo x{n}", "horovodrun", n))
        if with_mpi:
            out.append((f"horovod/mpi x{n}", "mpirun", n))
    return out


def argv_for(launcher: str, n: int, bench_args: list[str]) -> list[str]:
    py = sys.executable
    if launcher == "torchrun":
        return [
            "torchrun",
            "--standalone",
            "--nproc-per-node",
            str(n),
            str(BENCH),
            "--backend",
            "ddp",
            *bench_args,
        ]
    if launcher == "horovodrun":
        return [
            "horovodrun",
            "--gloo",
            "-np",
            str(n),
            py,
            str(BENCH),
            "--backend",
            "horovod",
            *bench_args,
        ]
    return ["mpirun", "-np", str(n), "--allow-run-as-root", "--bind-to", "none", py, str(BENCH),
            "--backend", "horovod", *bench_args]  # fmt: skip


def parse_result(output: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if '{"hpcdl_result"' in line:
            return json.loads(line[line.index('{"hpcdl_result"') :])["hpcdl_result"]
    raise RuntimeError("no hpcdl_result line in output:\n" + output[-2000:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="resnet18", choices=("resnet18", "resnet50"))
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--warmup", type=int, default=5, help="warm-up batches")
    p.add_argument("--batches-per-iter", type=int, default=10)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-mpi", action="store_true", help="skip Horovod under mpirun")
    p.add_argument("--timeout", type=float, default=600, help="seconds per launch")
    p.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = p.parse_args(argv)

    have_hvd = shutil.which("horovodrun") is not None
    if not have_hvd:
        print("horovodrun not found: run scripts/build-horovod.sh first", file=sys.stderr)
        return 1
    bench_args = [
        "--model", args.model, "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
        "--threads", "1", "--num-warmup-batches", str(args.warmup),
        "--num-batches-per-iter", str(args.batches_per_iter), "--num-iters", str(args.iters),
    ]  # fmt: skip
    env = {
        "OMP_NUM_THREADS": "1",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "PYTHONWARNINGS": "ignore",
    }
    plan = configs([1, 2], with_mpi=not args.no_mpi and shutil.which("mpirun") is not None)
    info = describe(packages=("torch", "horovod"))
    print(f"machine: {info['cpu']}, {info['cores']} cores, {info['os']}, python {info['python']}, "
          f"torch {info.get('torch')}, horovod {info.get('horovod')}")  # fmt: skip
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(
        f"each run: {shlex.join(['<launcher>', str(BENCH.relative_to(ROOT)), '--backend', '<b>', *bench_args])}"
    )
    print()
    samples: dict[str, list[float]] = {label: [] for label, _, _ in plan}
    commands: dict[str, str] = {}
    for rep in range(args.repeats):
        for label, launcher, n in plan:
            cmd = argv_for(launcher, n, bench_args)
            commands[label] = shlex.join(cmd)
            start = time.monotonic()
            res = run(cmd, timeout=args.timeout, env=env, cwd=ROOT)
            figure = parse_result(res.stdout + res.stderr)["images_per_sec"]
            samples[label].append(figure)
            print(f"  repeat {rep + 1}/{args.repeats}  {label:<20} {figure:9.1f} img/s  "
                  f"({time.monotonic() - start:.1f} s)", flush=True)  # fmt: skip
    med = {label: statistics.median(v) for label, v in samples.items()}

    print()
    print(f"{args.model} {args.image_size}px, batch {args.batch_size}/rank, 1 thread/rank, "
          f"median of {args.repeats} (img/s, all ranks together)")  # fmt: skip
    header = f"{'backend':<16}{'1 rank':>10}{'2 ranks':>10}{'per rank (2)':>14}{'efficiency':>12}"
    print(header)
    print("-" * len(header))
    rows = []
    for backend in ("ddp/torchrun", "horovod/gloo", "horovod/mpi"):
        one, two = med.get(f"{backend} x1"), med.get(f"{backend} x2")
        if one is None or two is None:
            continue
        eff = two / (2 * one)
        rows.append({"backend": backend, "one_rank": one, "two_ranks": two, "efficiency": eff})
        print(f"{backend:<16}{one:>10.1f}{two:>10.1f}{two / 2:>14.1f}{eff:>11.0%}")
    by = {r["backend"]: r for r in rows}
    if "ddp/torchrun" in by and "horovod/gloo" in by:
        d, h = by["ddp/torchrun"], by["horovod/gloo"]
        print(f"\nHorovod(gloo)/DDP: 1 rank {h['one_rank'] / d['one_rank']:.2f}x, "
              f"2 ranks {h['two_ranks'] / d['two_ranks']:.2f}x")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"machine": info, "args": vars(args), "samples": samples, "median": med, "rows": rows,
             "commands": commands}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
