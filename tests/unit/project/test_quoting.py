"""User values reach the job verbatim and never execute.

The rendered script is checked with `bash -n`, then run by bash with `srun`
replaced by a recorder that saves its argv and environment (NUL-separated), so
the values the job would see can be compared byte for byte.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpcdl.plan import JobPlan, JobRequest, build_plan
from hpcdl.profiles import load_profile
from hpcdl.schedulers.slurm.adapter import SlurmScheduler
from tests.unit.jobfiles import stage_job_scripts


def evil(marker: Path) -> list[str]:
    return [
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"x; touch {marker}",
        f"it's \"quoted\" && touch {marker}",
        f"line1\nline2 $(touch {marker})",
        f"$HOME ${{PATH}} \\ {marker}",
    ]


RECORDER = """#!/bin/bash
printf '%s\\0' "$@" > "$HPCDL_TEST_OUT/argv"
env -0 > "$HPCDL_TEST_OUT/env"
"""


def run_script(plan: JobPlan, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    stage_job_scripts(plan, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("srun", "mpirun", "apptainer"):
        (bin_dir / tool).write_text(RECORDER)
        (bin_dir / tool).chmod(0o755)
    path = tmp_path / "job.sbatch"
    path.write_text(plan.script)
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HPCDL_TEST_OUT": str(tmp_path),
           "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_CPUS_PER_TASK": "2",
           "HOME": "/root"}
    subprocess.run(["bash", str(path)], check=True, timeout=30, env=env, cwd=tmp_path)
    argv = (tmp_path / "argv").read_bytes().decode().split("\0")[:-1]
    pairs = (tmp_path / "env").read_bytes().decode().split("\0")[:-1]
    return argv, dict(p.split("=", 1) for p in pairs)


@pytest.mark.parametrize("index", range(6))
def test_values_arrive_verbatim_and_never_execute(tmp_path, index):
    marker = tmp_path / "pwned"
    value = evil(marker)[index]
    name = value.replace("\n", " ")  # a Slurm job name cannot hold a newline
    plan = build_plan(
        load_profile("sandbox"),
        JobRequest.of(
            nodes=2, gpus=4, job_name=name, env=(("HPCDL_EVIL", value),),
            image=f"/scratch/img/{name}.sif", binds=(f"/scratch/data/{name.replace(',', '')}",),
            command=("python3", "-c", "pass", value),
        ),
    )
    argv, env = run_script(plan, tmp_path)
    assert not marker.exists(), "a user value was executed"
    assert env["HPCDL_EVIL"] == value
    assert env["HPCDL_JOB_NAME"] == name
    assert env["HPCDL_IMAGE"] == f"/scratch/img/{name}.sif"
    # srun's argv: --label --mpi=pmix apptainer exec --nv -B BIND IMAGE
    #   /bin/sh ./job/bin/hpcdl-rank-env python3 -c pass VALUE
    assert argv == ["--label", "--kill-on-bad-exit=1", "--mpi=pmix", "apptainer", "exec", "--nv",
                    "-B", "/var/lib/hpcdl-sandbox/tmp", "-B", "/scratch", "-B", "/local",
                    "-B", f"/scratch/data/{name}",
                    f"/scratch/img/{name}.sif", "/bin/sh", "./job/bin/hpcdl-rank-env",
                    "python3", "-c", "pass", value]
    # The wrapper (the staged file) hands its arguments on verbatim too.
    out = subprocess.run([*argv[15:17], "printf", "%s", value], capture_output=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"},
                         cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.decode() == value
    assert not marker.exists(), "a user value was executed by the wrapper"


def test_sbatch_header_carries_quoted_name_on_one_line(tmp_path):
    plan = build_plan(load_profile("sandbox"),
                      JobRequest.of(nodes=1, gpus=1, job_name='a "b" $(c)', command=("true",)))
    header = [line for line in plan.script.splitlines() if line.startswith("#SBATCH --job-name")]
    assert header == ["#SBATCH --job-name=\"a 'b' $(c)\""]
    # The exact name travels on sbatch's argv, where no parser touches it.
    assert SlurmScheduler().submit_argv("j.sbatch", plan.spec.job_name)[2] == '--job-name=a "b" $(c)'
