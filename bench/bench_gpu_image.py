#!/usr/bin/env python3
"""Benchmark of the GPU image built from PyPI (containers/pytorch-horovod-gpu-pypi.yaml)
against the CPU image: SIF size, no-op rebuild time, and per-rank start-up (a fresh
`apptainer exec IMAGE python3 -c "import torch, horovod.torch; hvd.init()"`, and the
same plus torchvision), alternating the two images so that both see the same load.

    python3 bench/bench_gpu_image.py              # both images must be built already
    python3 bench/bench_gpu_image.py --runs 10 --json out.json

The fresh builds (Horovod CUDA wheel, image) are timed by the scripts themselves
(scripts/build-horovod-gpu.sh prints "built ... in N s", `hpcdl build` records
build_seconds in IMAGE.hash); this prints those recorded figures next to the measured
ones. Prints measured figures only, with the machine and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import describe, facts_line  # noqa: E402

IMPORTS = {
    "torch+horovod": "import torch, horovod.torch as hvd; hvd.init()",
    "torch+torchvision+horovod": "import torch, torchvision, horovod.torch as hvd; hvd.init()",
}


def cache() -> Path:
    return Path(os.environ.get("HPCDL_CACHE") or "/var/cache/hpcdl")


def run(argv: list[str], timeout: float = 600) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0, r


def drop_page_cache() -> bool:
    """Cold start (a rank's first read of the image on a node); needs root."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", type=Path, default=cache() / "images" / "pytorch-horovod-cpu.sif")
    ap.add_argument("--gpu", type=Path,
                    default=cache() / "images" / "pytorch-horovod-gpu-pypi.sif")
    ap.add_argument("--runs", type=int, default=5, help="warm start-ups per image and import set")
    ap.add_argument("--cold", action="store_true", help="also one cold start each (drops the "
                    "page cache: root only, disturbs other users of the machine)")
    ap.add_argument("--json", dest="json_out", type=Path)
    args = ap.parse_args()
    images = {"cpu": args.cpu, "gpu": args.gpu}
    for name, path in images.items():
        if not path.is_file():
            sys.exit(f"{name} image {path} is not built (scripts/build-image.sh"
                     f"{' --gpu' if name == 'gpu' else ''})")

    figures: dict[str, dict[str, object]] = {}
    for name, path in images.items():
        build = [sys.executable, "-m", "hpcdl", "build",
                 "pytorch-horovod-cpu" if name == "cpu" else "pytorch-horovod-gpu-pypi",
                 "-o", str(path)]
        # The first call builds when the image is out of date (so the second is a no-op).
        first, r1 = run(build, timeout=3600)
        if r1.returncode != 0:
            sys.exit(f"{name}: {' '.join(build)} failed: {r1.stderr[-2000:]}")
        noop, r = run(build)
        record = json.loads(path.with_name(path.name + ".hash").read_text())
        figures[name] = {
            "first_call_built": "is up to date" not in r1.stdout + r1.stderr,
            "first_call_seconds": round(first, 2),
            "image": str(path),
            "size_mib": round(path.stat().st_size / 2**20, 1),
            "recorded_build_seconds": record.get("build_seconds"),
            "noop_rebuild_seconds": round(noop, 2) if r.returncode == 0 else None,
            "compression": next((o for o in record.get("options", []) if "-comp" in o), "gzip"),
        }

    for label, code in IMPORTS.items():
        samples: dict[str, list[float]] = {n: [] for n in images}
        for path in images.values():  # warm-up: page cache, squashfuse mount
            run(["apptainer", "exec", str(path), "python3", "-c", "import torch"])
        for _ in range(args.runs):
            for name, path in images.items():
                if name == "cpu" and "torchvision" in code:
                    continue  # the CPU image has no torchvision (does not load beside CPU torch)
                dt, r = run(["apptainer", "exec", str(path), "python3", "-c", code])
                if r.returncode != 0:
                    sys.exit(f"{name}: {code} failed: {r.stderr[-2000:]}")
                samples[name].append(dt)
        for name, values in samples.items():
            if values:
                figures[name][f"startup_{label}_s"] = {
                    "median": round(statistics.median(values), 2),
                    "min": round(min(values), 2), "max": round(max(values), 2), "n": len(values)}
        if args.cold:
            for name, path in images.items():
                if name == "cpu" and "torchvision" in code:
                    continue
                if drop_page_cache():
                    dt, _ = run(["apptainer", "exec", str(path), "python3", "-c", code])
                    figures[name][f"cold_startup_{label}_s"] = round(dt, 2)

    machine = describe(tools=("apptainer",))
    print(f"# {facts_line(machine)}")
    print(f"# command: python3 bench/bench_gpu_image.py --runs {args.runs}"
          + (" --cold" if args.cold else ""))
    for name, f in figures.items():
        print(f"{name}: " + json.dumps(f))
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": machine, "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
