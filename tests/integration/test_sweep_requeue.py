"""`hpcdl sweep --requeue` on the real sandbox: one task of a 2-point array of the bundled
example is stopped mid-run and requeued, by its own batch shell, on its own; both points
end COMPLETED with the weights of an uninterrupted sweep, each with its attempts under
its own task id.

The task stopped is the one whose SLURM_JOB_ID is the array's own job id (Slurm gives it
to the last task it starts): for scontrol and squeue that id names every task of the
array, so a task that requeued itself by it would requeue its sibling too. It is stopped
the way a preemption stops it (USR2 to the batch shell: the ranks checkpoint at their
next step and exit 85, the shell requeues the task); `hpcdl sweep --wait` follows the
array through it. Helpers (the BeginTime release, the checksum) are test_requeue.py's.

Cost: two short sweeps of 2 points each, the points side by side (-c 1 each): the
uninterrupted one ~30 s, the requeued one ~1.5 min (20 steps of 1.5 s, plus the
requeued task's second start).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest_slurm import REPO, hpcdl
from tests.integration.test_requeue import CHECKSUM, checkpoints, sh, slurm_state, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.usefixtures("sandbox_twin"),
              pytest.mark.timeout(600)]

STEPS = 20
# Two points of the bundled example on the host's Python (this checkout's hpcdl on the
# ranks' PYTHONPATH: the requeue contract is hpcdl.jobside.requeue), one node and one rank each.
SWEEP = ["sweep", "-p", "sandbox", "-N", "1", "-G", "1", "-c", "1", "--backend", "ddp",
         "--no-image", "--synthetic", "-e", f"PYTHONPATH={REPO}",
         "-X", "--arch=resnet18", "-X", f"--max-steps={STEPS}", "-X", "--epochs=1",
         "-X", "--checkpoint-every=5", "--param", "lr=0.1,0.05", "--json"]
JOB_LINE = re.compile(r"^hpcdl: job (\d+) on ", re.M)


def points(sweep_dir: Path) -> dict[int, tuple[str, Path]]:
    """index -> (task id, run directory) from sweep.json."""
    record = json.loads((sweep_dir / "sweep.json").read_text())
    return {p["index"]: (p["job_id"], sweep_dir / p["run_dir"]) for p in record["points"]}


def checksum(task: str, run_dir: Path) -> str:
    sums = {m.group(2) for m in CHECKSUM.finditer((run_dir / f"slurm-{task}.out").read_text())}
    assert len(sums) == 1, sums
    return sums.pop()


def the_sweep(runs: Path) -> Path:
    """The sweep directory once its array is submitted (sweep.json with the task ids)."""
    found = list(runs.glob("sweep-*/sweep.json")) if runs.is_dir() else []
    if found and json.loads(found[0].read_text())["arrays"]:
        return found[0].parent
    raise LookupError


def test_a_requeued_task_resumes_alone_to_the_weights_of_an_uninterrupted_sweep(
        tmp_path: Path) -> None:
    ref_runs, runs = tmp_path / "ref", tmp_path / "runs"
    ref = hpcdl(*SWEEP, "--wait", env={"HPCDL_RUNS": str(ref_runs)}, timeout=400)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    (ref_dir,) = ref_runs.glob("sweep-*")
    reference = {i: checksum(task, run) for i, (task, run) in points(ref_dir).items()}
    ref_rows = {r["point"]: r for r in json.loads(ref.stdout)["rows"]}

    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdl", *SWEEP, "-X", "--step-sleep=1.5", "--requeue", "--wait"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HPCDL_RUNS": str(runs)})
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                sweep_dir = the_sweep(runs)
                break
            except LookupError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
                time.sleep(0.5)
        tasks = points(sweep_dir)
        array = tasks[0][0].split("_")[0]
        # Both tasks run; the one that carries the array's own job id is the one to stop.
        raw: dict[int, str] = {}
        for index, (task, run) in tasks.items():
            log = run / f"slurm-{task}.out"
            wait_for(f"task {task} to start", lambda log=log: log.is_file()  # type: ignore[misc]
                     and bool(JOB_LINE.search(log.read_text())), task, 200)
            raw[index] = JOB_LINE.search(log.read_text()).group(1)  # type: ignore[union-attr]
        (stopped,) = [i for i, job in raw.items() if job == array]
        (other,) = set(tasks) - {stopped}
        task, run = tasks[stopped]
        wait_for("a checkpoint", lambda: bool(checkpoints(run))
                 and slurm_state(task)[0] == "RUNNING", task, 200)
        assert slurm_state(tasks[other][0])[0] == "RUNNING"  # side by side when it stops
        sh("scancel", "--batch", "--signal=USR2", task)
        wait_for("the task requeued", lambda: slurm_state(task)[0] == "PENDING", task, 120)
        # The requeued task waits for its BeginTime; wait_for releases it.
        wait_for("the sweep's end", lambda: proc.poll() is not None, task, 400)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    rows = json.loads(out)["rows"]
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
    for index, (task_id, run_dir) in tasks.items():
        assert checksum(task_id, run_dir) == reference[index], f"point {index}"
    # top1 is measured on the final weights: the same for both points. The example's
    # final_loss is the mean over the last epoch's steps of the attempt that printed it:
    # the same for the point that ran once; the resumed point's covers only its second
    # attempt's steps (docs/guide/sweep.md says so).
    got = {r["point"]: r for r in rows}
    for index in tasks:
        assert got[index]["top1"] == pytest.approx(ref_rows[index]["top1"], rel=1e-9)
    assert got[other]["final_loss"] == pytest.approx(ref_rows[other]["final_loss"], rel=1e-9)

    stopped_out = (run / f"slurm-{task}.out").read_text()
    assert "exiting 85 (requeue me)" in stopped_out and "resumed from" in stopped_out
    # Each task's attempts, in its own run directory, under its own task id.
    lines = [ln.split("\t") for ln in (run / "attempts.tsv").read_text().splitlines()]
    assert [(c[0], c[1], c[4], c[5]) for c in lines] == [(task, "0", "85", "PREEMPTED"),
                                                         (task, "1", "0", "COMPLETED")]
    other_task, other_run = tasks[other]
    lines = [ln.split("\t") for ln in (other_run / "attempts.tsv").read_text().splitlines()]
    assert [(c[0], c[1], c[5]) for c in lines] == [(other_task, "0", "COMPLETED")]
    env = {"HPCDL_RUNS": str(runs)}
    status = json.loads(hpcdl("status", task, "--json", env=env).stdout)
    assert status["state"] == "COMPLETED"
    assert [a["reason"] for a in status["attempts"]] == ["PREEMPTED", "COMPLETED"], status
    status = json.loads(hpcdl("status", other_task, "--json", env=env).stdout)
    # One attempt: status lists attempts only for a job that was requeued.
    assert status["state"] == "COMPLETED" and "attempts" not in status, status
