"""What lets two test sessions share the ordinary user safely (tests/integration/conftest_user.py).

* The user's venv is cached, keyed by the content of the hpcdl wheel it installs (and the
  interpreter): a session whose wheel matches reuses it; otherwise it is built at its own
  keyed path under an exclusive lock and marked complete last. A venv cannot be built
  elsewhere and renamed into place (its scripts name their interpreter by absolute
  path), so the lock and the marker do what a rename would: no session ever uses a
  half-built venv, and two sessions never build the same one at once. Each session holds
  a shared "in use" lock on its venv; an old venv is removed only when no session holds
  that lock.
* The run directories a session's user commands create are recorded call by call, and
  only those are removed at its end: never one that was there before, and, where another
  session overlapped the command, only one the command's own output names (the other
  may have created the rest in the same moment).

Pure file and lock logic, unit-tested in tests/unit/project/test_user_cache.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import uuid
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

T = TypeVar("T")

COMPLETE = "hpcdl-test-venv.complete"  # written last, holding the key: the venv is whole


def wheel_content_hash(wheel: Path) -> str:
    """sha256 over the wheel's member names and contents, not the zip file's bytes: two
    builds of the same tree differ in their entries' timestamps, not in what they install."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            digest.update(name.encode() + b"\0")
            digest.update(hashlib.sha256(archive.read(name)).digest())
    return digest.hexdigest()


def _lock(path: Path, mode: int) -> IO[bytes]:
    handle = open(path, "ab")  # noqa: SIM115 - held open for as long as the lock is
    fcntl.flock(handle, mode)
    return handle


def _try_lock(path: Path, mode: int) -> IO[bytes] | None:
    handle = open(path, "ab")  # noqa: SIM115 - returned open, holding the lock
    try:
        fcntl.flock(handle, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


@dataclass
class CachedVenv:
    path: Path
    built: bool  # False: reused as another session (or an earlier one) left it
    in_use: IO[bytes]  # the shared lock held while this session uses the venv

    def release(self) -> None:
        self.in_use.close()


def cached_venv(root: Path, key: str, build: Callable[[Path], None]) -> CachedVenv:
    """The venv for ``key`` under ``root`` (root/venv-KEY16), built by ``build(path)``
    unless a complete one is there; then the venvs of other keys that no session uses are
    removed. The caller holds the returned ``in_use`` lock until it is done with it."""
    root.mkdir(parents=True, exist_ok=True)
    name = f"venv-{key[:16]}"
    path = root / name
    in_use = _lock(root / f"{name}.inuse", fcntl.LOCK_SH)
    built = False
    with _lock(root / f"{name}.lock", fcntl.LOCK_EX):
        marker = path / COMPLETE
        if not (marker.is_file() and marker.read_text() == key):
            if path.exists():  # a build that died half-way: nobody can be using it
                shutil.rmtree(path)
            build(path)
            marker.write_text(key)
            built = True
    prune(root, keep=name)
    return CachedVenv(path, built, in_use)


def point_latest(link: Path, venv: Path) -> None:
    """``link`` (a symlink) names ``venv`` from now on, replaced atomically: the benches'
    fixed path to the user's venv. The sessions themselves use their keyed path, so a
    later session re-pointing it changes nothing under a running one."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.symlink_to(venv.name)
    if link.is_dir() and not link.is_symlink():  # the venv of before the cache
        shutil.rmtree(link)
    os.replace(tmp, link)


def prune(root: Path, keep: str) -> list[Path]:
    """Remove root's venv-* other than ``keep`` that no session holds in use."""
    removed = []
    for other in sorted(root.glob("venv-*")):
        if other.name == keep or not other.is_dir():
            continue
        free = _try_lock(root / f"{other.name}.inuse", fcntl.LOCK_EX)
        if free is None:
            continue
        with free, _lock(root / f"{other.name}.lock", fcntl.LOCK_EX):
            shutil.rmtree(other, ignore_errors=True)
            removed.append(other)
    return removed


class Sessions:
    """The test sessions on this machine that use the ordinary user. Each holds an
    exclusive lock on its own file in ``folder`` for its lifetime (a crashed session's
    lock goes with its process) and appends its name to ``started.log`` when it starts,
    so a session can tell whether any other overlapped a stretch of its time: one alive
    at the stretch's start (its lock) or one started during it (the log)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.mine = folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.session"
        self._handle: IO[bytes] | None = _lock(self.mine, fcntl.LOCK_EX)
        self.log = folder / "started.log"
        with open(self.log, "a") as log:  # O_APPEND: whole lines, whoever writes
            log.write(self.mine.name + "\n")

    def others_alive(self) -> bool:
        alive = False
        for other in self.folder.glob("*.session"):
            if other == self.mine:
                continue
            probe = _try_lock(other, fcntl.LOCK_EX)
            if probe is None:
                alive = True
                continue
            with probe:  # its session is gone
                other.unlink(missing_ok=True)
        return alive

    def mark(self) -> tuple[int, bool]:
        """The start of a stretch: (the log's length, whether another session is alive)."""
        return self.log.stat().st_size, self.others_alive()

    def alone_since(self, mark: tuple[int, bool]) -> bool:
        """Whether no other session overlapped the time since ``mark``."""
        offset, alive_then = mark
        if alive_then or self.others_alive():
            return False
        with open(self.log) as log:
            log.seek(offset)
            return all(line.strip() in ("", self.mine.name) for line in log)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        self.mine.unlink(missing_ok=True)


def entries(folders: Iterable[Path]) -> set[Path]:
    return {folder / name for folder in folders if folder.is_dir()
            for name in os.listdir(folder)}


def claimed(new: set[Path], output: str, alone: bool) -> set[Path]:
    """Of the entries that appeared in the run folders during one command, those this
    session made: all of them when no other session overlapped the command, otherwise
    only those the command's own output names."""
    if alone:
        return set(new)
    return {path for path in new if path.name in output}


class RunRecord:
    """The run directories this session's user commands created.

    Recorded call by call (``around``); at the end (``to_remove``), when no other session
    overlapped this one at all, everything new in the run folders since the start is
    this session's (also what a command started without ``around`` made, a Popen or a
    test's own runuser), as before; otherwise only what the calls recorded."""

    def __init__(self, folders: tuple[Path, ...], sessions: Sessions) -> None:
        self.folders = folders
        self.sessions = sessions
        self.start = sessions.mark()
        self.before = entries(folders)
        self.made: set[Path] = set()

    def around(self, command: Callable[[], tuple[str, T]]) -> T:
        """Run ``command`` (returning (its output, its result)) and record what it made."""
        mark = self.sessions.mark()
        before = entries(self.folders)
        output, result = command()
        alone = self.sessions.alone_since(mark)
        self.made |= claimed(entries(self.folders) - before, output, alone)
        return result

    def to_remove(self) -> set[Path]:
        if self.sessions.alone_since(self.start):
            return entries(self.folders) - self.before
        return self.made - self.before


def remove(paths: Iterable[Path]) -> None:
    for path in sorted(paths):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
