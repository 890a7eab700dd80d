"""--stage-to: one copy per node, waiters see only a complete copy, racing copiers are safe."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from trainkit.staging import MARKER, stage_dataset

from hpcdl.errors import UserInputError


def _dataset(root: Path) -> Path:
    for rel in ("train/a/1.JPEG", "train/b/2.JPEG", "val/a/3.JPEG"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"\xff\xd8\xff" + rel.encode())
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.name != MARKER
    }


def test_first_call_copies_then_reuses(tmp_path: Path) -> None:
    src = _dataset(tmp_path / "imagenet")
    dest, seconds, copied = stage_dataset(src, tmp_path / "local", local_rank=0)
    assert copied and seconds >= 0
    assert dest == tmp_path / "local" / "imagenet"
    assert _files(dest) == _files(src)
    assert (dest / MARKER).read_text().strip() == str(src.resolve())
    again, _, copied_again = stage_dataset(src, tmp_path / "local", local_rank=0)
    assert again == dest and not copied_again


def test_other_local_ranks_wait_for_the_marker(tmp_path: Path) -> None:
    src = _dataset(tmp_path / "ds")
    results: list[tuple[Path, float, bool]] = []
    waiter = threading.Thread(
        target=lambda: results.append(
            stage_dataset(src, tmp_path / "l", local_rank=1, timeout=60, poll=0.01)
        )
    )
    waiter.start()
    stage_dataset(src, tmp_path / "l", local_rank=0)
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert results and results[0][2] is False
    assert _files(results[0][0]) == _files(src)


def test_waiter_times_out_with_a_clear_error(tmp_path: Path) -> None:
    src = _dataset(tmp_path / "ds")
    with pytest.raises(UserInputError, match="no staged copy"):
        stage_dataset(src, tmp_path / "l", local_rank=1, timeout=0.2, poll=0.01)


def test_two_copiers_sharing_the_target_both_end_with_one_complete_copy(tmp_path: Path) -> None:
    # Two "nodes" on one host share /tmp: both local ranks 0 copy; one rename wins.
    src = _dataset(tmp_path / "ds")
    out: list[tuple[Path, float, bool]] = []
    threads = [
        threading.Thread(
            target=lambda: out.append(stage_dataset(src, tmp_path / "l", local_rank=0))
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(out) == 2 and out[0][0] == out[1][0]
    assert _files(out[0][0]) == _files(src)
    assert sorted(p.name for p in (tmp_path / "l").iterdir()) == ["ds"]  # no temp copies left
