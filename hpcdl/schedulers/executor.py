"""The transport: where a scheduler adapter's commands run and how files get there.

An adapter is given an ``Executor`` and runs every command (sbatch, squeue, qsub, ...)
through it; the job path moves run directories with its ``push``/``pull``. Two
implementations: ``LocalExecutor`` runs commands here, through hpcdl.core.proc (the one
subprocess gateway), and copies directories (nothing moves when the two paths are the
same one); hpcdl.remote.ssh.SshExecutor carries the argv to a login node over one
multiplexed OpenSSH connection and moves directories with rsync over that connection.
Running the same adapter against a remote login node is another Executor, not another
adapter.

This module and hpcdl/remote/ are the only ones that name SSH: ``executor_for(profile)``
is where a profile's ``login:`` block picks the transport, and everything above asks
the transport (``remote``, ``where``, ``target``) rather than its type
(tests/unit/schedulers/test_transport.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from hpcdl.core import proc
from hpcdl.errors import ToolError
from hpcdl.remote.ssh import (
    ConnectionLost,
    LoginNode,
    RemoteError,
    RemoteInputError,
    SshExecutor,
)

if TYPE_CHECKING:
    from hpcdl.profiles.schema import Login, Profile

# The transport's errors, for the layers above (which name no SSH module): a login node
# that went away for a moment (a follow loop tries again), one the profile names but that
# cannot be used as given (exit 2), and any failure on it.
__all__ = ["LOCAL", "ConnectionLost", "Executor", "LocalExecutor", "RemoteError",
           "CommandDir", "RemoteInputError", "executor_for", "executor_for_login", "login_node",
           "ssh_transport"]


class Executor(Protocol):
    """Runs one command to completion (an argv list, never a shell string; a timeout;
    captured output) and moves directories to and from where the commands run."""

    @property
    def remote(self) -> bool:
        """Whether the commands run on another machine, which sees other files."""
        ...

    @property
    def target(self) -> str:
        """What names where the commands run in messages (``user@host``, or
        ``localhost``)."""
        ...

    @property
    def where(self) -> str:
        """Where the commands run, in words, as the transport's errors begin."""
        ...

    def __hash__(self) -> int:
        """Hashable (remote.dirs asks a transport for the remote home once)."""
        ...

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True) -> proc.Result:
        """Run ``argv``; raise ToolError when it is missing, times out, or (with
        ``check``) exits non-zero. The result carries ``argv`` as given."""
        ...

    def which(self, name: str) -> str | None:
        """Where the command ``name`` is found, or None."""
        ...

    def which_all(self, names: Sequence[str]) -> dict[str, str | None]:
        """``which`` of each name, in one go (one round trip for a remote executor)."""
        ...

    def push(self, local_dir: str | os.PathLike[str], remote_dir: str, *,
             timeout: float = 600, link_dest: Sequence[str] = (),
             parents: bool = True) -> int:
        """Copy ``local_dir``'s content into ``remote_dir`` where the commands run;
        returns the bytes moved."""
        ...

    def pull(self, remote_dir: str, local_dir: str | os.PathLike[str], *,
             timeout: float = 600, exclude: Sequence[str] = ()) -> int:
        """Copy ``remote_dir``'s content into ``local_dir``; returns the bytes moved."""
        ...

    def connect(self) -> None:
        """Open the connection now, prompts allowed (nothing to open here)."""
        ...

    def terminal(self, argv: Sequence[str], env: dict[str, str]
                 ) -> tuple[list[str], dict[str, str]]:
        """The local argv that runs ``argv`` with ``env`` attached to this terminal
        where the commands run, and what it adds to the local environment."""
        ...


class LocalExecutor:
    """Commands run on this machine, through hpcdl.core.proc; a push or a pull is a
    copy on this machine's filesystem, nothing when both paths are the same."""

    remote = False
    target = "localhost"
    where = "this machine"

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True) -> proc.Result:
        return proc.run(argv, timeout=timeout, check=check)

    def which(self, name: str) -> str | None:
        return proc.which(name)

    def which_all(self, names: Sequence[str]) -> dict[str, str | None]:
        return {name: proc.which(name) for name in names}

    def push(self, local_dir: str | os.PathLike[str], remote_dir: str, *,
             timeout: float = 600, link_dest: Sequence[str] = (),
             parents: bool = True) -> int:
        return _copy_tree(Path(local_dir), Path(remote_dir))

    def pull(self, remote_dir: str, local_dir: str | os.PathLike[str], *,
             timeout: float = 600, exclude: Sequence[str] = ()) -> int:
        return _copy_tree(Path(remote_dir), Path(local_dir), exclude)

    def connect(self) -> None:
        return None

    def terminal(self, argv: Sequence[str], env: dict[str, str]
                 ) -> tuple[list[str], dict[str, str]]:
        return list(argv), dict(env)


def _copy_tree(source: Path, dest: Path, exclude: Sequence[str] = ()) -> int:
    """``source``'s content into ``dest`` (made with its parents); returns the bytes
    copied: 0 when both name the same directory (the cluster sees this machine's
    files: nothing moves). ``exclude``: rsync-style ``/NAME/`` entries of the top
    level left out, as SshExecutor.pull takes them."""
    if not source.is_dir():
        raise ToolError(f"copy: {source} is not a directory")
    dest.mkdir(parents=True, exist_ok=True)
    if source.resolve() == dest.resolve():
        return 0
    skip = {e.strip("/") for e in exclude if e.startswith("/")}
    moved = 0
    for entry in source.iterdir():
        if entry.name in skip:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, dest / entry.name, symlinks=True, dirs_exist_ok=True)
            moved += sum(p.stat().st_size for p in entry.rglob("*")
                         if p.is_file() and not p.is_symlink())
        else:
            shutil.copy2(entry, dest / entry.name, follow_symlinks=False)
            moved += 0 if entry.is_symlink() else entry.stat().st_size
    return moved


LOCAL = LocalExecutor()


def login_node(login: Login) -> LoginNode:
    """The profile's ``login:`` block as the SSH transport's LoginNode."""
    return LoginNode(host=login.host, user=login.user, port=login.port,
                     identity=login.identity, jump=login.jump)


def executor_for_login(login: Login | None) -> Executor:
    """The transport to a ``login:`` block's node (SSH), or this machine without one."""
    if login is None:
        return LOCAL
    return SshExecutor.for_login(login_node(login))


class CommandDir:
    """Another executor whose scheduler commands (``names``: sbatch, srun, ...) run from
    ``directory`` instead of PATH: a profile's ``scheduler.commands`` (a site's
    `module load slurm/24.11` directory, a sandbox's release wrappers). Every other
    argv, and the moving of directories, is the inner executor's as it is."""

    def __init__(self, inner: Executor, directory: str, names: frozenset[str]) -> None:
        self.inner = inner
        self.directory = directory.rstrip("/") or "/"
        self.names = names

    @property
    def remote(self) -> bool:
        return self.inner.remote

    @property
    def target(self) -> str:
        return self.inner.target

    @property
    def where(self) -> str:
        return self.inner.where

    def __hash__(self) -> int:
        return hash((self.inner, self.directory))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, CommandDir) and other.inner == self.inner
                and other.directory == self.directory)

    def path(self, name: str) -> str:
        """Where the command ``name`` runs from: the directory's, for a scheduler
        command; else the name as given."""
        return f"{self.directory}/{name}" if name in self.names else name

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True) -> proc.Result:
        if not argv:
            return self.inner.run(argv, timeout=timeout, check=check)
        result = self.inner.run([self.path(argv[0]), *argv[1:]], timeout=timeout, check=check)
        # The result carries argv as given (messages name `sbatch`, not its directory).
        return proc.Result(argv=tuple(argv), returncode=result.returncode,
                           stdout=result.stdout, stderr=result.stderr)

    def which(self, name: str) -> str | None:
        return self.inner.which(self.path(name))

    def which_all(self, names: Sequence[str]) -> dict[str, str | None]:
        found = self.inner.which_all([self.path(n) for n in names])
        return {n: found[self.path(n)] for n in names}

    def push(self, local_dir: str | os.PathLike[str], remote_dir: str, *,
             timeout: float = 600, link_dest: Sequence[str] = (),
             parents: bool = True) -> int:
        return self.inner.push(local_dir, remote_dir, timeout=timeout, link_dest=link_dest,
                               parents=parents)

    def pull(self, remote_dir: str, local_dir: str | os.PathLike[str], *,
             timeout: float = 600, exclude: Sequence[str] = ()) -> int:
        return self.inner.pull(remote_dir, local_dir, timeout=timeout, exclude=exclude)

    def connect(self) -> None:
        self.inner.connect()

    def terminal(self, argv: Sequence[str], env: dict[str, str]
                 ) -> tuple[list[str], dict[str, str]]:
        return self.inner.terminal([self.path(argv[0]), *argv[1:]] if argv else argv, env)


def executor_for(profile: Profile) -> Executor:
    """Where the profile's scheduler commands run: its login node over SSH when it names
    one, else this machine. The one place the ``login:`` block picks a transport (the
    adapter itself takes ``scheduler.commands``: CommandDir)."""
    return executor_for_login(profile.login)


def ssh_transport(profile: Profile) -> SshExecutor | None:
    """The SSH transport of the profile's ``login:`` block, for what only SSH does
    (`hpcdl push`: an image rsynced into login.images, with its progress, and the rsync
    shown by its dry run); None without a login node."""
    return SshExecutor.for_login(login_node(profile.login)) if profile.login else None
