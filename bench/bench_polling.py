"""How many Slurm commands hpcdl runs while it follows jobs: per poll cycle and per
minute, for 1, 50, 200 and 1,000 jobs, with the batched Watcher (hpcdl.jobs.follow) against
per-job polling (what follow_sweep did before: squeue + scontrol/sacct for every
unfinished point every second).

Two kinds of run:
  fake  tests/fakeslurm's scripted sbatch/squeue/sacct (no cluster; jobs progress one
        step per squeue call) and a simulated clock: the counts are exact, the
        "per minute" figures follow the back-off schedule, not a real cluster's pace.
  real  the sandbox cluster (scripts/sandbox.sh up): a few `sleep` jobs followed on
        the real clock until they end.

Goal: commands per cycle constant in the number of jobs, at most 2 (squeue, plus
sacct only in a cycle where a job has ended).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import FAKE_BIN, counting, shared_tmp  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402
from hpcdl.jobs.follow import Watcher  # noqa: E402
from hpcdl.jobs.submit import plan_run, submit  # noqa: E402
from hpcdl.plan import JobRequest  # noqa: E402
from hpcdl.profiles import load_profile  # noqa: E402
from hpcdl.schedulers.base import is_final  # noqa: E402
from hpcdl.schedulers.slurm import query  # noqa: E402
from hpcdl.schedulers.slurm.adapter import SlurmScheduler  # noqa: E402


class SimClock:
    """A clock that sleeping advances: the back-off schedule without the waiting. The
    fake Slurm reads it from ``path``, so jobs progress in simulated seconds."""

    def __init__(self, path: Path) -> None:
        self.now = 0.0
        self.path = path
        path.write_text("0")

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.path.write_text(repr(self.now))


def submit_jobs(n: int, work: Path, name: str, command: tuple[str, ...]) -> list[str]:
    profile = load_profile("sandbox")
    ids = []
    for i in range(n):
        req = JobRequest.of(nodes=1, gpus=0, cpus_per_task=1, job_name=f"{name}-{i}",
                         command=command)
        ids.append(submit(profile, plan_run(profile, req, runs_under=work),
                          scheduler=SlurmScheduler(), live_check=False).job_id)
    return ids


def per_job_polling(ids: list[str], sleep: Callable[[float], None],
                    clock: Callable[[], float], max_cycles: int) -> tuple[int, float]:
    """The previous way: every unfinished job asked on its own every second (stopped
    after ``max_cycles``: its cost per cycle is what is compared)."""
    cycles, start, left = 0, clock(), set(ids)
    while left and cycles < max_cycles:
        for job_id in sorted(left):
            status = query.job_status(job_id)
            if is_final(status.state):
                query.settled(status)
                left.discard(job_id)
        cycles += 1
        if left:
            sleep(1.0)
    return cycles, clock() - start


def measure(label: str, ids_factory: Callable[[], list[str]], how: str,
            sim: SimClock | None, max_cycles: int = 10**9) -> dict[str, Any]:
    ids = ids_factory()
    clock: Any = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    if sim is not None:
        clock, sleep = sim, sim.sleep
    with counting() as counts:
        if how == "batched":
            watcher = Watcher(SlurmScheduler(), clock=clock, sleep=sleep)
            t0 = clock()
            watcher.watch(ids)
            cycles, elapsed = watcher.cycles, clock() - t0
        else:
            cycles, elapsed = per_job_polling(ids, sleep, clock, max_cycles)
    total = sum(counts.values())
    return {"case": label, "how": how, "jobs": len(ids), "cycles": cycles,
            "elapsed_s": round(elapsed, 1), "commands": dict(counts), "total": total,
            "per_cycle": round(total / max(cycles, 1), 2),
            "max_per_cycle_bound": 2 if how == "batched" else None,
            "per_minute": round(60 * total / elapsed, 1) if elapsed else None}


def fake_case(n: int, how: str, work: Path, baseline_cycles: int,
              min_job_age: int = 300) -> dict[str, Any]:
    state = work / f"fake-{how}-{n}-{min_job_age}"
    state.mkdir(parents=True)
    # Each job pends 5 s, then runs 60 to 120 s (spread by its index): the ends are
    # spread over the follow, so sacct is needed in several cycles.
    (state / "scenario.json").write_text(json.dumps({
        "default": {"states": [["PENDING", 5], ["RUNNING", 60], ["COMPLETED", 0]],
                    "spread": 10},
        "min_job_age": min_job_age, "sacct_lag": 3}))
    sim = SimClock(state / "clock")
    os.environ["FAKE_SLURM_DIR"] = str(state)
    old_path = os.environ["PATH"]
    os.environ["PATH"] = f"{FAKE_BIN}{os.pathsep}{old_path}"
    try:
        label = f"fake, {n} jobs" + (", squeue forgets" if min_job_age < 0 else "")
        return measure(label, lambda: submit_jobs(n, state / "runs", "poll", ("true",)),
                       how, sim, baseline_cycles)
    finally:
        os.environ["PATH"] = old_path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="1,50,200,1000", help="job counts for the fake runs")
    ap.add_argument("--real-jobs", type=int, default=4,
                    help="jobs for the sandbox run (0: skip it)")
    ap.add_argument("--real-seconds", type=int, default=20, help="how long each real job sleeps")
    ap.add_argument("--baseline-cycles", type=int, default=5,
                    help="cycles of per-job polling to count (it costs a command per job)")
    ap.add_argument("--baseline-max-jobs", type=int, default=50,
                    help="largest fake case that also runs the per-job baseline")
    ap.add_argument("--json-out", help="also write the rows here")
    args = ap.parse_args()
    work = shared_tmp("hpcdl-bench-polling-")  # the real jobs' run dirs: nodes see /scratch
    rows = []
    for n in (int(x) for x in args.jobs.split(",")):
        for how in ("batched", "per-job") if n <= args.baseline_max_jobs else ("batched",):
            rows.append(fake_case(n, how, work, args.baseline_cycles))
    # squeue forgetting ended jobs at once (MinJobAge=0 or a busy controller): their
    # state and exit code come from the one sacct call per cycle.
    biggest = max(int(x) for x in args.jobs.split(","))
    rows.append(fake_case(biggest, "batched", work, args.baseline_cycles, min_job_age=-1))
    if args.real_jobs:
        if not shutil.which("sbatch"):
            print("sbatch not found: start the sandbox (scripts/sandbox.sh up) or --real-jobs 0",
                  file=sys.stderr)
            return 1
        rows.append(measure(f"sandbox, {args.real_jobs} jobs",
                            lambda: submit_jobs(args.real_jobs, work / "real", "poll-real",
                                                ("sleep", str(args.real_seconds))),
                            "batched", None))
    info = describe(tools=("squeue",))
    print("Slurm commands while following jobs (hpcdl.jobs.follow.Watcher vs per-job polling)")
    print(f"{'case':<36} {'how':<8} {'cycles':>6} {'time s':>7} {'commands':>9} "
          f"{'per cycle':>9} {'per min':>8}  by tool")
    for r in rows:
        tools = " ".join(f"{k}={v}" for k, v in sorted(r["commands"].items()))
        print(f"{r['case']:<36} {r['how']:<8} {r['cycles']:>6} {r['elapsed_s']:>7} "
              f"{r['total']:>9} {r['per_cycle']:>9} {r['per_minute'] or '-':>8}  {tools}")
    worst = max(r["per_cycle"] for r in rows if r["how"] == "batched")
    print(f"goal: batched <= 2 commands per cycle whatever the number of jobs; worst seen: {worst}")
    print("fake rows: simulated clock (the back-off schedule; the fake jobs progress on it); "
          "sandbox row: real clock")
    print("machine: " + facts_line(info))
    print(f"reproduce: scripts/sandbox.sh up && python3 bench/bench_polling.py --jobs {args.jobs} "
          f"--real-jobs {args.real_jobs} --real-seconds {args.real_seconds} "
          f"--baseline-cycles {args.baseline_cycles} --baseline-max-jobs {args.baseline_max_jobs}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": info, "rows": rows}, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if worst <= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
