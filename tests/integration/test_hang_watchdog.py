"""The hang watchdog on the real sandbox, in the real image: a 2-node x 2-rank gloo job
in which rank 2 sleeps while the other ranks wait in all_reduce is stopped by its own
watchdog (`hpcdl submit --hang-timeout`: hpcdl.jobside.hangwatch on the batch host),
which names rank 2 and the frame it sleeps in (slow_step at gloo_hang.py:LINE, from
py-spy run through srun --overlap inside the image), writes the dumps and the diagnosis
to the run directory, and cancels the job; `--wait` shows what it found. A healthy job
that runs longer than the timeout, printing as it goes, is left alone. The same hang
submitted without --wait (nobody follows it), its ranks writing heartbeats, is
diagnosed and cancelled by the job all the same.

On the twin of the sandbox (``sandbox_twin``: the host sandbox's shape, node names of its
own; tests/parallel.py runs it beside the host sandbox's tests). Both jobs run at the
same time (they share the nodes). The time from the hang to the
diagnosis is printed (pytest -s); bench/bench_hang_watchdog.py measures it on its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest_slurm import NetnsCluster, hpcdl, shared_copy

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.torch,
              pytest.mark.usefixtures("sandbox_twin")]

# The nodes do not see the checkout: the script runs from a copy on the shared /scratch.
SCRIPT = shared_copy(Path(__file__).resolve().parent / "hang") / "gloo_hang.py"
SLEEP_LINE = next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1)
                  if "time.sleep(3600)" in line)
# s: long enough that torch's import and the rendezvous in the image on 2 busy cores is
# not taken for a hang (the script prints before and after each).
HANG_TIMEOUT = "30"
JOB_TIMEOUT = 600  # s: whole CLI run, start-up of 6 ranks in the image included


def start(runs: Path, name: str, shape: tuple[str, ...], *args: str,
          as_json: bool = True) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "hpcdl", "submit", "-p", "sandbox", *shape, "-c", "1",
            "--job-name", name, "--hang-timeout", HANG_TIMEOUT, "--wait",
            *(["--json"] if as_json else []), "--", "python3", str(SCRIPT), *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HPCDL_RUNS": str(runs)})


def finish(p: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    """Exit code, the --json object (without --json: result.json plus the job id, run
    directory and diagnosis) and what was printed besides."""
    try:
        out, err = p.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"hpcdl submit --wait did not end in {JOB_TIMEOUT} s:\n{err}") from None
    assert "Traceback" not in err, err
    lines = out.strip().splitlines()
    assert lines, f"no output (exit {p.returncode}):\n{err}"
    if lines[-1].startswith("{"):
        return p.returncode, dict(json.loads(lines[-1])), err
    run = Path(lines[-1].split("run directory: ", 1)[1])
    record = json.loads((run / "result.json").read_text())
    hang = (run / "hang" / "diagnosis.json")
    record.update(run_dir=str(run), job_id=lines[0].split()[2],
                  **({"hang": json.loads(hang.read_text())} if hang.exists() else {}))
    return p.returncode, record, out + err


@pytest.fixture(scope="module")
def jobs(sandbox_twin: NetnsCluster, cpu_image: Path, tmp_path_factory: pytest.TempPathFactory,
         ) -> dict[str, tuple[int, dict[str, Any], str]]:
    runs = tmp_path_factory.mktemp("hang-runs")
    image = ("--image", str(cpu_image))
    # The hung job as a person runs it (its report printed), the healthy one with --json.
    hung = start(runs, "hang-hung", ("-N", "2", "-G", "2", *image),
                 "--steps", "3", "--slow-rank", "2", as_json=False)
    healthy = start(runs, "hang-healthy", ("-N", "2", "-G", "0", *image),
                    "--steps", "45", "--step-s", "1")
    return {"hung": finish(hung), "healthy": finish(healthy)}


def test_the_hung_rank_is_named_with_its_frame_and_the_job_cancelled(
        jobs: dict, sandbox_twin: NetnsCluster) -> None:
    n1, n2 = sandbox_twin.nodes
    code, out, err = jobs["hung"]
    assert out["state"] == "CANCELLED", f"{out}\n{err}"
    assert code != 0
    hang = out["hang"]
    assert hang["cancelled"] is True and hang["action"] == "cancel"
    (s,) = hang["stragglers"]
    assert (s["label"], s["node"]) == ("rank 2", n2), hang
    assert (s["function"], s["line"]) == ("slow_step", SLEEP_LINE), hang
    assert s["file"] == str(SCRIPT) and not s["in_collective"]
    assert s["frame"] == f"slow_step (gloo_hang.py:{SLEEP_LINE})"
    # The other three wait together in the collective, called from the script's loop.
    (main,) = [p for p in hang["places"] if p["ranks"] != ["rank 2"]]
    assert main["ranks"] == ["rank 0", "rank 1", "rank 3"] and main["in_collective"]
    assert main["where"].startswith("all_reduce (torch/distributed/distributed_c10d.py:")
    assert main["called_from"].startswith("main (gloo_hang.py:")
    assert hang["silent_s"] >= float(HANG_TIMEOUT)
    # --wait said it in a few lines when it happened, and the report names the watchdog
    # (not srun's "Terminated" lines) as what ended the job.
    shown = [line for line in err.splitlines() if line.startswith("hang: ")]
    assert 3 <= len(shown) <= 8 and f"rank 2 ({n2}, pid" in shown[0], err
    assert f"slow_step (gloo_hang.py:{SLEEP_LINE})" in shown[0]
    assert "--- stopped by the hang watchdog (" in err and "the job failed" not in err
    # The run directory holds the dumps of both nodes and the diagnosis.
    run = Path(out["run_dir"])
    assert sorted(p.name for p in (run / "hang").iterdir()) == [
        "diagnosis.json", "diagnosis.txt", f"stacks-{n1}.txt", f"stacks-{n2}.txt"]
    assert json.loads((run / "hang" / "diagnosis.json").read_text())["summary"] == hang["summary"]
    stacks1 = (run / "hang" / f"stacks-{n1}.txt").read_text()
    stacks2 = (run / "hang" / f"stacks-{n2}.txt").read_text()
    assert stacks1.count("=== rank ") == 2 and "all_reduce" in stacks1
    assert f"slow_step ({SCRIPT}:{SLEEP_LINE})" in stacks2
    # Slurm agrees: the job ended CANCELLED.
    status = hpcdl("status", out["job_id"], "--json")
    assert json.loads(status.stdout)["state"] == "CANCELLED", status.stdout
    started = next(float(line.split()[2]) for line in
                   (run / f"slurm-{out['job_id']}.out").read_text().splitlines()
                   if "HANG_START" in line)
    print(f"\nhang watchdog: hang started {started:.1f}, diagnosis complete "
          f"{hang['detected_at']:.1f}: {hang['detected_at'] - started:.1f} s from the hang to "
          f"the diagnosis (--hang-timeout {HANG_TIMEOUT}, stacks collected in "
          f"{hang['collect_s']:.1f} s)")
    assert hang["detected_at"] > started


def test_a_healthy_job_is_left_alone(jobs: dict) -> None:
    code, out, err = jobs["healthy"]
    assert (code, out["state"]) == (0, "COMPLETED"), f"{out}\n{err}"
    assert "hang" not in out and "hang:" not in err
    run = Path(out["run_dir"])
    assert not (run / "hang").exists()
    assert sorted(p.name for p in (run / "pids").iterdir()) == ["rank-0", "rank-1"]
    assert "step 44 rank 1" in (run / f"slurm-{out['job_id']}.out").read_text()


def test_without_wait_the_job_diagnoses_and_cancels_itself(sandbox_twin: NetnsCluster,
                                                           tmp_path: Path) -> None:
    """issue 42: `submit --hang-timeout` without --wait returns at once; the job's own
    watchdog reads its ranks' heartbeats (gloo_hang.py --beat), names rank 2 in
    slow_step, writes hang/ and cancels the job, with no hpcdl process following it.
    Natively (the nodes' own Python and torch; py-spy runs on the node itself), so that
    it needs no image."""
    n1, n2 = sandbox_twin.nodes
    argv = [sys.executable, "-m", "hpcdl", "submit", "-p", "sandbox", "-N", "2", "-G", "2",
            "-c", "1", "--no-image", "--job-name", "hang-nowait",
            "--hang-timeout", HANG_TIMEOUT, "--json", "--", "python3", str(SCRIPT),
            "--steps", "3", "--slow-rank", "2", "--beat"]
    started = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HPCDL_RUNS": str(tmp_path)})
    assert res.returncode == 0, res.stdout + res.stderr
    assert time.monotonic() - started < 60  # submitted and gone: nothing follows the job
    sub = json.loads(res.stdout.strip().splitlines()[-1])
    job, run = sub["job_id"], Path(sub["run_dir"])
    deadline = time.monotonic() + JOB_TIMEOUT
    while True:
        row = json.loads(hpcdl("status", job, "--json").stdout)
        if row["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        assert time.monotonic() < deadline, f"job {job} not done in {JOB_TIMEOUT} s: {row}"
        time.sleep(2)
    err = (run / f"slurm-{job}.err").read_text()
    assert row["state"] == "CANCELLED", f"{row}\n{err[-3000:]}"
    hang = json.loads((run / "hang" / "diagnosis.json").read_text())
    assert hang["cancelled"] is True and hang["progress"] == "heartbeat", hang
    (s,) = hang["stragglers"]
    assert (s["label"], s["node"], s["function"], s["line"]) == ("rank 2", n2, "slow_step",
                                                                SLEEP_LINE), hang
    assert sorted(p.name for p in (run / "hang").iterdir()) == [
        "diagnosis.json", "diagnosis.txt", f"stacks-{n1}.txt", f"stacks-{n2}.txt"]
    assert sorted(p.name for p in (run / "heartbeat").iterdir()) == [
        "rank-0", "rank-1", "rank-2", "rank-3"]
    # The job's stderr says what its watchdog did (the lines --wait would have shown).
    assert f"hpcdl: hang watchdog: watching job {job} on {n1}" in err, err[-3000:]
    assert "hpcdl: hang watchdog: cancelling the job; stacks and diagnosis in" in err
    found = re.search(r"HANG_START (\S+)", (run / f"slurm-{job}.out").read_text())
    assert found, "no HANG_START in the job's output"
    started_at = float(found.group(1))
    print(f"\nhang watchdog in the job (no --wait): hang started {started_at:.1f}, diagnosis "
          f"complete {hang['detected_at']:.1f}: {hang['detected_at'] - started_at:.1f} s "
          f"(--hang-timeout {HANG_TIMEOUT}, stacks collected in {hang['collect_s']:.1f} s)")
    # (the last heartbeat came a step's sleep, 0.5 s, before HANG_START)
    assert float(HANG_TIMEOUT) - 1 <= hang["detected_at"] - started_at < float(HANG_TIMEOUT) + 60


def test_under_torchrun_the_workers_are_named_by_their_rank(
        jobs: dict, cpu_image: Path, tmp_path: Path, sandbox_twin: NetnsCluster) -> None:
    """--launcher torchrun: the wrapper records each node's agent; the workers (its
    children) are dumped with --subprocesses and named by the RANK torchrun gave them.
    Runs after the two jobs above (``jobs``), not beside them: 2 cores."""
    p = start(tmp_path, "hang-torchrun", ("-N", "2", "-G", "2", "--image", str(cpu_image),
                                          "--launcher", "torchrun"),
              "--steps", "3", "--slow-rank", "1")
    code, out, err = finish(p)
    assert out["state"] == "CANCELLED" and code != 0, f"{out}\n{err}"
    run = Path(out["run_dir"])
    assert sorted(f.name for f in (run / "pids").iterdir()) == ["node-0", "node-1"]
    (s,) = out["hang"]["stragglers"]
    assert (s["label"], s["node"], s["function"], s["line"]) == (
        "rank 1", sandbox_twin.nodes[0], "slow_step", SLEEP_LINE), out["hang"]
    (main,) = [p for p in out["hang"]["places"] if p["ranks"] != ["rank 1"]]
    assert main["ranks"] == ["rank 0", "rank 2", "rank 3"] and main["in_collective"]
