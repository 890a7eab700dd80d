"""The plan and the scheduler's dialect: planning decides the job in hpcdl's words, the
dialect spells it. Each derived value is made once, and what the plan records is what
the script runs."""

from __future__ import annotations

import shlex

import pytest

from hpcdl import plan as plan_pkg
from hpcdl.plan import JobRequest, build_plan
from hpcdl.plan import build as build_mod
from hpcdl.profiles import load_profile
from hpcdl.schedulers.dialects import dialect_for


def _binds_in(launch_line: str) -> list[str]:
    words = shlex.split(launch_line.replace('"${HPCDL_RANK_ENV:?}"', "W"))
    return [words[i + 1] for i, word in enumerate(words) if word == "-B"]


@pytest.mark.parametrize("command", [(), ("python3", "train.py")])
def test_the_plan_records_the_binds_the_ranks_get(tmp_path, command) -> None:
    # The run directory's bind (logs, checkpoints) is in both, from one derivation.
    run_dir = str(tmp_path / "run")
    plan = build_plan(load_profile("sandbox"), JobRequest.of(
        nodes=2, gpus=1, image="/scratch/images/x.sif", run_dir=run_dir, command=command,
        binds=("/scratch/data:/data",), synthetic=not command))
    assert _binds_in(plan.launch.launch_line) == list(plan.container.binds)
    assert run_dir in plan.container.binds and "/scratch/data:/data" in plan.container.binds


def test_a_pbs_plan_names_its_own_logs() -> None:
    plan = build_plan(load_profile("polaris"), JobRequest.of(
        nodes=2, gpus=4, run_dir="/lus/grand/me/run", job_name="my job"))
    assert plan.files.output == "/lus/grand/me/run/my_job.o<sequence number>"
    assert plan.files.error == "/lus/grand/me/run/my_job.e<sequence number>"
    assert "slurm" not in plan.files.output + plan.files.error
    assert "#PBS -o /lus/grand/me/run/" in plan.script
    slurm = build_plan(load_profile("sandbox"), JobRequest.of(nodes=1, run_dir="/scratch/r"))
    assert (slurm.files.output, slurm.files.error) == ("/scratch/r/slurm-%j.out", "/scratch/r/slurm-%j.err")


def test_each_derived_value_is_computed_once(monkeypatch) -> None:
    counts: dict[str, int] = {}

    def counting(name):
        real = getattr(build_mod, name)

        def wrapper(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return real(*args, **kwargs)
        monkeypatch.setattr(build_mod, name, wrapper)

    for name in ("job_time", "requeue_spec", "example_defaults", "job_image", "container_binds",
                 "decide_data"):
        counting(name)
    build_plan(load_profile("sandbox"), JobRequest.of(
        nodes=2, gpus=1, image="/scratch/images/x.sif", run_dir="/scratch/r", requeue=True,
        synthetic=True))
    assert counts == {"job_time": 1, "requeue_spec": 1, "example_defaults": 1, "job_image": 1,
                      "container_binds": 1, "decide_data": 1}


def test_the_dialect_owns_what_its_scheduler_cannot_do() -> None:
    sandbox, polaris = load_profile("sandbox"), load_profile("polaris")
    slurm, pbs = dialect_for("slurm"), dialect_for("pbs")
    assert [slurm.unsupported(sandbox, f) for f in ("probe", "stage", "torchrun")] == [None] * 3
    assert all(pbs.unsupported(polaris, f) for f in ("probe", "stage", "torchrun"))
    # Only jobs hpcdl submits get a requeue (from the profile) and a progress file.
    assert plan_pkg.requeue_spec(polaris, JobRequest.of(requeue=True).resilience, pbs) is None
    spec = plan_pkg.requeue_spec(sandbox, JobRequest.of(requeue=True, signal="USR1@90").resilience, slurm)
    assert spec is not None and (spec.signal, spec.lead, spec.chain) == ("USR1", 90, 1)
    plan = build_plan(polaris, JobRequest.of(nodes=1, requeue=True, run_dir="/lus/r"))
    assert plan.spec.requeue is None and not plan.launch.records_steps and "HPCDL_PROGRESS_FILE" not in plan.script
