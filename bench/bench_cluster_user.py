#!/usr/bin/env python3
"""hpcdl as a cluster user, measured: the cost of staging the job-side files into a run
directory, and the README's headline command as an ordinary user (hpcdl from a wheel in
a venv the nodes do not see, Apptainer unprivileged) against the same command as root,
on the sandbox, in pairs with the order alternating.

    sudo python3 bench/bench_cluster_user.py [--repeats 50] [--pairs 2] [--image IMG]
                                             [--json-out FILE]

--pairs 0 measures the staging only (no Slurm needed). The user is tests' hpcuser and
its venv /opt/hpcdl-user/venv (tests/integration/conftest_user.py makes both).
Root's ranks run the image as root; the user's run it unprivileged, with what MPI needs
across user namespaces (docs/guide/cluster-user.md). This machine's Apptainer has no
setuid starter, so setuid mode cannot be measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import describe, facts_line  # noqa: E402
from hpcdl.launch.staging import _job_side_files, job_side_files, stage  # noqa: E402
from tests.integration.conftest_user import VENV, ClusterUser, ensure_user  # noqa: E402

IMAGE = "/scratch/images/pytorch-horovod-cpu.sif"
HEADLINE = ("submit", "-p", "sandbox", "--nodes", "2", "--gpus", "4", "--wait")


def staging(repeats: int) -> dict[str, float]:
    """Median ms to find the job-side files (cold, by reading imports) and to copy them."""
    t0 = time.perf_counter()
    _job_side_files.cache_clear()
    files = job_side_files()
    find_ms = (time.perf_counter() - t0) * 1e3
    times, copied = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            run = Path(tmp) / f"r{i}"
            run.mkdir()
            t0 = time.perf_counter()
            copied = stage(run, files)
            times.append((time.perf_counter() - t0) * 1e3)
    return {"files": len(files), "bytes": copied, "find_ms": round(find_ms, 2),
            "stage_ms_median": round(statistics.median(times), 2),
            "stage_ms_max": round(max(times), 2)}


_ROW = re.compile(r"(images/sec|gradient sync share|wall time \(s\))\s+(\S+)")


def _table(stdout: str) -> dict[str, str]:
    """The result table's rows this benchmark reports."""
    return dict(m.groups() for line in stdout.splitlines() if (m := _ROW.fullmatch(line)))


def headline(argv: list[str], *, cwd: str, env: dict[str, str] | None = None) -> dict[str, object]:
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=cwd, env=env,
                         check=False)
    seconds = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"failed ({res.returncode}): {' '.join(argv)}\n{res.stdout}\n{res.stderr}")
    return {"seconds": round(seconds, 1), **_table(res.stdout)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--image", default=IMAGE)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    machine = describe(packages=("hpcdl", "torch"), tools=("apptainer", "sbatch"))
    out: dict[str, object] = {"machine": machine, "staging": staging(args.repeats)}
    print(f"machine: {facts_line(machine)}")
    s = out["staging"]
    print(f"staging the job-side files: {s['files']} files, {s['bytes']} bytes; finding them "  # type: ignore[index]
          f"{s['find_ms']} ms (cold), copying median {s['stage_ms_median']} ms, "  # type: ignore[index]
          f"max {s['stage_ms_max']} ms over {args.repeats}")  # type: ignore[index]
    if args.pairs:
        entry = ensure_user()
        user = ClusterUser(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir), VENV)
        if not (VENV / "bin" / "hpcdl").exists():
            raise SystemExit(f"no {VENV}: run tests/integration/test_headline.py once (it installs it)")
        runs = tempfile.mkdtemp(prefix="bench-root-", dir="/scratch/tmp")
        rows: dict[str, list[dict[str, object]]] = {"root": [], "user": []}
        for i in range(args.pairs):
            order = ("root", "user") if i % 2 == 0 else ("user", "root")
            for who in order:
                if who == "root":
                    rows["root"].append(headline(
                        [sys.executable, "-m", "hpcdl", *HEADLINE, "--image", args.image],
                        cwd=runs, env={**os.environ, "HPCDL_RUNS": runs}))
                else:
                    argv = [user.hpcdl, *HEADLINE, "--image", args.image]
                    t0 = time.monotonic()
                    res = user.run(argv, timeout=900)
                    if res.returncode != 0:
                        raise SystemExit(f"user run failed:\n{res.stdout}\n{res.stderr}")
                    rows["user"].append({"seconds": round(time.monotonic() - t0, 1),
                                         **_table(res.stdout)})
                print(f"pair {i + 1} {who}: {rows[who][-1]}")
        out["headline"] = rows
        print("\nheadline command (2 nodes x 4 ranks, ResNet-50, Horovod, 10 steps), medians:")
        print(f"{'who':<6} {'command->table s':>17} {'images/sec':>11} {'sync share':>11}")
        for who, found in rows.items():
            med = statistics.median(float(r["seconds"]) for r in found)  # type: ignore[arg-type]
            ips = statistics.median(float(str(r.get("images/sec", "nan"))) for r in found)
            sync = [str(r.get("gradient sync share", "?")) for r in found]
            print(f"{who:<6} {med:>17.1f} {ips:>11.2f} {'/'.join(sync):>11}")
    print(f"\nrerun: sudo python3 bench/bench_cluster_user.py --repeats {args.repeats} "
          f"--pairs {args.pairs}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
