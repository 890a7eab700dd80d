"""`hpcdl doctor -p PROFILE` looks for Slurm's tools in the profile's scheduler.commands
directory (a release sandbox's, a site module's) and shows the release they are and
what hpcdl does differently on it; on PATH's 22.05 it says nothing differs."""

from __future__ import annotations

import stat
from pathlib import Path

from hpcdl.doctor.host import host_facts


def _fake_srun(folder: Path, version: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    srun = folder / "srun"
    srun.write_text("#!/bin/sh\n"
                    f'case "$1" in --version) echo "{version}";; '
                    "*) echo 'MPI plugin types are...'; echo '\tnone'; echo '\tpmi2';; esac\n")
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)


def test_doctor_reads_the_release_from_the_command_directory(tmp_path):
    _fake_srun(tmp_path / "bin", "slurm-wlm 26.05.5")
    facts = host_facts(commands=str(tmp_path / "bin"))
    assert facts.slurm_commands == str(tmp_path / "bin")
    assert facts.slurm_tools["srun"] and not facts.slurm_tools["sbatch"]
    assert facts.slurm_version == "26.05.5" and facts.slurm_release == "26.05"
    assert any("--requeue=expedite" in n for n in facts.release_notes)
    assert facts.srun_mpi == ["none", "pmi2"]


def test_an_unknown_release_is_named_with_the_nearest(tmp_path):
    _fake_srun(tmp_path / "bin", "slurm 21.08.8")
    facts = host_facts(commands=str(tmp_path / "bin"))
    assert facts.slurm_release == "22.05"
    assert "21.08.8" in facts.release_notes[0] and "srun --version" in facts.release_notes[0]
