"""scripts/feature_files.py, issue 45's measure: the files a reader opens to follow
--data, --nodes and --spares from the command line to the job script. Each count stays
at or under what the parts' modules brought it to (a feature smeared again over more
files fails here, with the list), and the measure counts what reads the value, not
what hands its part on."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.project.scriptload import load_script

ROOT = Path(__file__).resolve().parents[3]

# At main before the parts moved next to their modules: --data 9, --nodes 10, --spares 11.
AT_MOST = {"--data": 6, "--nodes": 7, "--spares": 8}
PART_FILE = {"--data": "hpcdl/plan/data.py", "--nodes": "hpcdl/plan/partition.py",
             "--spares": "hpcdl/plan/partition.py"}


def _script() -> ModuleType:
    return load_script("feature_files")


@pytest.mark.parametrize("option", sorted(AT_MOST))
def test_each_option_is_followed_in_few_files(option: str) -> None:
    files, _ = _script().follow(option)
    assert files[:2] == ["hpcdl/cli/options.py", PART_FILE[option]], files
    assert files[-1] == "templates/sbatch.sh.j2", files
    assert len(files) <= AT_MOST[option], files


def test_reads_count_and_hand_overs_do_not() -> None:
    script = _script()
    data, after = script.follow("--data")
    # rules.check_shared_paths asks the DataPart for the host's path (a method that
    # returns the value): counted. check_request only asks the part to check itself.
    assert "hpcdl/plan/rules.py" in data and "hpcdl/plan/request.py" not in data
    # many_files_warning reads the decided dataset after the script is rendered.
    assert after == ["hpcdl/jobs/preflight.py"]
    spares, after = script.follow("--spares")
    # The launcher reads spec.spares (srun on the guard's nodes); --dry-run's summary
    # line reads it after the script.
    assert "hpcdl/schedulers/launchers.py" in spares and "hpcdl/cli/submit.py" in after
