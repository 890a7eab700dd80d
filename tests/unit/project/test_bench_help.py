"""Every benchmark under bench/ still imports and explains itself: a rename elsewhere
(a helper in bench/machine.py, a moved hpcdl module) must not leave one that fails at
its first line when someone reruns the command its figures cite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
# A Python start and the bench's imports each (~0.25 s, 20 benches): `make test`, not
# `make unit`.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("bench_*.py"))
                         + ["gpu_check.py"])
def test_bench_help(script: str) -> None:
    res = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "usage:" in res.stdout
