"""The table of Slurm releases (hpcdl.schedulers.slurm.releases): each behaviour flips
at the release SchedMD's notes name, versions parse from every form sbatch prints, and
an unknown release gets one line naming it and what was tried, with the nearest known
behaviour."""

from __future__ import annotations

import stat

import pytest

from hpcdl.jobside.errors import ValidationError
from hpcdl.schedulers.executor import LOCAL
from hpcdl.schedulers.slurm import releases
from hpcdl.schedulers.slurm.adapter import SlurmScheduler


@pytest.mark.parametrize(("text", "want"), [
    ("slurm 22.05.8\n", (22, 5, 8)),
    ("slurm-wlm 24.11.5\n", (24, 11, 5)),
    ("slurm 25.11.0-0rc1", (25, 11, 0)),
    ("slurm-wlm 26.05.5", (26, 5, 5)),
])
def test_versions_parse(text, want):
    assert releases.parse_version(text) == want


@pytest.mark.parametrize("text", ["", "sbatch: command not found", "slurm 24", "24.11"])
def test_no_version_is_one_line(text):
    with pytest.raises(ValidationError) as err:
        releases.parse_version(text)
    assert "\n" not in err.value.message and "sbatch --version" in err.value.message


# release: (cpus env, gpus exclusive, tres-bind, expedite, no-kill bug, sigterm teardown)
TABLE = {
    "22.05.8": ("SRUN_CPUS_PER_TASK", False, False, False, True, False),
    "23.02.2": ("SRUN_CPUS_PER_TASK", False, False, False, True, False),
    "23.02.3": ("SRUN_CPUS_PER_TASK", False, False, False, False, False),
    "23.11.1": ("SLURM_CPUS_PER_TASK", False, True, False, False, False),
    "24.05.4": ("SLURM_CPUS_PER_TASK", False, True, False, False, False),
    "24.11.5": ("SLURM_CPUS_PER_TASK", False, True, False, False, False),
    "25.05.0": ("SLURM_CPUS_PER_TASK", False, True, False, False, False),
    "25.11.2": ("SLURM_CPUS_PER_TASK", False, True, True, False, False),
    "26.05.5": ("SLURM_CPUS_PER_TASK", True, True, True, False, True),
}


@pytest.mark.parametrize(("version", "row"), TABLE.items())
def test_each_known_release(version, row):
    rel = releases.release_of(f"slurm {version}")
    b = rel.behaviour
    assert rel.note is None and rel.version == version
    assert (b.cpus_per_task_env, b.gpus_exclusive, b.tres_bind, b.requeue_expedite,
            b.no_kill_step_bug, b.sigterm_teardown) == row


def test_the_table_covers_every_release_from_22_05_to_26_05():
    assert list(releases.KNOWN) == ["22.05", "23.02", "23.11", "24.05", "24.11", "25.05",
                                    "25.11", "26.05"]


@pytest.mark.parametrize(("version", "nearest"), [
    ("21.08.8", "22.05"), ("20.11.9", "22.05"), ("27.05.0", "26.05"), ("27.11.1", "26.05"),
    ("24.08.1", "24.05"),  # never released: the older neighbour
])
def test_unknown_release_one_line_and_nearest(version, nearest):
    rel = releases.release_of(f"slurm {version}", tried="sbatch --version")
    assert rel.behaviour.release == nearest
    assert rel.note is not None and "\n" not in rel.note
    assert version in rel.note and "sbatch --version" in rel.note
    assert f"uses {nearest}'s behaviour" in rel.note


def test_the_adapter_reads_the_release_once(tmp_path):
    calls = tmp_path / "calls"
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'slurm-wlm 24.11.5'\n")
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IXUSR)
    sched = SlurmScheduler("p", LOCAL, str(tmp_path))
    assert sched.release().behaviour.cpus_per_task_env == "SLURM_CPUS_PER_TASK"
    assert sched.release().version == "24.11.5"
    assert calls.read_text() == "x\n"
