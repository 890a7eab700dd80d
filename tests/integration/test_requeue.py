"""Training that outlives its job, on the real sandbox.

A 2-node DDP run of the bundled example (ResNet-18, 32 px, synthetic data, slowed
down with --step-sleep so it can be interrupted) is (a) preempted twice by a job in
the sandbox's high-priority partition, (b) stopped by its time limit, (c) hit by a
SIGKILL of one rank with no warning; each attempt resumes from the checkpoint the
previous one left, and the run ends with the SAME parameter checksum as an
uninterrupted run of the same steps. A job that keeps failing stops after
--max-restarts.

Slurm holds a requeued job for ~2 minutes (its BeginTime) before it may start
again; the tests release it at once (`scontrol update StartTime=now`) so they take
minutes, not a quarter of an hour. Every wait has a hard timeout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest_slurm import REPO, command_lines, hpcdl, submit_json

# sandbox_twin: a cluster of the module's own, shaped like the sandbox (profile `sandbox`
# and Slurm's commands point at it): these jobs fill both nodes for minutes.
pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.usefixtures("sandbox_twin"),
              pytest.mark.timeout(900)]

STEPS = 30
# The job runs this checkout's examples on the host's Python; PYTHONPATH makes its
# `import hpcdl` this checkout's too (the requeue contract lives in hpcdl.jobside.requeue).
EXAMPLE = ["-p", "sandbox", "-N", "2", "-G", "1", "--backend", "ddp",
           "-e", f"PYTHONPATH={REPO}",
           "-X", "--arch=resnet18", "-X", f"--max-steps={STEPS}", "-X", "--epochs=1",
           "-X", "--checkpoint-every=5"]
# s a step: slow enough that a preemption or a kill lands while the job still runs (each
# test acts on a checkpoint it saw, then has 15 steps or more of margin), no slower: the
# sleeps of every attempt add up (30 steps and the ones redone after an interruption).
SLOW = "1.0"
# The test without a time limit acts 10 steps before its end, not 15: more margin a step.
SLOWER = "1.5"
CHECKSUM = re.compile(r"hpcdl_rank_checksum rank=(\d+) host=\S+ checksum=(\w+)")


def sh(*argv: str, timeout: float = 30) -> str:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                         check=False)
    return res.stdout


def slurm_state(job_id: str) -> tuple[str, str]:
    """(state, reason) from squeue; ("", "") once squeue forgot the job."""
    out = sh("squeue", "-h", "-j", job_id, "-o", "%T|%r").strip()
    return tuple(out.split("|", 1)) if "|" in out else ("", "")  # type: ignore[return-value]


# When each held job was first seen with no node COMPLETING (see release).
_idle_since: dict[str, float] = {}
# slurmd revokes the job id's credential when the previous attempt ends and refuses a
# credential created in the same second ("Job credential revoked"): wait this long
# after the nodes are done before the new attempt may start.
RELEASE_AFTER_IDLE_S = 2.0


def release(job_id: str) -> None:
    """A requeued job waits ~2 min (BeginTime); let it go soon after its nodes are done
    with the previous attempt. Released while a node is still COMPLETING, or in the same
    second as the teardown, the new attempt's batch step is refused by the node that is
    still revoking the job id's old credential (seen: attempt 1 FAILED in the same second
    as the requeue)."""
    state, reason = slurm_state(job_id)
    if state != "PENDING" or reason != "BeginTime" or "comp" in sh("sinfo", "-h", "-o", "%T"):
        _idle_since.pop(job_id, None)
        return
    first = _idle_since.setdefault(job_id, time.monotonic())
    if time.monotonic() - first >= RELEASE_AFTER_IDLE_S:
        sh("scontrol", "update", f"jobid={job_id}", "StartTime=now")
        _idle_since.pop(job_id, None)


def checkpoints(run_dir: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in (run_dir / "checkpoints").glob("checkpoint-*.pt"))


def wait_for(what: str, cond: Callable[[], bool], job_id: str, timeout: float) -> None:
    """Poll ``cond`` (releasing the job from BeginTime holds) until true; hard timeout."""
    deadline = time.monotonic() + timeout
    while not cond():
        release(job_id)
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id}: {what} not reached in {timeout:.0f} s "
                                 f"(squeue: {slurm_state(job_id)})")
        time.sleep(1)


def ended(job_id: str) -> bool:
    return slurm_state(job_id)[0] in ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def final(job_id: str, run_dir: Path) -> tuple[dict, set[str], str]:
    """(hpcdl status --json with its attempts, the ranks' checksums, stdout)."""
    res = hpcdl("status", job_id, "--json")
    assert res.returncode == 0, res.stderr
    out = (run_dir / f"slurm-{job_id}.out").read_text()
    sums = {m.group(2) for m in CHECKSUM.finditer(out)}
    return json.loads(res.stdout), sums, out


@pytest.fixture(scope="module")
def reference(sandbox_twin: object, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The checksum of the same STEPS without any interruption."""
    runs = tmp_path_factory.mktemp("reference")
    res = hpcdl("submit", *EXAMPLE, "--partition", "debug", "--wait", "--run-dir",
                str(runs / "ref"), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    sums = {m.group(2) for m in CHECKSUM.finditer(res.stdout)}
    assert len(sums) == 1, res.stdout
    return sums.pop()


def submit_requeue(runs_dir: Path, *extra: str, sleep: str = SLOW) -> tuple[str, Path]:
    # Under $HPCDL_RUNS (the runs_dir fixture), where `hpcdl status` finds attempts.tsv.
    run_dir = runs_dir / "run"
    out = submit_json(*EXAMPLE, "-X", f"--step-sleep={sleep}", "--requeue", "--run-dir",
                      str(run_dir), *extra)
    return out["job_id"], run_dir


def test_preempted_twice_resumes_to_the_same_weights(runs_dir: Path, reference: str) -> None:
    # -c 8: the job holds every CPU of both nodes, so the urgent job must preempt it.
    job, run_dir = submit_requeue(runs_dir, "--partition", "lowprio", "-c", "8")
    seen = 0
    for _ in range(2):
        wait_for("a new checkpoint", lambda s=seen: bool(checkpoints(run_dir))  # type: ignore[misc]
                 and checkpoints(run_dir)[-1] > s and slurm_state(job)[0] == "RUNNING",
                 job, 400)
        seen = checkpoints(run_dir)[-1]
        urgent = sh("sbatch", "--parsable", "-p", "urgent", "-N", "2", "--ntasks-per-node=1",
                    "-c", "1", "-t", "1:00", "-o", "/dev/null", "--wrap", "sleep 2").strip()
        assert urgent.split(";")[0].isdigit(), urgent
        wait_for("requeued", lambda: slurm_state(job)[0] == "PENDING", job, 120)
    wait_for("the end", lambda: ended(job), job, 500)
    status, sums, out = final(job, run_dir)
    assert status["state"] == "COMPLETED", status
    reasons = [a["reason"] for a in status["attempts"]]
    assert reasons == ["PREEMPTED", "PREEMPTED", "COMPLETED"], status["attempts"]
    assert out.count("resumed from") == 2
    assert sums == {reference}, f"{sums} != uninterrupted {reference}"


def test_time_limit_checkpoints_requeues_and_resumes(runs_dir: Path, reference: str) -> None:
    """`submit --wait` follows the job through its requeues and prints every attempt."""
    run_dir = runs_dir / "run"
    # 2 min with the signal 60 s before the limit (Slurm may send it up to 60 s early, so
    # at most 60 s in). 3 s of sleep per step: the 30 steps take at least 90 s, so the
    # first attempt cannot finish before the signal however fast the machine is.
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdl", "submit", *EXAMPLE, "-X", "--step-sleep=3", "--requeue",
         "--max-restarts", "10",
         "--partition", "lowprio", "-c", "1", "--time", "00:02:00", "--signal", "USR2@60", "--run-dir",
         str(run_dir), "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        found = re.match(r"Submitted job (\d+) ", first)
        assert found, first
        job = found.group(1)
        wait_for("submit --wait to return", lambda: proc.poll() is not None, job, 800)
        waited = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == 0, waited + (proc.stderr.read() if proc.stderr else "")
    assert re.search(r"--- \d+ attempts \(", waited), waited
    assert "TIMEOUT" in waited and "COMPLETED" in waited
    status, sums, out = final(job, run_dir)
    assert status["state"] == "COMPLETED", status
    reasons = [a["reason"] for a in status["attempts"]]
    assert reasons[-1] == "COMPLETED" and "TIMEOUT" in reasons, status["attempts"]
    assert set(reasons[:-1]) == {"TIMEOUT"}
    assert "exiting 85 (requeue me)" in out
    assert sums == {reference}


def _rank_pids(run_dir: Path) -> list[int]:
    return [pid for pid, cmd in command_lines()
            if any(a.endswith(b"resnet50_imagenet.py") for a in cmd)
            and str(run_dir).encode() in b" ".join(cmd)
            and not any(a.endswith(b"srun") for a in cmd)]


def _wait_rank_pids(run_dir: Path, job: str) -> list[int]:
    deadline = time.monotonic() + 60
    while len(pids := _rank_pids(run_dir)) != 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(pids) == 2, (pids, slurm_state(job), sh("ps", "-eo", "pid,args")[-3000:])
    return pids


def test_a_rank_killed_without_warning_resumes_from_the_last_checkpoint(
        runs_dir: Path, reference: str) -> None:
    job, run_dir = submit_requeue(runs_dir, "--partition", "lowprio", "-c", "1")
    wait_for("checkpoint 10", lambda: bool(checkpoints(run_dir)) and checkpoints(run_dir)[-1] >= 10
             and slurm_state(job)[0] == "RUNNING", job, 400)
    pids = _wait_rank_pids(run_dir, job)
    os.kill(max(pids), signal.SIGKILL)  # no signal first, no checkpoint: a crash
    wait_for("the end", lambda: ended(job), job, 600)
    status, sums, out = final(job, run_dir)
    assert status["state"] == "COMPLETED", status
    reasons = [a["reason"] for a in status["attempts"]]
    assert reasons == ["FAILED", "COMPLETED"], status["attempts"]
    resumed = re.search(r"resumed from \S+checkpoint-(\d+)\.pt at step (\d+)", out)
    assert resumed and int(resumed.group(2)) >= 10
    assert sums == {reference}


def test_a_job_that_keeps_failing_stops_after_max_restarts(runs_dir: Path) -> None:
    run_dir = runs_dir / "run"
    # It fails after a step (recorded as the contract asks): a crash worth another attempt.
    out = submit_json("-p", "sandbox", "-N", "1", "-G", "1", "-c", "1", "--requeue",
                      "--max-restarts", "1", "--run-dir", str(run_dir), "--",
                      "python3", "-c", "import os, pathlib, sys; "
                      "pathlib.Path(os.environ['HPCDL_PROGRESS_FILE']).touch(); sys.exit(3)")
    job = out["job_id"]
    wait_for("the end", lambda: ended(job), job, 300)
    status, _, _ = final(job, run_dir)
    assert (status["state"], status["exit_code"]) == ("FAILED", 3), status
    assert [a["reason"] for a in status["attempts"]] == ["FAILED", "FAILED"]
    lines = (run_dir / "attempts.tsv").read_text().splitlines()
    assert [ln.split("\t")[1] for ln in lines] == ["0", "1"]
    err = (run_dir / f"slurm-{job}.err").read_text()
    # Said once, by the last attempt: not by the first, which was requeued.
    assert err.count("not requeued") == 1 and "not requeued (--max-restarts 1)" in err, err
    assert "requeue failed" not in err, err


def test_an_attempt_that_fails_before_its_first_step_is_not_requeued(runs_dir: Path) -> None:
    """A start-up failure would fail the same way again: one attempt, stopped at once,
    the cause in one line. Cost: one short job (~5 s)."""
    run_dir = runs_dir / "run"
    res = hpcdl("submit", "-p", "sandbox", "-N", "1", "-G", "1", "-c", "1", "--requeue",
                "--max-restarts", "3", "--run-dir", str(run_dir), "--wait", "--",
                "python3", "-c", "import no_such_module", timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    line = ("attempt 0 failed before its first step (exit 1): not requeued; the cause is in "
            "the job's stderr: ModuleNotFoundError: No module named 'no_such_module'")
    assert line in res.stdout.splitlines(), res.stdout
    job = re.search(r"Submitted job (\d+) ", res.stdout).group(1)  # type: ignore[union-attr]
    lines = (run_dir / "attempts.tsv").read_text().splitlines()
    assert [ln.split("\t")[1::4] for ln in lines] == [["0", "STARTUP"]]
    err = (run_dir / f"slurm-{job}.err").read_text()
    assert "requeueing" not in err and "(STARTUP); not requeued" in err
    status = hpcdl("status", job)
    assert line in status.stdout.splitlines(), status.stdout


def test_a_job_that_completes_no_step_before_its_time_limit_looks_hung(
        runs_dir: Path, tmp_path: Path) -> None:
    """The bundled example hung before its first step (rank 0 blocked reading its --resume
    file, a FIFO no one writes: a hung file system; rank 1 waits in the broadcast that
    follows) runs into its time limit: exit 124 and "looks hung" with the hang watchdog
    and the probe to try, not "give it more time". Cost: ~1.5 min (a 1-minute limit;
    slurmctld checks limits every 30 s)."""
    fifo = tmp_path / "stuck.pt"
    os.mkfifo(fifo)
    run_dir = runs_dir / "run"
    res = hpcdl("submit", *EXAMPLE, "-X", f"--resume={fifo}", "--time", "00:01:00",
                "--run-dir", str(run_dir), "--wait", timeout=400)
    assert res.returncode == 124, res.stdout + res.stderr
    hung = [ln for ln in res.stdout.splitlines() if "it looks hung" in ln]
    assert len(hung) == 1 and "hit its time limit of 00:01:00" in hung[0], res.stdout
    assert "without completing a single training step" in hung[0]
    assert "--hang-timeout SECONDS" in hung[0] and "`hpcdl probe -N 2`" in hung[0]
    assert "give it more" not in res.stdout and not (run_dir / "progress").exists()
    job = re.search(r"Submitted job (\d+) ", res.stdout).group(1)  # type: ignore[union-attr]
    status = hpcdl("status", job)
    assert hung[0] in status.stdout.splitlines(), status.stdout


def test_a_requeued_attempt_that_completes_no_step_is_not_requeued(runs_dir: Path) -> None:
    """Under --requeue the batch shell stops such an attempt itself (the flag, then SIGTERM
    to the step: srun cancels it) and does not requeue it (STALLED). Slurm's own signal
    would come 35-60 s in; the test sends it at once (with a 1-minute limit the shell
    takes it for the time limit). Cost: ~20 s."""
    run_dir = runs_dir / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdl", "submit", "-p", "sandbox", "-N", "1", "-G", "1", "-c", "1",
         "--requeue", "--signal", "USR2@25", "--time", "00:01:00", "--run-dir", str(run_dir),
         "--wait", "--", "sleep", "600"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        found = re.match(r"Submitted job (\d+) ", proc.stdout.readline())
        assert found
        job = found.group(1)
        # The step runs: the shell's trap is set (it is set before the step starts).
        wait_for("the step", lambda: f"{job}.0" in sh("squeue", "-h", "-s", "-j", job, "-o", "%i"),
                 job, 120)
        sh("scancel", "--batch", "--signal=USR2", job)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode != 0, out + err
    lines = (run_dir / "attempts.tsv").read_text().splitlines()
    assert [ln.split("\t")[5] for ln in lines] == ["STALLED"]
    assert any(ln.startswith("attempt 0 completed no training step before its time limit (exit ")
               and "not requeued; it looks hung" in ln for ln in out.splitlines()), out


def test_a_chain_resumes_across_jobs(runs_dir: Path, reference: str) -> None:
    """Where requeue is disabled: each job (afterany) resumes from the previous one's
    checkpoint. USR2@60 reaches a 2-minute job 30-60 s in (slurmctld checks time limits
    every 30 s; seen here: 40 s, and none by 55 s), so at 3 s a step the first job cannot
    finish its 30 steps before the signal and each job does ~8 steps or more when the
    machine is quiet; under load (10 here) the first jobs' start-up took most of their
    minute (3 and 5 steps) and four jobs ended at step 29: five are asked for. A job that
    starts after the work is done resumes at the last step and ends at once."""
    run_dir = runs_dir / "run"
    out = submit_json(*EXAMPLE, "-X", "--step-sleep=3", "--chain", "5", "--partition", "lowprio",
                      "-c", "1", "--time", "00:02:00", "--signal", "USR2@60",
                      "--run-dir", str(run_dir))
    chain = out["chain"]
    assert len(chain) == 5, out
    wait_for("the chain's end", lambda: all(ended(j) for j in chain), chain[-1], 900)
    res = hpcdl("status", chain[-1], "--json")
    assert json.loads(res.stdout)["state"] == "COMPLETED", res.stdout
    outs = [(run_dir / f"slurm-{job}.out").read_text() for job in chain]
    assert "exiting 85 (requeue me)" in outs[0]
    assert "resumed from" in outs[1]
    assert {m.group(2) for m in CHECKSUM.finditer(outs[-1])} == {reference}, outs[-1]
    assert [ln.split("\t")[0] for ln in (run_dir / "attempts.tsv").read_text().splitlines()] \
        == chain


def test_a_job_without_a_time_limit_is_preempted_not_timed_out(runs_dir: Path) -> None:
    """Preempted for real (an urgent job needs its nodes) while it has no time limit:
    squeue's %L says UNLIMITED, which the requeue block reads as "no limit", so the signal
    is a preemption: requeued as PREEMPTED with --max-restarts 0 (a preemption spends no
    restart). The old block read UNLIMITED as 0 s left: TIMEOUT, not requeued, the job
    ended there. Every sandbox partition has a MaxTime, so hpcdl cannot submit a job
    without a limit to one (it renders --time=infinite only where the partition has none):
    root lifts the running job's limit, as an admin may (and then the partition's MaxTime
    does not hold the requeued job back). Cost: ~1.5 min (15 steps, one preemption), no
    reference run: the test is about the cause, not the weights."""
    job, run_dir = submit_requeue(runs_dir, "--partition", "lowprio", "-c", "8",
                                  "--max-restarts", "0", "-X", "--max-steps=15", sleep=SLOWER)
    wait_for("checkpoint 5", lambda: bool(checkpoints(run_dir))
             and slurm_state(job)[0] == "RUNNING", job, 400)
    assert sh("scontrol", "update", f"JobId={job}", "TimeLimit=UNLIMITED") == ""
    assert sh("squeue", "-h", "-j", job, "-o", "%L").strip() == "UNLIMITED"
    urgent = sh("sbatch", "--parsable", "-p", "urgent", "-N", "2", "--ntasks-per-node=1",
                "-c", "1", "-t", "1:00", "-o", "/dev/null", "--wrap", "sleep 2").strip()
    assert urgent.split(";")[0].isdigit(), urgent
    # (the old block ended the job here, TIMEOUT: the attempts below say so)
    wait_for("requeued or ended", lambda: slurm_state(job)[0] == "PENDING" or ended(job),
             job, 120)
    wait_for("the end", lambda: ended(job), job, 500)
    status, _, out = final(job, run_dir)
    err = (run_dir / f"slurm-{job}.err").read_text()
    assert status["state"] == "COMPLETED", (status, err[-3000:])
    assert [a["reason"] for a in status["attempts"]] == ["PREEMPTED", "COMPLETED"], \
        status["attempts"]
    assert "(attempt 0, PREEMPTED): asking the ranks to checkpoint" in err, err[-3000:]
    assert "resumed from" in out


def test_the_guards_slurm_words_on_an_array_task(runs_dir: Path) -> None:
    """What the node guard (templates/hpcdl-nodes.sh) says to Slurm, for an array task (hpcdl
    sweep), on this Slurm: `squeue -h -s -j A_1 -o %i` names the task's steps A_1.N (the
    guard's hpcdl_cancel_steps reads it), `scancel A_1.N` ends that step and not the job,
    and `scontrol update JobId=A_1 Comment=` with an empty comment is taken (the guard
    writes the job's own comment back to learn whether the job can be updated; most jobs
    have none). Cost: ~10 s, one 1-CPU task."""
    out = sh("sbatch", "--parsable", "-p", "debug", "-N", "1", "-n", "1", "-c", "1",
             "--array=1-1", "-t", "2:00", "-o", "/dev/null", "--wrap", "srun sleep 120; sleep 120")
    array = out.strip().split(";")[0]
    assert array.isdigit(), out
    task = f"{array}_1"
    try:
        step = f"{task}.0"
        wait_for("the task's step", lambda: step in sh("squeue", "-h", "-s", "-j", task,
                                                       "-o", "%i").split(), task, 120)
        steps = sh("squeue", "-h", "-s", "-j", task, "-o", "%i").split()
        assert set(steps) <= {step, f"{task}.batch", f"{task}.extern"}, steps
        res = subprocess.run(["scontrol", "update", f"JobId={task}", "Comment="],
                             capture_output=True, text=True, timeout=30, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        assert sh("squeue", "-h", "-j", task, "-o", "%k").strip() in ("", "(null)")
        res = subprocess.run(["scancel", step], capture_output=True, text=True, timeout=30,
                             check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        wait_for("the step's end", lambda: step not in sh("squeue", "-h", "-s", "-j", task,
                                                          "-o", "%i").split(), task, 60)
        assert slurm_state(task)[0] == "RUNNING"  # the batch shell goes on
    finally:
        sh("scancel", array)
