"""docs/benchmarks.md's test counts come from scripts/docs_counts.py, and are current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.project.scriptload import load_script

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "docs_counts.py"


def _counts() -> ModuleType:
    return load_script("docs_counts")


def test_tiers_split_unit_tests_on_the_slow_marker() -> None:
    counts = _counts()
    items = [("tests/unit/test_a.py::t1", {"parametrize"}), ("tests/unit/test_a.py::t2", set()),
             ("tests/unit/test_b.py::t3", {"slow"}), ("tests/integration/test_c.py::t4", {"slurm"})]
    tiers = counts.tiers(items)
    assert tiers == {"unit": 2, "slow": 1, "integration": 1, "all": 4}
    table = counts.block({**tiers, "all": 1234})
    assert "| `make unit` (tests/unit, not `slow`) | 2 |\n" in table
    assert table.endswith("| all: `make test` | 1,234 |\n")
    assert counts.BLOCK.search((ROOT / "docs" / "benchmarks.md").read_text()), "the marked block"


@pytest.mark.slow  # collects every test (~10-20 s)
def test_the_page_has_the_current_counts() -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
