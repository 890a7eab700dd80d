"""Writing files so that a reader (or a crash) never sees half of one: a temp file in
the same directory, flushed to disk, then renamed over the target; a directory the same
way, filled under a temporary name beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def write_atomic(path: Path, content: str | bytes, mode: int = 0o644) -> None:
    """Write ``content`` (text as UTF-8, or bytes) to ``path`` through a temp file in
    the same directory + rename."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """``data`` as indented, key-sorted JSON, written atomically."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """A temporary directory beside ``target`` to fill; renamed to ``target`` (mode 0755)
    when the block ends, removed when it raises: whole or not at all. Raises
    FileExistsError when ``target`` exists."""
    if target.exists():
        raise FileExistsError(f"{target} exists")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
