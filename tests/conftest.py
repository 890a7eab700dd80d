"""Shared pytest set-up. Each area registers its fixtures module here (one line each)."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# pytester: tests/unit/project/test_skip_policy.py runs small pytest sessions of its own;
# tests.skip_policy: in CI a skip is a failure (unless the test is gpu-marked);
# tests.durations: a whole run writes docs/generated/test-durations.md (docs/testing.md);
# tests.parallel: which tests share a cluster, so xdist keeps them to one worker.
pytest_plugins: list[str] = ["pytester", "tests.skip_policy", "tests.durations", "tests.parallel",
                             "tests.unit.conftest_examples", "tests.integration.conftest_apptainer",
                             "tests.integration.conftest_slurm", "tests.integration.conftest_user",
                             "tests.integration.conftest_releases",
                             "tests.integration.conftest_remote",
                             "tests.fakeslurm.fixture"]

# The sandbox's nodes see only the host's /home and /scratch (scripts/sandbox.sh), so the
# tests' temporary directories, where their run directories, scripts and datasets go,
# live on the shared /scratch when it is there (made by `sandbox up`) or can be made.
SHARED_TMP = Path("/scratch/tmp")
if Path("/scratch").is_dir() or os.geteuid() == 0:
    SHARED_TMP.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        SHARED_TMP.parent.chmod(0o1777)
        SHARED_TMP.chmod(0o1777)
    tempfile.tempdir = str(SHARED_TMP)


def require(condition: bool, why: str) -> None:
    """Skip when a real tool is missing: locally a skip with the reason, in CI a failure
    (tests/skip_policy.py turns every skip there into one)."""
    if not condition:
        pytest.skip(why)


def pytest_report_header() -> str:
    """The free disk where the tests write, first in the log: a run uses about 10 GB at
    its peak (the derived GPU image's build), and a full disk otherwise shows only as a
    build's ENOSPC."""
    folder = SHARED_TMP if SHARED_TMP.is_dir() else Path(tempfile.gettempdir())
    free = shutil.disk_usage(folder).free / 2**30
    return f"free disk under {folder}: {free:.1f} GiB"
