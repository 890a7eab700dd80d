#!/usr/bin/env python3
"""The dataset as the nodes of a real Slurm job read it: a directory tree on the shared
path, the packed file (`--data X.sqfs`), and the packed file staged to every node's local
scratch (`--data X.sqfs --stage-data`), each a real 2-node `hpcdl submit --wait` in the
image, side by side in one run.

Every rank runs the bundled example's input pipeline over its share of one epoch
(--rank below: scan_imagefolder, trainkit's ImageFolderDataset and TrainData loader with
a ResumableDistributedSampler over the job's ranks: PIL decode, random-resized crop, flip,
normalise), as the example does before its first step, and prints its times:

  opens      every open on the machine's filesystem that holds the shared paths (/scratch,
             /home), seen with fanotify (a filesystem mark, FAN_OPEN | FAN_ONDIR) from
             the host while the job runs, attributed to a node by the opening process's
             network namespace (each sandbox node has its own): opens of dataset files
             on the shared path (the tree's images, or the .sqfs itself: Apptainer's
             mount, sbcast's read), directory opens (listings) of the tree, and opens of
             the node-local copy. It sees every process of a node (ranks, loader
             workers, Apptainer's starter, sbcast, slurmd), in the image or not, without
             changing the job; it does not see stat-type calls (bench/bench_data.py
             counts those for one reader with strace: 4 per epoch for the tree)
  job        from `hpcdl submit --wait` to its return (staging and mounts included)
  first      a rank's time from its start (after its imports) to its first batch: the scan of every class
             folder, then one batch (the slowest rank)
  epoch      a rank's time to read its share of each epoch (--epochs; the slowest rank):
             the first from a fresh mount, the next from what the first left cached
  fresh read (--fresh-read) one process in the image reads every training file once
             (raw bytes), in the tree's order and shuffled: from the tree, from a fresh
             mount of the packed file, and of the tree packed with mksquashfs
             -no-fragments; wall and CPU seconds. Why a fresh mount's first shuffled
             epoch of small files is slow: the kernel's squashfs keeps few decompressed
             fragment blocks (CONFIG_SQUASHFS_FRAGMENT_CACHE_SIZE, 3 by default), and a
             small file shares its fragment block with many others

The cluster: the shared sandbox (-p sandbox, nodes n1 and n2) when it is up, else (or with
--own-cluster) a 2-node scripts/sandbox.sh cluster of the bench's own (bench/common.py),
stopped at the end. The tree and the .sqfs are made under /scratch/tmp (shared_tmp) and
removed at the end. Needs root (fanotify, the sandbox's image) and the CPU image
(/scratch/images/pytorch-horovod-cpu.sif: `make image`). Page cache warm: every node
is this machine.

    sudo python3 bench/bench_data_nodes.py                        # 200 x 100: ~20k files
    sudo python3 bench/bench_data_nodes.py --classes 1000         # ~105k files
    sudo python3 bench/bench_data_nodes.py --classes 200 --epochs 2 --fresh-read
    sudo python3 bench/bench_data_nodes.py --classes 10 --per-class 20 --own-cluster  # smoke
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import stat
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("tree", "packed", "packed+staged")
KINDS = ("shared_file", "shared_dir", "local")
SANDBOX_DIR = Path("/var/lib/hpcdl-sandbox")  # the shared sandbox's (scripts/sandbox.sh)

# fanotify(7): a group that may hold openers (content class), inode marks, open events on
# files and directories (a directory's own and its children's).
FAN_CLOEXEC, FAN_NONBLOCK, FAN_CLASS_CONTENT, FAN_UNLIMITED_QUEUE = 0x1, 0x2, 0x4, 0x10
FAN_MARK_ADD = 0x1
FAN_OPEN, FAN_OPEN_PERM, FAN_Q_OVERFLOW = 0x20, 0x10000, 0x4000
FAN_EVENT_ON_CHILD, FAN_ONDIR, FAN_ALLOW = 0x08000000, 0x40000000, 0x1
AT_FDCWD = -100
EVENT = 24  # struct fanotify_event_metadata: u32 len, u8 vers, u8, u16, u64 mask, s32 fd, s32 pid


# ---- the rank: the example's input pipeline, in the image ---------------------------

def rank(root: str, batch: int, image_size: int, workers: int, epochs: int) -> None:
    """One rank's share of ``epochs`` epochs through the example's loader; one JSON line.
    Its clock starts after the imports (torch's, the same for every variant)."""
    import socket

    import torch
    from trainkit.data import ImageFolderDataset, ResumableDistributedSampler
    from trainkit.loop import TrainData

    from hpcdl.jobside.imagefolder import scan_imagefolder

    torch.set_num_threads(1)
    start = time.perf_counter()
    world, me = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    folder = scan_imagefolder(root)
    scanned = time.perf_counter() - start
    train = ImageFolderDataset(folder.samples["train"], image_size, train=True, seed=0)
    sampler = ResumableDistributedSampler(train, num_replicas=world, rank=me, shuffle=True,
                                          seed=0, drop_last=True)
    data = TrainData(dataset=train, sampler=sampler, batch=batch, workers=workers,
                     pin_memory=False)
    n, first, ends = 0, 0.0, []
    for epoch in range(epochs):
        for x, _ in data.loader(epoch, 0):
            if not n:
                first = time.perf_counter() - start
            n += len(x)
        ends.append(time.perf_counter() - start)
    print("BENCH " + json.dumps({
        "rank": me, "host": socket.gethostname(), "images": n, "scan_s": round(scanned, 3),
        "first_batch_s": round(first, 3),
        "epoch_s": [round(b - a, 3) for a, b in zip([0.0, *ends[:-1]], ends, strict=True)]}),
        flush=True)


# ---- the host: opens on the filesystem, per node -------------------------------------

class Opens:
    """While running: opens (files and directories) of the paths in ``marks`` by a
    process of one of ``nodes`` ({network namespace inode: node}), counted per node and
    kind by ``classify(path, is_dir)`` (None: not counted). ``marks``: (path, children,
    permission): an inode mark on the path (and its direct children with ``children``);
    with ``permission`` the opener waits until its event is read (FAN_OPEN_PERM), so that
    a short-lived one (sbcast, Apptainer's mount helper) is still there to be attributed;
    the tree's opens, by long-lived ranks, are not held up (FAN_OPEN). An open by a
    process gone before its event was read counts for node "?"."""

    def __init__(self, marks: list[tuple[Path, bool, bool]], nodes: dict[int, str],
                 classify: Any) -> None:
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64,
                                            ctypes.c_int, ctypes.c_char_p]
        self.fd = self.libc.fanotify_init(
            FAN_CLASS_CONTENT | FAN_CLOEXEC | FAN_NONBLOCK | FAN_UNLIMITED_QUEUE,
            os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "fanotify_init (needs root)")
        for path, children, permission in marks:
            mask = (FAN_OPEN_PERM if permission else FAN_OPEN) | FAN_ONDIR \
                | (FAN_EVENT_ON_CHILD if children else 0)
            if self.libc.fanotify_mark(self.fd, FAN_MARK_ADD, mask, AT_FDCWD,
                                       str(path).encode()) < 0:
                raise OSError(ctypes.get_errno(), f"fanotify_mark {path}")
        self.nodes, self.classify = nodes, classify
        self.counts: Counter[tuple[str, str]] = Counter()
        self.netns: dict[int, int | None] = {}  # pid -> its network namespace's inode
        self.overflow = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _node(self, pid: int) -> str:
        if pid not in self.netns:
            try:
                self.netns[pid] = os.stat(f"/proc/{pid}/ns/net").st_ino
            except OSError:  # gone already
                return "?"
        return self.nodes.get(self.netns[pid] or 0, "other")

    def _drain(self) -> int:
        try:
            buf = os.read(self.fd, 65536)
        except BlockingIOError:
            return 0
        for off in range(0, len(buf), EVENT):
            mask = int.from_bytes(buf[off + 8:off + 16], "little")
            fd = int.from_bytes(buf[off + 16:off + 20], "little", signed=True)
            pid = int.from_bytes(buf[off + 20:off + 24], "little", signed=True)
            if mask & FAN_Q_OVERFLOW:
                self.overflow = True
            if fd < 0:
                continue
            try:
                node = self._node(pid)
                # (the event's mask does not always carry FAN_ONDIR for a directory)
                kind = self.classify(os.readlink(f"/proc/self/fd/{fd}"),
                                     stat.S_ISDIR(os.fstat(fd).st_mode))
                if kind is not None and node != "other":
                    self.counts[(node, kind)] += 1
            finally:
                if mask & FAN_OPEN_PERM:
                    os.write(self.fd, struct.pack("iI", fd, FAN_ALLOW))
                os.close(fd)
        return len(buf)

    def _loop(self) -> None:
        import select
        while not self.stopping.is_set():
            select.select([self.fd], [], [], 0.1)
            while self._drain():
                pass

    def stop(self) -> Counter[tuple[str, str]]:
        time.sleep(0.5)  # the last events of the job's end
        self.stopping.set()
        self.thread.join(timeout=30)
        while self._drain():
            pass
        os.close(self.fd)  # any permission event still pending is allowed
        return self.counts


def node_namespaces(netns_names: dict[str, str]) -> dict[int, str]:
    """{inode of the network namespace: node} from {node: its name in /run/netns}."""
    return {os.stat(f"/run/netns/{name}").st_ino: node for node, name in netns_names.items()}


def classifier(tree: Path, sqfs: Path) -> Any:
    """Kinds of open: of a file of the tree or of the .sqfs on the shared path (file),
    of one of the tree's directories (dir), of a node's local copy (local); else None."""
    tree_s, sqfs_s = str(tree), str(sqfs)
    local_suffix = f"-data-{sqfs.stem}.sqfs"

    def classify(path: str, is_dir: bool) -> str | None:
        if path == tree_s or path.startswith(tree_s + "/"):
            return "shared_dir" if is_dir else "shared_file"
        if path == sqfs_s:
            return "shared_file"
        if path.endswith(local_suffix):
            return "local"
        return None
    return classify


# ---- the first read from a fresh mount -------------------------------------------

# Every training file read once (raw bytes), in the tree's order or shuffled; prints the
# count, the wall and the CPU seconds (user+system: the kernel's decompression included).
READ = ("import os, random, sys, time\n"
        "files = sorted(os.path.join(d, n) for d, _, ns in os.walk(sys.argv[1] + '/train')"
        " for n in ns)\n"
        "if sys.argv[2] == 'shuffled':\n    random.Random(0).shuffle(files)\n"
        "t, c = time.perf_counter(), time.process_time()\n"
        "for f in files:\n    with open(f, 'rb') as fh:\n        fh.read()\n"
        "print(len(files), time.perf_counter() - t, time.process_time() - c)\n")


def fresh_read(image: str, tree: Path, sqfs: Path, work: Path) -> dict[str, Any]:
    """One process in the image reads every training file once, sorted and shuffled: from
    the tree, and from a fresh mount (each `apptainer exec` mounts the file anew) of the
    packed file and of the same tree packed with mksquashfs -no-fragments (one block per
    small file instead of many files per fragment block)."""
    nofrag = work / "inet-no-fragments.sqfs"
    subprocess.run(["mksquashfs", str(tree), str(nofrag), "-noappend", "-no-xattrs",
                    "-all-root", "-no-fragments", "-comp", "gzip", "-no-progress", "-quiet"],
                   check=True, capture_output=True, timeout=3600)
    out: dict[str, Any] = {"no_fragments_mib": round(nofrag.stat().st_size / 2**20, 1)}
    for name, packed in (("tree", None), ("packed", sqfs), ("packed -no-fragments", nofrag)):
        for order in ("sorted", "shuffled"):
            argv = ["apptainer", "exec", "-B", str(work)]
            if packed is not None:
                argv += ["-B", f"{packed}:/data:image-src=/,ro"]
            argv += [image, "python3", "-c", READ, "/data" if packed else str(tree), order]
            res = subprocess.run(argv, capture_output=True, text=True, timeout=3600,
                                 check=True)
            _, wall, cpu = res.stdout.split()[-3:]
            out[f"{name}, {order}"] = [round(float(wall), 2), round(float(cpu), 2)]
    return out


# ---- the run -------------------------------------------------------------------------

def shared_sandbox_up() -> bool:
    res = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True,
                         text=True, timeout=30, check=False,
                         env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"})
    return res.returncode == 0 and "n1" in res.stdout.split()


def ranks_of(run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for log in run_dir.rglob("*.out"):
        for line in log.read_text(errors="replace").splitlines():
            if "BENCH {" in line:
                rows.append(json.loads(line.split("BENCH ", 1)[1]))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--classes", type=int, default=200)
    p.add_argument("--per-class", type=int, default=100, help="training images per class")
    p.add_argument("--val-per-class", type=int, default=5)
    p.add_argument("--size", type=int, default=32, help="the JPEGs' side (make-tiny --size)")
    p.add_argument("--image-size", type=int, default=32, help="the example's --image-size")
    p.add_argument("--batch", type=int, default=32, help="the loader's batch per rank")
    p.add_argument("--workers", type=int, default=0, help="loader workers per rank")
    p.add_argument("--gpus", type=int, default=1, help="ranks per node (hpcdl submit -G)")
    p.add_argument("--image", default="/scratch/images/pytorch-horovod-cpu.sif")
    p.add_argument("--own-cluster", action="store_true",
                   help="a 2-node cluster of the bench's own even when the shared sandbox is up")
    p.add_argument("--epochs", type=int, default=1,
                   help="epochs per job (the opens are counted per job: all its epochs)")
    p.add_argument("--repeats", type=int, default=1,
                   help="jobs per variant, in rotating order; timings are medians")
    p.add_argument("--fresh-read", action="store_true",
                   help="also read every training file once from a fresh mount, sorted and "
                        "shuffled (one process in the image; no job)")
    p.add_argument("--json", metavar="PATH", help="also write the figures here")
    p.add_argument("--rank", metavar="ROOT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        rank(args.rank, args.batch, args.image_size, args.workers, args.epochs)
        return

    sys.path.insert(0, str(REPO))
    from bench.common import own_cluster, shared_tmp
    from bench.machine import describe, facts_line

    command = (f"sudo python3 bench/bench_data_nodes.py --classes {args.classes} "
               f"--per-class {args.per_class} --val-per-class {args.val_per_class} "
               f"--size {args.size} --image-size {args.image_size} --batch {args.batch} "
               f"--workers {args.workers} --gpus {args.gpus} --epochs {args.epochs} "
               f"--repeats {args.repeats}" + (" --fresh-read" if args.fresh_read else "")
               + (" --own-cluster" if args.own_cluster else ""))
    print("machine: " + facts_line(describe(packages=("torch", "pillow"),
                                            tools=("apptainer", "sbatch"))))
    print(f"command: {command}")
    if os.geteuid() != 0:
        raise SystemExit("bench_data_nodes: needs root (fanotify)")
    if not Path(args.image).is_file():
        raise SystemExit(f"bench_data_nodes: no image {args.image} (make image)")

    work = shared_tmp("bench-data-nodes-")
    work.chmod(0o755)
    figures: dict[str, Any] = {"command": command, "repeats": args.repeats}
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        tree, sqfs = work / "inet", work / "inet.sqfs"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hpcdl", "data", "make-tiny", str(tree),
                        "--classes", str(args.classes), "--per-class", str(args.per_class),
                        "--val-per-class", str(args.val_per_class), "--size", str(args.size)],
                       env=env, check=True, capture_output=True, timeout=3600)
        figures["make_tiny_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hpcdl", "data", "pack", str(tree), "-o",
                        str(sqfs)], env=env, check=True, capture_output=True, timeout=3600)
        figures["pack_s"] = round(time.perf_counter() - t0, 1)
        figures["files"] = sum(len(names) for _, _, names in os.walk(tree))
        figures["directories"] = sum(1 for _ in os.walk(tree))
        figures["packed_mib"] = round(sqfs.stat().st_size / 2**20, 1)
        # What the ranks import, where the nodes see it (they do not see the checkout).
        code = work / "code"
        shutil.copytree(REPO / "hpcdl", code / "hpcdl",
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(REPO / "examples" / "trainkit", code / "trainkit",
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(Path(__file__), code / "bench_data_nodes.py")
        for d, _, _files in os.walk(work):
            os.chmod(d, 0o755)

        if args.fresh_read:
            figures["fresh_read"] = fresh_read(args.image, tree, sqfs, work)
        if args.own_cluster or not shared_sandbox_up():
            from tests.own_cluster import netns_name
            with own_cluster(2, "data", default_time="00:20:00") as cl:
                figures["cluster"] = "own"
                names = {n: netns_name(cl["dir"], n) for n in cl["nodes"]}
                jobs(args, figures, work, tree, sqfs, code, str(cl["profile"]),
                     {**env, **cl["env"]}, names,
                     [cl["dir"] / "nodes" / n / "local" for n in cl["nodes"]])
        else:
            figures["cluster"] = "sandbox"
            names = {n: netns_name_shared(n) for n in ("n1", "n2")}
            jobs(args, figures, work, tree, sqfs, code, "sandbox", env, names,
                 [SANDBOX_DIR / "nodes" / n / "local" for n in names])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    report(figures)


def netns_name_shared(node: str) -> str:
    from tests.own_cluster import netns_name
    return netns_name(SANDBOX_DIR, node)


def one_job(args: argparse.Namespace, variant: str, work: Path, tree: Path, sqfs: Path,
            code: Path, profile: str, env: dict[str, str], names: dict[str, str],
            local_dirs: list[Path], run_dir: Path) -> dict[str, Any]:
    """One variant's job, watched: its figures."""
    packed = variant != "tree"
    argv = [sys.executable, "-m", "hpcdl", "submit", "-p", profile, "-N", "2",
            "-G", str(args.gpus), "-t", "00:20:00", "--image", args.image,
            "--data", str(sqfs if packed else tree), "--run-dir", str(run_dir),
            "-e", f"PYTHONPATH={code}", "--wait"]
    if variant == "packed+staged":
        argv.append("--stage-data")
    argv += ["--", "python3", str(code / "bench_data_nodes.py"), "--rank",
             "/data" if packed else str(tree), "--batch", str(args.batch),
             "--image-size", str(args.image_size), "--workers", str(args.workers),
             "--epochs", str(args.epochs)]
    marks = [(Path(d), True, False) for d, _, _ in os.walk(tree)] + [(sqfs, False, True)] \
        + [(d, True, True) for d in local_dirs]
    watch = Opens(marks, node_namespaces(names), classifier(tree, sqfs))
    t0 = time.perf_counter()
    try:
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800,
                             check=False, cwd=REPO)
    finally:
        counts = watch.stop()
    job_s = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"bench_data_nodes: {variant}: hpcdl submit exit "
                         f"{res.returncode}:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    ranks = ranks_of(run_dir)
    if len(ranks) != 2 * args.gpus:
        raise SystemExit(f"bench_data_nodes: {variant}: {len(ranks)} ranks reported, "
                         f"expected {2 * args.gpus}; see {run_dir}")
    return {"job_s": round(job_s, 1),
            "first_batch_s": max(r["first_batch_s"] for r in ranks),
            "scan_s": max(r["scan_s"] for r in ranks),
            # per epoch, the slowest rank's
            "epoch_s": [max(e) for e in zip(*(r["epoch_s"] for r in ranks), strict=True)],
            "images": sum(r["images"] for r in ranks),
            "opens": {node: {kind: counts[(node, kind)] for kind in KINDS}
                      for node in [*sorted(names), "?"]},
            "overflow": watch.overflow}


def jobs(args: argparse.Namespace, figures: dict[str, Any], work: Path, tree: Path,
         sqfs: Path, code: Path, profile: str, env: dict[str, str],
         names: dict[str, str], local_dirs: list[Path]) -> None:
    """The three variants, one job each, --repeats times in rotating order (the page
    cache is warm for all: the tree was just written and the file just packed).
    ``local_dirs``: the nodes' local scratch as this host sees it."""
    env = {**env, "HPCDL_RUNS": str(work / "runs")}
    figures["nodes"] = sorted(names)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for i in range(args.repeats):
        for variant in VARIANTS[i % 3:] + VARIANTS[:i % 3]:
            run_dir = work / "runs" / f"{variant.replace('+', '-')}-{i}"
            runs[variant].append(one_job(args, variant, work, tree, sqfs, code, profile,
                                         env, names, local_dirs, run_dir))
    figures["runs"] = runs
    figures["variants"] = {
        variant: {**{key: statistics.median(r[key] for r in rows)
                     for key in ("job_s", "first_batch_s", "scan_s", "images")},
                  "epoch_s": [statistics.median(e)
                              for e in zip(*(r["epoch_s"] for r in rows), strict=True)],
                  "opens": {node: {kind: sorted({r["opens"][node][kind] for r in rows})
                                   for kind in KINDS} for node in rows[0]["opens"]},
                  "overflow": any(r["overflow"] for r in rows)}
        for variant, rows in runs.items()}


def report(figures: dict[str, Any]) -> None:
    v = figures["variants"]
    print(f"dataset: {figures['files']:,} files in {figures['directories']:,} directories; "
          f"make-tiny {figures['make_tiny_s']} s; pack {figures['pack_s']} s -> "
          f"{figures['packed_mib']} MiB; cluster: {figures['cluster']}")
    cols = list(v)
    epochs = len(v[cols[0]]["epoch_s"])
    print(f"{f'per job of {epochs} epoch(s), per node':48}" + "".join(f"{c:>15}" for c in cols))
    for node in [*figures["nodes"], "?"]:
        if node == "?" and not any(max(v[c]["opens"]["?"][k]) for c in cols for k in KINDS):
            continue
        for label, kind in (("opens of dataset files on the shared path", "shared_file"),
                            ("directory opens on the shared path", "shared_dir"),
                            ("opens of the node-local copy", "local")):
            print(f"{node + ': ' + label:48}"
                  + "".join(f"{'-'.join(f'{n:,}' for n in v[c]['opens'][node][kind]):>15}"
                            for c in cols))
    print(f"medians of {figures['repeats']} run(s) of each:")
    for label, key in (("images read (all ranks)", "images"),
                       ("scan of the class folders, s (slowest rank)", "scan_s"),
                       ("time to first batch, s (slowest rank)", "first_batch_s"),
                       ("job, submit --wait to its end, s", "job_s")):
        print(f"{label:48}" + "".join(f"{v[c][key]:>15}" for c in cols))
    for i in range(epochs):
        print(f"{f'epoch {i + 1}, s (slowest rank)':48}"
              + "".join(f"{v[c]['epoch_s'][i]:>15.3f}" for c in cols))
    if "fresh_read" in figures:
        f = figures["fresh_read"]
        print("first read of every training file, one process in the image, a fresh mount "
              f"(-no-fragments: {f['no_fragments_mib']} MiB): wall s (CPU s)")
        for key, value in f.items():
            if key != "no_fragments_mib":
                print(f"  {key:44}{value[0]:>10} ({value[1]})")
    if any(v[c]["overflow"] for c in cols):
        print("note: the fanotify queue overflowed: counts are lower bounds")


if __name__ == "__main__":
    main()
