"""hpcdl/doctor/host.py on this machine, with Slurm's commands from a directory of the
test's own (the profile's scheduler.commands, which host_facts takes): the release and
MPI plugins read from srun, missing tools as facts rather than errors."""

from __future__ import annotations

import stat
from pathlib import Path

from hpcdl.doctor.host import host_facts

SRUN = """#!/bin/sh
case "$1" in
  --version) echo "slurm 24.11.1" ;;
  --mpi=list) printf 'MPI plugin types are...\\n\\tnone\\n\\tpmi2\\n\\tpmix\\nspecific pmix plugin versions available: pmix_v5,pmix_v4\\n' ;;
  *) exit 1 ;;
esac
"""


def tool(folder: Path, name: str, text: str) -> None:
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_the_release_and_mpi_plugins_come_from_srun(tmp_path):
    tool(tmp_path, "srun", SRUN)
    tool(tmp_path, "sbatch", "#!/bin/sh\nexit 0\n")
    f = host_facts(binary="/nonexistent/apptainer", commands=f"{tmp_path}/")
    assert f.slurm_commands == f"{tmp_path}/"
    assert f.slurm_tools == {"sbatch": True, "srun": True, "squeue": False, "sinfo": False,
                             "sacct": False, "scontrol": False}
    assert (f.slurm_version, f.slurm_release) == ("24.11.1", "24.11")
    assert f.srun_mpi == ["none", "pmi2", "pmix"] and f.pmix_plugins == ["pmix_v4", "pmix_v5"]
    # A runtime that is not there is a fact, not an exception.
    assert f.runtime is None and f.runtime_error and f.shared_loop_devices is None


def test_a_failing_srun_leaves_the_facts_empty(tmp_path):
    tool(tmp_path, "srun", "#!/bin/sh\necho broken >&2\nexit 3\n")
    f = host_facts(binary="/nonexistent/apptainer", commands=str(tmp_path))
    assert f.slurm_tools["srun"] and f.slurm_version is None and f.slurm_release is None
    assert f.srun_mpi == [] and f.release_notes == []


def test_an_unknown_release_keeps_the_version_and_says_so(tmp_path):
    tool(tmp_path, "srun", SRUN.replace("24.11.1", "99.01.0"))
    f = host_facts(binary="/nonexistent/apptainer", commands=str(tmp_path))
    assert f.slurm_version == "99.01.0"
    assert f.release_notes and any("99.01" in note for note in f.release_notes)
