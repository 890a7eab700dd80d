"""The job's own hang watchdog (hpcdl.jobside.hangwatch) and the ranks' heartbeat
(hpcdl.jobside.steps.beat) without a cluster: what counts as progress, the watch's
files and actions in their order, the diagnosis read back, and the watchdog run for
real as the batch script runs it (python3 -m, from the staged job/ alone, beside a
stand-in srun and scancel), ending with its parent. With real Slurm:
tests/integration/test_hang_watchdog.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdl.jobside import hangwatch, steps
from hpcdl.jobside.hangdiag import Diagnosis, NodeDump, RankPid, diagnose, rank_stacks
from hpcdl.launch.staging import job_side_files, stage
from tests.unit.hang.test_hang import SLEEPING, WAITING

# ---- the heartbeat -------------------------------------------------------------------------


@pytest.fixture
def fresh_beat(monkeypatch: pytest.MonkeyPatch):
    steps.beat_reset()
    yield
    steps.beat_reset()


def test_a_rank_beats_at_most_once_a_second_and_not_without_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_beat) -> None:
    monkeypatch.delenv(steps.HEARTBEAT_ENV, raising=False)
    assert not steps.beat(1, now=0.0)
    assert not steps.beat(2, now=50.0)  # looked once: never again in this process
    steps.beat_reset()
    monkeypatch.setenv(steps.HEARTBEAT_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    assert steps.beat(7, now=100.0)
    assert (tmp_path / "rank-3").read_text() == "7\n"
    assert not steps.beat(8, now=100.9)  # within BEAT_EVERY_S: nothing written
    assert (tmp_path / "rank-3").read_text() == "7\n"
    assert steps.beat(9, now=101.0)
    assert (tmp_path / "rank-3").read_text() == "9\n"


def test_a_heartbeat_that_cannot_be_written_never_stops_the_training(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_beat) -> None:
    monkeypatch.setenv(steps.HEARTBEAT_ENV, str(tmp_path / "gone"))
    monkeypatch.setenv("RANK", "0")
    assert steps.beat(1, now=0.0) is False


def test_the_step_writer_beats_every_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          fresh_beat) -> None:
    monkeypatch.setenv(steps.HEARTBEAT_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    writer = steps.StepWriter("", 1)  # metrics off; the heartbeat still goes
    writer.step(4, epoch=0, step_s=0.1, data_s=0.0, sync_s=0.0, images=1, loss=None, lr=None)
    assert (tmp_path / "rank-1").read_text() == "4\n"


# ---- progress --------------------------------------------------------------------------------


def test_progress_is_the_heartbeats_once_a_rank_wrote_one(tmp_path: Path) -> None:
    (tmp_path / "slurm-1.out").write_text("a")
    (tmp_path / steps.HEARTBEAT_DIR).mkdir()
    source, before = hangwatch.progress(tmp_path)
    assert source == "run directory"
    (tmp_path / "slurm-1.out").write_text("ab")  # the log grows: progress, for now
    assert hangwatch.progress(tmp_path)[1] != before
    (tmp_path / steps.HEARTBEAT_DIR / "rank-0").write_text("1\n")
    source, beats = hangwatch.progress(tmp_path)
    assert source == "heartbeat" and {name for name, _, _ in beats} == {"rank-0"}
    (tmp_path / "slurm-1.out").write_text("abc")  # a printing thread is not a step
    assert hangwatch.progress(tmp_path) == ("heartbeat", beats)
    os.utime(tmp_path / steps.HEARTBEAT_DIR / "rank-0",
             ns=(time.time_ns() + 10**9,) * 2)
    assert hangwatch.progress(tmp_path)[1] != beats


def test_the_run_directory_walk_leaves_out_what_is_not_the_training(tmp_path: Path) -> None:
    (tmp_path / "slurm-1.out").write_text("a")
    before = hangwatch.fingerprint(tmp_path)
    for name in ("job/bin/py-spy", "code/train.py", "heartbeat/rank-0", "hang/diagnosis.json",
                 "relaunch.request", "result.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert hangwatch.fingerprint(tmp_path) == before
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "checkpoint-1.pt").write_bytes(b"1")
    assert hangwatch.fingerprint(tmp_path) != before


# ---- the watch -------------------------------------------------------------------------------


def collected(pids: list[RankPid]) -> hangwatch.Collected:
    assert [p.rank for p in pids] == [0, 1]
    return ({"n1": [NodeDump("0", 21367, WAITING, 0)], "n2": [NodeDump("1", 21416, SLEEPING, 0)]},
            {"n1": "=== rank 0 ===\n" + WAITING, "n2": "=== rank 1 ===\n" + SLEEPING}, {})


def a_run(tmp_path: Path) -> Path:
    (tmp_path / "pids").mkdir()
    (tmp_path / "pids" / "rank-0").write_text("n1 21367\n")
    (tmp_path / "pids" / "rank-1").write_text("n2 21416\n")
    (tmp_path / "heartbeat").mkdir()
    for rank in (0, 1):
        (tmp_path / "heartbeat" / f"rank-{rank}").write_text("1\n")
    return tmp_path


def test_a_silent_job_is_diagnosed_written_then_cancelled(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    clock = [0.0]
    seen_at_cancel: list[dict] = []

    def cancel() -> bool:  # in the job this ends the watchdog too: the files come first
        seen_at_cancel.append(json.loads((run / "hang" / "diagnosis.json").read_text()))
        return True

    watch = hangwatch.Watch(run, "9", timeout=30, action="cancel", collector=collected,
                            cancel=cancel, clock=lambda: clock[0])
    assert watch.poll() is None
    clock[0] = 29.0
    assert watch.poll() is None and not (run / "hang").exists()
    clock[0] = 31.0
    diag = watch.poll()
    assert diag is not None and diag.cancelled and diag.progress == "heartbeat"
    assert diag.stragglers[0].label == "rank 1" and diag.stragglers[0].node == "n2"
    assert seen_at_cancel[0]["cancelled"] is True and seen_at_cancel[0]["summary"] == diag.summary
    assert "hang_ddp.py:16" in (run / "hang" / "stacks-n2.txt").read_text()
    assert (run / "hang" / "diagnosis.txt").read_text().startswith("job 9: no progress for 31 s")
    clock[0] = 100.0
    assert watch.poll() is None and len(seen_at_cancel) == 1  # one silence, one diagnosis


def test_a_cancel_that_fails_is_written_as_failed(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    clock = [0.0]
    watch = hangwatch.Watch(run, "9", timeout=5, action="cancel", collector=collected,
                            cancel=lambda: False, clock=lambda: clock[0])
    watch.poll()
    clock[0] = 6.0
    diag = watch.poll()
    assert diag is not None and not diag.cancelled
    assert json.loads((run / "hang" / "diagnosis.json").read_text())["cancelled"] is False
    assert (run / "hang" / "stacks-n1.txt").is_file()  # the dumps of the first write stay


def test_relaunch_asks_the_guard_without_the_stragglers_node_and_watches_again(
        tmp_path: Path) -> None:
    run = a_run(tmp_path)
    clock = [0.0]
    watch = hangwatch.Watch(run, "9", timeout=5, action="relaunch", collector=collected,
                            cancel=lambda: pytest.fail("a relaunch cancels nothing"),
                            clock=lambda: clock[0])
    watch.poll()
    clock[0] = 6.0
    first = watch.poll()
    assert first is not None and first.relaunched and first.relaunch_without == "n2"
    node, why = (run / "relaunch.request").read_text().rstrip("\n").split("\t")
    assert node == "n2" and why == first.summary
    (run / "relaunch.request").unlink()  # the guard took it
    clock[0] = 8.0
    os.utime(run / "heartbeat" / "rank-0", ns=(time.time_ns() + 10**9,) * 2)  # the new step
    assert watch.poll() is None
    clock[0] = 13.5
    second = watch.poll()  # a second hang after the relaunch is diagnosed too
    assert second is not None and second.detected_at >= first.detected_at


def test_a_relaunched_step_that_never_beats_is_diagnosed_again_after_the_timeout(
        tmp_path: Path) -> None:
    """The new step hangs before its first heartbeat (in its rendezvous, say): the old
    step's heartbeats stay as they were when the first hang was diagnosed. Its silence is
    measured from the relaunch request, with the run directory's files as progress until
    the new step beats (as for a first step); each relaunch is the guard's to allow
    (--max-restarts), so the watch asks again."""
    run = a_run(tmp_path)
    (run / "slurm-9.err").write_text("")
    clock = [0.0]
    watch = hangwatch.Watch(run, "9", timeout=5, action="relaunch", collector=collected,
                            cancel=lambda: pytest.fail("a relaunch cancels nothing"),
                            clock=lambda: clock[0])
    watch.poll()
    clock[0] = 6.0
    first = watch.poll()
    assert first is not None and first.relaunched and first.progress == "heartbeat"
    (run / "relaunch.request").unlink()  # the guard took it
    for now in (8.0, 10.9):  # under 5 s since the request: the relaunch's own time
        clock[0] = now
        assert watch.poll() is None
    clock[0] = 11.2
    second = watch.poll()
    assert second is not None and second.relaunched and second.progress == "run directory"
    assert (run / "relaunch.request").read_text().startswith("n2\t")
    (run / "relaunch.request").unlink()
    # The guard's and the new ranks' lines in the job's log are progress until a beat ...
    clock[0] = 14.0
    (run / "slurm-9.err").write_text("hpcdl: relaunch 2 on n1,n3\n")
    assert watch.poll() is None
    clock[0] = 18.5
    assert watch.poll() is None
    # ... and once the new step beats, its heartbeats are (the log no longer counts).
    os.utime(run / "heartbeat" / "rank-0", ns=(time.time_ns() + 10**9,) * 2)
    clock[0] = 19.0
    assert watch.poll() is None and watch.source == "heartbeat"
    clock[0] = 22.0
    (run / "slurm-9.err").write_text("a printing thread is not a step\n")
    assert watch.poll() is None
    clock[0] = 24.5
    third = watch.poll()
    assert third is not None and third.progress == "heartbeat"


@pytest.mark.parametrize("action", ["leave", "cancel"])
def test_one_silence_is_diagnosed_once_where_nothing_was_relaunched(
        tmp_path: Path, action: str) -> None:
    """leave watches again once progress resumes; cancel ends the job (a failed cancel
    is written as failed, not tried every timeout)."""
    run = a_run(tmp_path)
    clock = [0.0]
    watch = hangwatch.Watch(run, "9", timeout=5, action=action, collector=collected,
                            cancel=lambda: False, clock=lambda: clock[0])
    watch.poll()
    clock[0] = 6.0
    assert watch.poll() is not None
    clock[0] = 60.0
    assert watch.poll() is None


def test_the_diagnosis_reads_back_from_its_json() -> None:
    stacks = rank_stacks([RankPid(0, "n1", 21367), RankPid(1, "n2", 21416)],
                         {"n1": [NodeDump("0", 21367, WAITING, 0)]}, {"n2": "srun: timeout"})
    diag = diagnose(stacks, job_id="7", silent_s=40.5, timeout_s=30, action="leave")
    data = json.loads(json.dumps(diag.to_dict()))
    assert Diagnosis.from_dict(data) == diag
    assert Diagnosis.from_dict({**data, "from_a_newer_hpcdl": 1}) == diag


def test_the_watchdog_defaults_agree_with_the_cli() -> None:
    from hpcdl.hang.actions import DEFAULT_HANG_ACTION, HANG_ACTIONS
    from hpcdl.jobside.hangdiag import DEFAULT_HANG_ACTION as JOB_SIDE_DEFAULT

    assert JOB_SIDE_DEFAULT == DEFAULT_HANG_ACTION
    assert hangwatch.parse_args(["--run-dir", ".", "--job-id", "1", "--timeout", "1",
                                 "--action", HANG_ACTIONS[-1]]).action == HANG_ACTIONS[-1]


# ---- the process the batch script starts ------------------------------------------------------


FAKE_SRUN = """#!/bin/sh
# srun --overlap ... --nodelist=NODE ... CMD...: NODE's ranks as py-spy would dump them
echo "$@" >> "$FAKE_LOG"
for a do case $a in --nodelist=*) node=${a#--nodelist=} ;; esac; done
cat "$FAKE_DUMPS/$node"
"""
FAKE_SCANCEL = """#!/bin/sh
echo "scancel $*" >> "$FAKE_LOG"
"""


def test_the_watchdog_runs_from_the_staged_job_dir_and_ends_with_its_parent(
        tmp_path: Path) -> None:
    """As the batch script starts it: python3 -m, PYTHONPATH the run's job/ (the staged
    job-side files only: hpcdl's dependencies are not on the nodes), srun and scancel
    from PATH. A silent run is diagnosed, written, cancelled; the watchdog ends when
    the shell that started it does."""
    (tmp_path / "run").mkdir()
    run = a_run(tmp_path / "run")
    stage(run, job_side_files(watchdog=True))
    bin_dir, dumps = tmp_path / "bin", tmp_path / "dumps"
    bin_dir.mkdir()
    dumps.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scancel", FAKE_SCANCEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (dumps / "n1").write_text(f"@@hpcdl-stack 0 21367\n{WAITING}@@hpcdl-end 0\n")
    (dumps / "n2").write_text(f"@@hpcdl-stack 1 21416\n{SLEEPING}@@hpcdl-end 0\n")
    log = tmp_path / "calls"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(run / "job"),
           "FAKE_LOG": str(log), "FAKE_DUMPS": str(dumps), "HPCDL_PY_SPY": "/bin/true",
           "SLURM_NTASKS_PER_NODE": "2"}
    # The "batch shell": starts the watchdog in the background, then lives on a while.
    shell = subprocess.Popen(
        ["/bin/sh", "-c", f'"$0" -m hpcdl.jobside.hangwatch --job-id 42 --run-dir {run} '
                          '--timeout 1 --action cancel --interval 0.2 2>"$1" & echo $!; sleep 600',
         sys.executable, str(tmp_path / "stderr")],
        stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path, start_new_session=True)
    try:
        assert shell.stdout is not None
        dog = int(shell.stdout.readline())
        deadline = time.monotonic() + 60
        while not (run / "hang" / "diagnosis.json").exists() or "scancel" not in (
                log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, (tmp_path / "stderr").read_text()
            time.sleep(0.2)
        diag = json.loads((run / "hang" / "diagnosis.json").read_text())
        assert diag["cancelled"] and diag["stragglers"][0]["label"] == "rank 1"
        assert diag["progress"] == "heartbeat" and diag["job_id"] == "42"
        calls = log.read_text().splitlines()
        assert calls[-1] == "scancel 42"
        sruns = sorted(c.split()[:4] for c in calls if c.startswith("--overlap"))
        assert sruns == [["--overlap", "--jobid=42", "--nodelist=n1", "--nodes=1"],
                         ["--overlap", "--jobid=42", "--nodelist=n2", "--nodes=1"]]
        err = (tmp_path / "stderr").read_text()
        assert "hpcdl: hang watchdog: watching job 42" in err and "Traceback" not in err
        assert "hpcdl: hang watchdog: cancelling the job; stacks and diagnosis in" in err
        os.kill(shell.pid, signal.SIGKILL)  # the batch script ends (its sleep, its child, not)
        shell.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(dog):
            assert time.monotonic() < deadline, "the watchdog outlived its batch script"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):  # what is left of the group (the sleep)
            os.killpg(shell.pid, signal.SIGKILL)
        if shell.poll() is None:
            shell.wait(timeout=30)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


# ---- the batch script's block that starts it ------------------------------------------------


def hang_block(run_dir: Path) -> str:
    """The rendered script's hang watchdog block (from its header to its ``fi``)."""
    from hpcdl.plan import JobRequest, build_plan
    from hpcdl.profiles import load_profile

    plan = build_plan(load_profile("sandbox"), JobRequest.of(
        nodes=2, gpus=0, no_image=True, command=("python3", "t.py"), run_dir=str(run_dir),
        hang_timeout=45.0))
    text = plan.script
    start = text.index("# ---- hang watchdog")
    return text[start:text.index("\nfi\n", start) + 4]


@pytest.mark.parametrize("python", ["missing", "too old"])
def test_a_batch_host_without_a_python3_runs_the_job_unwatched_and_says_so(
        tmp_path: Path, python: str) -> None:
    run = tmp_path / "run dir"  # (a blank: every path is quoted)
    run.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if python == "too old":  # (the version check is the only call it gets)
        (bin_dir / "python3").write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / "python3").chmod(0o755)
    res = subprocess.run(["/bin/bash", "-c", "set -euo pipefail\n" + hang_block(run)],
                         capture_output=True, text=True, timeout=30,
                         env={"PATH": str(bin_dir), "SLURM_JOB_ID": "7",
                              "SLURMD_NODENAME": "n1"})
    assert res.returncode == 0, res.stderr
    shown = "none on PATH" if python == "missing" else str(bin_dir / "python3")
    assert res.stderr == ("hpcdl: hang watchdog: no python3 >= 3.9 on the batch host n1 "
                          f"({shown}): the job does not watch itself\n")
    assert (run / "hang-unwatched").read_text() == (
        f"no python3 >= 3.9 on the batch host n1 ({shown})\n")


def test_the_batch_script_starts_the_watchdog_from_the_runs_job_dir(tmp_path: Path) -> None:
    run = tmp_path / "run dir"
    run.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A stand-in python3: the version check passes, the start records what it got.
    (bin_dir / "python3").write_text(
        '#!/bin/sh\n[ "$1" = -c ] && exit 0\n'
        'printf "%s\\n" "PYTHONPATH=$PYTHONPATH" "$@" > "$OUT"\n')
    (bin_dir / "python3").chmod(0o755)
    out = tmp_path / "argv"
    res = subprocess.run(["/bin/bash", "-c", "set -euo pipefail\n" + hang_block(run) + "wait\n"],
                         capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "7",
                              "OUT": str(out)})
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert out.read_text().splitlines() == [
        f"PYTHONPATH={run}/job", "-m", "hpcdl.jobside.hangwatch", "--job-id", "7",
        "--run-dir", str(run), "--timeout", "45", "--action", "cancel"]
    assert not (run / "hang-unwatched").exists()
