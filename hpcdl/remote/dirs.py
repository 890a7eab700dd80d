"""Directories on the login node's side: the remote home, the runs and images
directories a profile's ``login:`` names (or their defaults under the remote home), and
the check that one can be written, all through a transport's Shell (an SshExecutor).
Never prints.

The remote home, once asked, is remembered in the user's cache (``remote-home.json``,
by login target) so that ``submit --dry-run`` can name the cluster's paths without a
connection: a dry run reads it (``remembered=True``), a submission always asks."""

from __future__ import annotations

import contextlib
import json
import posixpath
from functools import lru_cache
from pathlib import Path

from hpcdl.core.atomic import write_json_atomic
from hpcdl.core.resources import user_cache
from hpcdl.remote.ssh import RemoteError, RemoteInputError, Shell

DEFAULT_RUNS = "hpcdl-runs"
DEFAULT_IMAGES = "hpcdl-images"
HOMES_FILE = "remote-home.json"

# The remote shell's own words, each quoted as one argument by remote_command: the
# script is a constant; paths reach it as "$1", never as shell text.
_HOME = ["sh", "-c", 'printf "%s" "$HOME"']
_WRITABLE = ["sh", "-c", 'mkdir -p -- "$1" 2>&1 && test -w "$1" -a -x "$1"', "sh"]


@lru_cache(maxsize=8)
def remote_home(ex: Shell) -> str:
    """$HOME of the remote account. Raises RemoteError when it is not an absolute path."""
    home = ex.run(_HOME, timeout=60).stdout.strip()
    if not posixpath.isabs(home):
        raise RemoteError(f"login node {ex.target}: $HOME is {home!r}, not an absolute path")
    # Remembered for a later dry run; a cache that cannot be written only costs that
    # dry run one question to the login node.
    with contextlib.suppress(OSError):
        homes = _read_homes()
        if homes.get(ex.target) != home:
            _homes_path().parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(_homes_path(), {**homes, ex.target: home})
    return home


def _homes_path() -> Path:
    return Path(user_cache()) / HOMES_FILE


def _read_homes() -> dict[str, str]:
    try:
        data = json.loads(_homes_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items()
            if isinstance(k, str) and isinstance(v, str) and posixpath.isabs(v)}


def remembered_home(ex: Shell) -> str | None:
    """The remote home a connection to ``ex``'s login node found before, or None. Reads
    a local file only."""
    return _read_homes().get(ex.target)


def remote_dir(ex: Shell, configured: str | None, default_leaf: str, *,
               remembered: bool = False) -> str:
    """``configured`` (an absolute path), else ``default_leaf`` in the remote home.
    ``remembered``: take the home from the local record when there is one (a dry run,
    which should open no connection); else, and always without it, ask the login node."""
    if configured:
        return posixpath.normpath(configured)
    home = remembered_home(ex) if remembered else None
    return posixpath.join(home or remote_home(ex), default_leaf)


def known_offline(ex: Shell, configured: str | None) -> bool:
    """Whether remote_dir(..., remembered=True) answers without the login node."""
    return bool(configured) or remembered_home(ex) is not None


def ensure_writable(ex: Shell, path: str, field: str) -> None:
    """Make ``path`` on the login node (with its parents) and check this user can write
    there. Raises RemoteInputError (exit 2) naming the profile ``field`` when not."""
    res = ex.run([*_WRITABLE, path], timeout=60, check=False)
    if not res.ok:
        said = " ".join((res.stdout + res.stderr).split())[:300]
        raise RemoteInputError(f"{field}: {path} is not writable on {ex.target}"
                               + (f" ({said})" if said else ""),
                               hint="set login.runs / login.images in the profile to a "
                                    "directory of yours the compute nodes share")
