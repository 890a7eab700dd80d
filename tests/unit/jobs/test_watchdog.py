"""The hang watchdog's follow side (hpcdl.jobs.watchdog) without a cluster: what counts
as the job's progress, the fallback watchdog on a fake scheduler and collector (diagnose,
write, cancel or leave), finding py-spy, and submit --wait --hang-timeout against the
fake Slurm: reporting what the job's own watchdog wrote, and watching from here a job
that says it cannot. The job's watchdog (hpcdl.jobside.hangwatch) is
tests/unit/jobside/test_hangwatch.py's, its decisions tests/unit/hang/test_hang.py's; on
the real sandbox: tests/integration/test_hang_watchdog.py."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hpcdl.errors import ToolError
from hpcdl.hang import diagnosis as hang
from hpcdl.hang.actions import UNWATCHED_NAME
from hpcdl.hang.diagnosis import NodeDump, RankPid, diagnose, rank_stacks
from hpcdl.jobs.rundir import RunDir
from hpcdl.jobs.watchdog import HangWatchdog, find_py_spy, fingerprint
from hpcdl.jobside.hangwatch import hang_dump, write_hang
from hpcdl.schedulers.base import JobState, JobStatus
from tests.unit.hang.test_hang import SLEEPING, WAITING


def test_the_relaunch_request_has_one_name() -> None:
    from hpcdl.jobside import hangwatch
    from hpcdl.launch import nodes

    assert nodes.RELAUNCH_REQUEST_NAME == hangwatch.RELAUNCH_REQUEST_NAME


def test_fingerprint_sees_the_jobs_files_not_the_watchdogs(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    (tmp_path / "slurm-1.out").write_text("a")
    before = fingerprint(run)
    write_hang(run.path, {"x": 1}, "x\n", {"n1": "dump"})
    (tmp_path / "result.json").write_text("{}")
    assert fingerprint(run) == before
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step-1.pt").write_bytes(b"1")
    assert fingerprint(run) != before


class FakeScheduler:
    name = "fake"

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, job_ids: list[str]) -> None:
        self.cancelled += job_ids


def make_dog(tmp_path: Path, action: str, clock: list[float]) -> tuple[HangWatchdog, FakeScheduler,
                                                                        list]:
    run = RunDir(tmp_path)
    run.pids.mkdir()
    (run.pids / "rank-0").write_text("n1 21367\n")
    (run.pids / "rank-1").write_text("n2 21416\n")
    (tmp_path / "slurm-9.out").write_text("step 0\n")
    sched = FakeScheduler()
    seen: list = []

    def collector(job_id: str, pids: list[RankPid]):
        assert job_id == "9" and [p.rank for p in pids] == [0, 1]
        dumps = {"n1": [NodeDump("0", 21367, WAITING, 0)],
                 "n2": [NodeDump("1", 21416, SLEEPING, 0)]}
        return dumps, {"n1": "=== rank 0 ===\n" + WAITING, "n2": "=== rank 1 ===\n" + SLEEPING}, {}

    dog = HangWatchdog(run, "9", timeout=30, action=action, scheduler=sched,  # type: ignore[arg-type]
                       collector=collector, on_hang=seen.append, clock=lambda: clock[0])
    return dog, sched, seen


def running() -> dict[str, JobStatus]:
    return {"9": JobStatus("9", "x", JobState.RUNNING, "RUNNING")}


def test_the_watchdog_diagnoses_writes_and_cancels_once(tmp_path: Path) -> None:
    clock = [100.0]
    dog, sched, seen = make_dog(tmp_path, "cancel", clock)
    dog(running(), 0)
    clock[0] = 129
    dog(running(), 29)
    assert not seen and not (tmp_path / "hang").exists()
    clock[0] = 131
    dog(running(), 31)
    (diag,) = seen
    assert sched.cancelled == ["9"] and diag.cancelled
    assert diag.stragglers[0].label == "rank 1" and diag.stragglers[0].line == 16
    data = json.loads((tmp_path / "hang" / "diagnosis.json").read_text())
    assert data["stragglers"][0]["frame"] == "<module> (hang_ddp.py:16)"
    assert data["silent_s"] == pytest.approx(31) and data["action"] == "cancel"
    assert (tmp_path / "hang" / "diagnosis.txt").read_text().startswith("job 9: no progress")
    assert "hang_ddp.py:16" in (tmp_path / "hang" / "stacks-n2.txt").read_text()
    assert sorted(data["dumps"]) == [str(tmp_path / "hang" / f"stacks-{n}.txt")
                                     for n in ("n1", "n2")]
    clock[0] = 200
    dog(running(), 100)  # the same silence is diagnosed once
    assert len(seen) == 1 and sched.cancelled == ["9"]


def test_leave_keeps_the_job_and_watches_again_after_progress(tmp_path: Path) -> None:
    clock = [0.0]
    dog, sched, seen = make_dog(tmp_path, "leave", clock)
    dog(running(), 0)
    clock[0] = 31
    dog(running(), 31)
    assert len(seen) == 1 and not sched.cancelled and not seen[0].cancelled
    clock[0] = 40
    with (tmp_path / "slurm-9.out").open("a") as fh:
        fh.write("step 1\n")
    os.utime(tmp_path / "slurm-9.out", ns=(time.time_ns() + 10**9,) * 2)
    dog(running(), 40)  # progress: the clock restarts
    clock[0] = 65
    dog(running(), 65)
    assert len(seen) == 1
    clock[0] = 71
    dog(running(), 71)
    assert len(seen) == 2 and not sched.cancelled


def test_find_py_spy_takes_the_binary_not_a_shim(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    shim = tmp_path / "py-spy"
    shim.write_text("#!/bin/sh\nexec real-py-spy \"$@\"\n")
    shim.chmod(0o755)
    monkeypatch.setenv("HPCDL_PY_SPY", str(shim))
    with pytest.raises(ToolError, match="no py-spy executable"):
        find_py_spy()
    monkeypatch.delenv("HPCDL_PY_SPY")
    found = find_py_spy()  # the dependency, installed with hpcdl
    odd = tmp_path / "a:b"
    odd.mkdir()
    shutil.copy2(found, odd / "py-spy")
    monkeypatch.setenv("HPCDL_PY_SPY", str(odd / "py-spy"))
    with pytest.raises(ToolError, match="a container bind cannot carry"):
        find_py_spy()
    assert Path(found).read_bytes()[:4] == b"\x7fELF"


# ---- the lifecycle through the CLI, against the fake Slurm -------------------------------------


def test_submit_wait_watches_a_job_that_cannot_watch_itself(fake_slurm,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    """submit --wait --hang-timeout of a job whose batch host has no python3 (it wrote
    hang-unwatched): the job never writes a file, so after the timeout the follower runs
    one srun --overlap per node, names rank 1, cancels; --json carries it."""
    from click.testing import CliRunner

    from hpcdl.cli import cli

    monkeypatch.setenv("HPCDL_SKIP_LIVE_CHECK", "1")
    monkeypatch.setattr("hpcdl.jobs.follow.MIN_INTERVAL_S", 0.01)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('never run: the fake Slurm runs nothing')\n")
    fake_slurm.scenario(jobs={"hung": {
        "states": [["RUNNING", 10**6], ["COMPLETED", 0]],
        "pids": {"rank-0": "n1 21367", "rank-1": "n2 21416"},
        "run_files": {UNWATCHED_NAME: "no python3 >= 3.9 on the batch host n1 (none on PATH)\n"},
        "srun": {"n1": f"@@hpcdl-stack 0 21367\n{WAITING}@@hpcdl-end 0\n",
                 "n2": f"@@hpcdl-stack 1 21416\n{SLEEPING}@@hpcdl-end 0\n"}}})
    started = time.monotonic()
    res = CliRunner().invoke(cli, ["submit", "-p", "sandbox", "-N", "2", "-G", "0", "-J", "hung",
                                   "--no-image", "--hang-timeout", "1", "--wait", "--json", "--",
                                   "python3", "train.py"], catch_exceptions=False)
    assert time.monotonic() - started < 60
    assert res.exit_code != 2, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["state"] == "CANCELLED", res.output
    assert out["hang"]["stragglers"][0]["label"] == "rank 1"
    assert out["hang"]["stragglers"][0]["frame"] == "<module> (hang_ddp.py:16)"
    assert out["hang"]["cancelled"] is True
    sruns = [c["argv"] for c in fake_slurm.calls() if c["tool"] == "srun"]
    assert sorted(a[1:3] for a in sruns) == [["--jobid=100", "--nodelist=n1"],
                                            ["--jobid=100", "--nodelist=n2"]]
    assert [c["argv"] for c in fake_slurm.calls() if c["tool"] == "scancel"] == [["100"]]
    run = RunDir(Path(out["run_dir"]))
    assert json.loads(run.hang_json.read_text())["summary"] == out["hang"]["summary"]
    assert hang_dump(run.path, "n2").is_file()


def test_submit_wait_reports_what_the_jobs_own_watchdog_wrote(fake_slurm,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    """The job watched itself (the fake Slurm writes its hang/ as its watchdog would):
    --wait shows the diagnosis as it appears, in the lines and --json it always printed,
    and neither collects stacks nor cancels anything itself; a run directory that stays
    silent after that is not diagnosed again from here."""
    from click.testing import CliRunner

    from hpcdl.cli import cli

    monkeypatch.setenv("HPCDL_SKIP_LIVE_CHECK", "1")
    monkeypatch.setattr("hpcdl.jobs.follow.MIN_INTERVAL_S", 0.01)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('never run: the fake Slurm runs nothing')\n")
    stacks = rank_stacks([RankPid(0, "n1", 21367), RankPid(1, "n2", 21416)],
                         {"n1": [NodeDump("0", 21367, WAITING, 0)],
                          "n2": [NodeDump("1", 21416, SLEEPING, 0)]})
    diag = replace(diagnose(stacks, job_id="100", silent_s=1.2, timeout_s=1, action="cancel"),
                   cancelled=True, detected_at=time.time(), progress="heartbeat")
    fake_slurm.scenario(jobs={"hung": {
        "states": [["RUNNING", 6], ["CANCELLED", 0]], "exit": "0:15",
        "pids": {"rank-0": "n1 21367", "rank-1": "n2 21416"},
        "run_files": {"hang/diagnosis.json": json.dumps(diag.to_dict()),
                      "hang/diagnosis.txt": "\n".join(diag.lines()) + "\n"}}})
    res = CliRunner().invoke(cli, ["submit", "-p", "sandbox", "-N", "2", "-G", "0", "-J", "hung",
                                   "--no-image", "--hang-timeout", "1", "--wait", "--json", "--",
                                   "python3", "train.py"], catch_exceptions=False)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["state"] == "CANCELLED", res.output
    assert out["hang"] == json.loads(json.dumps(diag.to_dict()))
    assert not [c for c in fake_slurm.calls() if c["tool"] in ("srun", "scancel")]
    # As a person runs it: the diagnosis in a few lines, once, and how the job ended.
    res = CliRunner().invoke(cli, ["submit", "-p", "sandbox", "-N", "2", "-G", "0", "-J", "hung",
                                   "--no-image", "--hang-timeout", "1", "--wait", "--",
                                   "python3", "train.py"], catch_exceptions=False)
    shown = [line for line in res.stderr.splitlines() if line.startswith("hang: ")]
    assert shown[0].startswith("hang: job 100: no progress for 1 s (--hang-timeout 1): rank 1 "), \
        res.stderr
    assert sum("stacks and diagnosis in" in line for line in shown) == 1  # shown once
    assert "--- stopped by the hang watchdog (" in res.output


def test_a_job_that_writes_is_left_alone(fake_slurm, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    """The fake job 'prints' (its log grows every poll through a stand-in for the ranks)
    and cannot watch itself, so the follower watches: no srun, no cancel, the job
    completes."""
    from click.testing import CliRunner

    import hpcdl.jobs.watchdog as watchdog
    from hpcdl.cli import cli

    monkeypatch.setenv("HPCDL_SKIP_LIVE_CHECK", "1")
    monkeypatch.setattr("hpcdl.jobs.follow.MIN_INTERVAL_S", 0.01)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('never run: the fake Slurm runs nothing')\n")
    fake_slurm.scenario(jobs={"busy": {"states": [["RUNNING", 8], ["COMPLETED", 0]],
                                       "pids": {"rank-0": "n1 5"},
                                       "run_files": {UNWATCHED_NAME: "no python3\n"}}})
    real = watchdog.fingerprint
    ticks = iter(range(10**6))

    def growing(run: RunDir) -> hang.Fingerprint:  # a log line per poll
        (run.path / "progress.log").write_text("x" * next(ticks))
        return real(run)

    monkeypatch.setattr(watchdog, "fingerprint", growing)
    res = CliRunner().invoke(cli, ["submit", "-p", "sandbox", "-N", "1", "-G", "0", "-J", "busy",
                                   "--no-image", "--hang-timeout", "0.5", "--wait", "--json",
                                   "--", "python3", "train.py"], catch_exceptions=False)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["state"] == "COMPLETED" and "hang" not in out
    assert not [c for c in fake_slurm.calls() if c["tool"] in ("srun", "scancel")]

