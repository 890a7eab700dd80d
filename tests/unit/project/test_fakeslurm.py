"""tests/fakeslurm answers hpcdl's own calls in process and anything else through its
PATH wrappers, and both give the same answers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpcdl.core import proc
from tests.fakeslurm.fixture import BIN, FakeSlurm


def test_hpcdls_calls_are_answered_without_starting_a_process(
        fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_process(*args: object, **kw: object) -> None:
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "run", no_process)
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --partition=debug\ntrue\n")
    assert proc.run(["sbatch", "--parsable", "--job-name", "a", str(script)]).stdout == "100;fake\n"
    # A path into bin/ is the fake too; each squeue call is a tick of its clock.
    assert proc.run([str(BIN / "squeue"), "-h", "-j", "100"]).stdout.startswith("100|RUNNING|")
    refused = proc.run(["scontrol", "show", "job", "999"], check=False)
    assert refused.returncode == 1 and "Invalid job id" in refused.stderr
    assert [c["tool"] for c in fake_slurm.calls()] == ["sbatch", "squeue", "scontrol"]


def test_the_path_wrappers_give_the_same_answers(fake_slurm: FakeSlurm) -> None:
    for argv in (["sinfo"], ["scontrol", "show", "partition"], ["squeue", "-h", "-j", "7"]):
        inside = proc.run(argv, check=False)
        outside = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert (inside.returncode, inside.stdout, inside.stderr) == (
            outside.returncode, outside.stdout, outside.stderr), argv
    assert [c["tool"] for c in fake_slurm.calls()] == ["sinfo", "sinfo", "scontrol", "scontrol",
                                                       "squeue", "squeue"]
