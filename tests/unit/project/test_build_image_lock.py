"""scripts/build-image.sh takes a lock per wheelhouse (flock(1)): a second run waits
for the first instead of preparing the same wheelhouse at the same time.

The script runs for real up to its first pip download, with a stub Python that answers
hpcdl's cache rule (a temporary cache) and fails everything else (exit 7): what the
lock guards is never reached in a unit test, only the wait for it."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
STUB = """#!/bin/sh
case "$*" in
  *cache_dirs*) echo "$CACHE_FOR_TEST"; echo "$CACHE_FOR_TEST" ;;
  *) echo "stub python: $*" >&2; exit 7 ;;
esac
"""


@pytest.fixture
def stub_env(tmp_path: Path) -> dict[str, str]:
    if shutil.which("flock") is None:  # util-linux: Debian's base system has it
        pytest.skip("flock(1) is missing")
    python = tmp_path / "python"
    python.write_text(STUB)
    python.chmod(0o755)
    return {"PATH": "/usr/bin:/bin", "PYTHON": str(python), "CACHE_FOR_TEST": str(tmp_path / "c")}


def build_image(env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    done = subprocess.run([str(REPO / "scripts" / "build-image.sh"), "--prepare-only"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    return done, time.monotonic() - start


def test_a_free_wheelhouse_is_prepared_at_once(stub_env: dict[str, str]) -> None:
    done, _ = build_image(stub_env)
    assert done.returncode == 7, done.stderr  # reached the first download: the stub's exit
    assert "waiting for another" not in done.stderr
    assert Path(stub_env["CACHE_FOR_TEST"], "wheelhouse.lock").is_file()


def test_a_second_run_waits_for_the_first(stub_env: dict[str, str], tmp_path: Path) -> None:
    cache = Path(stub_env["CACHE_FOR_TEST"])
    cache.mkdir()
    ready = tmp_path / "held"
    holder = subprocess.Popen(["flock", str(cache / "wheelhouse.lock"), "sh", "-c",
                               f"touch {ready}; sleep 2"])
    try:
        for _ in range(100):
            if ready.exists():
                break
            time.sleep(0.05)
        assert ready.exists(), "the holder never took the lock"
        done, seconds = build_image(stub_env)
    finally:
        holder.wait(timeout=30)
    assert done.returncode == 7, done.stderr
    assert f"waiting for another build-image.sh on {cache}/wheelhouse" in done.stderr
    assert seconds > 1.0  # it waited for the holder's 2 s (less the start-up)
