#!/usr/bin/env python3
"""Spare nodes (submit --spares): how long from a node's death to training again, inside
the allocation against a requeue through the queue; what the health gate costs on 2 to
16 nodes; what the guard costs a healthy run.

A cluster of its own is started beside the sandbox for each part (own directory, ports,
subnet, node names; a network namespace per node; no slurmdbd) and stopped at the end,
whatever happens. The job is the bundled example in the CPU image (ResNet-18, 32 px,
synthetic, 30 steps, a checkpoint every 5, --step-sleep 1), 2 ranks on 2 nodes.

- recovery (3 nodes, per backend): with --spares 1, every process of an active node is
  killed once the checkpoint of step 10 exists. Split from the job's own records:
  detection (death -> the guard's verdict, recoveries.tsv), gate + release (verdict ->
  relaunch), start (relaunch -> the example's process start, container and imports),
  rendezvous + checkpoint load + first step (start -> first step), and steps lost.
- requeue (3 nodes, --requeue, no spares, the first backend): the same death;
  Slurm declares the node down after SlurmdTimeout (lowered to 20 s here, 300 s by
  default), ends the job NODE_FAIL and requeues it; the requeued job waits Slurm's own
  hold (BeginTime, about 2 minutes; not released) and starts again on the nodes left.
- gate (2, 4, 8, 16 nodes): a job of N-1 nodes with 1 spare whose command is `true`;
  the gate's own time from its log line (all nodes, container start included).
- healthy overhead (3 nodes, one cluster, --repeats rounds in rotating order): the same
  run without spares, with --spares 1, and with --spares 1 and no heartbeat (the job
  rendered with hpcdl.launch.nodes.HEARTBEAT_DEAD_S = 0, which the guard reads as "no
  heartbeat step"; no user option), 150 steps each: wall time from submit to the end and
  the example's steps/s (images/s over the global batch, first step excluded).
- probe (3 nodes, the first backend): one node's link rate-limited to 200 Mbit/s
  (``sandbox.sh shape``) before a job with --spares 1 --probe-first; the probe's own time
  (its report's elapsed_s), the node it names and the nodes the training ran on.

- --baseline DIR (recovery only): the same death with the hpcdl of another checkout
  (e.g. ``git archive main | tar -x -C DIR``) submitting the job, alternating with this
  tree's in the same run, so both meet the same machine load.

    sudo python3 bench/bench_spares.py [--repeats 1] [--backends ddp,horovod]
         [--gate-nodes 2,4,8,16] [--parts recovery,requeue,gate,healthy,probe]
         [--baseline DIR] [--image SIF] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import own_cluster, run, spread  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402
from tests.own_cluster import (  # noqa: E402
    kill_node,
    netns_name,
    wait_checkpoint,
)

SANDBOX = REPO / "scripts" / "sandbox.sh"
EXAMPLE = ["-G", "1", "--synthetic", "-X", "--arch=resnet18", "-X", "--max-steps=30",
           "-X", "--epochs=1", "-X", "--checkpoint-every=5"]
PARTS = ("recovery", "requeue", "gate", "healthy", "probe")
GATE = re.compile(r"hpcdl: gate: (\d+) of (\d+) nodes healthy in ([0-9.]+) s")


def cluster(nodes: int, slurmd_timeout: int | None = None
            ) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """A cluster of ``nodes`` of its own (bench.common.own_cluster); yields env, profile,
    node names, directory."""
    return own_cluster(nodes, "bs", slurmd_timeout)


# ``python -m hpcdl`` with the node guard's heartbeat off: the job script then exports
# HPCDL_HB_DEAD_S=0 and the guard starts no heartbeat step (the healthy part's third run).
NO_HEARTBEAT = ("import runpy, hpcdl.launch.nodes as n; n.HEARTBEAT_DEAD_S = 0; "
                "runpy.run_module('hpcdl', run_name='__main__', alter_sys=True)")


def hpcdl(args: list[str], env: dict[str, str], timeout: float = 900, tree: Path = REPO,
          heartbeat: bool = True) -> subprocess.CompletedProcess[str]:
    """``hpcdl ARGS``, from ``tree`` (this checkout, or --baseline's): python -m puts the
    working directory first on sys.path, so that tree's hpcdl renders and stages the job.
    ``heartbeat`` False (this tree only): the job is rendered without the guard's heartbeat."""
    if tree == REPO:
        head = ["-m", "hpcdl"] if heartbeat else ["-c", NO_HEARTBEAT]
        return run([sys.executable, *head, *args], env, timeout=timeout, check=False)
    return subprocess.run([sys.executable, "-m", "hpcdl", *args], capture_output=True,
                          text=True, timeout=timeout, check=False, cwd=tree,
                          env={**os.environ, **env, "PYTHONPATH": str(tree),
                               "PYTHONDONTWRITEBYTECODE": "1"})


def wait_end(job: str, env: dict[str, str], timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while run(["squeue", "-h", "-j", job, "-o", "%T"], env, check=False).stdout.strip():
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job} still there after {timeout} s")
        time.sleep(1)


def result_of(log: str) -> dict[str, Any]:
    line = next(x for x in reversed(log.splitlines()) if "hpcdl_result" in x)
    return dict(json.loads(line.split(": ", 1)[1])["hpcdl_result"])


def submit(c: dict[str, Any], run_dir: Path, extra: list[str], backend: str,
           tree: Path = REPO) -> str:
    res = hpcdl(["submit", "--json", "-p", str(c["profile"]), "-N", "2", "--image",
                 c["image"], "--backend", backend, *EXAMPLE, *extra, "--run-dir",
                 str(run_dir)], c["env"], tree=tree)
    if res.returncode != 0:
        raise RuntimeError(res.stdout + res.stderr)
    return str(json.loads(res.stdout.strip().splitlines()[-1])["job_id"])


def recovery(image: str, backend: str, tree: Path = REPO) -> dict[str, Any]:
    with cluster(3) as c:
        c["image"] = image
        run_dir = Path(c["env"]["HPCDL_RUNS"]) / f"spare-{backend}"
        job = submit(c, run_dir, ["--spares", "1", "-X", "--step-sleep=1"], backend, tree)
        wait_checkpoint(run_dir, 10)
        died = kill_node(c["dir"], c["nodes"][1])
        wait_end(job, c["env"])
        from hpcdl.jobs import recoveries
        (rec,) = recoveries.read(run_dir, job)
        result = result_of((run_dir / f"slurm-{job}.out").read_text())
        first = rec.first_step_at or float("nan")
        return {"backend": backend, "code": "this tree" if tree == REPO else str(tree),
                "load": os.getloadavg()[0], "how": rec.how, "steps_lost": rec.steps_lost,
                "detect_s": rec.detected_at - died,
                "gate_s": (rec.relaunched_at or rec.detected_at) - rec.detected_at,
                "start_s": result["started_at"] - (rec.relaunched_at or 0),
                "first_step_s": first - result["started_at"],
                "total_s": first - died, "checksum": result["param_checksum"]}


def requeue(image: str, backend: str) -> dict[str, Any]:
    with cluster(3, slurmd_timeout=20) as c:
        c["image"] = image
        run_dir = Path(c["env"]["HPCDL_RUNS"]) / f"requeue-{backend}"
        job = submit(c, run_dir, ["--requeue", "-X", "--step-sleep=1"], backend)
        wait_checkpoint(run_dir, 10)
        died = kill_node(c["dir"], c["nodes"][1])
        wait_end(job, c["env"], timeout=1500)
        result = result_of((run_dir / f"slurm-{job}.out").read_text())
        return {"backend": backend, "total_s": result["first_step_at"] - died,
                "start_to_first_step_s": result["first_step_at"] - result["started_at"],
                "checksum": result["param_checksum"]}


def gate(image: str, nodes: int) -> float:
    with cluster(nodes) as c:
        run_dir = Path(c["env"]["HPCDL_RUNS"]) / "gate"
        res = hpcdl(["submit", "--wait", "-p", str(c["profile"]), "-N", str(nodes - 1),
                     "-G", "0", "--spares", "1", "--image", image, "--run-dir", str(run_dir), "--",
                     "true"], c["env"])
        found = GATE.findall(res.stdout + res.stderr) or GATE.findall(
            "".join(p.read_text() for p in run_dir.glob("slurm-*.err")))
        if res.returncode != 0 or not found:
            raise RuntimeError(f"gate job on {nodes} nodes: {res.stdout}{res.stderr}")
        return float(found[0][2])


HEALTHY: tuple[tuple[str, list[str], bool], ...] = (
    ("plain", [], True), ("spares", ["--spares", "1"], True),
    ("spares, no heartbeat", ["--spares", "1"], False))
# A healthy run is longer than the others' 30 steps (~5 s of steps): a per-second cost
# such as the heartbeat's would drown in the start's noise.
HEALTHY_STEPS = 150


class HeartbeatCpu(threading.Thread):
    """While a job runs on the cluster in ``folder``: the CPU time (user + system, the
    reaped children's too) of the heartbeat's processes there, sampled every second:
    its srun on the batch host, its slurmstepd ([JOB.STEP] of the step named
    hpcdl-heartbeat) and its task (the bash loop and its sleeps) on each node. Only
    processes in the cluster's network namespaces count (other clusters' jobs run
    beside it). ``stop()`` returns the seconds."""

    def __init__(self, folder: Path, nodes: list[str], env: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.env, self.done = env, threading.Event()
        self.seen: dict[str, int] = {}
        self.netns = {os.stat(f"/run/netns/{netns_name(folder, n)}").st_ino for n in nodes}

    def run(self) -> None:
        while not self.done.wait(1):
            out = run(["squeue", "-h", "-s", "-o", "%i %j"], self.env, check=False).stdout
            steps = [f"slurmstepd: [{line.split()[0]}]".encode() for line in out.splitlines()
                     if line.endswith(" hpcdl-heartbeat")]
            for pid in (x for x in os.listdir("/proc") if x.isdigit()):
                try:
                    if os.stat(f"/proc/{pid}/ns/net").st_ino not in self.netns:
                        continue
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if not (b"hpcdl-beat" in cmd or b"--job-name=hpcdl-heartbeat" in cmd
                            or any(cmd.startswith(s) for s in steps)):
                        continue
                    stat = Path(f"/proc/{pid}/stat").read_text()
                except OSError:
                    continue  # (ended meanwhile)
                ticks = sum(int(x) for x in stat[stat.rindex(")") + 2:].split()[11:15])
                self.seen[pid] = max(self.seen.get(pid, 0), ticks)

    def stop(self) -> float:
        self.done.set()
        self.join()
        return sum(self.seen.values()) / os.sysconf("SC_CLK_TCK")


def healthy(image: str, backend: str, rounds: int) -> list[dict[str, Any]]:
    """``rounds`` rounds of HEALTHY's three runs on one cluster, the order rotated each
    round (so none always runs first, or after the same one)."""
    out: list[dict[str, Any]] = []
    with cluster(3) as c:
        for k in range(rounds):
            for i in range(len(HEALTHY)):
                label, extra, heartbeat = HEALTHY[(i + k) % len(HEALTHY)]
                run_dir = Path(c["env"]["HPCDL_RUNS"]) / f"{k}-{label.replace(', ', '-').replace(' ', '-')}"
                cpu = HeartbeatCpu(c["dir"], c["nodes"], c["env"])
                cpu.start()
                t0 = time.monotonic()
                res = hpcdl(["submit", "--wait", "-p", str(c["profile"]), "-N", "2", "--image",
                             image, "--backend", backend, *EXAMPLE,
                             "-X", f"--max-steps={HEALTHY_STEPS}", *extra, "--run-dir",
                             str(run_dir)], c["env"], heartbeat=heartbeat)
                hb_cpu = cpu.stop()
                if res.returncode != 0:
                    raise RuntimeError(res.stdout + res.stderr)
                script = (run_dir / "job.sbatch").read_text()
                if extra and ("export HPCDL_HB_DEAD_S=0" in script) == heartbeat:
                    raise RuntimeError(f"{label}: the job script's heartbeat is not as asked")
                result = result_of(res.stdout)
                out.append({"label": label, "round": k, "wall_s": time.monotonic() - t0,
                            "images_per_sec": result["images_per_sec"],
                            "steps_per_sec": result["images_per_sec"] / result["global_batch"],
                            "heartbeat_cpu_s": hb_cpu,
                            "load": os.getloadavg()[0]})
                print(f"measured: healthy {out[-1]}", file=sys.stderr, flush=True)
    return out


def slowed(image: str, backend: str) -> dict[str, Any]:
    with cluster(3) as c:
        slow = c["nodes"][1]
        run(["bash", str(SANDBOX), "shape", slow, "--rate", "200"], c["env"])
        run_dir = Path(c["env"]["HPCDL_RUNS"]) / "probe"
        t0 = time.monotonic()
        res = hpcdl(["submit", "--wait", "--json", "-p", str(c["profile"]), "-N", "2",
                     "--image", image, "--backend", backend, *EXAMPLE, "--spares", "1",
                     "--probe-first", "--probe-sizes", "4K,64K,1M", "--run-dir", str(run_dir)], c["env"])
        if res.returncode != 0:
            raise RuntimeError(res.stdout + res.stderr)
        out = json.loads(res.stdout.strip().splitlines()[-1])
        hosts = sorted(set(re.findall(r"hpcdl_rank_checksum rank=\d+ host=(\S+)",
                                      (run_dir / f"slurm-{out['job_id']}.out").read_text())))
        return {"backend": backend, "slowed": slow, "probe_s": out["probe"]["elapsed_s"],
                "named": out["probe"]["verdict"]["slow_nodes"], "trained_on": hosts,
                "wall_s": time.monotonic() - t0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--backends", default="ddp,horovod")
    parser.add_argument("--gate-nodes", default="2,4,8,16")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"which parts to measure (default all: {','.join(PARTS)})")
    cache = os.environ.get("HPCDL_CACHE") or "/var/cache/hpcdl"
    parser.add_argument("--image", default="/scratch/images/pytorch-horovod-cpu.sif",
                        help=f"the CPU image where the nodes see it (built in {cache}/images)")
    parser.add_argument("--baseline", type=Path,
                        help="recovery: also with the hpcdl of this checkout, alternating")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_spares: needs root (starts Slurm daemons, network namespaces)",
              file=sys.stderr)
        return 2
    if not Path(args.image).is_file():
        print(f"bench_spares: no image at {args.image} (make demo publishes it)",
              file=sys.stderr)
        return 2
    backends = args.backends.split(",")
    data: dict[str, Any] = {"recovery": [], "requeue": [], "gate": {}, "healthy": [],
                            "probe": []}
    parts = args.parts.split(",")
    if unknown := set(parts) - set(PARTS):
        parser.error(f"--parts: {','.join(sorted(unknown))} not among {','.join(PARTS)}")
    for _ in range(args.repeats):
        if "probe" in parts:
            data["probe"].append(slowed(args.image, backends[0]))
            print(f"measured: {data['probe'][-1]}", file=sys.stderr, flush=True)
        for backend in backends if "recovery" in parts else ():
            for tree in (REPO, args.baseline) if args.baseline else (REPO,):
                data["recovery"].append(recovery(args.image, backend, tree))
                print(f"measured: {data['recovery'][-1]}", file=sys.stderr, flush=True)
        if "requeue" in parts:  # the queue's cost does not depend on the backend
            data["requeue"].append(requeue(args.image, backends[0]))
            print(f"measured: {data['requeue'][-1]}", file=sys.stderr, flush=True)
        for n in (int(x) for x in args.gate_nodes.split(",") if "gate" in parts):
            data["gate"].setdefault(str(n), []).append(gate(args.image, n))
            print(f"measured: gate {n} {data['gate'][str(n)][-1]}", file=sys.stderr, flush=True)
    if "healthy" in parts:  # one cluster, --repeats rounds (the runs side by side)
        data["healthy"] = healthy(args.image, backends[0], args.repeats)
    machine = describe(packages=("torch",), tools=("sbatch", "apptainer"))
    print("spare nodes: the bundled example (ResNet-18, 32 px, 2 ranks on 2 nodes, 30 steps, a "
          "checkpoint every 5) in the CPU image; a node's processes all killed after step 10")
    print(f"machine: {facts_line(machine)}")
    print(f"{'backend':<8} {'detect s':>9} {'gate s':>7} {'start s':>8} {'1st step s':>10} "
          f"{'death->step s':>13} {'lost':>5} {'load':>5}  code: how")
    for r in data["recovery"]:
        print(f"{r['backend']:<8} {r['detect_s']:>9.1f} {r['gate_s']:>7.1f} {r['start_s']:>8.1f} "
              f"{r['first_step_s']:>10.1f} {r['total_s']:>13.1f} {r['steps_lost']!s:>5} "
              f"{r['load']:>5.1f}  {r['code']}: {r['how']}")
    for backend in backends:
        for code in dict.fromkeys(r["code"] for r in data["recovery"]):
            totals = [r["total_s"] for r in data["recovery"]
                      if r["backend"] == backend and r["code"] == code]
            if totals:
                print(f"{backend} ({code}): death -> first step {spread(totals, '{:.1f}')} s "
                      f"over {len(totals)}")
    for r in data["requeue"]:
        print(f"requeue through the queue ({r['backend']}, SlurmdTimeout 20 s, Slurm's own "
              f"hold): death -> first step {r['total_s']:.1f} s")
    for n, values in data["gate"].items():
        print(f"gate on {n:>2} nodes: {spread(values)} s")
    for label, _, _ in HEALTHY if data["healthy"] else ():
        rows = [h for h in data["healthy"] if h["label"] == label]
        print(f"healthy run, {label}: steps/s {spread([h['steps_per_sec'] for h in rows], '{:.3f}')}, "
              f"wall {spread([h['wall_s'] for h in rows], '{:.1f}')} s over {len(rows)}")
    if data["healthy"]:
        on, off = ([h["steps_per_sec"] for h in data["healthy"] if h["label"] == x]
                   for x in ("spares", "spares, no heartbeat"))
        diff = (statistics.median(on) / statistics.median(off) - 1) * 100
        print(f"the heartbeat's cost on a healthy run: medians {statistics.median(on):.3f} vs "
              f"{statistics.median(off):.3f} steps/s ({diff:+.1f}%)")
        rows = [h for h in data["healthy"] if h["label"] == "spares"]
        cpu = sum(h["heartbeat_cpu_s"] for h in rows)
        wall = sum(h["wall_s"] for h in rows)
        print(f"the heartbeat's CPU (its srun, slurmstepd and task on 3 nodes): {cpu:.2f} s "
              f"over {wall:.0f} s of submit -> end ({100 * cpu / wall:.2f}% of one core)")
    for p in data["probe"]:
        print(f"a node slowed before the start ({p['slowed']}, 200 Mbit/s): --probe-first "
              f"took {p['probe_s']:.1f} s on 3 nodes, named {','.join(p['named']) or 'none'}; "
              f"the training ran on {','.join(p['trained_on'])}; submit -> end "
              f"{p['wall_s']:.1f} s")
    print(f"reproduce: sudo python3 bench/bench_spares.py --repeats {args.repeats} "
          f"--backends {args.backends} --gate-nodes {args.gate_nodes}"
          + (f" --parts {args.parts}" if parts != list(PARTS) else "")
          + (f" --baseline {args.baseline}" if args.baseline else ""))
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": machine, **data}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
