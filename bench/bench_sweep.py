"""What a hyperparameter sweep costs the scheduler: submit time and Slurm commands for 10,
100 and 1,000 points as one job array (`hpcdl sweep`) against one job per point (what
`hpcdl scale` does), and the Slurm commands per polling cycle while following 1,000 array
tasks (hpcdl.jobs.follow.Watcher, as `hpcdl sweep --wait` does; goal: one).

Two kinds of run:
  fake  tests/fakeslurm's scripted sbatch/squeue/sacct started as programs (one process
        per command, as real Slurm's are; no cluster): exact command counts, times that
        include a Python start per command.
  real  the sandbox cluster (--real 10,100): the same submissions of a `true` command,
        cancelled right after submission so the shared sandbox is not kept busy.

Every point is planned (checked) in both variants; the times are planning + writing the
run directories + submitting.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import FAKE_BIN, counting, shared_tmp  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402
from hpcdl.jobs.follow import Watcher  # noqa: E402
from hpcdl.jobs.submit import submit  # noqa: E402
from hpcdl.plan import JobRequest  # noqa: E402
from hpcdl.profiles import load_profile  # noqa: E402
from hpcdl.schedulers.slurm.adapter import SlurmScheduler  # noqa: E402
from hpcdl.sweep.arrays import plan_array, submit_array  # noqa: E402
from hpcdl.sweep.params import grid  # noqa: E402


@contextmanager
def fake_slurm(work: Path, scenario: str) -> Iterator[None]:
    state = work / "fakeslurm"
    state.mkdir(parents=True)
    (state / "scenario.json").write_text(scenario)
    saved = {k: os.environ.get(k) for k in ("FAKE_SLURM_DIR", "PATH")}
    os.environ["FAKE_SLURM_DIR"] = str(state)
    os.environ["PATH"] = f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def planned(n: int, sweep_dir: Path) -> Any:
    profile = load_profile("sandbox")
    base = JobRequest.of(nodes=1, gpus=1, cpus_per_task=1, command=("true", "{x}"),
                      job_name="bench-sweep")
    return profile, plan_array(profile, base, grid([("x", tuple(str(i) for i in range(n)))]),
                               sweep_dir=sweep_dir)


def submit_case(n: int, how: str, runs: Path) -> dict[str, Any]:
    """Plan ``n`` points and submit them as one array or one job each."""
    scheduler = SlurmScheduler("sandbox")
    sweep_dir = runs / f"sweep-{how}-{n}"
    with counting() as counts:
        start = time.perf_counter()
        profile, plan = planned(n, sweep_dir)
        planned_at = time.perf_counter()
        if how == "array":
            record = submit_array(profile, plan, scheduler=scheduler, live_check=False)
            ids = [record["arrays"][0]["job_id"]]
        else:
            sweep_dir.mkdir(parents=True)
            ids = [submit(profile, p, scheduler=scheduler, live_check=False).job_id
                   for p in plan.plans]
        end = time.perf_counter()
    return {"points": n, "how": how, "plan_s": planned_at - start, "submit_s": end - planned_at,
            "total_s": end - start, "sbatch": counts["sbatch"],
            "commands": sum(counts.values()), "ids": ids}


def follow_case(n: int, runs: Path, throttle: int) -> dict[str, Any]:
    """Submit ``n`` points as one array (%throttle) to the fake and follow every task with
    the Watcher, no sleeping; the Slurm commands of each cycle."""
    scheduler = SlurmScheduler("sandbox")
    profile, plan = planned(n, runs / f"sweep-follow-{n}")
    plan = type(plan)(**{**plan.__dict__, "array": f"0-{n - 1}%{throttle}"})
    record = submit_array(profile, plan, scheduler=scheduler, live_check=False)
    ids = [str(p["job_id"]) for p in record["points"]]
    per_cycle: list[int] = []
    with counting() as counts:
        seen = [0]

        def polled(_pending: Any, _elapsed: float) -> None:
            total = sum(counts.values())
            per_cycle.append(total - seen[0])
            seen[0] = total

        start = time.perf_counter()
        Watcher(scheduler, sleep=lambda _s: None).watch(ids, on_poll=polled)
        elapsed = time.perf_counter() - start
    return {"tasks": n, "cycles": len(per_cycle), "max": max(per_cycle),
            "mean": sum(per_cycle) / len(per_cycle), "by_tool": dict(counts),
            "elapsed_s": elapsed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--points", default="10,100,1000",
                    help="sweep sizes for the submit figures (default: %(default)s)")
    ap.add_argument("--follow", type=int, default=1000,
                    help="array tasks followed for the per-cycle figure (default: %(default)s)")
    ap.add_argument("--throttle", type=int, default=100,
                    help="the followed array's %%M (default: %(default)s)")
    ap.add_argument("--real", default="",
                    help="also submit these sizes to the sandbox (e.g. 10,100), then cancel")
    args = ap.parse_args()
    sizes = [int(x) for x in args.points.split(",") if x]
    work = shared_tmp("bench-sweep-")  # the real jobs' run dirs: the nodes see /scratch
    os.environ["HPCDL_RUNS"] = str(work / "runs")
    rows = []
    try:
        with fake_slurm(work, '{"default": {"states": [["PENDING", 1], ["RUNNING", 2], '
                              '["COMPLETED", 0]]}, "min_job_age": 1000}'):
            for n in sizes:
                for how in ("array", "per-job"):
                    rows.append({**submit_case(n, how, work / "runs"), "slurm": "fake"})
            follow = follow_case(args.follow, work / "runs", args.throttle)
        for n in [int(x) for x in args.real.split(",") if x]:
            if shutil.which("sbatch") is None:
                print("sbatch not found: start the sandbox or leave out --real", file=sys.stderr)
                return 2
            for how in ("array", "per-job"):
                row = submit_case(n, how, work / "runs-real")
                SlurmScheduler("sandbox").cancel(row["ids"])
                rows.append({**row, "slurm": "sandbox"})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("hpcdl sweep: submitting N points as one job array vs one job per point")
    print(f"{'slurm':<8} {'points':>6} {'how':<8} {'plan s':>7} {'submit s':>9} {'total s':>8} "
          f"{'sbatch':>6} {'commands':>8}")
    for r in rows:
        print(f"{r['slurm']:<8} {r['points']:>6} {r['how']:<8} {r['plan_s']:>7.2f} "
              f"{r['submit_s']:>9.2f} {r['total_s']:>8.2f} {r['sbatch']:>6} {r['commands']:>8}")
    print(f"following {follow['tasks']} array tasks (%{args.throttle}) to their end: "
          f"{follow['cycles']} cycles, Slurm commands per cycle mean {follow['mean']:.2f}, "
          f"max {follow['max']} ({follow['by_tool']}), {follow['elapsed_s']:.1f} s")
    print("machine: " + facts_line(describe(tools=("squeue",))))
    real = f" --real {args.real}" if args.real else ""
    print(f"reproduce: python3 bench/bench_sweep.py --points {args.points} --follow "
          f"{args.follow} --throttle {args.throttle}{real}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
