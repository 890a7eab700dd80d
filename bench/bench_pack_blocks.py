#!/usr/bin/env python3
"""`hpcdl data pack --block-size`: how the SquashFS block size changes the first,
shuffled read of a packed dataset, side by side in one run (needs root: loop mounts and
dropping the page cache).

For each block size (and `auto`, what `data pack` chooses), the same tree is packed with
`hpcdl data pack --block-size B`, mounted with the kernel's squashfs on a loop device
(what Apptainer mounts in an image), the page cache dropped, and every file read once
(open, read whole, close) in one shuffled order, as a training epoch's sampler reads;
the tree itself, cold too, as the reference. Printed per variant: the packed size, wall
and CPU seconds of the read (medians of --repeats, the variants' order rotating).

Why it matters: files smaller than a block are packed together into fragment blocks of
that size, and reading one such file decompresses its whole fragment; in a shuffled
order each read hits another fragment.

  sudo python3 bench/bench_pack_blocks.py                       # 200 x 100 JPEGs of 32 px
  sudo python3 bench/bench_pack_blocks.py --size 256 --classes 100 --per-class 40
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import describe, facts_line  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def hpcdl(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "hpcdl", *args], env=ENV, check=True,
                   stdout=subprocess.DEVNULL, timeout=1800)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def read_all(root: Path, seed: int) -> tuple[float, float]:
    """Every file under ``root`` read once in a shuffled order: (wall, CPU) seconds."""
    files = sorted(str(Path(d) / f) for d, _, names in os.walk(root) for f in names)
    random.Random(seed).shuffle(files)
    wall, cpu = time.perf_counter(), time.process_time()
    for path in files:
        with open(path, "rb") as fh:
            fh.read()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--classes", type=int, default=200)
    p.add_argument("--per-class", type=int, default=100)
    p.add_argument("--size", type=int, default=32, help="the JPEGs' side (make-tiny --size)")
    p.add_argument("--blocks", default="4K,32K,128K,auto",
                   help="block sizes to pack with (data pack --block-size)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dir", type=Path, help="work here (default: a temporary directory)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("error: needs root (loop mounts, dropping the page cache)", file=sys.stderr)
        return 2
    blocks = [b.strip() for b in args.blocks.split(",") if b.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-pack-blocks-", dir=args.dir) as tmp:
        work = Path(tmp)
        tree = work / "tree"
        hpcdl("data", "make-tiny", str(tree), "--classes", str(args.classes), "--per-class",
              str(args.per_class), "--val-per-class", "1", "--size", str(args.size))
        sizes = [f.stat().st_size for f in tree.rglob("*.JPEG")]
        packed = {}
        for b in blocks:
            out = work / f"data-{b}.sqfs"
            hpcdl("data", "pack", str(tree), "-o", str(out), "--block-size", b)
            packed[b] = out
        variants = ["tree", *blocks]
        times: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
        for r in range(args.repeats):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for v in order:
                target = tree
                mnt = work / f"mnt-{v}"
                if v != "tree":
                    mnt.mkdir(exist_ok=True)
                    subprocess.run(["mount", "-t", "squashfs", "-o", "loop,ro",
                                    str(packed[v]), str(mnt)], check=True, timeout=60)
                    target = mnt / "tree" if (mnt / "tree").is_dir() else mnt
                try:
                    drop_caches()
                    times[v].append(read_all(target, seed=r))
                finally:
                    if v != "tree":
                        subprocess.run(["umount", str(mnt)], check=True, timeout=60)
        mib = {b: packed[b].stat().st_size / 1048576 for b in blocks}
    print(f"first shuffled read of {len(sizes)} files (median {statistics.median(sizes):.0f} "
          f"bytes), cold page cache, kernel squashfs on a loop device; medians of "
          f"{args.repeats}")
    print(f"machine: {facts_line(describe())}")
    print(f"{'variant':<14}{'packed MiB':>11}{'wall s':>9}{'CPU s':>8}")
    for v in variants:
        wall = statistics.median(t[0] for t in times[v])
        cpu = statistics.median(t[1] for t in times[v])
        size = "-" if v == "tree" else f"{mib[v]:.1f}"
        label = v if v == "tree" else f"--block-size {v}"
        print(f"{label:<14}{size:>11}{wall:>9.2f}{cpu:>8.2f}")
    print(f"reproduce: sudo python3 bench/bench_pack_blocks.py --classes {args.classes} "
          f"--per-class {args.per_class} --size {args.size} --blocks {args.blocks} "
          f"--repeats {args.repeats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
