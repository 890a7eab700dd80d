"""Checkpoints: written by rank 0 only, atomically, keeping the last N.

A checkpoint is first written to a temporary file in the same directory, flushed
and fsynced, then renamed over its final name (``os.replace`` is atomic on POSIX),
and the directory is fsynced. A process killed mid-write leaves at most a stray
``.tmp`` file, which ``latest_checkpoint`` ignores; the previous checkpoint stays
intact and loadable.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

import torch

NAME = "checkpoint-{step:08d}.pt"
_PATTERN = re.compile(r"checkpoint-(\d{8})\.pt")


def checkpoint_path(directory: str | os.PathLike[str], step: int) -> Path:
    return Path(directory) / NAME.format(step=step)


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints in ``directory``, oldest first (temporary files excluded)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), d / name) for name in os.listdir(d) if (m := _PATTERN.fullmatch(name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    items = list_checkpoints(directory)
    return items[-1] if items else None


def _write(fh: BinaryIO, state: dict[str, Any]) -> None:
    torch.save(state, fh)


def save_checkpoint(
    directory: str | os.PathLike[str],
    step: int,
    state: dict[str, Any],
    keep: int = 3,
    writer: Any = None,
) -> Path:
    """Write ``state`` atomically as checkpoint ``step``; delete all but the newest ``keep``.

    ``writer(fh, state)`` defaults to ``torch.save``. Raises OSError on I/O failure
    (leaving earlier checkpoints untouched).
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(d, step)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as fh:
            (writer or _write)(fh, state)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, final)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(d)
    if keep > 0:
        for old in list_checkpoints(d)[:-keep]:
            old.unlink(missing_ok=True)
    return final


def _fsync_dir(d: Path) -> None:
    # Makes the rename itself durable; not every filesystem allows it.
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_latest_valid(
    directory: str | os.PathLike[str], required: tuple[str, ...] = ("model", "optimizer", "progress")
) -> tuple[Path, dict[str, Any], list[str]] | None:
    """The newest checkpoint in ``directory`` that loads and has ``required`` keys, as
    (path, state, skipped): ``skipped`` says which newer files were damaged and why
    (a requeued job falls back to the previous checkpoint rather than failing). None
    when there is no loadable checkpoint."""
    skipped: list[str] = []
    for path in reversed(list_checkpoints(directory)):
        try:
            state = load_checkpoint(path)
            missing = [k for k in required if k not in state]
            if missing:
                raise ValueError(f"no {', '.join(missing)}")
        except Exception as exc:  # any unreadable file: torch/pickle raise many kinds
            skipped.append(f"{path.name}: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}")
            continue
        return path, state, skipped
    return None


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint written by ``save_checkpoint`` onto the CPU."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not an hpcdl checkpoint")
    return state
