"""The user's code directory a remote job runs in (``submit --code DIR``): which files
go, read from the directory and its ignore file, and the size limit. Pure apart from
reading the directory, and copying it into a run directory (stage_code).

The ignore file, ``.hpcdlignore`` in DIR, takes one fnmatch pattern per line (``#``
starts a comment): a pattern with a '/' is matched against the path relative to DIR,
one without against each name, and a trailing '/' matches directories only.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hpcdl.core.atomic import atomic_dir
from hpcdl.errors import ValidationError

IGNORE_FILE = ".hpcdlignore"
# RUN_DIR/code: the copy the job starts in.
CODE_DIR_NAME = "code"
# Never code: version control, caches, virtual environments.
DEFAULT_IGNORES = (".git/", ".hg/", ".svn/", "__pycache__/", "*.pyc", ".venv/", "venv/",
                   ".ipynb_checkpoints/", ".mypy_cache/", ".pytest_cache/", ".ruff_cache/",
                   ".tox/", "*.sif")


@dataclass(frozen=True)
class CodeDir:
    """The files of ``root`` that a job gets (paths relative to it) and their bytes."""

    root: Path
    files: tuple[str, ...]
    size: int


def ignore_patterns(root: Path) -> tuple[str, ...]:
    """DEFAULT_IGNORES and the lines of ``root``/.hpcdlignore."""
    try:
        text = (root / IGNORE_FILE).read_text(encoding="utf-8")
    except OSError:
        text = ""
    lines = (line.strip() for line in text.splitlines())
    return DEFAULT_IGNORES + tuple(line for line in lines if line and not line.startswith("#"))


def ignored(rel: str, is_dir: bool, patterns: tuple[str, ...]) -> bool:
    """Whether the path ``rel`` (relative, '/'-separated) matches one of ``patterns``."""
    name = rel.rsplit("/", 1)[-1]
    for pattern in patterns:
        dir_only = pattern.endswith("/")
        body = pattern.rstrip("/").lstrip("/")
        if dir_only and not is_dir:
            continue
        target = rel if "/" in body else name
        if fnmatch.fnmatchcase(target, body):
            return True
    return False


def scan_code(root: Path, *, limit_bytes: int, skip: tuple[Path, ...] = ()) -> CodeDir:
    """The files of ``root`` a job gets, without the ignored ones and the directories in
    ``skip`` (the local runs directory when it lies inside). Symbolic links are followed
    to files only. Raises ValidationError (exit 2) when the rest holds more than
    ``limit_bytes``, naming the size, the limit and the largest entries."""
    root = root.resolve()
    if not root.is_dir():
        raise ValidationError(f"code: {root} is not a directory")
    patterns = ignore_patterns(root)
    skipped = {s.resolve() for s in skip}
    files: list[str] = []
    sizes: dict[str, int] = {}
    total = 0
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        rel_dir = here.relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirs[:] = sorted(d for d in dirs if not ignored(prefix + d, True, patterns)
                         and (here / d).resolve() not in skipped)
        for name in sorted(names):
            rel = prefix + name
            path = here / name
            if ignored(rel, False, patterns) or not path.is_file():
                continue
            size = path.stat().st_size
            files.append(rel)
            total += size
            top = rel.split("/", 1)[0]
            sizes[top] = sizes.get(top, 0) + size
    if total > limit_bytes:
        largest = ", ".join(f"{k} ({v / 1e6:.0f} MB)"
                            for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
        raise ValidationError(
            f"code: {root} holds {total / 1e6:.0f} MB to copy, over the limit of "
            f"{limit_bytes / 1e6:.0f} MB (profile login.code_limit_mb); largest: {largest}",
            hint=f"list what the job does not need in {root / IGNORE_FILE} (one pattern a "
                 f"line, e.g. data/), or give --code a smaller directory")
    return CodeDir(root, tuple(sorted(files)), total)


def stage_code(run_dir: Path, root: Path, files: tuple[str, ...]) -> int:
    """Copy ``files`` (relative to ``root``; scan_code) into ``run_dir``/code/, with their
    times (rsync then links what an earlier run sent), all or nothing; returns the bytes."""
    copied = 0
    with atomic_dir(run_dir / CODE_DIR_NAME) as tmp:
        for rel in files:
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, dest)
            copied += dest.stat().st_size
    return copied
