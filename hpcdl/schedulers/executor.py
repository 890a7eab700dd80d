"""Where a scheduler adapter's commands run. An adapter is given an ``Executor`` and
runs every command (sbatch, squeue, qsub, ...) through it; ``LocalExecutor`` runs
them here, through hpcdl.core.proc (the one subprocess gateway). Running the same adapter
against a remote login node is another Executor (one that carries the argv over a
connection: hpcdl.remote.ssh.SshExecutor's run, with a ``which``), not another adapter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from hpcdl.core import proc


class Executor(Protocol):
    """Runs one command to completion: an argv list (never a shell string), a timeout,
    captured output."""

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


class LocalExecutor:
    """Commands run on this machine, through hpcdl.core.proc."""

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True) -> proc.Result:
        return proc.run(argv, timeout=timeout, check=check)

    def which(self, name: str) -> str | None:
        return proc.which(name)

    def which_all(self, names: Sequence[str]) -> dict[str, str | None]:
        return {name: proc.which(name) for name in names}


LOCAL = LocalExecutor()
