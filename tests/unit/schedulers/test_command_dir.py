"""A profile's scheduler.commands: every Slurm command the adapter runs comes from that
directory (CommandDir around the transport), any other argv runs as given."""

from __future__ import annotations

import stat
from pathlib import Path

from hpcdl.schedulers.executor import LOCAL, CommandDir
from hpcdl.schedulers.registry import scheduler_for
from hpcdl.schedulers.slurm.commands import SLURM_COMMANDS


def _fake_command(folder: Path, name: str, text: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\necho {text} \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_slurm_commands_run_from_the_directory(tmp_path):
    _fake_command(tmp_path, "squeue", "release-squeue")
    ex = CommandDir(LOCAL, str(tmp_path), SLURM_COMMANDS)
    res = ex.run(["squeue", "-h"], timeout=10)
    assert res.stdout == "release-squeue -h\n"
    assert res.argv == ("squeue", "-h")  # messages name the command as hpcdl asked it
    # Not a scheduler command: PATH's.
    assert ex.run(["echo", "plain"], timeout=10).stdout == "plain\n"
    assert ex.which("squeue") == str(tmp_path / "squeue")
    assert ex.which_all(["squeue", "sbatch"]) == {"squeue": str(tmp_path / "squeue"),
                                                   "sbatch": None}


def test_the_adapter_uses_the_profile_directory(tmp_path):
    for name in ("sbatch", "squeue", "sacct", "scontrol"):
        _fake_command(tmp_path, name, name)
    sched = scheduler_for("p", "slurm", LOCAL, str(tmp_path))
    assert sched.available()
    assert scheduler_for("p", "slurm", LOCAL, str(tmp_path / "nowhere")).available() is False


def test_alloc_runs_salloc_from_the_profiles_command_directory():
    from hpcdl.jobs.alloc import alloc_command, build_alloc
    from hpcdl.plan import JobRequest
    from hpcdl.profiles import load_profile
    from hpcdl.schedulers.registry import with_commands

    prof = load_profile("sandbox")
    prof = prof.model_copy(update={"scheduler": prof.scheduler.model_copy(
        update={"commands": "/opt/slurm/24.11/bin", "release": "24.11"})})
    plan = build_alloc(prof, JobRequest.of(nodes=1, gpus=1))
    argv, env = alloc_command(plan, with_commands(prof, LOCAL))
    assert argv[0] == "/opt/slurm/24.11/bin/salloc" and argv[1:] == list(plan.argv[1:])
    # The release's variable for srun's CPUs per task, in salloc's environment.
    assert env == {"SLURM_CPUS_PER_TASK": plan.env[0][1]}
    plain = load_profile("sandbox")
    assert with_commands(plain, LOCAL) is LOCAL
