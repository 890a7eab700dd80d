#!/usr/bin/env python3
"""What the host-trust pass-through (CA bundle bound, proxies passed) and the import
check (%test: torch, torchvision + nms, horovod.torch, mpi4py) add to a derived build.

    python3 bench/bench_build_check.py                  # 2 rounds, sandbox builds
    python3 bench/bench_build_check.py --repeat 3 --sif # SIF builds (adds mksquashfs)
    python3 bench/bench_build_check.py --sif --compression lz4 \
        --image /var/cache/hpcdl/images/pytorch-horovod-gpu-pypi.sif   # from the GPU image

Each round builds the same tiny definition (``Bootstrap: localimage`` from the bundled
CPU image, a one-line %post) three ways, in turn: ``--no-host-trust --no-import-check``,
``--no-import-check`` (pass-through only), and the default (both); plus the check on
its own (``apptainer exec IMAGE python3 -c <import_check.py>``, as doctor runs it).
Needs Apptainer and the CPU image (scripts/build-image.sh). Prints measured figures
only, with the machine and the command.
"""

from __future__ import annotations

import argparse
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

from bench.common import spread  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402

VARIANTS = {
    "bare (--no-host-trust --no-import-check)": ["--no-host-trust", "--no-import-check"],
    "pass-through only (--no-import-check)": ["--no-import-check"],
    "pass-through + import check (default)": [],
}


def build(definition: Path, out: Path, flags: list[str], sif: bool,
          compression: str | None = None) -> float:
    argv = [sys.executable, "-m", "hpcdl", "build", str(definition), "-o", str(out), "--force",
            *([] if sif else ["--sandbox"]),
            *(["--compression", compression] if compression else []), *flags]
    start = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=definition.parent,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    seconds = time.monotonic() - start
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default=None,
                        help="base image (default: <cache>/images/pytorch-horovod-cpu.sif)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the three builds")
    parser.add_argument("--sif", action="store_true",
                        help="build SIF files (default: sandbox folders, no mksquashfs)")
    parser.add_argument("--compression", choices=("gzip", "lz4", "lzo", "xz", "zstd"),
                        help="with --sif: the SIF's squashfs codec (default: gzip, Apptainer's)")
    args = parser.parse_args()
    if args.compression and not args.sif:
        parser.error("--compression needs --sif (a sandbox folder is not compressed)")
    from hpcdl.container.runtime import find_runtime, runtime_env
    from hpcdl.container.verify import find_import_check, import_check_source

    cache = os.environ.get("HPCDL_CACHE") or "/var/cache/hpcdl"
    image = Path(args.image or f"{cache}/images/pytorch-horovod-cpu.sif")
    if not image.is_file():
        raise SystemExit(f"{image} is missing: scripts/build-image.sh builds it")
    print(facts_line(describe(tools=("apptainer",))))
    print("command: " + " ".join([sys.executable, *sys.argv]))
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-build-check-", dir="/scratch"
                                     if Path("/scratch").is_dir() else None) as tmp:
        definition = Path(tmp) / "derived.def"
        definition.write_text(f"Bootstrap: localimage\nFrom: {image}\n\n%post\n    true\n")
        for round_ in range(args.repeat):
            for name, flags in VARIANTS.items():
                # A new target each time: replacing an old sandbox would time its removal.
                out = Path(tmp) / f"img-{round_}-{len(times[name])}-{abs(hash(name))}"
                out = out.with_suffix(".sif") if args.sif else out
                seconds = build(definition, out, flags, args.sif, args.compression)
                shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink()
                times[name].append(seconds)
                print(f"round {round_ + 1}: {name}: {seconds:.1f} s", flush=True)
        rt = find_runtime()
        check_s: list[float] = []
        for _ in range(args.repeat):
            start = time.monotonic()
            r = subprocess.run([rt.path, "exec", str(image), "python3", "-c", import_check_source()],
                               capture_output=True, text=True, timeout=600,
                               env={**os.environ, **runtime_env()})
            check_s.append(time.monotonic() - start)
        result = find_import_check(r.stdout)
    kind = f"SIF, {args.compression or 'gzip'}" if args.sif else "sandbox"
    print(f"\nderived build from {image.name} ({kind}), "
          f"{args.repeat} round(s), seconds: median (range)")
    for name, values in times.items():
        print(f"  {name:<44} {spread(values, '{:.1f}')}")
    bare = statistics.median(times[list(VARIANTS)[0]])
    for name, values in list(times.items())[1:]:
        print(f"  {name:<44} adds {statistics.median(values) - bare:+.1f} s over bare (medians)")
    print(f"  import check alone (apptainer exec, as doctor runs it): {spread(check_s, '{:.1f}')} s"
          f" -> {result.message if result else 'no result'}")


if __name__ == "__main__":
    main()
