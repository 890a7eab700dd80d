"""The requeue contract (hpcdl/jobside/requeue.py), the batch script's requeue block, and the
user-script example, without Slurm: the rendered block runs in bash with stub srun,
scontrol and squeue."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpcdl.errors import ValidationError
from hpcdl.jobside import requeue
from hpcdl.plan import JobPlan, JobRequest, build_plan
from hpcdl.profiles import load_profile
from hpcdl.schedulers.base import RequeueSpec
from tests.unit.jobfiles import stage_job_scripts

REPO = Path(__file__).resolve().parents[3]


def plan(**kw: Any) -> JobPlan:
    return build_plan(load_profile("sandbox"), JobRequest.of(nodes=2, gpus=1, run_dir="/scratch/r/x", **kw))


def test_requeue_options_and_block() -> None:
    p = plan(requeue=True, max_restarts=2, signal="USR1@90")
    for line in ("#SBATCH --signal=B:USR1@90", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "export HPCDL_CHECKPOINT_DIR=/scratch/r/x/checkpoints",
                 "export HPCDL_REQUEUE_FLAG=/scratch/r/x/requeue.flag", "trap hpcdl_on_signal USR1"):
        assert line in p.script
    assert "--resume" in p.launch.command and p.spec.requeue == RequeueSpec(signal="USR1", lead=90,
                                                                        max_restarts=2, chain=1)
    plain = plan()
    assert "--requeue" not in plain.script and "trap" not in plain.script
    assert "--resume" not in plain.launch.command
    # Where a step is recorded, with or without requeue; a missing file means "no step"
    # for the bundled example and under the requeue contract, not for any COMMAND.
    for job in (p, plain):
        assert "export HPCDL_PROGRESS_FILE=/scratch/r/x/progress" in job.script.splitlines()
    assert p.launch.records_steps and plain.launch.records_steps
    assert plan(requeue=True, command=("python3", "t.py")).launch.records_steps
    assert not plan(command=("python3", "t.py")).launch.records_steps
    no_dir = build_plan(load_profile("sandbox"), JobRequest.of(nodes=1, gpus=1))
    assert "HPCDL_PROGRESS_FILE" not in no_dir.script and not no_dir.launch.records_steps


@pytest.mark.parametrize("kw, message", [
    ({"signal": "KILL@60"}, "signal: "),
    ({"signal": "USR2@60\n"}, "signal: "),
    ({"max_restarts": -1}, "max-restarts: must be 0 or more (got -1)"),
    ({"chain": 0}, "chain: must be at least 1 job (got 0)"),
    ({"chain": 3, "requeue": True}, "chain: --chain 3 is for clusters without requeue"),
])
def test_bad_requeue_requests_are_one_line(kw: dict, message: str) -> None:
    with pytest.raises(ValidationError) as err:
        plan(**kw)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_profile_default_turns_requeue_on(tmp_path: Path) -> None:
    prof = load_profile("sandbox")
    prof = prof.model_copy(update={"scheduler": prof.scheduler.model_copy(
        update={"requeue": True, "max_restarts": 5})})
    p = build_plan(prof, JobRequest.of(nodes=1, gpus=1, run_dir="/scratch/r/y"))
    assert "#SBATCH --requeue" in p.script and p.spec.requeue is not None and p.spec.requeue.max_restarts == 5
    off = build_plan(prof, JobRequest.of(nodes=1, gpus=1, run_dir="/scratch/r/y", requeue=False))
    assert "--requeue" not in off.script


def run_block(tmp_path: Path, step: str, restart: int, max_restarts: int = 1,
              signal_after: float | None = None, left: str = "0:30",
              slurm_env: dict[str, str] | None = None,
              requeue_fails: bool = False) -> tuple[int, str, str]:
    """Run the rendered script with stub srun (runs ``step``), scontrol and squeue (whose
    time left, ``left``, tells a time limit from a preemption; its arguments go to
    squeue.log); ``signal_after``: send the job's signal that many seconds after the step
    started; ``slurm_env``: Slurm's variables (default: job 42, not an array task);
    ``requeue_fails``: scontrol refuses the requeue, in Slurm's words."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    p = build_plan(load_profile("sandbox"), JobRequest.of(
        nodes=1, gpus=1, run_dir=str(run), requeue=True, max_restarts=max_restarts,
        signal="USR2@20", command=("python3", "-c", step)))
    stage_job_scripts(p, tmp_path)  # the rank wrapper and port pick, as submit stages them
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    # The step starts after the script has set its trap: the signal may come from then on.
    started = tmp_path / "step-started"
    (stub / "srun").write_text(f'#!/bin/bash\n: > {started}\nwhile [[ $1 == -* ]]; do shift; done\n'
                               'exec "$@"\n')
    # `scontrol show hostnames` (MASTER_ADDR, the first node) answers; the rest is logged.
    refuse = ('[[ $1 == requeue ]] && { echo "scontrol: error: Requested operation is '
              'presently disabled for job $2" >&2; exit 1; }\n') if requeue_fails else ""
    (stub / "scontrol").write_text('#!/bin/bash\n[[ $1 == show ]] && { echo n1; exit 0; }\n'
                                   f'echo "$@" >> {tmp_path}/scontrol.log\n{refuse}')
    (stub / "squeue").write_text(f'#!/bin/bash\necho "$@" >> {tmp_path}/squeue.log\n'
                                 f"[[ $* == *%L* ]] && echo {left}\nexit 0\n")
    # No 300 s wait after the requeue (Slurm would kill the script then), no 2 s for a
    # previous attempt's step to be cleaned up (there is none), and the fallback
    # SIGTERM after 1 s instead of wait_seconds(20) = 10 (the stepping ranks answer the
    # flag within 0.05 s); other sleeps stay.
    (stub / "sleep").write_text(
        '#!/bin/bash\n[[ $1 == 300 || $1 == 2 ]] && exit 0\n'
        f'[[ $1 == {requeue.wait_seconds(20)} ]] && exec /bin/sleep 1\n'
        'exec /bin/sleep "$@"\n')
    for f in stub.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(p.script)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}",
           **(slurm_env or {"SLURM_JOB_ID": "42"}), "SLURM_RESTART_COUNT": str(restart), "SLURM_JOB_NODELIST": "n1",
           "SLURM_SUBMIT_DIR": str(tmp_path)}
    # Output to files, not pipes, and wait for bash alone: the block's background
    # `( sleep ...; kill -TERM ... ) &` can outlive the script, and would hold pipes open
    # for its whole sleep (1 s a test). What is left of the script's process group once
    # it ended is killed, as Slurm ends a job's processes with the job.
    out_file, err_file = (tmp_path / "job.out").open("w"), (tmp_path / "job.err").open("w")
    with out_file, err_file:
        proc = subprocess.Popen(["bash", str(script)], env=env, stdout=out_file,
                                stderr=err_file, text=True, start_new_session=True)
    if signal_after is not None:
        flag = run / "requeue.flag"
        deadline = time.monotonic() + 20
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(signal_after)
        proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 20
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    try:
        proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    err = (tmp_path / "job.err").read_text()
    log = tmp_path / "scontrol.log"
    return proc.returncode, err, log.read_text() if log.exists() else ""


# The step: polls the flag like the example does, exits 85 when it appears.
POLL = ("import os, sys, time, pathlib\n"
        "f = pathlib.Path(os.environ['HPCDL_REQUEUE_FLAG'])\n"
        "for _ in range(400):\n"
        "    time.sleep(0.05)\n"
        "    if f.exists(): sys.exit(85)\n"
        "sys.exit(0)\n")


def test_signal_reaches_the_step_through_the_flag_and_the_job_requeues(tmp_path: Path) -> None:
    code, err, scontrol = run_block(tmp_path, POLL, restart=0, signal_after=0.1)
    assert "SIGUSR2" in err and "(attempt 0, TIMEOUT)" in err  # 30 s left: the time limit
    assert scontrol.strip() == "requeue 42"
    line = (tmp_path / "run" / "attempts.tsv").read_text().split("\t")
    assert (line[0], line[1], line[4], line[5].strip()) == ("42", "0", "85", "TIMEOUT")
    assert code == 85


def test_an_array_task_requeues_itself_alone_by_its_task_id(tmp_path: Path) -> None:
    """A sweep's task (hpcdl sweep --requeue): the task an array's job record ends as has
    SLURM_JOB_ID equal to the array's, which for scontrol and squeue names every task of
    the array; the task's own id (42_1) requeues it alone, and keys its attempts."""
    tasks = {"SLURM_JOB_ID": "42", "SLURM_ARRAY_JOB_ID": "42", "SLURM_ARRAY_TASK_ID": "1"}
    run = tmp_path / "run"
    run.mkdir()
    # Another task's attempt in the same file would not count against this one's restarts.
    (run / "attempts.tsv").write_text("42_0\t0\t1\t2\t3\tFAILED\n")
    code, err, scontrol = run_block(tmp_path, POLL, restart=1, max_restarts=1,
                                    signal_after=0.1, slurm_env=tasks)
    assert "(attempt 1, TIMEOUT)" in err and "requeueing" in err, err
    assert scontrol.strip() == "requeue 42_1"
    squeue = (tmp_path / "squeue.log").read_text().splitlines()
    assert squeue and all("-j 42_1 " in f"{line} " for line in squeue), squeue
    line = (run / "attempts.tsv").read_text().splitlines()[-1].split("\t")
    assert (line[0], line[1], line[4], line[5]) == ("42_1", "1", "85", "TIMEOUT")
    assert code == 85


# A crash after the attempt's first step (recorded as the contract asks).
CRASH_AFTER_A_STEP = ("import os, pathlib, sys\n"
                      "pathlib.Path(os.environ['HPCDL_PROGRESS_FILE']).write_text('step 1')\n"
                      "sys.exit(3)\n")
# A crash before any step: a container that does not start, an import error.
CRASH_AT_START = ("import sys\n"
                  "print('0: FATAL:   could not open image /x.sif: no such file', file=sys.stderr)\n"
                  "sys.exit(255)\n")
# Stops when asked (the flag), having completed no step: no checkpoint, no exit 85.
STOP_WITHOUT_A_STEP = POLL.replace("sys.exit(85)", "sys.exit(143)")


def causes(tmp_path: Path) -> list[str]:
    return [line.split("\t")[5] for line in
            (tmp_path / "run" / "attempts.tsv").read_text().splitlines()]


def test_no_requeue_after_max_restarts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    # Two preemptions and one crash before: the crash used the one restart.
    (run / "attempts.tsv").write_text("42\t0\t1\t2\t85\tPREEMPTED\n42\t1\t3\t4\t85\tPREEMPTED\n"
                                      "42\t2\t5\t6\t3\tFAILED\n")
    code, err, scontrol = run_block(tmp_path, CRASH_AFTER_A_STEP, restart=3)
    assert code == 3 and scontrol == ""
    assert "not requeued (--max-restarts 1)" in err
    assert causes(tmp_path)[-1] == "FAILED"


def test_preemptions_use_up_no_restart(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "attempts.tsv").write_text("42\t0\t1\t2\t85\tPREEMPTED\n42\t1\t3\t4\t85\tPREEMPTED\n")
    code, err, scontrol = run_block(tmp_path, CRASH_AFTER_A_STEP, restart=2)
    assert scontrol.strip() == "requeue 42" and "requeueing" in err


def test_an_attempt_that_fails_before_its_first_step_is_not_requeued(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "progress").write_text("a step of an earlier attempt\n")  # removed at the start
    code, err, scontrol = run_block(tmp_path, CRASH_AT_START, restart=0, max_restarts=3)
    assert code == 255 and scontrol == ""
    assert causes(tmp_path) == ["STARTUP"]
    assert err.splitlines()[-1] == (
        "hpcdl: attempt 0 failed before its first step: exit 255 (STARTUP); not requeued "
        "(another attempt would fail the same way; the cause is above)")
    assert not (run / "progress").exists()


def test_an_attempt_that_reaches_its_time_limit_without_a_step_is_not_requeued(
        tmp_path: Path) -> None:
    code, err, scontrol = run_block(tmp_path, STOP_WITHOUT_A_STEP, restart=0, max_restarts=3,
                                    signal_after=0.1)
    assert "(attempt 0, TIMEOUT)" in err and scontrol == ""
    assert code == 143 and causes(tmp_path) == ["STALLED"]
    assert "completed no step before its time limit: exit 143 (STALLED); not requeued" in err


def test_a_preemption_before_the_first_step_is_requeued(tmp_path: Path) -> None:
    # 9 minutes left: the signal is a preemption, not the job's doing.
    code, err, scontrol = run_block(tmp_path, STOP_WITHOUT_A_STEP, restart=0, signal_after=0.1,
                                    left="9:00")
    assert "(attempt 0, PREEMPTED)" in err and scontrol.strip() == "requeue 42"
    assert causes(tmp_path) == ["PREEMPTED"]


@pytest.mark.parametrize("left", ["UNLIMITED", "NOT_SET", "1-00:00:30"])
def test_a_signal_to_a_job_without_a_time_limit_is_a_preemption(tmp_path: Path,
                                                                left: str) -> None:
    """--time=infinite: squeue's UNLIMITED is no limit (the signal can only be a
    preemption, which spends no restart), not 0 s left; a day is 86400 s."""
    code, err, scontrol = run_block(tmp_path, POLL, restart=0, signal_after=0.1, left=left)
    assert "(attempt 0, PREEMPTED)" in err, err
    assert scontrol.strip() == "requeue 42" and causes(tmp_path) == ["PREEMPTED"]


def test_a_silent_squeue_is_named_and_read_as_a_preemption(tmp_path: Path) -> None:
    """squeue failing (slurmctld busy) is said in the job's log, in Slurm's words."""
    code, err, scontrol = run_block(tmp_path, POLL, restart=0, signal_after=0.1,
                                    left="x; echo 'slurm_load_jobs error: Socket timed out' >&2; exit 1")
    assert "hpcdl: squeue -h -j 42 -o %L failed (exit 1: slurm_load_jobs error: Socket timed " \
        "out)" in err, err
    assert "(attempt 0, PREEMPTED)" in err


def test_a_crash_after_a_step_is_requeued(tmp_path: Path) -> None:
    code, err, scontrol = run_block(tmp_path, CRASH_AFTER_A_STEP, restart=0)
    assert scontrol.strip() == "requeue 42" and causes(tmp_path) == ["FAILED"]


def test_a_requeued_attempt_does_not_say_it_was_not_requeued(tmp_path: Path) -> None:
    """The sleep after `scontrol requeue` ends here at once (as expedite's TERM ends it on
    26.05): the shell runs on to its end, and said "not requeued (--max-restarts 1)"
    after its "requeueing" line."""
    code, err, scontrol = run_block(tmp_path, CRASH_AFTER_A_STEP, restart=0)
    assert scontrol.strip() == "requeue 42" and code == 3
    assert "(FAILED); requeueing at " in err and "not requeued" not in err, err
    assert "requeue failed" not in err, err


def test_a_requeue_slurm_refuses_is_named_and_not_blamed_on_max_restarts(
        tmp_path: Path) -> None:
    code, err, scontrol = run_block(tmp_path, CRASH_AFTER_A_STEP, restart=0, requeue_fails=True)
    assert scontrol.strip() == "requeue 42" and code == 3
    lines = err.splitlines()
    assert lines[-2:] == [
        "hpcdl: scontrol requeue 42 failed (exit 1: scontrol: error: Requested operation is "
        "presently disabled for job 42)",
        "hpcdl: attempt 0: the requeue failed (its error is above)"], err
    assert "--max-restarts" not in err


def test_a_finished_step_is_not_requeued(tmp_path: Path) -> None:
    code, err, scontrol = run_block(tmp_path, "pass", restart=0)
    assert code == 0 and scontrol == ""
    assert (tmp_path / "run" / "attempts.tsv").read_text().endswith("\t0\tCOMPLETED\n")


def test_contract_helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flag = tmp_path / "flag"
    env = {requeue.FLAG_ENV: str(flag), requeue.CHECKPOINT_ENV: str(tmp_path / "c")}
    assert not requeue.requested(env)
    flag.touch()
    assert requeue.requested(env)
    assert requeue.checkpoint_dir(env=env) == str(tmp_path / "c")
    assert requeue.wait_seconds(120) == 105 and requeue.wait_seconds(5) == requeue.MIN_WAIT_S


def test_mark_step_writes_once_and_only_where_asked(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setattr(requeue, "_marked", False)
    assert not requeue.mark_step(1, env={})  # no variable: nothing, and still unmarked
    path = tmp_path / "progress"
    env = {requeue.PROGRESS_ENV: str(path), "SLURM_RESTART_COUNT": "2"}
    assert requeue.mark_step(7, env=env)
    record = json.loads(path.read_text())
    assert (record["attempt"], record["step"]) == (2, 7)
    path.unlink()
    assert not requeue.mark_step(8, env=env) and not path.exists()  # once per process
    assert [f.name for f in tmp_path.iterdir()] == []  # no temp file left behind


def test_user_script_example_resumes_and_exits_85(tmp_path: Path) -> None:
    env = {**os.environ, "HPCDL_CHECKPOINT_DIR": str(tmp_path / "c"),
           "HPCDL_REQUEUE_FLAG": str(tmp_path / "flag"),
           "HPCDL_PROGRESS_FILE": str(tmp_path / "progress")}
    (tmp_path / "flag").touch()
    script = str(REPO / "examples" / "requeue_contract.py")
    code = "import runpy,sys; m = runpy.run_path(sys.argv[1]); sys.exit(m['main'](steps=30, step_seconds=0))"
    first = subprocess.run([sys.executable, "-c", code, script], env=env, capture_output=True,
                           text=True, timeout=60)
    assert first.returncode == requeue.EXIT_REQUEUE and "stopping after step 1" in first.stdout
    assert '"step": 1' in (tmp_path / "progress").read_text()  # its first step, recorded
    (tmp_path / "flag").unlink()
    second = subprocess.run([sys.executable, "-c", code, script], env=env, capture_output=True,
                            text=True, timeout=60)
    assert second.returncode == 0 and "starting at step 1" in second.stdout
    assert "done: total 435" in second.stdout  # sum(range(30)): nothing lost, nothing twice
