#!/usr/bin/env python3
"""hpcdl on each Slurm release, side by side in one run (issue 41): the host sandbox's
22.05 and the 24.11 and 26.05 release sandboxes (`hpcdl sandbox up --slurm R --nodes 3`,
brought up here in a directory of the bench's own and taken down at the end). Per release:

  submit    hpcdl's own time over plain sbatch: `hpcdl submit -N 1 -G 0 --no-image -- true`
            against `sbatch --parsable --wrap true` of the same release, in pairs, the
            order alternating; the median of each and of hpcdl - sbatch.
  requeue   the requeue through the queue: a `submit --requeue --no-image -N 2` job whose
            ranks print when they start; once both run, `scontrol requeue` (what a node
            failure or hpcdl's own requeue asks of Slurm), then the next attempt's first
            rank: seconds from the requeue. A BeginTime hold (22.05, 24.11: ~2 min) is
            let go (StartTime=now) 2 s after it is first seen, as the tests do: the
            figure says which release held it.
  probe     `hpcdl probe -N 2 --sizes 4K,64K --iters 3 --warmup 1 --wait` natively
            (Gloo): wall seconds from the command to its verdict.
  death     a node death to the first step after the relaunch: a `submit --spares 1 -N 2
            --no-image` job (3 nodes) whose ranks print when they start; once both run,
            every process of the second active node (not the batch host) is killed for
            real (its network namespace's) and the survivor's rank ends non-zero at once,
            as a DDP rank whose peer vanished does; then the relaunched step's first rank
            on the survivor and the spare: seconds from the kill (hpcdl's guard and gate
            at their defaults). 22.05 in a 3-node cluster of the bench's own
            (bench.common.own_cluster: the shared sandbox's nodes are never killed);
            24.11 and 26.05 in their sandbox, as its last row (it is taken down after).

    sudo python3 bench/bench_releases.py [--releases 22.05,24.11,26.05] [--pairs 5]
                                         [--json-out FILE]

Only one session may bring the 24.11/26.05 sandboxes up at a time (their node names are
fixed): not beside a test run of the release matrix. Prints the machine and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import describe, facts_line  # noqa: E402
from hpcdl import sandbox as shape  # noqa: E402

HOST_RELEASE = "22.05"
NODES = 3
RANK = 'echo "rank-start $(date +%s.%N) attempt=${SLURM_RESTART_COUNT:-0} on=$(hostname)"; sleep 300'
RELEASE_AFTER_S = 2.0


class Release:
    def __init__(self, release: str, base: Path) -> None:
        self.release = release
        self.runs = base / f"runs-{release}"
        self.env = {**os.environ, "HPCDL_RUNS": str(self.runs),
                    "XDG_CONFIG_HOME": str(base / "cfg")}
        self.folder: Path | None = None
        if release == HOST_RELEASE:
            self.profile, self.bin = "sandbox", None
            self.env.pop("XDG_CONFIG_HOME")
        else:
            self.folder = Path("/var/lib") / f"hpcdl-bench-slurm-{release}-{os.getpid()}"
            self.profile = shape.profile_name(NODES, release)
            self.bin = shape.commands_dir(self.folder)
            self.env["SLURM_CONF"] = str(self.folder / "etc" / "slurm.conf")

    def hpcdl(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hpcdl", *args], capture_output=True,
                              text=True, timeout=timeout, check=False, env=self.env, cwd=REPO)

    def slurm(self, name: str, *args: str, timeout: float = 60) -> str:
        argv = [str(self.bin / name) if self.bin else name, *args]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                             check=False, env=self.env)
        return res.stdout + res.stderr

    def up(self) -> float:
        if self.folder is None:
            return 0.0
        t0 = time.perf_counter()
        res = self.hpcdl("sandbox", "up", "--slurm", self.release, "--nodes", str(NODES),
                         "--dir", str(self.folder), timeout=900)
        if res.returncode:
            raise SystemExit(f"{self.release}: sandbox up failed: {res.stderr.strip()}")
        return time.perf_counter() - t0

    def down(self) -> None:
        if self.folder is not None and self.folder.exists():
            self.hpcdl("sandbox", "down", "--slurm", self.release, "--nodes", str(NODES),
                       "--dir", str(self.folder))
            shutil.rmtree(self.folder, ignore_errors=True)


def _ok(res: subprocess.CompletedProcess[str], what: str) -> str:
    if res.returncode:
        raise SystemExit(f"{what}: exit {res.returncode}: {(res.stderr or res.stdout).strip()[-500:]}")
    return res.stdout


def measure_submit(rel: Release, pairs: int) -> dict[str, Any]:
    hp: list[float] = []
    sb: list[float] = []
    for i in range(pairs):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            t0 = time.perf_counter()
            if side == 0:
                _ok(rel.hpcdl("submit", "-p", rel.profile, "-N", "1", "-G", "0", "--no-image",
                              "--json", "--", "true"), "hpcdl submit")
                hp.append(time.perf_counter() - t0)
            else:
                out = rel.slurm("sbatch", "--parsable", "-N", "1", "-o", "/dev/null",
                                "--wrap", "true")
                if not re.match(r"^\d+", out.strip()):
                    raise SystemExit(f"sbatch: {out.strip()}")
                sb.append(time.perf_counter() - t0)
    return {"hpcdl_s": statistics.median(hp), "sbatch_s": statistics.median(sb),
            "own_s": statistics.median(hp) - statistics.median(sb)}


def _starts(out: Path) -> list[tuple[float, int]]:
    text = out.read_text() if out.exists() else ""
    return [(float(m.group(1)), int(m.group(2)))
            for m in re.finditer(r"rank-start (\d+\.\d+) attempt=(\d+)", text)]


def measure_requeue(rel: Release) -> dict[str, Any]:
    run = rel.runs / f"requeue-{os.getpid()}"
    info = json.loads(_ok(rel.hpcdl("submit", "-p", rel.profile, "-N", "2", "-G", "0",
                                    "--no-image", "--requeue", "--time", "00:05:00",
                                    "--run-dir", str(run), "--json", "--", "bash", "-c", RANK),
                          "submit --requeue").strip().splitlines()[-1])
    job = str(info["job_id"])
    out = run / f"slurm-{job}.out"
    try:
        deadline = time.monotonic() + 180
        while len([s for s in _starts(out) if s[1] == 0]) < 2:
            if time.monotonic() > deadline:
                raise SystemExit(f"{rel.release}: job {job}'s ranks did not start")
            time.sleep(0.2)
        asked = time.time()
        rel.slurm("scontrol", "requeue", job)
        held_since: float | None = None
        held = False
        deadline = time.monotonic() + 240
        while not [s for s in _starts(out) if s[1] >= 1]:
            row = rel.slurm("squeue", "-h", "-j", job, "-o", "%T|%r").strip()
            if row == "PENDING|BeginTime":
                held = True
                held_since = held_since or time.monotonic()
                if time.monotonic() - held_since >= RELEASE_AFTER_S:
                    rel.slurm("scontrol", "update", f"jobid={job}", "StartTime=now")
            if time.monotonic() > deadline:
                raise SystemExit(f"{rel.release}: job {job}'s next attempt did not start ({row})")
            time.sleep(0.2)
        first = min(t for t, a in _starts(out) if a >= 1)
        return {"requeue_to_first_rank_s": first - asked, "begin_time_hold": held}
    finally:
        rel.slurm("scancel", job)


def measure_probe(rel: Release) -> dict[str, Any]:
    t0 = time.perf_counter()
    res = rel.hpcdl("probe", "-p", rel.profile, "-N", "2", "--sizes", "4K,64K", "--iters", "3",
                    "--warmup", "1", "--wait", "--json")
    took = time.perf_counter() - t0
    out = json.loads(_ok(res, "probe").strip().splitlines()[-1])
    return {"probe_s": took, "probe_state": out.get("state")}


DEATH_RANK = r"""#!/bin/bash
echo "death-rank cycle=${HPCDL_CYCLE:-?} host=$(hostname -s) task=${SLURM_PROCID} t=$(date +%s.%N)"
if [[ ${HPCDL_CYCLE:-0} == 0 ]]; then
  until [[ -e $1 ]]; do sleep 0.2; done
  exit 3
fi
"""
DEATH_LINE = re.compile(r"death-rank cycle=(\d+) host=(\S+) task=(\d+) t=(\d+\.\d+)")


def measure_death(hpcdl_env: dict[str, str], profile: str, folder: Path, nodes: list[str],
                  slurm: Any, work: Path) -> dict[str, Any]:
    """A node death to the first step after the relaunch (see the module's docstring),
    on the 3-node cluster in ``folder`` (``nodes``), hpcdl run with ``hpcdl_env``,
    ``slurm(name, *args)`` its Slurm commands."""
    from tests.own_cluster import kill_node

    work.mkdir(parents=True, exist_ok=True)
    script, stop, run = work / "rank.sh", work / "stop", work / "death"
    script.write_text(DEATH_RANK)
    res = subprocess.run([sys.executable, "-m", "hpcdl", "submit", "--json", "-p", profile,
                          "-N", "2", "--spares", "1", "-G", "1", "--no-image", "--time",
                          "00:05:00", "--run-dir", str(run), "--", "bash", str(script),
                          str(stop)], capture_output=True, text=True, timeout=300,
                         check=False, env=hpcdl_env, cwd=REPO)
    job = str(json.loads(_ok(res, "submit --spares").strip().splitlines()[-1])["job_id"])
    out, err = run / f"slurm-{job}.out", run / f"slurm-{job}.err"

    def lines() -> list[tuple[int, str, float]]:
        text = out.read_text() if out.exists() else ""
        return [(int(m.group(1)), m.group(2), float(m.group(4)))
                for m in DEATH_LINE.finditer(text)]
    try:
        deadline = time.monotonic() + 180
        while len([x for x in lines() if x[0] == 0]) < 2:
            if time.monotonic() > deadline:
                raise SystemExit(f"death: job {job}'s first step did not start")
            time.sleep(0.2)
        victim = nodes[1]
        died = kill_node(folder, victim)
        stop.touch()
        deadline = time.monotonic() + 300
        while not [x for x in lines() if x[0] >= 1]:
            if time.monotonic() > deadline:
                tail = err.read_text()[-1500:] if err.exists() else ""
                raise SystemExit(f"death: job {job} did not relaunch in 300 s:\n{tail}")
            time.sleep(0.2)
        first = min(x[2] for x in lines() if x[0] >= 1)
        # Where the relaunch ran (evidence, not timed): both of its ranks, once printed.
        deadline = time.monotonic() + 30
        while len([x for x in lines() if x[0] >= 1]) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        relaunched = [x for x in lines() if x[0] >= 1]
        return {"death_to_relaunch_s": first - died, "death_killed": victim,
                "death_relaunch_hosts": sorted({x[1] for x in relaunched})}
    finally:
        slurm("scancel", job)


def death_row(rel: Release) -> dict[str, Any]:
    """measure_death on ``rel``'s cluster: the release sandbox's own, or for the host's
    22.05 a 3-node cluster of the bench's own."""
    if rel.folder is not None:
        assert rel.bin is not None
        return measure_death(rel.env, rel.profile, rel.folder,
                             shape.node_names(NODES, rel.release), rel.slurm,
                             rel.runs / "death")
    from bench.common import own_cluster

    with own_cluster(NODES, "brd") as c:
        env = {**os.environ, **c["env"]}

        def slurm(name: str, *args: str) -> str:
            res = subprocess.run([name, *args], capture_output=True, text=True, timeout=60,
                                 check=False, env=env)
            return res.stdout + res.stderr
        return measure_death(env, str(c["profile"]), c["dir"], c["nodes"], slurm,
                             c["runs"] / "death")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", default="22.05,24.11,26.05")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_releases: the release sandboxes need root")
    releases = [r.strip() for r in args.releases.split(",") if r.strip()]
    for r in releases:
        if r != HOST_RELEASE:
            shape.check_release(r)
    base = Path(tempfile.mkdtemp(prefix="hpcdl-bench-releases-", dir="/scratch"))
    os.chmod(base, 0o755)
    rows: dict[str, dict[str, Any]] = {}
    try:
        for r in releases:
            rel = Release(r, base)
            try:
                row: dict[str, Any] = {"up_s": rel.up()}
                row.update(measure_submit(rel, args.pairs))
                row.update(measure_requeue(rel))
                row.update(measure_probe(rel))
                # Last: it kills a node of the release sandbox, which goes down next.
                row.update(death_row(rel))
                rows[r] = row
                print(f"{r}: {json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})}",
                      flush=True)
            finally:
                rel.down()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    machine = describe()
    print()
    print("| release | sandbox up | hpcdl submit | plain sbatch | hpcdl's own | requeue -> "
          "next attempt's first rank | probe, 2 nodes | node death -> first step of the "
          "relaunch |")
    print("|---|---|---|---|---|---|---|---|")
    for r, row in rows.items():
        hold = " (BeginTime hold let go after 2 s)" if row["begin_time_hold"] else ""
        up = f"{row['up_s']:.1f} s" if r != HOST_RELEASE else "(shared, up)"
        print(f"| {r} | {up} | {row['hpcdl_s']:.2f} s | {row['sbatch_s']:.2f} s | "
              f"{row['own_s']:.2f} s | {row['requeue_to_first_rank_s']:.1f} s{hold} | "
              f"{row['probe_s']:.1f} s | {row['death_to_relaunch_s']:.1f} s |")
    print(f"\nmachine: {facts_line(machine)}")
    print("command: sudo python3 bench/bench_releases.py " + " ".join(sys.argv[1:]))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": machine, "releases": rows},
                                                  indent=2) + "\n")


if __name__ == "__main__":
    main()
