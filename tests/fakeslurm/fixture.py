"""The ``fake_slurm`` fixture: tests/fakeslurm's tools first on PATH, a fresh state
directory, and helpers to script outcomes and count the commands hpcdl ran."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

BIN = Path(__file__).resolve().parent / "bin"


class FakeSlurm:
    """Handle on one test's fake cluster (see tests/fakeslurm/fakeslurm.py)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def scenario(self, **scenario: Any) -> None:
        """Say how jobs progress (keys: default, jobs, refuse, min_job_age, sacct_lag)."""
        (self.root / "scenario.json").write_text(json.dumps(scenario))

    def calls(self) -> list[dict[str, Any]]:
        path = self.root / "calls.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def counts(self) -> Counter[str]:
        return Counter(call["tool"] for call in self.calls())

    def reset_calls(self) -> None:
        (self.root / "calls.jsonl").unlink(missing_ok=True)

    def jobs(self) -> dict[str, Any]:
        path = self.root / "jobs.json"
        return dict(json.loads(path.read_text())["jobs"]) if path.is_file() else {}


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """A scripted fake Slurm on PATH; run directories under tmp_path/runs."""
    root = tmp_path / "fakeslurm"
    root.mkdir()
    monkeypatch.setenv("FAKE_SLURM_DIR", str(root))
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HPCDL_RUNS", str(tmp_path / "runs"))
    return FakeSlurm(root)
