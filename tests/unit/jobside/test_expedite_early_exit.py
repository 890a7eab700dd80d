"""A --requeue=expedite job (Slurm 25.11 on, where the cluster enables it) that stops
before its requeue block (staging, the packed dataset's mount, --probe-first) tells Slurm
not to requeue it, as the requeue block's own final exits do: Slurm 26.05.5 holds such a
job requeued (REQUEUE_HOLD) for good otherwise. The rendered script runs in bash with
stub srun (every step fails), scontrol (logged) and squeue; a 24.11 script (no expedite)
exits the same way without a word to Slurm."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpcdl.plan import JobRequest, build_plan
from hpcdl.profiles import load_profile
from tests.unit.jobfiles import stage_job_scripts


def _profile(release: str):  # type: ignore[no-untyped-def]
    prof = load_profile("sandbox")
    return prof.model_copy(update={"scheduler": prof.scheduler.model_copy(
        update={"release": release, "requeue_expedite": True})})


# What stops the script before its requeue block, and how it says so (stderr).
CASES = {
    "probe": (dict(probe=("--sizes", "4K"), probe_first=True, command=("true",)),
              "the probe failed (exit 3", 3),
    "packed-data": (dict(data="/scratch/data/x.sqfs", command=("true",)),
                    "packed dataset: squashfuse_ll", 1),
}


def _run(tmp_path: Path, release: str, case: str) -> tuple[int, str, str]:
    kw, _, _ = CASES[case]
    plan = build_plan(_profile(release), JobRequest.of(
        nodes=2, gpus=0, run_dir=str(tmp_path / "run"), requeue=True, image=None, **kw))
    assert "hpcdl_final" in plan.script or release != "26.05"
    stage_job_scripts(plan, tmp_path)
    stub = tmp_path / "bin"
    stub.mkdir()
    # Every step fails: the probe with 3, the dataset's mount.
    (stub / "srun").write_text("#!/bin/bash\nexit 3\n")
    (stub / "sbcast").write_text("#!/bin/bash\nexit 3\n")
    (stub / "scontrol").write_text('#!/bin/bash\n[[ $1 == show ]] && { echo n1; exit 0; }\n'
                                   f'echo "$@" >> {tmp_path}/scontrol.log\n')
    (stub / "squeue").write_text("#!/bin/bash\nexit 0\n")
    (stub / "sleep").write_text("#!/bin/bash\nexit 0\n")  # the mount's 60 s of waiting
    for f in stub.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(plan.script)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "SLURM_JOB_ID": "42",
           "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_SUBMIT_DIR": str(tmp_path)}
    env.pop("SLURM_ARRAY_JOB_ID", None)
    proc = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
    log = tmp_path / "scontrol.log"
    return proc.returncode, proc.stderr, log.read_text() if log.exists() else ""


@pytest.mark.parametrize("case", ["probe", "packed-data"])
@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_an_early_exit_of_an_expedite_job_sets_requeue_0(tmp_path: Path, release: str,
                                                        case: str) -> None:
    code, err, scontrol = _run(tmp_path, release, case)
    _, said, rc = CASES[case]
    assert said in err and code == rc, err
    # Once, before the exit, by the job's own id; never the requeue block's requeue.
    assert scontrol.splitlines() == (["update JobId=42 Requeue=0"] if release == "26.05"
                                     else []), scontrol


def test_the_staging_exits_go_through_the_same_function() -> None:
    # sbcast and its free-space check need a real file and nodes: the rendered lines say it.
    plan = build_plan(_profile("26.05"), JobRequest.of(
        nodes=2, gpus=0, run_dir="/scratch/runs/x", requeue=True, image="/scratch/i/x.sif",
        data="/scratch/data/x.sqfs", stage_image=True, stage_data=True))
    lines = plan.script.splitlines()
    stage = lines[lines.index("hpcdl_stage() {"):]
    stage = stage[:stage.index("}")]
    assert [ln.strip() for ln in stage if "exit" in ln.split()[:1] or "hpcdl_final" in ln] \
        == ["hpcdl_final 1", "hpcdl_final 1"]
    # One definition, before the first exit that uses it; no `exit N` but its own.
    assert plan.script.count("hpcdl_final() {") == 1
    assert plan.script.index("hpcdl_final() {") < plan.script.index("hpcdl_stage() {")
    assert [ln.strip() for ln in lines if ln.strip().startswith("exit ")] == ['exit "$1"']
    plain = build_plan(_profile("24.11"), JobRequest.of(
        nodes=2, gpus=0, run_dir="/scratch/runs/x", requeue=True, image="/scratch/i/x.sif",
        data="/scratch/data/x.sqfs", stage_image=True, stage_data=True))
    assert "hpcdl_final" not in plain.script and "Requeue=0" not in plain.script
