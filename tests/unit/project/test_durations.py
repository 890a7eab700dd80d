"""tests/durations.py in small pytest sessions of their own (pytester): a run of the whole
tests tree writes the durations page and its json; a subset, one file, a -k/-m
selection or a -x stop leaves the last whole run's files alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import durations

UNIT = '''
import time

def test_fails():
    assert False

def test_fast():
    pass

def test_slow():
    time.sleep(0.2)
'''

INTEGRATION = '''
import pytest

def test_other():
    pass

def test_skipped():
    pytest.skip("no tool")
'''


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("HPCDL_SETUP_SECONDS", "75")
    monkeypatch.setenv("HPCDL_LINT_SECONDS", "not a number")
    pytester.makeini("[pytest]\nhpcdl_durations_dir = out\n")
    for tier, source in (("unit", UNIT), ("integration", INTEGRATION)):
        folder = pytester.path / "tests" / tier
        folder.mkdir(parents=True)
        (folder / f"test_{tier}.py").write_text(source)
    return pytester


def out(pytester: pytest.Pytester) -> Path:
    return pytester.path / "out"


def test_a_whole_run_writes_the_slowest_tests_and_each_tier(suite: pytest.Pytester) -> None:
    result = suite.runpytest_inprocess("-p", "tests.durations", "tests")
    # One test fails: the run still ran everything, and its times are written.
    result.assert_outcomes(passed=3, failed=1, skipped=1)
    data = json.loads((out(suite) / "test-durations.json").read_text())
    assert data["tiers"]["unit"]["tests"] == 3
    assert data["tiers"]["integration"]["tests"] == 2
    assert data["tiers"]["unit"]["seconds"] >= 0.2
    assert data["outcomes"] == {"passed": 3, "failed": 1, "skipped": 1}
    assert data["slowest"][0]["nodeid"] == "tests/unit/test_unit.py::test_slow"
    assert data["slowest"][0]["seconds"] >= 0.2
    # The Makefile's set-up seconds are taken; a value that is not a number is not.
    assert data["stages"] == {"set-up (scripts/setup.sh)": 75.0}
    page = (out(suite) / "test-durations.md").read_text()
    assert "| tests/unit | 3 |" in page
    assert "| set-up (scripts/setup.sh) | | 75.0 s |" in page
    assert "| 1 | `tests/unit/test_unit.py::test_slow` |" in page
    # Written through a temp file + rename: nothing else is left in the folder.
    assert sorted(p.name for p in out(suite).iterdir()) == ["test-durations.json",
                                                             "test-durations.md"]


def test_no_argument_runs_the_testpaths_and_counts_as_whole(suite: pytest.Pytester) -> None:
    suite.makeini("[pytest]\nhpcdl_durations_dir = out\ntestpaths = tests\n")
    suite.runpytest_inprocess("-p", "tests.durations")
    assert (out(suite) / "test-durations.md").is_file()


@pytest.mark.parametrize("args", [
    ["tests/unit"],
    ["tests/unit/test_unit.py"],
    ["tests/unit/test_unit.py::test_fast"],
    ["tests", "-k", "fast"],
    ["tests", "-m", "not slow"],
    ["tests", "-x"],
    ["tests", "--deselect", "tests/unit/test_unit.py::test_fast"],
    ["tests", "--ignore", "tests/unit/test_unit.py"],
    ["tests", "--ignore-glob", "*/test_unit.py"],
    ["tests", "--collect-only"],
], ids=lambda a: " ".join(a))
def test_a_partial_run_writes_nothing(suite: pytest.Pytester, args: list[str]) -> None:
    result = suite.runpytest_inprocess("-p", "tests.durations", *args)
    # Each of these sessions did run (or collect): the plugin chose not to write.
    assert result.ret in (0, 1)
    assert not out(suite).exists()


def test_a_partial_run_keeps_the_last_whole_runs_file(suite: pytest.Pytester) -> None:
    suite.runpytest_inprocess("-p", "tests.durations", "tests")
    before = (out(suite) / "test-durations.json").read_text()
    suite.runpytest_inprocess("-p", "tests.durations", "tests/integration")
    assert (out(suite) / "test-durations.json").read_text() == before


def test_an_xdist_run_sums_each_group_and_each_file(suite: pytest.Pytester) -> None:
    """Under `-n N --dist loadgroup` the ids carry their group (``@sandbox``): the page and
    the json sum every group and every file, so the next balance is measured."""
    (suite.path / "tests" / "integration" / "test_grouped.py").write_text(
        "import time, pytest\n"
        "@pytest.mark.xdist_group('cluster')\n"
        "def test_a(): time.sleep(0.3)\n"
        "@pytest.mark.xdist_group('cluster')\n"
        "def test_b(): time.sleep(0.2)\n")
    result = suite.runpytest_inprocess("-p", "tests.durations", "-p", "xdist", "-n", "2",
                                       "--dist", "loadgroup", "tests")
    result.assert_outcomes(passed=5, failed=1, skipped=1)
    data = json.loads((out(suite) / "test-durations.json").read_text())
    groups = {g["group"]: g for g in data["groups"]}
    assert sorted(groups) == [durations.FREE, "cluster"]
    summed = [g["seconds"] for g in data["groups"]]
    assert summed == sorted(summed, reverse=True)  # the biggest first
    assert groups["cluster"]["tests"] == 2 and groups["cluster"]["seconds"] >= 0.5
    assert groups[durations.FREE]["tests"] == 5
    files = {f["file"]: f for f in data["files"]}
    assert files["tests/integration/test_grouped.py"]["group"] == "cluster"
    assert files["tests/integration/test_grouped.py"]["tests"] == 2
    assert files["tests/unit/test_unit.py"] == {
        "file": "tests/unit/test_unit.py", "group": durations.FREE, "tests": 3,
        "seconds": files["tests/unit/test_unit.py"]["seconds"]}
    summed = [f["seconds"] for f in data["files"]]
    assert summed == sorted(summed, reverse=True) and len(summed) == 3
    # The ids in the slowest list are the plain ones (no @group).
    assert data["slowest"][0]["nodeid"] == "tests/integration/test_grouped.py::test_a"
    page = (out(suite) / "test-durations.md").read_text()
    assert "| cluster | 2 |" in page and f"| {durations.FREE} | 5 |" in page
    assert "| `tests/integration/test_grouped.py` | cluster | 2 |" in page
    assert "over 2 worker(s) at least" in page


def test_group_and_file_of_a_test_id() -> None:
    assert durations.group_of("tests/integration/test_x.py::test_y[a]@sandbox-twin") \
        == "sandbox-twin"
    assert durations.group_of("tests/integration/test_x.py::test_y[a@b]") == durations.FREE
    assert durations.group_of("tests/unit/test_x.py::test_y") == durations.FREE
    assert durations.file_of("tests/unit/test_x.py::test_y[a::b]") == "tests/unit/test_x.py"
    sums = durations.sums_by({"a": 1.0, "b": 2.5, "c": 0.04},
                             {"a": "g", "b": "h", "c": "g"})
    assert sums == {"h": {"tests": 1, "seconds": 2.5}, "g": {"tests": 2, "seconds": 1.0}}


def test_tier_of_names_the_folder_under_tests() -> None:
    assert durations.tier_of("tests/unit/core/test_x.py::test_y[a/b]") == "unit"
    assert durations.tier_of("tests/integration/test_x.py::test_y") == "integration"
    assert durations.tier_of("test_top.py::test_y") == "test_top.py"


def test_the_checked_in_page_is_the_generated_one() -> None:
    # docs/testing.md includes it: it must exist (mkdocs --strict), and be the plugin's.
    root = Path(__file__).resolve().parents[3] / durations.DEFAULT_DIR
    page = (root / "test-durations.md").read_text()
    assert page.startswith("<!-- Written by tests/durations.py")
