"""In CI (CI=true) a skipped test is a failure: the one place that says so.

A local run skips what this machine lacks (no Slurm, no image, no torch) and says why; in
CI the same skip would let a run pass with a piece never tested, so it fails, naming the
test and the skip's reason. Only a test carrying a marker of SKIP_ALLOWED may still skip
there: a need that no machine this project's CI or developers run on can meet. Every
skip goes through here: ``pytest.skip`` in a test or fixture, ``require()``, a
``skipif`` mark, ``pytest.importorskip`` (in a test, or at module level: then the
module's collection fails).
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

# marker -> why no machine here can run such a test (printed in pytest's header in CI).
SKIP_ALLOWED: dict[str, str] = {
    "gpu": "needs an NVIDIA GPU; CI and the development machines have none",
}


def in_ci() -> bool:
    # Read at each report, not at import: a pytester run sets CI for its own session.
    return os.environ.get("CI") == "true"


def skip_reason(longrepr: Any) -> str:
    """The reason pytest keeps for a skip: (path, line, 'Skipped: why') for a test,
    the same tuple or a text for a collector."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def failure_text(what: str, when: str, reason: str) -> str:
    allowed = ", ".join(sorted(SKIP_ALLOWED))
    return (f"CI=true: a skip is a failure: {what} skipped in {when}: {reason} "
            f"(only tests marked {allowed} may skip in CI; tests/skip_policy.py)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    # An xfail is reported as a skip carrying wasxfail: an expected failure, not a gap.
    if not report.skipped or hasattr(report, "wasxfail") or not in_ci():
        return report
    if any(item.get_closest_marker(name) for name in SKIP_ALLOWED):
        return report
    report.outcome = "failed"
    report.longrepr = failure_text(item.nodeid, report.when, skip_reason(report.longrepr))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector
                               ) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    # A module-level importorskip skips the whole module before its marks can be read, so
    # no marker exempts it: the missing module is a gap in CI whatever the tests need.
    if report.skipped and in_ci():
        report.outcome = "failed"
        report.longrepr = failure_text(collector.nodeid, "collection",
                                       skip_reason(report.longrepr))
    return report


def pytest_report_header(config: pytest.Config) -> str | None:
    if not in_ci():
        return None
    allowed = "; ".join(f"{name}: {why}" for name, why in SKIP_ALLOWED.items())
    return f"CI=true: a skip fails the test unless it is marked ({allowed})"
