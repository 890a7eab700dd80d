#!/usr/bin/env python3
"""An ImageNet-shaped dataset read as a directory tree and as one packed SquashFS file,
side by side in one run, each variant in its own process (no Slurm needed):

  pack        `hpcdl data pack` time and the file's size (`hpcdl data make-tiny` makes
              the tree first: 1,000 classes x 100 train + 5 val JPEGs by default)
  opens       one epoch of the bundled example's input pipeline (scan_imagefolder, then
              every training image through trainkit's ImageFolderDataset: decode and
              augment), traced with `strace -f --seccomp-bpf`: opens, directory opens and
              stat-type calls on paths under the dataset. For the packed file the reader's
              calls land on the squashfuse mount (node-local); what reaches the path the
              file lives on (the shared filesystem on a cluster) is squashfuse's own
              calls on the .sqfs, traced the same way
  first batch a new process: the example's scan of every class folder, then the first
              batch of the example's loader (TrainData: shuffled, batch --batch)
  loader      images/s through that loader with 0, 1 and 2 workers, over --images
              training images drawn at random (the first batch left out)
  epochs      (--epochs N) N whole shuffled epochs of that loader (--epoch-workers
              workers), each timed; the page cache dropped before the first (as root),
              and each packed variant freshly mounted: the first epoch reads from the
              disk, the second from the cache. Every image: read, decoded, augmented
  mount CPU   (--mount-cpu N) every file of a fresh mount read once (open, read whole,
              close) by this process, N fresh mounts per mounter: the user+sys CPU the
              FUSE process spent (from /proc), the reader's CPU and wall time; medians.
              Steadier than the loader rates on a loaded machine: CPU, not wall time

The packed variants mount the file as root with squashfuse (what a native job runs) and
with the kernel's squashfs on a loop device (what Apptainer's setuid mode uses), and
unmount it at the end; without root they are left out with a note. Without strace
(Debian: apt-get install strace) the opens rows are left out with a note. Page cache warm (the
tree was just written, the file just packed): the figures are the filesystem calls and
the CPU cost, not a cold disk.

  python3 bench/bench_data.py                                  # ~105k files, ~7 min
  python3 bench/bench_data.py --classes 50 --per-class 40      # quick
  python3 bench/bench_data.py --dir /scratch/inet --json out.json   # reuse a made tree
  python3 bench/bench_data.py --classes 200 --per-class 100 --fuse squashfuse,squashfuse_ll,kernel --mount-cpu 5
  python3 bench/bench_data.py --imagenet-like --classes 20 --per-class 150 --epochs 2   # ~110 KB JPEGs

--imagenet-like makes the tree with `hpcdl data make-tiny --imagenet-like` (ImageNet's
sizes and ~110 KB JPEGs) and the example's --image-size defaults to 224, as on ImageNet.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import describe, facts_line  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'examples'}"}
# A path argument of a file call in strace's output: openat(AT_FDCWD, "/p", ...),
# newfstatat(AT_FDCWD, "/p", ...), statx(AT_FDCWD, "/p", ...), stat("/p", ...).
CALL = re.compile(r'^(?:\d+\s+)?(\w+)\((?:AT_FDCWD, |-?\d+, )?"([^"]*)"(.*)$')
TRACED = "openat,open,newfstatat,fstatat64,statx,stat,lstat,access,faccessat,faccessat2,readlink"


# The packed variants' column names, by mounter.
VARIANT = {"squashfuse": "squashfuse", "squashfuse_ll": "squashfuse_ll", "kernel": "kernel"}


def hpcdl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcdl", *args], capture_output=True,
                          text=True, env=ENV, timeout=3600, check=True)


def count_calls(trace: Path, under: str) -> dict[str, int]:
    """Calls in strace's output ``trace`` whose path is ``under`` or below it: opens of
    files, opens of directories (each a listing), stat-type calls."""
    counts = {"opens": 0, "dir_opens": 0, "stats": 0}
    prefix = under.rstrip("/") + "/"
    with trace.open(errors="replace") as fh:
        for line in fh:
            m = CALL.match(line)
            if not m or not (m[2] == under or m[2].startswith(prefix)):
                continue
            if m[1] in ("openat", "open"):
                counts["dir_opens" if "O_DIRECTORY" in m[3] else "opens"] += 1
            else:
                counts["stats"] += 1
    return counts


# ---- the child: one variant's reading, in its own process ----------------------------

def child(mode: str, root: str, batch: int, images: int, image_size: int,
          epochs: int = 0, workers: int = 2) -> None:
    """``epoch``: scan and read every training image once (for strace). ``loader``: time
    to the first batch, then images/s with 0, 1 and 2 workers. ``epochs``: ``epochs``
    whole shuffled epochs of the loader with ``workers`` workers, each timed. Prints one
    JSON line."""
    import torch
    from trainkit.data import ImageFolderDataset, ResumableDistributedSampler
    from trainkit.loop import TrainData

    from hpcdl.jobside.imagefolder import scan_imagefolder

    torch.set_num_threads(1)
    start = time.perf_counter()
    folder = scan_imagefolder(root)
    scanned = time.perf_counter() - start
    train = ImageFolderDataset(folder.samples["train"], image_size, train=True, seed=0)
    if mode == "epoch":
        for i in range(len(train)):
            train[i]
        print(json.dumps({"images": len(train), "seconds": time.perf_counter() - start}))
        return

    def loader(dataset: Any, workers: int) -> Any:
        sampler = ResumableDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True,
                                              seed=0, drop_last=True)
        return TrainData(dataset=dataset, sampler=sampler, batch=batch, workers=workers,
                         pin_memory=False).loader(0, 0)

    if mode == "epochs":
        data = TrainData(dataset=train, sampler=ResumableDistributedSampler(
            train, num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=True),
            batch=batch, workers=workers, pin_memory=False)
        seconds = []
        for epoch in range(epochs):
            t0, n = time.perf_counter(), 0
            for x, _ in data.loader(epoch, 0):
                n += len(x)
            seconds.append(round(time.perf_counter() - t0, 2))
        print(json.dumps({"epoch_s": seconds, "epoch_images": n}))
        return

    next(iter(loader(train, 0)))
    first = time.perf_counter() - start
    out: dict[str, Any] = {"scan_s": round(scanned, 3), "first_batch_s": round(first, 3),
                           "classes": len(folder.classes), "train_images": len(train)}
    # A random part of the training set (the loader shuffles it again), as a whole
    # dataset: the example's loader sets its epoch.
    pick = random.Random(0).sample(folder.samples["train"], min(images, len(train)))
    part = ImageFolderDataset(pick, image_size, train=True, seed=0)
    for workers in (0, 1, 2):
        it = iter(loader(part, workers))
        next(it)  # workers started, first batch: left out
        t0, n = time.perf_counter(), 0
        for x, _ in it:
            n += len(x)
        out[f"images_per_s_{workers}w"] = round(n / (time.perf_counter() - t0), 1)
    print(json.dumps(out))


def run_child(mode: str, root: str, args: argparse.Namespace,
              trace: Path | None = None) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--dir", root,
            "--batch", str(args.batch), "--images", str(args.images),
            "--image-size", str(args.image_size), "--epochs", str(args.epochs),
            "--epoch-workers", str(args.epoch_workers)]
    if trace is not None:
        argv = ["strace", "-f", "--seccomp-bpf", "-qq", "-e", f"trace={TRACED}", "-o",
                str(trace)] + argv
    res = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=3600,
                         check=False)
    if res.returncode != 0:
        raise SystemExit(f"bench_data: {mode} on {root} failed: {res.stderr.strip()[-2000:]}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


# ---- the packed file's mount -------------------------------------------------------

class Mount:
    """The packed file mounted at ``where`` (under strace when ``trace``) until stop():
    ``fuse`` squashfuse or squashfuse_ll in the background (-f), or "kernel": the
    kernel's squashfs on a loop device (mount -t squashfs -o loop,ro), what Apptainer's
    setuid mode and a root mount use."""

    def __init__(self, sqfs: Path, where: Path, trace: Path | None,
                 fuse: str = "squashfuse") -> None:
        where.mkdir(parents=True, exist_ok=True)
        kernel = fuse == "kernel"
        argv = (["mount", "-t", "squashfs", "-o", "loop,ro"] if kernel else [fuse, "-f"]) \
            + [str(sqfs), str(where)]
        if trace is not None:
            argv = ["strace", "-f", "-qq", "-e", f"trace={TRACED}", "-o", str(trace)] + argv
        self.where = where
        self.proc: subprocess.Popen[bytes] | None = None
        start = time.perf_counter()
        if kernel:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            if res.returncode != 0:
                raise SystemExit(f"bench_data: mount failed: {res.stderr.strip()}")
        else:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)
        while not (where / "train").is_dir():
            if self.proc is not None and self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise SystemExit(f"bench_data: {fuse} failed: {err}")
            time.sleep(0.01)
        self.seconds = time.perf_counter() - start

    def stop(self) -> None:
        subprocess.run(["umount", str(self.where)], capture_output=True, timeout=60,
                       check=False)
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def _process_cpu(pid: int) -> float:
    """User+system CPU seconds process ``pid`` has used so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _read_every_file(root: Path) -> int:
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                total += len(f.read())
    return total


def mount_cpu(sqfs: Path, mnt: Path, fuse: str, repeats: int) -> dict[str, float]:
    """Medians over ``repeats`` fresh mounts of ``fuse``: the mounter's CPU seconds
    (0 for the kernel's squashfs: its work is not a process of its own) and this
    process's CPU and wall seconds to read every file once."""
    rows = []
    for _ in range(repeats):
        mount = Mount(sqfs, mnt, None, fuse)
        try:
            before = _process_cpu(mount.proc.pid) if mount.proc else 0.0
            r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            _read_every_file(mnt)
            wall = time.perf_counter() - w0
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            mounter = (_process_cpu(mount.proc.pid) - before) if mount.proc else 0.0
        finally:
            mount.stop()
        reader = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        rows.append((mounter, reader, wall))
    return {key: round(statistics.median(r[i] for r in rows), 3)
            for i, key in enumerate(("mounter_cpu_s", "reader_cpu_s", "reader_wall_s"))}


def drop_caches(notes: list[str]) -> None:
    """Empty the page cache (root), so a first epoch reads from the disk; a note without."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        note = "page cache not dropped (needs root): first epochs read a warm cache"
        if note not in notes:
            notes.append(note)


# ---- the run -------------------------------------------------------------------------

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--per-class", type=int, default=100, help="training images per class")
    p.add_argument("--val-per-class", type=int, default=5)
    p.add_argument("--size", type=int, default=32, help="the JPEGs' side (make-tiny --size)")
    p.add_argument("--image-size", type=int, default=None,
                   help="the example's --image-size (what augmentation produces; default "
                        "32, 224 with --imagenet-like)")
    p.add_argument("--imagenet-like", action="store_true",
                   help="make the tree with ImageNet's sizes and ~110 KB JPEGs "
                        "(make-tiny --imagenet-like; --size is then unused)")
    p.add_argument("--epochs", type=int, default=0, metavar="N",
                   help="also time N whole shuffled epochs of the loader per variant, page "
                        "cache dropped before the first (as root; default 0: off)")
    p.add_argument("--epoch-workers", type=int, default=2, metavar="W",
                   help="the loader's workers for --epochs (default 2)")
    p.add_argument("--batch", type=int, default=32, help="the loader's batch")
    p.add_argument("--images", type=int, default=10_000,
                   help="training images per loader-throughput figure")
    p.add_argument("--compression", default="gzip",
                   help="hpcdl data pack --compression (default gzip, pack's default)")
    p.add_argument("--fuse", default="squashfuse,kernel", metavar="LIST",
                   help="how the packed file is mounted, comma-separated: squashfuse (what a "
                        "native job runs), squashfuse_ll (its low-level FUSE variant), "
                        "kernel (mount -t squashfs -o loop: Apptainer's setuid mode); "
                        "default squashfuse,kernel")
    p.add_argument("--mount-cpu", type=int, default=0, metavar="N",
                   help="also read every file of N fresh mounts per mounter and report the "
                        "CPU the mounter spent (medians; default 0: off)")
    p.add_argument("--dir", metavar="DIR",
                   help="the dataset tree: made there when missing (default: a temporary "
                        "one, removed at the end)")
    p.add_argument("--json", metavar="PATH", help="also write the figures here")
    p.add_argument("--child", choices=("epoch", "loader", "epochs"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.image_size is None:
        args.image_size = 224 if args.imagenet_like else 32
    if args.child:
        child(args.child, args.dir, args.batch, args.images, args.image_size, args.epochs,
              args.epoch_workers)
        return

    command = (f"python3 bench/bench_data.py --classes {args.classes} --per-class "
               f"{args.per_class} --val-per-class {args.val_per_class} --size {args.size} "
               f"--image-size {args.image_size} --batch {args.batch} --images {args.images} "
               f"--compression {args.compression} --fuse {args.fuse}"
               + (f" --mount-cpu {args.mount_cpu}" if args.mount_cpu else "")
               + (" --imagenet-like" if args.imagenet_like else "")
               + (f" --epochs {args.epochs} --epoch-workers {args.epoch_workers}"
                  if args.epochs else ""))
    print("machine: " + facts_line(describe(packages=("torch", "pillow"), tools=("strace",))))
    print(f"command: {command}")
    notes: list[str] = []
    strace = shutil.which("strace") is not None
    if not strace:
        notes.append("strace missing (apt-get install strace): no opens figures")
    fuses = [f for f in args.fuse.split(",") if f]
    if os.geteuid() != 0:
        notes.append("the packed variants need root (they mount): left out")
        fuses = []
    for fuse in [f for f in fuses if f not in VARIANT]:
        raise SystemExit(f"bench_data: --fuse {fuse}: not one of {', '.join(VARIANT)}")
    for fuse in [f for f in fuses if f != "kernel" and shutil.which(f) is None]:
        notes.append(f"{fuse} missing (apt-get install squashfuse): left out")
        fuses.remove(fuse)

    work = Path(tempfile.mkdtemp(prefix="bench-data-", dir=os.environ.get("TMPDIR", "/tmp")))
    work.chmod(0o755)
    figures: dict[str, Any] = {"command": command, "notes": notes}
    try:
        tree = Path(args.dir) if args.dir else work / "inet"
        if not tree.exists():
            t0 = time.perf_counter()
            hpcdl("data", "make-tiny", str(tree), "--classes", str(args.classes),
                  "--per-class", str(args.per_class), "--val-per-class",
                  str(args.val_per_class), "--size", str(args.size),
                  *(["--imagenet-like"] if args.imagenet_like else []))
            figures["make_tiny_s"] = round(time.perf_counter() - t0, 2)
        files = sum(len(names) for _, _, names in os.walk(tree))
        dirs = sum(1 for _ in os.walk(tree))
        figures.update(files=files, directories=dirs)
        sqfs = work / "inet.sqfs"
        t0 = time.perf_counter()
        hpcdl("data", "pack", str(tree), "-o", str(sqfs), "--compression", args.compression)
        figures["pack_s"] = round(time.perf_counter() - t0, 2)
        figures["packed_mib"] = round(sqfs.stat().st_size / 2**20, 1)
        figures["tree_mib_allocated"] = round(sum(
            (Path(d) / n).stat().st_blocks * 512 for d, _, ns in os.walk(tree) for n in ns)
            / 2**20, 1)

        variants: dict[str, dict[str, Any]] = {}
        tree_fig: dict[str, Any] = {}
        if strace:
            trace = work / "tree.trace"
            tree_fig["epoch"] = run_child("epoch", str(tree), args, trace)
            tree_fig["shared_path_calls"] = count_calls(trace, str(tree))
            trace.unlink()
        tree_fig.update(run_child("loader", str(tree), args))
        if args.epochs:
            drop_caches(notes)
            tree_fig.update(run_child("epochs", str(tree), args))
        variants["tree"] = tree_fig
        for fuse in fuses:
            packed: dict[str, Any] = {}
            mnt = work / "mnt"
            if strace:
                sq_trace, rd_trace = work / "squashfuse.trace", work / "packed.trace"
                mount = Mount(sqfs, mnt, sq_trace, fuse)
                try:
                    packed["epoch"] = run_child("epoch", str(mnt), args, rd_trace)
                finally:
                    mount.stop()
                packed["shared_path_calls"] = count_calls(sq_trace, str(sqfs))
                packed["mount_calls"] = count_calls(rd_trace, str(mnt))
                sq_trace.unlink()
                rd_trace.unlink()
            mount = Mount(sqfs, mnt, None, fuse)
            try:
                packed["mount_s"] = round(mount.seconds, 3)
                packed.update(run_child("loader", str(mnt), args))
            finally:
                mount.stop()
            if args.epochs:
                drop_caches(notes)
                mount = Mount(sqfs, mnt, None, fuse)
                try:
                    packed.update(run_child("epochs", str(mnt), args))
                finally:
                    mount.stop()
            if args.mount_cpu > 0:
                packed.update(mount_cpu(sqfs, mnt, fuse, args.mount_cpu))
            variants[VARIANT[fuse]] = packed
        figures["variants"] = variants
    finally:
        shutil.rmtree(work, ignore_errors=True)  # a --dir tree stays where it was

    print(f"dataset: {figures['files']:,} files in {figures['directories']:,} directories, "
          f"{figures['tree_mib_allocated']} MiB allocated"
          + (f"; made in {figures['make_tiny_s']} s" if "make_tiny_s" in figures else ""))
    print(f"pack: {figures['pack_s']} s -> {figures['packed_mib']} MiB")
    rows = [("opens of files on the shared path, per epoch", "shared_path_calls", "opens"),
            ("directory opens (listings) on the shared path", "shared_path_calls", "dir_opens"),
            ("stat-type calls on the shared path", "shared_path_calls", "stats"),
            ("opens in the node-local mount", "mount_calls", "opens")]
    names = list(figures["variants"])
    print(f"{'':52}" + "".join(f"{n:>14}" for n in names))
    for label, group, key in rows:
        cells = [figures["variants"][n].get(group, {}).get(key) for n in names]
        if any(c is not None for c in cells):
            print(f"{label:52}" + "".join(f"{'-' if c is None else f'{c:,}':>14}"
                                           for c in cells))
    for label, key in (("epoch under strace, s", "epoch"), ("scan of the class folders, s",
                       "scan_s"), ("time to first batch (new process), s", "first_batch_s"),
                       ("mount, s", "mount_s"),
                       ("loader images/s, 0 workers", "images_per_s_0w"),
                       ("loader images/s, 1 worker", "images_per_s_1w"),
                       ("loader images/s, 2 workers", "images_per_s_2w"),
                       ("read every file once: mounter CPU, s", "mounter_cpu_s"),
                       ("read every file once: reader CPU, s", "reader_cpu_s"),
                       ("read every file once: reader wall, s", "reader_wall_s")):
        cells = [figures["variants"][n].get(key) for n in names]
        cells = [round(c["seconds"], 1) if isinstance(c, dict) else c for c in cells]
        if any(c is not None for c in cells):
            print(f"{label:52}" + "".join(f"{'-' if c is None else c:>14}" for c in cells))
    for epoch in range(args.epochs):
        cells = [figures["variants"][n].get("epoch_s", [None] * args.epochs)[epoch]
                 for n in names]
        label = (f"epoch {epoch + 1}, {args.epoch_workers} workers, s"
                 + (" (page cache dropped)" if epoch == 0 else ""))
        print(f"{label:52}" + "".join(f"{'-' if c is None else c:>14}" for c in cells))
        rates = [figures["variants"][n].get("epoch_images", 0) / c if c else None
                 for n, c in zip(names, cells, strict=True)]
        print(f"{f'epoch {epoch + 1}, images/s':52}"
              + "".join(f"{'-' if r is None else round(r, 1):>14}" for r in rates))
    for note in notes:
        print(f"note: {note}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
