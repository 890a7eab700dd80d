"""The requeue contract (hpcdl/requeue.py), the batch script's requeue block, and the
user-script example, without Slurm: the rendered block runs in bash with stub srun,
scontrol and squeue."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl import requeue
from hpcdl.errors import ValidationError
from hpcdl.plan import JobRequest, build_plan
from hpcdl.profiles import load_profile

REPO = Path(__file__).resolve().parents[2]


def plan(**kw: object):
    return build_plan(load_profile("sandbox"), JobRequest(nodes=2, gpus=1, run_dir="/scratch/r/x", **kw))


def test_requeue_options_and_block() -> None:
    p = plan(requeue=True, max_restarts=2, signal="USR1@90")
    for line in ("#SBATCH --signal=B:USR1@90", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "export HPCDL_CHECKPOINT_DIR=/scratch/r/x/checkpoints",
                 "export HPCDL_REQUEUE_FLAG=/scratch/r/x/requeue.flag", "trap hpcdl_on_signal USR1"):
        assert line in p.script
    assert "--resume" in p.command and (p.requeue, p.max_restarts, p.signal) == (True, 2, "USR1@90")
    plain = plan()
    assert "--requeue" not in plain.script and "trap" not in plain.script
    assert "--resume" not in plain.command


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
    p = build_plan(prof, JobRequest(nodes=1, gpus=1, run_dir="/scratch/r/y"))
    assert "#SBATCH --requeue" in p.script and p.max_restarts == 5
    off = build_plan(prof, JobRequest(nodes=1, gpus=1, run_dir="/scratch/r/y", requeue=False))
    assert "--requeue" not in off.script


def run_block(tmp_path: Path, step: str, restart: int, max_restarts: int = 1,
              signal_after: float | None = None) -> tuple[int, str, str]:
    """Run the rendered script with stub srun (runs ``step``), scontrol and squeue."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    p = build_plan(load_profile("sandbox"), JobRequest(
        nodes=1, gpus=1, run_dir=str(run), requeue=True, max_restarts=max_restarts,
        signal="USR2@20", command=("python3", "-c", step)))
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "srun").write_text('#!/bin/bash\nwhile [[ $1 == -* ]]; do shift; done\nexec "$@"\n')
    # `scontrol show hostnames` (MASTER_ADDR, the first node) answers; the rest is logged.
    (stub / "scontrol").write_text('#!/bin/bash\n[[ $1 == show ]] && { echo n1; exit 0; }\n'
                                   f'echo "$@" >> {tmp_path}/scontrol.log\n')
    (stub / "squeue").write_text("#!/bin/bash\n[[ $* == *%L* ]] && echo 0:30\nexit 0\n")
    # No 300 s wait after the requeue (Slurm would kill the script then); other sleeps stay.
    (stub / "sleep").write_text('#!/bin/bash\n[[ $1 == 300 ]] && exit 0\nexec /bin/sleep "$@"\n')
    for f in stub.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(p.script)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "SLURM_JOB_ID": "42",
           "SLURM_RESTART_COUNT": str(restart), "SLURM_JOB_NODELIST": "n1",
           "SLURM_SUBMIT_DIR": str(tmp_path)}
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if signal_after is not None:
        flag = run / "requeue.flag"
        import signal as sig
        import time
        time.sleep(signal_after)
        proc.send_signal(sig.SIGUSR2)
        deadline = time.monotonic() + 20
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    out, err = proc.communicate(timeout=60)
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
    code, err, scontrol = run_block(tmp_path, POLL, restart=0, signal_after=1.0)
    assert "SIGUSR2" in err and "(attempt 0, TIMEOUT)" in err  # 30 s left: the time limit
    assert scontrol.strip() == "requeue 42"
    line = (tmp_path / "run" / "attempts.tsv").read_text().split("\t")
    assert (line[0], line[1], line[4], line[5].strip()) == ("42", "0", "85", "TIMEOUT")
    assert code == 85


def test_no_requeue_after_max_restarts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    # Two preemptions and one crash before: the crash used the one restart.
    (run / "attempts.tsv").write_text("42\t0\t1\t2\t85\tPREEMPTED\n42\t1\t3\t4\t85\tPREEMPTED\n"
                                      "42\t2\t5\t6\t3\tFAILED\n")
    code, err, scontrol = run_block(tmp_path, "import sys; sys.exit(3)", restart=3)
    assert code == 3 and scontrol == ""
    assert "not requeued (--max-restarts 1)" in err


def test_preemptions_use_up_no_restart(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "attempts.tsv").write_text("42\t0\t1\t2\t85\tPREEMPTED\n42\t1\t3\t4\t85\tPREEMPTED\n")
    code, err, scontrol = run_block(tmp_path, "import sys; sys.exit(3)", restart=2)
    assert scontrol.strip() == "requeue 42" and "requeueing" in err


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


def test_user_script_example_resumes_and_exits_85(tmp_path: Path) -> None:
    env = {**os.environ, "HPCDL_CHECKPOINT_DIR": str(tmp_path / "c"),
           "HPCDL_REQUEUE_FLAG": str(tmp_path / "flag")}
    (tmp_path / "flag").touch()
    script = str(REPO / "examples" / "requeue_contract.py")
    code = "import runpy,sys; m = runpy.run_path(sys.argv[1]); sys.exit(m['main'](steps=30, step_seconds=0))"
    first = subprocess.run([sys.executable, "-c", code, script], env=env, capture_output=True,
                           text=True, timeout=60)
    assert first.returncode == requeue.EXIT_REQUEUE and "stopping after step 1" in first.stdout
    (tmp_path / "flag").unlink()
    second = subprocess.run([sys.executable, "-c", code, script], env=env, capture_output=True,
                            text=True, timeout=60)
    assert second.returncode == 0 and "starting at step 1" in second.stdout
    assert "done: total 435" in second.stdout  # sum(range(30)): nothing lost, nothing twice
