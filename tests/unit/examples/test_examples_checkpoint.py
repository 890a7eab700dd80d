"""Atomic rank-0 checkpoints: keep-last-N, latest, and a writer killed mid-write."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.unit.conftest import SEALED_DIRS, UNSET
from tests.unit.conftest_examples import EXAMPLES

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def test_save_keep_last_n_and_latest(tmp_path: Path) -> None:
    from trainkit.checkpoint import (
        latest_checkpoint,
        list_checkpoints,
        load_checkpoint,
        save_checkpoint,
    )

    assert latest_checkpoint(tmp_path / "none") is None
    for step in (5, 10, 15, 20):
        save_checkpoint(tmp_path, step, {"step": step, "w": torch.full((3,), float(step))}, keep=2)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["checkpoint-00000015.pt", "checkpoint-00000020.pt"]
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "checkpoint-00000020.pt"
    state = load_checkpoint(latest)
    assert state["step"] == 20 and torch.equal(state["w"], torch.full((3,), 20.0))
    assert sorted(os.listdir(tmp_path)) == names  # no temporary files left behind


def test_failed_write_removes_temp_and_keeps_previous(tmp_path: Path) -> None:
    from trainkit.checkpoint import latest_checkpoint, save_checkpoint

    save_checkpoint(tmp_path, 1, {"ok": True})

    def broken(fh: object, state: object) -> None:
        fh.write(b"partial")  # type: ignore[attr-defined]
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, {"ok": False}, writer=broken)
    assert os.listdir(tmp_path) == ["checkpoint-00000001.pt"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-00000001.pt"


CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {examples!r})
    import torch
    from trainkit.checkpoint import save_checkpoint

    directory, marker = sys.argv[1], sys.argv[2]
    save_checkpoint(directory, 1, {{"step": 1, "w": torch.arange(1000.0)}})

    def stalls_halfway(fh, state):
        import io
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        fh.write(data[: len(data) // 2])
        fh.flush()
        open(marker, "w").close()  # tell the test we are mid-write
        time.sleep(600)

    save_checkpoint(directory, 2, {{"step": 2, "w": torch.zeros(200000)}}, writer=stalls_halfway)
    """
)


@pytest.fixture(scope="module")
def killed_mid_write(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint folder whose writer, a child process, was SIGKILLed halfway through
    its second checkpoint (after a whole first one). One child (~1.5 s: a Python start
    and torch's import) for the tests below, each of which works on its own copy. The
    child gets a HOME and caches of its own (this fixture outlives one test's
    sealed_home, tests/unit/conftest.py)."""
    base = tmp_path_factory.mktemp("killed")
    ckpt, marker = base / "ckpt", base / "writing"
    script = base / "child.py"
    script.write_text(CHILD.format(examples=str(EXAMPLES)))
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    for var, rel in SEALED_DIRS.items():
        (base / rel).mkdir(parents=True, exist_ok=True)
        env[var] = str(base / rel)
    proc = subprocess.Popen([sys.executable, str(script), str(ckpt), str(marker)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "child exited before writing"
            assert time.monotonic() < deadline, "child never reached the middle of the write"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return ckpt


def test_process_killed_mid_write_leaves_previous_checkpoint_loadable(
        killed_mid_write: Path, tmp_path: Path) -> None:
    from trainkit.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

    ckpt = Path(shutil.copytree(killed_mid_write, tmp_path / "ckpt"))
    leftovers = [n for n in os.listdir(ckpt) if n.endswith(".tmp")]
    assert len(leftovers) == 1 and (ckpt / leftovers[0]).stat().st_size > 0  # really half-written
    latest = latest_checkpoint(ckpt)
    assert latest is not None and latest.name == "checkpoint-00000001.pt"
    state = load_checkpoint(latest)
    assert state["step"] == 1 and torch.equal(state["w"], torch.arange(1000.0))
    # Training goes on: the next save works and is the new latest.
    save_checkpoint(ckpt, 3, {"step": 3})
    assert load_checkpoint(latest_checkpoint(ckpt))["step"] == 3  # type: ignore[arg-type]


def test_resume_skips_a_damaged_newest_checkpoint(tmp_path: Path) -> None:
    """A requeued job resumes from the newest checkpoint that loads: a truncated newest
    file (a kill during a copy, a full disk outside save_checkpoint) and one without the
    training state fall back to the one before, each named in ``skipped``."""
    from trainkit.checkpoint import checkpoint_path, load_latest_valid, save_checkpoint

    assert load_latest_valid(tmp_path / "none") is None
    good = {"model": {"w": torch.arange(4.0)}, "optimizer": {}, "progress": {"global_step": 5}}
    save_checkpoint(tmp_path, 5, good)
    save_checkpoint(tmp_path, 10, {**good, "progress": {"global_step": 10}})
    newest = checkpoint_path(tmp_path, 10)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # damaged
    save_checkpoint(tmp_path, 15, {"model": {}})  # loads, but holds no training state
    found = load_latest_valid(tmp_path)
    assert found is not None
    path, state, skipped = found
    assert path.name == "checkpoint-00000005.pt" and state["progress"]["global_step"] == 5
    assert [s.split(":")[0] for s in skipped] == ["checkpoint-00000015.pt",
                                                   "checkpoint-00000010.pt"]
    assert "no optimizer, progress" in skipped[0]


def test_killed_mid_write_is_never_resumed_from(killed_mid_write: Path, tmp_path: Path) -> None:
    """The requeue path's loader after a SIGKILL mid-write: the half-written temp file is
    not a candidate, the previous checkpoint is what the next attempt resumes from."""
    from trainkit.checkpoint import load_latest_valid

    ckpt = Path(shutil.copytree(killed_mid_write, tmp_path / "ckpt"))
    assert any(n.endswith(".tmp") for n in os.listdir(ckpt))
    found = load_latest_valid(ckpt, required=("step",))
    assert found is not None
    assert found[0].name == "checkpoint-00000001.pt" and found[1]["step"] == 1 and not found[2]
