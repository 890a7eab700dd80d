"""Fixtures for tests against the real sandbox Slurm cluster (marker ``slurm``).

``slurm_cluster`` brings the cluster up once per session through
scripts/sandbox.sh (idempotent: a no-op when it already runs). Locally a
cluster that cannot come up skips the tests; in CI (CI=true) it fails them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
SANDBOX = REPO / "scripts" / "sandbox.sh"
CLI_TIMEOUT = 180


@pytest.fixture(scope="session")
def slurm_cluster() -> Path:
    """Start the sandbox (once per session); returns its slurm.conf."""
    require(os.geteuid() == 0, "the Slurm sandbox needs root (it starts Slurm's daemons)")
    require(shutil.which("unshare") is not None, "unshare (util-linux) is missing")
    res = subprocess.run(["bash", str(SANDBOX), "up"], capture_output=True, text=True,
                         timeout=900, check=False)
    require(res.returncode == 0,
            f"scripts/sandbox.sh up failed (exit {res.returncode}):\n{res.stdout}\n{res.stderr}")
    require(shutil.which("sbatch") is not None, "sbatch not on PATH after sandbox up")
    return Path(os.environ.get("HPCDL_SANDBOX_DIR", "/var/lib/hpcdl-sandbox")) / "etc/slurm.conf"


@pytest.fixture
def runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run directories of this test go under tmp_path (for the CLI and the library)."""
    path = tmp_path / "runs"
    monkeypatch.setenv("HPCDL_RUNS", str(path))
    return path


def hpcdl(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
          timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (``python -m hpcdl``) with a hard timeout."""
    return subprocess.run([sys.executable, "-m", "hpcdl", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **(env or {})},
                          cwd=cwd)


def submit_json(*args: str, **kw: Any) -> dict[str, Any]:
    """``hpcdl submit --json ...``; asserts success and returns the printed object."""
    res = hpcdl("submit", "--json", *args, **kw)
    assert res.returncode == 0, f"submit failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def wait_final(job_id: str, timeout: float = 120) -> dict[str, Any]:
    """Poll ``hpcdl status JOBID --json`` until a final state (hard timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        res = hpcdl("status", job_id, "--json")
        assert res.returncode == 0, res.stderr
        row = dict(json.loads(res.stdout))
        if row["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return row
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} not finished after {timeout} s: {row}")
        time.sleep(0.5)
