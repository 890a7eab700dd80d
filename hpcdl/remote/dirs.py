"""Directories on the login node's side: the remote home, the runs and images
directories a profile's ``login:`` names (or their defaults under the remote home), and
the check that one can be written, all through an SshExecutor. Never prints."""

from __future__ import annotations

import posixpath
from functools import lru_cache

from hpcdl.remote.ssh import RemoteError, RemoteInputError, SshExecutor

DEFAULT_RUNS = "hpcdl-runs"
DEFAULT_IMAGES = "hpcdl-images"

# The remote shell's own words, each quoted as one argument by remote_command: the
# script is a constant; paths reach it as "$1", never as shell text.
_HOME = ["sh", "-c", 'printf "%s" "$HOME"']
_WRITABLE = ["sh", "-c", 'mkdir -p -- "$1" 2>&1 && test -w "$1" -a -x "$1"', "sh"]


@lru_cache(maxsize=8)
def remote_home(ex: SshExecutor) -> str:
    """$HOME of the remote account. Raises RemoteError when it is not an absolute path."""
    home = ex.run(_HOME, timeout=60).stdout.strip()
    if not posixpath.isabs(home):
        raise RemoteError(f"login node {ex.login.target}: $HOME is {home!r}, not an absolute path")
    return home


def remote_dir(ex: SshExecutor, configured: str | None, default_leaf: str) -> str:
    """``configured`` (an absolute path), else ``default_leaf`` in the remote home."""
    if configured:
        return posixpath.normpath(configured)
    return posixpath.join(remote_home(ex), default_leaf)


def ensure_writable(ex: SshExecutor, path: str, field: str) -> None:
    """Make ``path`` on the login node (with its parents) and check this user can write
    there. Raises RemoteInputError (exit 2) naming the profile ``field`` when not."""
    res = ex.run([*_WRITABLE, path], timeout=60, check=False)
    if not res.ok:
        said = " ".join((res.stdout + res.stderr).split())[:300]
        raise RemoteInputError(f"{field}: {path} is not writable on {ex.login.target}"
                               + (f" ({said})" if said else ""),
                               hint="set login.runs / login.images in the profile to a "
                                    "directory of yours the compute nodes share")
