"""hpcdl/schedulers/registry.py: the adapter a profile's scheduler.type picks, a type
nothing submits to refused in one line, the run files' names, and a profile's
scheduler.commands directory put in front of the transport."""

from __future__ import annotations

import pytest

from hpcdl.errors import UserInputError
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.executor import LOCAL, CommandDir
from hpcdl.schedulers.registry import run_files, scheduler_for, scheduler_of, with_commands
from hpcdl.schedulers.slurm.adapter import SlurmScheduler


def profile(**scheduler: object) -> Profile:
    return Profile.model_validate({"name": "site", "scheduler": scheduler, "partitions": [
        {"name": "p", "nodes": 1, "gpus_per_node": 0, "cpus_per_node": 4, "max_time": "01:00:00"}]})


def test_slurm_profiles_get_the_slurm_adapter_and_pbs_is_refused():
    assert isinstance(scheduler_for("site"), SlurmScheduler)
    assert isinstance(scheduler_of(profile()), SlurmScheduler)
    with pytest.raises(UserInputError, match=r"scheduler: hpcdl submits to slurm only "
                                             r"\(profile site: pbs\)"):
        scheduler_for("site", "pbs")
    with pytest.raises(UserInputError):
        run_files("pbs")


def test_a_run_directorys_files_are_named_with_the_job_id():
    files = run_files()
    out, err = files.logs("4242")
    assert "4242" in out and "4242" in err and out != err
    assert files.script.endswith(".sbatch")


def test_the_commands_directory_serves_slurms_commands_only():
    assert with_commands(profile(), LOCAL) is LOCAL
    ex = with_commands(profile(commands="/opt/slurm-24.11/bin/"), LOCAL)
    assert isinstance(ex, CommandDir) and ex.directory == "/opt/slurm-24.11/bin"
    assert ex.path("sbatch") == "/opt/slurm-24.11/bin/sbatch"
    assert ex.path("salloc") == "/opt/slurm-24.11/bin/salloc"
    assert ex.path("bash") == "bash"
    assert ex == with_commands(profile(commands="/opt/slurm-24.11/bin"), LOCAL)
