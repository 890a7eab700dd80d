"""hpcdl.jobs.prepare: one prepare for every command, so each command's --dry-run refuses
what its submission refuses and shows what it runs (issue 45). A scheduler hpcdl does
not submit to (PBS, the bundled polaris profile) is where the copies disagreed: a dry
run there either prints the script to qsub or refuses with the submission's own line.
The runs are in-process (tests.unit.clirun) and submit nothing: polaris is refused
before any scheduler is asked."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from hpcdl.jobs.alloc import alloc_command, build_alloc
from hpcdl.plan import JobRequest
from hpcdl.profiles import load_profile
from hpcdl.schedulers.pbs.script import NO_SCRIPT
from tests.unit.clirun import hpcdl

# Each command that submits, with the arguments of a request it accepts.
COMMANDS = {
    "submit": ["-N", "1", "-G", "1", "--synthetic"],
    "scale": ["-N", "1", "-G", "1", "--synthetic"],
    "sweep": ["-N", "1", "-G", "1", "--synthetic", "--param", "lr=0.1,0.05"],
    "alloc": ["-N", "1", "-G", "1"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_pbs_dry_run_prints_the_script_or_refuses_as_the_submission_does(
        command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCDL_RUNS", str(tmp_path / "runs"))
    real = hpcdl(command, "-p", "polaris", *COMMANDS[command])
    dry = hpcdl(command, "-p", "polaris", *COMMANDS[command], "--dry-run")
    assert real.returncode == 2 and real.stdout == ""
    refusal = real.stderr.strip()
    assert refusal.startswith(f"error: scheduler: profile polaris uses pbs; hpcdl {command} "
                              f"works with Slurm only (")
    if command in NO_SCRIPT:
        # No PBS script of it exists (a job array, salloc): the dry run says what the
        # submission says, and does not offer itself as the way out.
        assert (dry.returncode, dry.stdout, dry.stderr.strip()) == (2, "", refusal)
        assert "--dry-run to print" not in refusal
    else:
        assert "use --dry-run to print the PBS script" in refusal
        assert dry.returncode == 0, dry.stderr
        assert dry.stdout
    assert not (tmp_path / "runs").exists()


def test_every_slurm_command_has_a_pbs_answer() -> None:
    # The commands refused dry run or not are commands that exist.
    assert set(NO_SCRIPT) <= set(COMMANDS)


@pytest.mark.parametrize("profile", ["generic", "karolina", "neuron", "sandbox", "taurus"])
def test_an_allocs_dry_run_shows_what_the_allocation_runs(profile: str) -> None:
    # The dry run's script, its comments aside, is the environment and the command that
    # run_alloc runs (no `module load` that nothing runs).
    dry = hpcdl("alloc", "-p", profile, "-N", "1", "-G", "1", "-t", "0:10:00", "--dry-run",
                "--", "srun", "hostname")
    assert dry.returncode == 0, dry.stderr
    commands = [line for line in dry.stdout.splitlines()
                if line.strip() and not line.startswith("#")]
    plan = build_alloc(load_profile(profile), JobRequest.of(
        nodes=1, gpus=1, time="0:10:00", job_name="interactive", command=("srun", "hostname")))
    argv, env = alloc_command(plan)
    assert commands == [*(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
                        shlex.join(argv)]
