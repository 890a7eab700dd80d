"""Copy a dataset to node-local storage once per node before training.

Reading ImageNet's 1.28 M small files from a shared parallel filesystem starves the
GPUs; the usual fix is to copy it to node-local disk (``$TMPDIR``, ``/local``) at job
start. Local rank 0 of each node copies; the other ranks of that node wait for a
marker file. The copy goes to a private temporary directory renamed into place when
complete, so two copiers that share the target (two "nodes" on one host) never see
half a dataset: the first rename wins, the loser discards its copy.
Standard library only (runs before torch is initialised).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from hpcdl.jobside.errors import UserInputError

MARKER = ".hpcdl-staged"


def staged_path(source: str | os.PathLike[str], stage_to: str | os.PathLike[str]) -> Path:
    return Path(stage_to) / Path(source).resolve().name


def _complete(dest: Path, source: Path) -> bool:
    marker = dest / MARKER
    try:
        return marker.read_text().strip() == str(source)
    except OSError:
        return False


def stage_dataset(
    source: str | os.PathLike[str],
    stage_to: str | os.PathLike[str],
    *,
    local_rank: int,
    timeout: float = 3600,
    poll: float = 0.2,
) -> tuple[Path, float, bool]:
    """Return (staged path, seconds spent, whether this process copied).

    Raises UserInputError when the target cannot be written or the copy does not
    appear within ``timeout`` seconds (waiting ranks).
    """
    src = Path(source).resolve()
    dest = staged_path(src, stage_to)
    start = time.monotonic()
    if _complete(dest, src):
        return dest, time.monotonic() - start, False
    if local_rank != 0:
        while not _complete(dest, src):
            if time.monotonic() - start > timeout:
                raise UserInputError(
                    f"--stage-to {stage_to}: no staged copy of {src} after {timeout:g} s",
                    hint="local rank 0 of this node should have copied it; check its log",
                )
            time.sleep(poll)
        return dest, time.monotonic() - start, False
    tmp: Path | None = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        # A private name per copier (unique even for two copiers in one process).
        tmp = Path(
            tempfile.mkdtemp(
                prefix=f".{dest.name}.staging-{socket.gethostname()}-", dir=dest.parent
            )
        )
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        (tmp / MARKER).write_text(f"{src}\n")
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise UserInputError(f"--stage-to {stage_to}: cannot copy {src}: {exc}") from None
    try:
        if dest.exists() and not _complete(dest, src):
            shutil.rmtree(dest)  # a stale or foreign copy: replace it
        os.rename(tmp, dest)
        copied = True
    except OSError:
        # Another node's rank 0 sharing this directory finished first.
        shutil.rmtree(tmp, ignore_errors=True)
        copied = False
        if not _complete(dest, src):
            raise UserInputError(
                f"--stage-to {stage_to}: {dest} exists and is not a copy of {src}"
            ) from None
    return dest, time.monotonic() - start, copied
