"""hpcdl/jobs/status.py on real run directories with a scripted scheduler (the Scheduler
job_snapshot takes): what `hpcdl status` adds to the scheduler's row: attempts from
attempts.tsv, whether a step completed, the node count, the stderr of an attempt that
failed before its first step, recoveries and excluded nodes."""

from __future__ import annotations

import pytest

from hpcdl.jobs import rundir
from hpcdl.jobs.rundir import JobRecord, make_run_dir
from hpcdl.jobs.status import job_snapshot
from hpcdl.launch.nodes import BAD_NODES_NAME
from hpcdl.schedulers.base import JobState, JobStatus
from hpcdl.schedulers.registry import run_files


class Scripted:
    """A scheduler that knows one job and has no accounting history."""

    def __init__(self, status: JobStatus) -> None:
        self._status = status
        self.settle: list[float] = []

    def status(self, job_id: str, *, settle_s: float = 0) -> JobStatus:
        self.settle.append(settle_s)
        return self._status

    def history(self, job_id: str) -> list[JobStatus]:
        return []


FAILED = JobStatus("7", "j", JobState.FAILED, "FAILED", exit_code=1)


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCDL_RUNS", str(tmp_path))
    r = make_run_dir(tmp_path / "j-1")
    r.write_plan("#!/bin/bash\n", {"nodes": 3, "gpus_per_node": 0, "ntasks": 3,
                                   "records_steps": True})
    r.write_job(JobRecord("7", ["sbatch"], "t"))
    return r


def test_an_attempt_that_failed_before_its_first_step_shows_its_stderr(run):
    run.attempts_log.write_text("7\t0\t100\t160\t1\tSTARTUP\nhalf a li")
    _, err = run.logs("7")
    err.write_text("Traceback ...\nModuleNotFoundError: No module named 'timm'\n")
    (run.path / BAD_NODES_NAME).write_text("n3\tgate: no GPU\n")
    sched = Scripted(FAILED)
    snap = job_snapshot("7", sched)
    assert sched.settle == [3]
    assert snap.run is not None and snap.run.path == run.path
    assert [(a.number, a.reason, a.exit_code) for a in snap.attempts] == [(0, "STARTUP", 1)]
    assert snap.steps is False and snap.nodes == 3
    assert snap.stderr.endswith("No module named 'timm'\n")
    assert snap.excluded == [{"node": "n3", "why": "gate: no GPU"}] and snap.recoveries == []


def test_a_job_that_trained_shows_no_stderr(run):
    run.attempts_log.write_text("7\t0\t100\t160\t1\tFAILED\n")
    run.logs("7")[1].write_text("boom\n")
    run.progress.write_text('{"attempt": 0, "step": 1}\n')
    snap = job_snapshot("7", Scripted(FAILED))
    assert snap.steps is True and snap.stderr == ""


def test_a_job_without_its_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCDL_RUNS", str(tmp_path))
    snap = job_snapshot("8", Scripted(JobStatus("8", "x", JobState.RUNNING, "RUNNING")))
    assert (snap.run, snap.attempts, snap.steps, snap.nodes, snap.stderr) == (None, [], None, 1, "")
    assert rundir.find_run("8") is None
    assert run_files().logs("8")[1].endswith(".err")
