#!/usr/bin/env python3
"""When image staging pays off: the CPU image read from the shared path by every rank
against staged to each node's local scratch with sbcast (`hpcdl submit --stage-image`),
on 1 to 16 nodes of a sandbox cluster of the bench's own.

The cluster: scripts/sandbox.sh with its own directory under /tmp, node names no other
cluster uses (3 random letters + 1..N), its own subnet and slurmctld port, no
accounting daemons, each node its own network and mount namespace with a private
/local (the profile's paths.local_scratch). It is stopped at the end, whatever happens;
the shared two-node sandbox is not touched. The image is first copied (not linked) to
a path of the bench's own on the shared /scratch, so that nothing else opens it.

Per node count in --nodes (one rank per node), --repeats times, the two in rotating
order, each rank running `date +%s.%N; sleep 1` in the image (--work torch: `import
torch` before the sleep):

  time     from `hpcdl submit --wait` to the last rank's start (its clock: every node
           shares this machine's), staging included
  opens    opens of the shared image (inotify IN_OPEN on it) and of the nodes' local
           copies (inotify on each node's local scratch directory); a lower bound:
           inotify merges an event with an identical one still unread
  MiB      read from the image by the ranks' containers: the sectors read by every loop
           device Apptainer attached to the shared image or to a local copy (its
           block statistics, sampled every 20 ms from its attach to its detach); the
           staged run's sbcast reads the whole file once more (its size)

Prints the table, the machine and the command to rerun. Needs root.

    sudo python3 bench/bench_image_stage.py [--nodes 1,2,4,8,16] [--repeats 2]
        [--image /scratch/images/pytorch-horovod-cpu.sif] [--work date|torch]
        [--json-out FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import own_cluster, run, spread, stamps  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402

METHODS = ("shared", "staged")
# What each rank runs in the image: its start (the clock), then, for --work torch, what
# a training script's first line costs (the bytes it reads from the image).
WORK = {"date": "date +%s.%N; sleep 1",
        "torch": 'date +%s.%N; python3 -c "import torch"; sleep 1'}
IN_OPEN = 0x20



class Watch:
    """While running: IN_OPEN events on the shared image and in the nodes' local
    scratch directories, and the sectors read by every loop device bound to either."""

    def __init__(self, shared: Path, local_dirs: list[Path]) -> None:
        self.shared = str(shared)
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.kind: dict[int, str] = {}
        for path, kind in [(shared, "shared"), *((d, "local") for d in local_dirs)]:
            wd = self.libc.inotify_add_watch(self.fd, str(path).encode(), IN_OPEN)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
            self.kind[wd] = kind
        self.opens = {"shared": 0, "local": 0}
        self.read = {"shared": 0, "local": 0}  # bytes
        self.attaches = {"shared": 0, "local": 0}
        self._last: dict[str, int] = {}  # loop device -> sectors read at the last poll
        # loop device -> [backing file, kind, sectors before it was bound, sectors now]
        self._bound: dict[str, list[Any]] = {}
        self._stop = threading.Event()
        self._poll()  # every loop device's counters before the launch
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _classify(self, backing: str) -> str | None:
        if backing == self.shared:
            return "shared"
        name = Path(self.shared).name
        return "local" if backing.endswith(f"-{name}") and "/hpcdl-" in backing else None

    def _poll(self) -> None:
        for dev in Path("/sys/block").glob("loop*"):
            try:
                sectors = int((dev / "stat").read_text().split()[2])
                backing_file = dev / "loop" / "backing_file"
                backing = backing_file.read_text().strip() if backing_file.exists() else ""
            except (OSError, ValueError, IndexError):
                continue
            name = dev.name
            bound = self._bound.get(name)
            if bound and bound[0] != backing:  # detached (or bound to another file)
                self._finish(name)
                bound = None
            kind = self._classify(backing) if backing else None
            if kind and not bound:  # newly bound: its reads count from the last value before
                self._bound[name] = [backing, kind, self._last.get(name, 0), sectors]
                self.attaches[kind] += 1
            elif bound:
                bound[3] = sectors
            self._last[name] = sectors
        self._events()

    def _finish(self, name: str) -> None:
        _, kind, base, latest = self._bound.pop(name)
        self.read[kind] += max(0, latest - base) * 512

    def _events(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(data):
                wd, mask, _, length = struct.unpack_from("iIII", data, offset)
                if mask & IN_OPEN and wd in self.kind:
                    self.opens[self.kind[wd]] += 1
                offset += 16 + length

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            self._poll()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=10)
        self._poll()
        for name in list(self._bound):
            self._finish(name)
        os.close(self.fd)
        return {"opens": dict(self.opens), "read_bytes": dict(self.read),
                "loop_attaches": dict(self.attaches)}



def launch(method: str, n: int, env: dict[str, str], profile: Path, image: Path,
           local_dirs: list[Path], work: str) -> dict[str, Any]:
    watch = Watch(image, local_dirs)
    t0 = time.time()
    try:
        res = run([sys.executable, "-m", "hpcdl", "submit", "-p", str(profile), "-N", str(n),
                   "-G", "0", "--image", str(image),
                   "--stage-image" if method == "staged" else "--no-stage-image",
                   "--wait", "--json", "--", "sh", "-c", work], env, timeout=900)
    finally:
        seen = watch.stop()
    end = time.time() - t0
    record = json.loads(res.stdout.strip().splitlines()[-1])
    text = Path(record["stdout"]).read_text()
    ranks = stamps(text)
    if len(ranks) != n:
        raise RuntimeError(f"{method} on {n} nodes: {len(ranks)} rank clocks in:\n{text[-2000:]}")
    left = [p for d in local_dirs for p in d.iterdir()]
    if left:
        raise RuntimeError(f"{method} on {n} nodes: staged copies left behind: {left}")
    return {"started_s": max(ranks) - t0, "end_s": end, **seen}



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1,2,4,8,16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--image", type=Path, default=Path("/scratch/images/pytorch-horovod-cpu.sif"))
    ap.add_argument("--work", choices=sorted(WORK), default="date",
                    help="each rank's command after its clock: nothing, or `import torch`")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_image_stage: needs root (Slurm daemons, namespaces)", file=sys.stderr)
        return 2
    if not args.image.is_file():
        print(f"bench_image_stage: no image at {args.image}", file=sys.stderr)
        return 2
    # Before the cluster: a tool's --version can be slow on a loaded machine, and a
    # failure here must not cost the measurements.
    info = describe(packages=("torch",), tools=("srun", "sbcast", "apptainer"))
    nodes = [int(x) for x in args.nodes.split(",") if x]
    biggest = max(nodes)
    results: dict[str, dict[int, list[dict[str, Any]]]] = {m: {} for m in METHODS}
    t0 = time.perf_counter()
    with own_cluster(biggest, "bis", default_time="00:10:00", up_timeout=900,
                     down_timeout=300) as cluster:
        up_s = time.perf_counter() - t0
        env, profile, names = cluster["env"], cluster["profile"], cluster["nodes"]
        cluster["runs"].mkdir(parents=True)
        image = cluster["runs"] / args.image.name
        shutil.copyfile(args.image, image)  # a copy: inotify watches this inode alone
        image.chmod(0o644)
        local_dirs = [cluster["dir"] / "nodes" / x / "local" for x in names]
        for n in nodes:
            for r in range(args.repeats):
                order = METHODS[r % 2:] + METHODS[:r % 2]
                for method in order:
                    got = launch(method, n, env, profile, image, local_dirs[:n], WORK[args.work])
                    results[method].setdefault(n, []).append(got)
            print(f"{n} nodes done", file=sys.stderr, flush=True)
    size = args.image.stat().st_size
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": info, "image_bytes": size,
                                             "results": results}, indent=2))
    print(f"cluster: {biggest} nodes ({names[0]}..{names[-1]}), up in {up_s:.1f} s; image "
          f"{args.image.name}, {size / 2**20:.0f} MiB; each rank `{WORK[args.work]}` in the image")
    print("median (min-max) of", args.repeats, "runs; one rank per node")
    print(f"{'nodes':>5} | {'shared: to all started s':>24} {'staged s':>20} {'staged/shared':>13} "
          f"| {'shared-path opens>= sh/st':>23} | {'MiB read via shared path sh/st':>30} "
          f"| {'MiB read via local copies':>25}")
    for n in nodes:
        sh, st = results["shared"][n], results["staged"][n]
        t_sh = [x["started_s"] for x in sh]
        t_st = [x["started_s"] for x in st]

        def med(rows: list[dict[str, Any]], key: str, kind: str) -> float:
            return statistics.median(x[key][kind] for x in rows)

        print(f"{n:>5} | {spread(t_sh):>24} {spread(t_st):>20} "
              f"{statistics.median(t_st) / statistics.median(t_sh):>13.2f} "
              f"| {med(sh, 'opens', 'shared'):>10.0f} / {med(st, 'opens', 'shared'):<10.0f} "
              f"| {med(sh, 'read_bytes', 'shared') / 2**20:>13.1f} / "
              f"{med(st, 'read_bytes', 'shared') / 2**20:.1f} + sbcast {size / 2**20:.0f} "
              f"| {med(st, 'read_bytes', 'local') / 2**20:>10.1f} ({med(st, 'opens', 'local'):.0f} "
              f"opens)")
    print(f"machine: {facts_line(info)}")
    print(f"reproduce: sudo python3 bench/bench_image_stage.py --nodes {args.nodes} --repeats "
          f"{args.repeats} --image {args.image} --work {args.work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
