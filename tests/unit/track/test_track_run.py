"""hpcdl/track/run.py with sinks of the test's own (the Sink protocol run.py takes) and
real run directories: one pass over many runs, following until every job has ended
(the scheduler asked only about runs without a result), and the totals over cycles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcdl.jobs.rundir import JobRecord, make_run_dir
from hpcdl.schedulers.base import JobState, JobStatus
from hpcdl.track.run import Sinks, Totals, follow, track_once
from hpcdl.track.source import RunSource


class Recorder:
    """A sink that records what it was given (TensorBoard's and MLflow's stand-in)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, Any]] = []

    def track(self, source: RunSource, **kw: Any) -> dict[str, Any]:
        self.seen.append((source.run_id, len(source.points), kw))
        return {"steps": len(source.points), "created": not self.seen[:-1], "last": source.state}

    def close(self) -> None:
        self.seen.append(("closed", 0, {}))


class Slurm:
    """Answers statuses from a script; remembers what it was asked."""

    label = "Slurm"

    def __init__(self, answers: list[dict[str, JobStatus]]) -> None:
        self.answers, self.asked = answers, []

    def available(self) -> bool:
        return True

    def statuses(self, ids: list[str]) -> dict[str, JobStatus]:
        self.asked.append(list(ids))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def __getattr__(self, name: str) -> Any:  # anything else the refresh path asks
        raise AssertionError(f"unexpected scheduler call: {name}")


def run_dir(root: Path, name: str, *, job: str | None = None, result: bool = False) -> Path:
    run = make_run_dir(root / name)
    run.write_plan("#!/bin/bash\n", {"nodes": 1, "gpus_per_node": 0, "ntasks": 1})
    if job:
        run.write_job(JobRecord(job, ["sbatch"], "t"))
    if result:
        run.write_result({"state": "COMPLETED", "exit_code": 0})
    return run.path


def test_totals_sum_counts_keep_flags_and_take_the_last_state():
    totals = Totals()
    totals.add({"run": "r", "steps": 3, "state": None, "ranks": 2,
                "tensorboard": {"steps": 3, "created": True, "dir": "/tb/r"}})
    totals.add({"run": "r", "steps": 5, "state": "COMPLETED", "ranks": 2,
                "tensorboard": {"steps": 2, "created": False, "dir": None}})
    (got,) = totals.runs.values()
    assert got["tensorboard"] == {"steps": 5, "created": True, "dir": "/tb/r"}
    assert (got["steps"], got["state"]) == (5, "COMPLETED")


def test_one_pass_goes_to_every_sink(tmp_path):
    tb, ml = Recorder(), Recorder()
    sinks = Sinks(tensorboard=tb, mlflow=ml, dry_run=True)
    out = track_once([run_dir(tmp_path, "a"), run_dir(tmp_path, "b")], sinks)
    assert [e["run"] for e in out] == ["a", "b"] and out[0]["tensorboard"]["steps"] == 0
    assert [kw for _, _, kw in tb.seen] == [{"dry_run": True}] * 2
    assert [kw for _, _, kw in ml.seen] == [{"report": True}] * 2
    sinks.close()
    assert tb.seen[-1][0] == "closed"
    assert set(track_once([tmp_path / "a"], Sinks())[0]) == {"run", "path", "ranks", "steps", "state"}


def test_following_ends_when_every_job_has(tmp_path):
    done = run_dir(tmp_path, "done", job="1", result=True)
    going = run_dir(tmp_path, "going", job="2")
    slurm = Slurm([{"2": JobStatus("2", "j", JobState.RUNNING, "RUNNING")},
                   {"2": JobStatus("2", "j", JobState.RUNNING, "RUNNING")},
                   {"2": JobStatus("2", "j", JobState.COMPLETED, "COMPLETED", exit_code=0)}])
    ml = Recorder()
    cycles: list[int] = []
    sleeps: list[float] = []
    totals = follow([done, going], Sinks(mlflow=ml), scheduler=slurm, interval=7,
                    on_cycle=lambda entries, left: cycles.append(left), sleep=sleeps.append)
    assert slurm.asked == [["2"], ["2"], ["2"]]  # the run with a result is never asked about
    assert cycles == [1, 1, 0] and sleeps == [7, 7]
    # Each run got its last pass with the report once its job had ended.
    reports = [(run, kw["report"]) for run, _, kw in ml.seen if kw["report"]]
    assert reports == [("done", True), ("going", True)]
    assert {t["run"]: t["state"] for t in totals} == {"done": "COMPLETED", "going": "COMPLETED"}


def test_a_directory_never_submitted_is_not_waited_for(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    totals = follow([bare], Sinks(), scheduler=Slurm([{}]), sleep=lambda s: None)
    assert [t["run"] for t in totals] == ["bare"]
