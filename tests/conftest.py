"""Shared pytest set-up. Each area registers its fixtures module here (one line each)."""

import os

import pytest

pytest_plugins: list[str] = ["tests.unit.conftest_examples", "tests.integration.conftest_apptainer",
                             "tests.integration.conftest_slurm", "tests.integration.conftest_user",
                             "tests.fakeslurm.fixture"]

IN_CI = os.environ.get("CI") == "true"


def require(condition: bool, why: str) -> None:
    """Skip locally when a real tool is missing; in CI the same gap is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI must have this: {why}")
    pytest.skip(why)
