"""The ``fake_slurm`` fixture: tests/fakeslurm's tools first on PATH, a fresh state
directory, and helpers to script outcomes and count the commands hpcdl ran.

The tools hpcdl itself runs (through hpcdl.core.proc) are answered in this process, by
the same code the PATH wrappers run: a test that follows a job through a hundred
squeue and sacct calls no longer starts two hundred shells and Pythons. What runs them
as programs (a batch script, a bench, another hpcdl process) still finds bin/ on PATH.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import traceback
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hpcdl.core import proc
from tests.fakeslurm import fakeslurm

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


class InProcess:
    """hpcdl.core.proc's ``subprocess`` while a fake Slurm is up: ``run`` of one of the
    fake's tools (its bare name, which PATH resolves to bin/, or a path into bin/) calls
    fakeslurm.call here and returns what the program would have; anything else, and a
    call with its own cwd or environment, is a real process."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)  # Popen, PIPE, TimeoutExpired, ...

    @staticmethod
    def run(argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        program = Path(argv[0])
        ours = program.name in fakeslurm.TOOLS and str(program.parent) in (".", str(BIN))
        if not ours or kw.get("cwd") is not None or kw.get("env") is not None:
            return subprocess.run(argv, **kw)  # an argv list, exactly as proc passed it
        out, err = io.StringIO(), io.StringIO()
        try:
            code = fakeslurm.call(program.name, [str(a) for a in argv[1:]], out, err)
        except Exception:  # a bug in the fake: fail as its process would, with the trace
            err.write(traceback.format_exc())
            code = 1
        return subprocess.CompletedProcess(list(argv), code, out.getvalue(), err.getvalue())


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """A scripted fake Slurm on PATH (and in process for hpcdl's own calls); run
    directories under tmp_path/runs."""
    root = tmp_path / "fakeslurm"
    root.mkdir()
    monkeypatch.setenv("FAKE_SLURM_DIR", str(root))
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HPCDL_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(proc, "subprocess", InProcess())
    return FakeSlurm(root)
